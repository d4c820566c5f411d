"""The tutorial ViT this project grew from (seeds/004): `patch_embedding`, `position_embedding`, MHA blocks."""
from __future__ import annotations

import torch

from vitviz.core.checkpoint import RawCheckpoint
from vitviz.core.families.base import Converted, Hint, rename as _rename

NAMES = ("seed",)


def detect(keys: set[str], raw: RawCheckpoint) -> str | None:
    return "seed" if "patch_embedding.weight" in keys and "position_embedding" in keys else None


def convert(sd: dict[str, torch.Tensor], raw: RawCheckpoint, family: str | None = None) -> Converted:
    """The tutorial ViT of seeds/004: nn.MultiheadAttention blocks, nn.LayerNorm defaults (eps 1e-5)."""
    sd = _rename(sd, [
        (r"^patch_embedding\.", "patch_embed.proj."), (r"^position_embedding$", "pos_embed"),
        (r"\.attention\.in_proj_weight$", ".attn.qkv.weight"), (r"\.attention\.in_proj_bias$", ".attn.qkv.bias"),
        (r"\.attention\.out_proj\.", ".attn.proj."), (r"\.mlp\.0\.", ".mlp.fc1."), (r"\.mlp\.2\.", ".mlp.fc2."),
    ])
    hints: dict[str, Hint] = {"eps": (1e-5, "family: nn.LayerNorm default"), "pos_prefix": (1, "family"),
                              "pos_interp": ("torchvision", "family: seed tutorial (bicubic, align_corners)"),
                              "default_heads": ((4, 64), "family default: the tutorial ViT (dim 64, 4 heads)")}
    return Converted("seed", sd, hints)
