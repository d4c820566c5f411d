"""OpenMMLab mmpretrain (formerly mmcls) `VisionTransformer` checkpoints: `backbone.layers.N.ln1 / attn.qkv /
ffn.layers.0.0`, `backbone.patch_embed.projection`, the final norm `backbone.ln1` and the classifier
`head.layers.head` (`VisionTransformerClsHead`, with `head.layers.pre_logits` when it has a hidden layer).

A training checkpoint holds `{'meta', 'state_dict', 'optimizer', ...}`; the reader takes its `state_dict`. The
numerics are mmpretrain's defaults for this backbone (LayerNorm eps 1e-6, exact GELU, pre-norm blocks, head_dim ** -0.5
scale); its arch table names sizes that timm's does not (its 'small' is 768 wide with 8 heads), so the head count
is not taken from timm's width table. The preprocessing is its ViT configs' (below).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vitviz.core.reading.families.base import Converted, Hint, Recipe, rename
from vitviz.core.spec import INCEPTION_MEAN, INCEPTION_STD

if TYPE_CHECKING:
    import torch

    from vitviz.core.reading.checkpoint import RawCheckpoint

NAMES = ("mmpretrain",)
DETECT_ORDER = 115   # detection tries the families in this order, lowest first
HELP = "OpenMMLab mmpretrain / mmcls VisionTransformer"
# mmpretrain's published ViT weights (`vit-*_3rdparty_in1k-384px`, from Google's JAX ones) are evaluated with its
# data_preprocessor mean = std = 127.5 (0.5 of 255), ResizeEdge(384, short, bilinear) and CenterCrop(384): the
# whole short side. Its DeiT configs differ (ImageNet statistics, 256 -> 224 bicubic): nothing in a file tells,
# so the recipe is said as an assumption unless the model is named.
PREPROCESS = {"mmpretrain": Recipe(1.0, "bilinear", INCEPTION_MEAN, INCEPTION_STD, "center")}
NAME_HINTS: tuple[tuple[str, str, int], ...] = ((r"mmpretrain|mmcls|vit-(base|large|huge)-p\d+_", "mmpretrain", 40),)


def detect(keys: set[str], raw: RawCheckpoint) -> str | None:
    return ("mmpretrain" if "patch_embed.projection.weight" in keys
            and any(k.startswith("layers.") and ".ffn.layers.0.0." in k for k in keys) else None)


def convert(sd: dict[str, torch.Tensor], raw: RawCheckpoint, family: str | None = None,
            overrides: dict[str, Any] | None = None) -> Converted:
    sd = rename(sd, [
        (r"^patch_embed\.projection\.", "patch_embed.proj."), (r"^pre_norm\.", "norm_pre."), (r"^ln1\.", "norm."),
        (r"^layers\.(\d+)\.", r"blocks.\1."), (r"^(blocks\.\d+)\.ln1\.", r"\1.norm1."),
        (r"^(blocks\.\d+)\.ln2\.", r"\1.norm2."), (r"^(blocks\.\d+)\.ffn\.layers\.0\.0\.", r"\1.mlp.fc1."),
        (r"^(blocks\.\d+)\.ffn\.layers\.1\.", r"\1.mlp.fc2."),
        (r"^head\.layers\.head\.", "head."), (r"^head\.layers\.pre_logits\.", "pre_logits.fc."),
    ])
    hints: dict[str, Hint] = {"eps": (1e-6, "family: mmpretrain VisionTransformer (norm_cfg LN eps=1e-6)"),
                              "mlp_kind": ("gelu", "family: mmpretrain VisionTransformer (act_cfg GELU)"),
                              "pos_interp": ("hf", "family: mmpretrain resize_pos_embed (bicubic, align_corners=False, no antialias)")}
    return Converted("mmpretrain", sd, hints)
