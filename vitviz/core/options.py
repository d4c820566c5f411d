"""The names of every choice vitviz offers, in one place: activations, poolings, norm orders, crop modes,
resampling filters, position-embedding recipes, RoPE presets, patch orders.

The reference model (`vitviz.core.model`), the position code (`vitviz.core.posembed`), the loader's checks
(`vitviz.core.hyperparams`, `vitviz.core.validate`), the command line (`vitviz.cli.options`) and the window's
Model settings read their lists here instead of keeping copies. Stdlib only (no torch, numpy or Qt), so the
command line and the window can import it before anything heavy; it imports no other vitviz module.
"""
from __future__ import annotations

# MLP activations a user may name (`act=`, `head_act=`); `vitviz.core.model.make_act` builds each.
ACTIVATIONS = ("gelu", "gelu_tanh", "quick_gelu", "relu", "silu", "tanh")
# `ModelSpec.mlp_kind`: an activation, or a gated MLP read off its shapes (not a choice of activation).
MLP_KINDS = ACTIVATIONS + ("swiglu",)
# `ModelSpec.block_norm`: where each block's LayerNorms sit (see `vitviz.core.model.Block`).
BLOCK_NORMS = ("pre", "post", "res_post")
# Poolings whose head reads one D-wide vector (the class token, the mean of the patches, of every token): what a
# user may ask for on the command line, and what LeGrad can apply to a mean-pooled layer.
ONE_VECTOR_POOLINGS = ("token", "avg", "avg_all")
LEGRAD_POOLINGS = ONE_VECTOR_POOLINGS
# `ModelSpec.pooling`: also the class token beside the patch mean (DINOv2's linear head), and a MAP head.
POOLINGS = ONE_VECTOR_POOLINGS + ("cls_avg", "map")
# How the image is brought to the model's input size (`Preprocess.mode`), with the words the window shows.
CROP_MODE_LABELS = {"center": "resize, centre crop", "squash": "squash to size", "squash_crop": "squash, centre crop"}
CROP_MODES = tuple(CROP_MODE_LABELS)
# Resampling filters (Pillow's names; `vitviz.core.images.INTERPOLATIONS` maps them to Pillow's constants).
INTERPOLATIONS = ("nearest", "bilinear", "bicubic", "lanczos", "box", "hamming")
# How a learned position table is resampled at another input size (`vitviz.core.posembed.resample_grid`).
POS_RECIPES = ("timm", "torchvision", "hf", "dino", "dinov2", "dinov2_reg", "deit", "bilinear_aa")
# How a relative position bias table is resampled (`vitviz.core.posembed.resize_rel_pos_table`).
REL_POS_RECIPES = ("timm", "hf")
# `ModelSpec.rope`: the RoPE coordinate kinds (`vitviz.core.posembed.rope_coords`).
ROPE_KINDS = ("axial", "dinov3", "mixed")
# The RoPE settings of the model families that use it (timm eva.py), by the name a user passes as `rope=`.
# rope_ref_grid (-1, -1): the model's native grid.
ROPE_PRESETS: dict[str, dict[str, object]] = {
    "dinov3": dict(rope="dinov3", rope_theta=100.0, rope_half=True),
    "eva02": dict(rope="axial", rope_theta=10000.0, rope_ref_grid=(16, 16)),
    "pe": dict(rope="axial", rope_theta=10000.0, rope_xy=True, rope_offset=1.0, rope_ref_grid=(-1, -1)),
    "rope_vit": dict(rope="axial", rope_theta=100.0, rope_xy=True),        # Naver RoPE-ViT, axial
    "rope_mixed": dict(rope="mixed", rope_theta=10.0, rope_xy=True),       # Naver RoPE-ViT, learned frequencies
    "timm_rope": dict(rope="axial", rope_theta=10000.0, rope_ref_grid=(16, 16)),  # timm vit_*_rope_reg*_gap_256
    "none": dict(rope=""),
}
ROPE_PRESET_NAMES = tuple(ROPE_PRESETS)
# Pixel order of a Linear patch embedding: einops '(p1 p2 c)' or unfold '(c p1 p2)'.
PATCH_ORDERS = ("p1p2c", "cp1p2")


def alternatives(choices: tuple[str, ...] | list[str], quote: bool = True) -> str:
    """"'a'|'b'|'c'" (quoted, as a Python argument is written) or 'a|b|c' (as a command-line value)."""
    return "|".join(f"'{c}'" if quote else c for c in choices)
