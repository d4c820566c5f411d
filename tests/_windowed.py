"""Tiny windowed reference models for the tests (random weights): a 2-stage Swin and a 3-block SAM encoder."""
from __future__ import annotations

import warnings
from pathlib import Path

import torch

from parity_refs import perturb
from vitviz.core.running.windowed import WindowedModel, WindowedNet
from vitviz.core.winspec import WindowedSpec


def swin_spec(order: str = "pad_roll", rule: str = "fits", size: tuple[int, int] = (64, 64)) -> WindowedSpec:
    """2 stages (16 x 16 then 8 x 8 cells of 4 and 8 px), 4 x 4 windows, every second block shifted by 2."""
    return WindowedSpec(family="test", source="test", arch="swin", image_size=size, patch_size=4, in_chans=3,
                        depths=(2, 2), heads=(1, 2), dims=(16, 32), mlp_hidden=(32, 64), windows=((4, 4),) * 4,
                        shifts=((0, 0), (2, 2)) * 2, pretrained_windows=((0, 0),) * 2, order=order, shift_rule=rule,
                        num_classes=3)


def sam_spec() -> WindowedSpec:
    """Windowed, global, windowed blocks with SAM's decomposed relative position bias, on a 6 x 7 grid."""
    return WindowedSpec(family="test", source="test", arch="sam", image_size=(48, 56), patch_size=8, in_chans=3,
                        depths=(3,), heads=(2,), dims=(16,), mlp_hidden=(32,), windows=((4, 4), (0, 0), (4, 4)),
                        shifts=((0, 0),) * 3, rel_pos="decomposed", block_norm="pre", patch_norm=False,
                        final_norm=False, pos_embed=True, pos_grid=(6, 7), neck="norm")


def save_tiny_timm_swin(folder: Path) -> Path:
    """A tiny timm Swin v1 hub folder at `folder` (64 px, 4x4 windows, 2 stages, random weights, seed 0)."""
    import timm
    from timm.models import save_for_hf

    kw = dict(img_size=64, embed_dim=16, depths=(1, 1), num_heads=(1, 2), window_size=4, num_classes=5)
    torch.manual_seed(0)
    model = timm.create_model("swin_tiny_patch4_window7_224", pretrained=False, **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        save_for_hf(model, str(folder), safe_serialization=True, model_args=kw)
    return folder


def model_of(spec: WindowedSpec) -> WindowedModel:
    torch.manual_seed(0)
    return WindowedModel(perturb(WindowedNet(spec), std=0.3), spec, torch.device("cpu"), [])


def x_for(size: tuple[int, int]) -> torch.Tensor:
    return torch.randn(1, 3, *size, generator=torch.Generator().manual_seed(1))
