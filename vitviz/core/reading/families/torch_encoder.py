"""ViTs built on `nn.TransformerEncoder` / `nn.TransformerEncoderLayer` (`layers.N.self_attn.in_proj_weight`,
`linear1`, `linear2`, `norm1`, `norm2`), with whatever patch embedding, tokens and head around them.

The tensors are placed by `structural`. `nn.TransformerEncoderLayer`'s constructor decides what no tensor shows:
post-norm (`norm_first=False`) and ReLU are PyTorch's defaults, `layer_norm_eps` is 1e-5; each is said as
assumed (flagged) unless training args or a config beside the file give `norm_first` / `activation` /
`layer_norm_eps`. The attention is `nn.MultiheadAttention`'s, so its scale is known (head_dim ** -0.5).
"""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from vitviz.core.reading.families.base import Converted
from vitviz.core.reading.families.structural import Facts, facts_from_metadata, read

if TYPE_CHECKING:
    import torch
    from vitviz.core.reading.checkpoint import RawCheckpoint

NAMES = ("torch_encoder",)
DETECT_ORDER = 130   # detection tries the families in this order, lowest first
# What this family knows beyond its keys (read by `vitviz.core.reading.families`: see there).
HELP = "nn.TransformerEncoder ViTs"


def detect(keys: set[str], raw: RawCheckpoint) -> str | None:
    attn = any(re.search(r"\.self_attn\.in_proj_weight$", k) for k in keys)
    ff = any(re.search(r"\.linear1\.weight$", k) for k in keys)
    return "torch_encoder" if attn and ff else None


def convert(sd: dict[str, torch.Tensor], raw: RawCheckpoint, family: str | None = None,
            overrides: dict[str, Any] | None = None) -> Converted:
    facts = Facts(
        family="torch_encoder", eps=(1e-5, "assumed: nn.TransformerEncoderLayer's default layer_norm_eps 1e-5 (no "
                                           "tensor holds it)"),
        mlp_kind=("relu", "guess: ReLU, nn.TransformerEncoderLayer's default activation (pass act='gelu' if it "
                  "was built with activation='gelu')"),
        block_norm=("post", "guess: post-norm, nn.TransformerEncoderLayer's default norm_first=False (pass "
                    "block_norm='pre' if it was built with norm_first=True)"),
    )
    return read(sd, raw, facts_from_metadata(facts, raw), overrides or {})
