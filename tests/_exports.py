"""Inputs for export tests: a tiny timm ViT saved as a hub folder (random weights) and random PNG images."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image


def timm_folder_and_images(tmp_path: Path, count: int, *, img_size: int, depth: int, heads: int,
                           image_px: int) -> tuple[Path, list[Path]]:
    """`tmp_path / "m"`: timm's `vit_small_patch16_224` at `img_size` px, patch 8, width 32, `depth` blocks of
    `heads` heads, 3 classes, saved by timm with its model_args; `count` random `image_px`-square PNGs beside it."""
    import timm

    torch.manual_seed(0)
    args = dict(img_size=img_size, patch_size=8, embed_dim=32, depth=depth, num_heads=heads)
    model = timm.create_model("vit_small_patch16_224", pretrained=False, num_classes=3, **args)
    timm.models._hub.save_for_hf(model, str(tmp_path / "m"), model_args=args, safe_serialization=True)
    rng = np.random.default_rng(0)
    paths = [tmp_path / f"{i:02d}.png" for i in range(count)]
    for path in paths:
        Image.fromarray(rng.integers(0, 255, (image_px, image_px, 3), dtype=np.uint8)).save(path)
    return tmp_path / "m", paths
