"""Position-embedding resampling, one recipe per family (checkpoint-formats.md §5).

Each recipe reproduces the original implementation's interpolation exactly, so a model run at another
resolution matches what its own code would compute.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

RECIPES = ("timm", "torchvision", "hf", "dino", "dinov2", "dinov2_reg", "deit")


def resample_grid(
    pos: torch.Tensor, old: tuple[int, int], new: tuple[int, int], recipe: str
) -> torch.Tensor:
    """Resample the grid part of a position embedding.

    Args:
        pos: (1, gh*gw, D) position embedding of the patch tokens only, row-major.
        old: stored grid (gh, gw).
        new: target grid (nh, nw).
        recipe: one of RECIPES.

    Returns:
        (1, nh*nw, D) in pos's dtype.
    """
    if tuple(old) == tuple(new):
        return pos
    if recipe not in RECIPES:
        raise ValueError(f"unknown position-embedding recipe {recipe!r}; expected one of {RECIPES}")
    dtype, d = pos.dtype, pos.shape[-1]
    grid = pos.float().reshape(1, old[0], old[1], d).permute(0, 3, 1, 2)  # (1, D, gh, gw)
    if recipe == "timm" or recipe == "dinov2_reg":
        out = F.interpolate(grid, size=new, mode="bicubic", antialias=True, align_corners=False)
    elif recipe == "torchvision":
        out = F.interpolate(grid, size=new, mode="bicubic", align_corners=True)
    elif recipe in ("hf", "deit"):
        out = F.interpolate(grid, size=new, mode="bicubic", align_corners=False)
    else:  # 'dino' and 'dinov2': scale factor with the +0.1 offset, no antialias
        n = math.sqrt(old[0] * old[1])
        sh, sw = (new[0] + 0.1) / n, (new[1] + 0.1) / n
        out = F.interpolate(grid, scale_factor=(sh, sw), mode="bicubic", align_corners=False)
        if tuple(out.shape[-2:]) != tuple(new):
            raise ValueError(f"DINO interpolation produced grid {tuple(out.shape[-2:])}, expected {new}")
    return out.permute(0, 2, 3, 1).reshape(1, new[0] * new[1], d).to(dtype)  # (1, D, nh, nw) -> (1, N, D)


def resample_pos_embed(
    pos: torch.Tensor, num_prefix: int, old: tuple[int, int], new: tuple[int, int], recipe: str
) -> torch.Tensor:
    """Resample a full position embedding whose first `num_prefix` rows belong to prefix tokens.

    Args:
        pos: (1, num_prefix + gh*gw, D).

    Returns:
        (1, num_prefix + nh*nw, D); the prefix rows are kept as they are.
    """
    prefix, grid = pos[:, :num_prefix], pos[:, num_prefix:]
    return torch.cat([prefix, resample_grid(grid, old, new, recipe)], dim=1)


def sincos_2d(grid: tuple[int, int], dim: int, temperature: int = 10000) -> torch.Tensor:
    """The fixed 2-D sin-cos position embedding of vit-pytorch's SimpleViT (`posemb_sincos_2d`), computed, not
    stored: (1, gh*gw, dim) float32, rows in row-major patch order, columns [sin x, cos x, sin y, cos y].

    The arithmetic follows the original step by step, so the values are bit-identical to it.
    """
    if dim % 4:
        raise ValueError(f"sin-cos position embedding needs a width divisible by 4, got {dim}")
    y, x = torch.meshgrid(torch.arange(grid[0]), torch.arange(grid[1]), indexing="ij")
    omega = torch.arange(dim // 4) / (dim // 4 - 1)
    omega = 1.0 / (temperature ** omega)
    y = y.flatten()[:, None] * omega[None, :]  # (N, dim/4)
    x = x.flatten()[:, None] * omega[None, :]
    pe = torch.cat((x.sin(), x.cos(), y.sin(), y.cos()), dim=1)  # (N, dim)
    return pe.to(torch.float32).unsqueeze(0)
