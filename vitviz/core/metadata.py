"""Hyper-parameters that no tensor shape holds: num_heads tables, model-name parsing, torchvision weights.

Order of trust (DESIGN.md): metadata (config files, training `args`, file names) first, then shapes, then the
embed-dim table; the caller can override anything.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

# embed_dim -> num_heads for the registered timm / DINO / torchvision ViTs (checkpoint-formats.md §6).
HEADS_BY_DIM = {192: 3, 256: 4, 320: 5, 384: 6, 512: 8, 640: 10, 768: 12, 832: 13, 896: 14, 1024: 16,
                1152: 16, 1280: 16, 1408: 16, 1664: 16, 2048: 16, 3072: 24}
SIZE_WORD_HEADS = {"tiny": 3, "small": 6, "medium": 8, "base": 12, "large": 16, "huge": 16, "giant": 16,
                   "gigantic": 16, "s": 6, "b": 12, "l": 16, "h": 16, "g": 24, "g2": 24}


def heads_from_dim(dim: int) -> tuple[int, str]:
    """num_heads for an embedding width: the table, else head_dim 64, else the largest sensible split."""
    if dim in HEADS_BY_DIM:
        return HEADS_BY_DIM[dim], f"table: embed_dim {dim}"
    if dim % 64 == 0:
        return dim // 64, f"guess: embed_dim {dim} / head_dim 64"
    for hd in (32, 16, 8):
        if dim % hd == 0:
            return dim // hd, f"guess: embed_dim {dim} / head_dim {hd}"
    return 1, f"guess: embed_dim {dim} has no usual head split"


@dataclass(frozen=True)
class NameInfo:
    heads: int | None = None
    patch: int | None = None
    image: int | None = None


def parse_model_name(name: str) -> NameInfo:
    """Read heads, patch and image size from names like 'vit_base_patch16_384', 'deit_small_distilled_patch16_224',
    'dinov2_vitl14_reg', 'vit_small' (DINO `args.arch`) or torchvision 'vit_b_16'."""
    n = name.lower().split("/")[-1].split(".")[0]
    heads = patch = image = None
    if "_gap_" in n and "base" in n:
        heads = 16
    m = re.search(r"(tiny|small|medium|base|large|huge|giant|gigantic)", n)
    if m and heads is None:
        heads = SIZE_WORD_HEADS[m.group(1)]
    m2 = re.search(r"(?:dinov2_)?vit([sblg]2?)(\d+)", n)
    if m2 and heads is None:
        heads = SIZE_WORD_HEADS[m2.group(1)]
        patch = int(m2.group(2))
    m3 = re.match(r"vit_([blh])_(\d+)", n)
    if m3 and heads is None:
        heads, patch = SIZE_WORD_HEADS[m3.group(1)], int(m3.group(2))
    if (mp := re.search(r"patch(\d+)", n)):
        patch = int(mp.group(1))
    if (mi := re.search(r"patch\d+_(\d{2,4})", n)):
        image = int(mi.group(1))
    return NameInfo(heads, patch, image)


def torchvision_weights(file_name: str) -> dict[str, Any] | None:
    """Identify a torch-hub file name (e.g. 'vit_b_16-c867db91.pth') with torchvision's Weights enum, offline.

    Returns:
        {'arch', 'weights', 'categories', 'image_size', 'resize', 'crop', 'interpolation', 'mean', 'std',
        'num_params'} or None when the name is not a torchvision ViT file.
    """
    from torchvision.models import vision_transformer as tv

    base = file_name.split("/")[-1]
    for enum in (tv.ViT_B_16_Weights, tv.ViT_B_32_Weights, tv.ViT_L_16_Weights, tv.ViT_L_32_Weights,
                 tv.ViT_H_14_Weights):
        for w in enum:
            if w.url.split("/")[-1] == base:
                t = w.transforms()
                return {
                    "arch": enum.__name__.replace("_Weights", "").lower(), "weights": f"{enum.__name__}.{w.name}",
                    "categories": tuple(w.meta["categories"]), "image_size": int(w.meta["min_size"][0]),
                    "resize": int(t.resize_size[0]), "crop": int(t.crop_size[0]),
                    "interpolation": t.interpolation.value, "mean": tuple(t.mean), "std": tuple(t.std),
                    "num_params": int(w.meta["num_params"]),
                }
    return None


def args_info(meta: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The model name and useful fields from a training checkpoint's `arch`/`args`."""
    args = meta.get("args") or {}
    if not isinstance(args, dict):
        args = {}
    name = str(meta.get("arch") or args.get("model") or args.get("arch") or "")
    fields = {}
    for key in ("img_size", "input_size"):
        v = args.get(key)
        if isinstance(v, int):
            fields["image_size"] = v
        elif isinstance(v, (list, tuple)) and v:
            fields["image_size"] = int(v[-1])
    if isinstance(args.get("patch_size"), int):
        fields["patch_size"] = args["patch_size"]
    return name, fields
