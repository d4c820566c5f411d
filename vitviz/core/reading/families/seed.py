"""The tutorial ViT this project grew from (seeds/004): `patch_embedding`, `position_embedding`, MHA blocks."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vitviz.core.reading.families.base import Converted, Hint, Recipe, blocks_are_canonical, rename as _rename

if TYPE_CHECKING:
    import torch
    from vitviz.core.reading.checkpoint import RawCheckpoint

NAMES = ("seed",)
DETECT_ORDER = 60   # detection tries the families in this order, lowest first
# What this family knows beyond its keys (read by `vitviz.core.reading.families`: see there).
HELP = "the tutorial ViT vitviz grew from"
PREPROCESS = {"seed": Recipe(1.0, "bilinear", (0.0,), (1.0,), "squash")}


_RULES = [
    (r"^patch_embedding\.", "patch_embed.proj."), (r"^position_embedding$", "pos_embed"),
    (r"\.attention\.in_proj_weight$", ".attn.qkv.weight"), (r"\.attention\.in_proj_bias$", ".attn.qkv.bias"),
    (r"\.attention\.out_proj\.", ".attn.proj."), (r"\.mlp\.0\.", ".mlp.fc1."), (r"\.mlp\.2\.", ".mlp.fc2."),
]


def detect(keys: set[str], raw: RawCheckpoint) -> str | None:
    if "patch_embedding.weight" not in keys or "position_embedding" not in keys:
        return None
    return "seed" if blocks_are_canonical(set(_rename({k: None for k in keys}, _RULES))) else None  # type: ignore[arg-type]


def convert(sd: dict[str, torch.Tensor], raw: RawCheckpoint, family: str | None = None,
            overrides: dict[str, Any] | None = None) -> Converted:
    """The tutorial ViT of seeds/004: nn.MultiheadAttention blocks, nn.LayerNorm defaults (eps 1e-5)."""
    sd = _rename(sd, _RULES)
    hints: dict[str, Hint] = {"eps": (1e-5, "family: nn.LayerNorm default"), "pos_prefix": (1, "family"),
                              "pos_interp": ("torchvision", "family: seed tutorial (bicubic, align_corners)"),
                              "default_heads": ((4, 64), "family default: the tutorial ViT (dim 64, 4 heads)")}
    return Converted("seed", sd, hints)
