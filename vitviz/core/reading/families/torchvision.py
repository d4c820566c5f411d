"""torchvision `VisionTransformer` checkpoints (`conv_proj`, `encoder.layers.encoder_layer_N`)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vitviz.core.reading.families.base import Converted, Hint, Recipe, rename as _rename
from vitviz.core.spec import IMAGENET_MEAN, IMAGENET_STD

if TYPE_CHECKING:
    import torch
    from vitviz.core.reading.checkpoint import RawCheckpoint

NAMES = ("torchvision",)
DETECT_ORDER = 30   # detection tries the families in this order, lowest first
# What this family knows beyond its keys (read by `vitviz.core.reading.families`: see there).
HELP = "torchvision ViT"
PREPROCESS = {"torchvision": Recipe(0.875, "bilinear", IMAGENET_MEAN, IMAGENET_STD, "center")}
REGISTERED_SIZES = True
# No NAME_HINTS: its downloads are known by their file names (catalog)


def detect(keys: set[str], raw: RawCheckpoint) -> str | None:
    return "torchvision" if "conv_proj.weight" in keys and "encoder.pos_embedding" in keys else None


def convert(sd: dict[str, torch.Tensor], raw: RawCheckpoint, family: str | None = None,
            overrides: dict[str, Any] | None = None) -> Converted:
    sd = _rename(sd, [
        (r"^conv_proj\.", "patch_embed.proj."), (r"^class_token$", "cls_token"),
        (r"^encoder\.pos_embedding$", "pos_embed"), (r"^encoder\.ln\.", "norm."),
        (r"^encoder\.layers\.encoder_layer_(\d+)\.", r"blocks.\1."),
        (r"\.ln_1\.", ".norm1."), (r"\.ln_2\.", ".norm2."),
        (r"\.self_attention\.in_proj_weight$", ".attn.qkv.weight"),
        (r"\.self_attention\.in_proj_bias$", ".attn.qkv.bias"),
        (r"\.self_attention\.out_proj\.", ".attn.proj."),
        (r"\.mlp\.(0|linear_1)\.", ".mlp.fc1."), (r"\.mlp\.(3|linear_2)\.", ".mlp.fc2."),
        (r"^heads\.head\.", "head."), (r"^heads\.pre_logits\.", "pre_logits.fc."),
    ])
    hints: dict[str, Hint] = {"eps": (1e-6, "family: torchvision"), "pos_interp": ("torchvision", "family"),
                              "pos_prefix": (1, "family: torchvision")}
    return Converted("torchvision", sd, hints)


def read_object(module: torch.nn.Module, what: str) -> dict[str, tuple[Any, str]]:
    """What a torchvision model object states that its tensors do not (`vitviz.core.reading.objects`): its
    `EncoderBlock`s are pre-norm by their class."""
    if any(type(m).__name__ == "EncoderBlock" and type(m).__module__.startswith("torchvision.")
           for m in module.modules()):
        return {"block_norm": ("pre", f"model object: {what}'s blocks are pre-norm by their class")}
    return {}
