"""Tiny checkpoints for tests: timm-layout state dicts with random weights, written without timm."""
from __future__ import annotations

from pathlib import Path

import torch

HEADS = 2   # the head count tests load the tiny checkpoints with


def tiny_state_dict(
    *, embed_dim: int = 32, depth: int = 2, patch: int = 8, grid: tuple[int, int] = (4, 4),
    num_classes: int = 5, reg_tokens: int = 0, class_token: bool = True, in_chans: int = 3,
    seed: int = 0,
) -> dict[str, torch.Tensor]:
    """A timm `VisionTransformer` state dict (mlp ratio 2) with random, non-trivial weights."""
    g = torch.Generator().manual_seed(seed)
    d, f = embed_dim, 2 * embed_dim

    def r(*shape: int, std: float = 0.2) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * std

    prefix = int(class_token) + reg_tokens
    sd: dict[str, torch.Tensor] = {
        "patch_embed.proj.weight": r(d, in_chans, patch, patch), "patch_embed.proj.bias": r(d),
        "pos_embed": r(1, prefix + grid[0] * grid[1], d),
    }
    if class_token:
        sd["cls_token"] = r(1, 1, d)
    if reg_tokens:
        sd["reg_token"] = r(1, reg_tokens, d)
    for i in range(depth):
        b = f"blocks.{i}."
        sd.update({
            b + "norm1.weight": 1 + r(d), b + "norm1.bias": r(d),
            b + "attn.qkv.weight": r(3 * d, d), b + "attn.qkv.bias": r(3 * d),
            b + "attn.proj.weight": r(d, d), b + "attn.proj.bias": r(d),
            b + "norm2.weight": 1 + r(d), b + "norm2.bias": r(d),
            b + "mlp.fc1.weight": r(f, d), b + "mlp.fc1.bias": r(f),
            b + "mlp.fc2.weight": r(d, f), b + "mlp.fc2.bias": r(d),
        })
    if class_token:
        sd["norm.weight"], sd["norm.bias"] = 1 + r(d), r(d)
    else:
        sd["fc_norm.weight"], sd["fc_norm.bias"] = 1 + r(d), r(d)
    if num_classes:
        sd["head.weight"], sd["head.bias"] = r(num_classes, d), r(num_classes)
    return sd


def write_tiny_checkpoint(path: Path, **kwargs) -> Path:
    """Write `tiny_state_dict(**kwargs)` as .pth or .safetensors (by suffix) and return the path.

    The file holds no head count (a bare state dict of width 32 says nothing about heads), so `vitviz.load` would
    guess and warn; tests load it with `heads=HEADS` (2 heads of 16 dims).
    """
    path = Path(path)
    sd = tiny_state_dict(**kwargs)
    if path.suffix == ".safetensors":
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in sd.items()}, str(path))
    else:
        torch.save(sd, path)
    return path


def write_permuted_heads(folder: Path, perm: list[int]) -> tuple[Path, Path]:
    """a.pth, the tiny ViT, and b.pth, the same model with its heads permuted in every block (q, k, v rows and the
    proj columns): B's head h is A's head perm[h] (len(perm) heads of the 32-wide model)."""
    heads, d = len(perm), 32
    hd = d // heads
    sd = tiny_state_dict(embed_dim=d)
    a = Path(folder) / "a.pth"
    torch.save(sd, a)
    rows = torch.cat([torch.arange(p * hd, (p + 1) * hd) for p in perm])
    qkv = torch.cat([rows + k * d for k in range(3)])
    for i in range(2):
        b = f"blocks.{i}.attn."
        sd[b + "qkv.weight"], sd[b + "qkv.bias"] = sd[b + "qkv.weight"][qkv], sd[b + "qkv.bias"][qkv]
        sd[b + "proj.weight"] = sd[b + "proj.weight"][:, rows]
    torch.save(sd, Path(folder) / "b.pth")
    return a, Path(folder) / "b.pth"
