"""Positions: learned-table resampling (one recipe per family, checkpoint-formats.md §5), 2-D rotary embeddings
(RoPE) and BEiT's relative position bias.

Each recipe reproduces the original implementation's arithmetic, so a model run at another resolution matches
what its own code would compute. `rope_kernel` / `kernel_at` describe what RoPE does to attention for the position
panel of a model without a learned table.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

# the names of the recipes live with every other choice list
from vitviz.core.options import POS_RECIPES as RECIPES, REL_POS_RECIPES, ROPE_KINDS


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
    if recipe == "bucket":  # Idefics3 / SmolVLM: a lookup, not an interpolation
        return pos[:, bucket_ids(old, new).to(pos.device)]  # (1, nh*nw, D)
    dtype, d = pos.dtype, pos.shape[-1]
    grid = pos.float().reshape(1, old[0], old[1], d).permute(0, 3, 1, 2)  # (1, D, gh, gw)
    if recipe == "timm" or recipe == "dinov2_reg":
        out = F.interpolate(grid, size=new, mode="bicubic", antialias=True, align_corners=False)
    elif recipe == "bilinear_aa":  # transformers SigLIP 2 (NaFlex) resize_positional_embeddings
        out = F.interpolate(grid, size=new, mode="bilinear", antialias=True, align_corners=False)
    elif recipe == "bilinear":  # transformers DPT's own ViT (_resize_pos_embed): no antialias
        out = F.interpolate(grid, size=new, mode="bilinear", align_corners=False)
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


def bucket_ids(old: tuple[int, int], new: tuple[int, int]) -> torch.Tensor:
    """The rows of a square (n x n) position table that transformers' Idefics3 / SmolVLM vision embeddings give an
    (nh, nw) patch grid: each patch's fractional coordinate i / nh, bucketed into the table's n cells (their own
    float32 arithmetic, so that the rows are theirs exactly, also where it is not the identity): (nh*nw,) long."""
    n = int(old[1])
    boundaries = torch.arange(1 / n, 1.0, 1 / n)

    def axis(m: int) -> torch.Tensor:
        coords = torch.arange(m, dtype=torch.float32) * (1.0 / torch.tensor(m))
        return torch.bucketize(torch.clamp(coords, max=1.0 - 1e-6), boundaries, right=True)
    return (axis(int(new[0]))[:, None] * n + axis(int(new[1]))[None, :]).reshape(-1)  # (nh, nw) -> (nh*nw,)


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


def sincos_1d(length: int, dim: int, temperature: int = 10000) -> torch.Tensor:
    """The fixed 1-D sin-cos position embedding of the "Vision Transformers from scratch" tutorial
    (`get_positional_embeddings`), computed, not stored: (1, length, dim) float32, one row per token in sequence
    order (the class token first), sin(i / T^(j/dim)) at even columns j, cos(i / T^((j-1)/dim)) at odd ones.

    Computed in float64 and rounded once, as the original (NumPy's float64 sin/cos written into a float32 table).
    """
    i = torch.arange(length, dtype=torch.float64)[:, None]                 # (T, 1)
    j = torch.arange(dim, dtype=torch.float64)[None, :]                    # (1, D)
    even = (j - j.remainder(2)) / dim                                      # j/d at even j, (j-1)/d at odd j
    angle = i / (float(temperature) ** even)                               # (T, D)
    pe = torch.where(j.remainder(2) == 0, angle.sin(), angle.cos())
    return pe.to(torch.float32).unsqueeze(0)


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


# ------------------------------------------------------------------------------------------------ rotary (RoPE)
# ROPE_KINDS and ROPE_PRESETS (the settings of each `rope=` name) are in `vitviz.core.options`.


def rope_coords(kind: str, grid: tuple[int, int], xy: bool = False, offset: float = 0.0,
                ref_grid: tuple[int, int] = (0, 0)) -> torch.Tensor:
    """The 2-D coordinates RoPE rotates by, one row per patch in row-major order: (gh*gw, 2) float32.

    Channels are (row, column), or (column, row) with `xy` (timm `grid_indexing='xy'`). The arithmetic follows
    timm's `_build_grid` step by step, so the values are the same floats:
      'axial' / 'mixed': patch indices + `offset`, rescaled to span `ref_grid` when given (EVA `ref_feat_shape`);
      'dinov3': patch centres (i + 0.5 + offset) / size, mapped to [-1, 1] (each axis by its own size).
    """
    sizes = [int(grid[0]), int(grid[1])]
    refs = [int(ref_grid[0]), int(ref_grid[1])]
    if xy:
        sizes, refs = sizes[::-1], refs[::-1]
    if kind == "dinov3":
        t = [(torch.arange(0.5, s, dtype=torch.float32) + offset) / float(s) for s in sizes]
    elif kind in ("axial", "mixed"):
        t = [torch.arange(s, dtype=torch.int64).to(torch.float32) + offset for s in sizes]
        if refs[0] and refs[1]:
            t = [x / f * r for x, f, r in zip(t, sizes, refs)]
    else:
        raise ValueError(f"unknown RoPE kind {kind!r}; expected one of {ROPE_KINDS}")
    g = torch.stack(torch.meshgrid(t, indexing="xy" if xy else "ij"), dim=-1)  # (gh, gw, 2)
    if kind == "dinov3":
        g = 2.0 * g - 1.0
    return g.reshape(-1, 2)  # (gh, gw, 2) -> (N, 2)


def rope_bands(kind: str, head_dim: int, theta: float) -> torch.Tensor:
    """Per-axis frequencies (head_dim // 4,) float32: timm `freq_bands` (1 / theta^(i / n)) for 'axial', DINOv3's
    periods (theta^(2i / (head_dim / 2))) for 'dinov3'."""
    n = head_dim // 4
    if kind == "dinov3":
        exponents = 2.0 * torch.arange(n, dtype=torch.float32) / (head_dim // 2)
        return theta ** exponents  # periods
    exponents = torch.arange(0, n, 1, dtype=torch.int64).to(torch.float32) / n
    return 1.0 / (theta ** exponents)


def rope_angles(kind: str, coords: torch.Tensor, head_dim: int, theta: float = 10000.0,
                freqs: torch.Tensor | None = None, periods: torch.Tensor | None = None) -> torch.Tensor:
    """Rotation angle of every frequency pair at every patch.

    Args:
        coords: (N, 2) from `rope_coords`.
        freqs: 'mixed' only: the learned (2, L, H, head_dim/2) frequencies (timm `rope.freqs`).
        periods: 'dinov3' only: periods stored in the file (head_dim/4,), used instead of theta's.

    Returns:
        (N, head_dim/2) for 'axial' / 'dinov3' -- pair j turns by coordinate j // (head_dim/4) times band
        j % (head_dim/4) -- or (L, H, N, head_dim/2) for 'mixed' (both coordinates, per layer and head).
    """
    if kind == "mixed":
        if freqs is None:
            raise ValueError("mixed RoPE needs its learned frequencies")
        f = freqs.float()
        fx = coords[:, 0].unsqueeze(-1) * f[0].unsqueeze(-2)  # (L, H, N, hd/2)
        fy = coords[:, 1].unsqueeze(-1) * f[1].unsqueeze(-2)
        return fx + fy
    if kind == "dinov3":
        p = (periods if periods is not None else rope_bands(kind, head_dim, theta)).float().to(coords.device)
        angles = 2 * math.pi * coords[:, :, None] / p[None, None, :]  # (N, 2, hd/4)
    else:
        angles = coords[:, :, None] * rope_bands(kind, head_dim, theta).to(coords.device)  # (N, 2, hd/4)
    return angles.flatten(1)  # (N, 2, hd/4) -> (N, hd/2)


def rope_sincos(angles: torch.Tensor, half: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(sin, cos), each (..., head_dim), in the layout the rotation reads: [a0, a1, .., a0, a1, ..] with `half`,
    else interleaved [a0, a0, a1, a1, ..] (timm `_rope_layout`)."""
    sin, cos = angles.sin(), angles.cos()
    if half:
        return torch.cat([sin, sin], dim=-1), torch.cat([cos, cos], dim=-1)
    return sin.repeat_interleave(2, -1), cos.repeat_interleave(2, -1)


def rotate(x: torch.Tensor, sin: torch.Tensor, cos: torch.Tensor, half: bool) -> torch.Tensor:
    """Apply the rotation to x (..., head_dim): x * cos + rot(x) * sin, rot pairing (i, i + hd/2) with `half`,
    else (2i, 2i + 1) -- timm `apply_rot_embed`, result in x's dtype."""
    if half:
        x1, x2 = x.chunk(2, dim=-1)
        turned = torch.cat([-x2, x1], dim=-1)
    else:
        turned = torch.stack([-x[..., 1::2], x[..., ::2]], -1).reshape(x.shape)
    return (x * cos + turned * sin).to(dtype=x.dtype)


def rope_kernel(model: Any, grid: tuple[int, int] | None = None, head: int | None = None,
                layer: int = 0) -> np.ndarray:
    """What RoPE alone does to attention: the q·k rotation kernel as a function of the 2-D offset between patches.

    For a query at patch p and a key at patch p + (dy, dx) with the same content vector, RoPE turns their score by
    the mean over frequency pairs of cos(angle(p + d) - angle(p)). For axial and DINOv3 RoPE that depends only on
    the offset d (the angles are linear in the position), so one (2gh - 1, 2gw - 1) map describes every patch: the
    centre entry (gh - 1, gw - 1) is offset (0, 0) and is 1; the map of a hovered patch (r, c) is
    `kernel_at(kernel, grid, (r, c))`. RoPE-Mixed (learned frequencies) has one kernel per layer and head.

    Args:
        model: a loaded `VitModel` (or its `ReferenceViT`) with `spec.rope`.
        grid: the patch grid (default: the model's native one); DINOv3's coordinates scale with the grid.
        head: a head index (only 'mixed' differs per head), or None for the mean over heads.
        layer: the layer ('mixed' only).

    Returns:
        (2gh - 1, 2gw - 1) float32 in [-1, 1]; row index dy + gh - 1, column index dx + gw - 1.
    """
    net = getattr(model, "net", model)
    spec = net.spec
    if not spec.rope:
        raise ValueError(f"{spec.source}: the model has no rotary position embedding (RoPE)")
    gh, gw = grid or spec.grid
    dy = torch.arange(-(gh - 1), gh, dtype=torch.float32)
    dx = torch.arange(-(gw - 1), gw, dtype=torch.float32)
    oy, ox = torch.meshgrid(dy, dx, indexing="ij")  # offsets in patches, (2gh-1, 2gw-1)
    # coordinate change per patch step, per axis (row, column), as rope_coords scales them
    step = torch.ones(2)
    if spec.rope == "dinov3":
        step = torch.tensor([2.0 / gh, 2.0 / gw])
    elif spec.rope_ref_grid[0] and spec.rope_ref_grid[1]:
        step = torch.tensor([spec.rope_ref_grid[0] / gh, spec.rope_ref_grid[1] / gw])
    d_row, d_col = oy.flatten() * step[0], ox.flatten() * step[1]
    delta = torch.stack([d_col, d_row] if spec.rope_xy else [d_row, d_col], dim=-1)  # (M, 2) in channel order
    with torch.no_grad():
        rope = getattr(net, "rope", None)
        freqs = getattr(rope, "freqs", None)
        periods = getattr(rope, "periods", None)
        freqs = freqs[:, layer].unsqueeze(1).detach().cpu() if freqs is not None else None  # (2, 1, H, hd/2)
        angles = rope_angles(spec.rope, delta, spec.head_dim, spec.rope_theta, freqs,
                             periods.detach().cpu() if periods is not None else None)
        k = angles.double().cos().mean(dim=-1)  # (M,) or (1, H, M)
        if k.ndim == 3:
            k = k[0, head] if head is not None else k[0].mean(dim=0)
    return k.reshape(2 * gh - 1, 2 * gw - 1).float().numpy()


def rope_kernels(model: Any, grid: tuple[int, int]) -> np.ndarray | None:
    """Every RoPE kernel of `model` at `grid` (`rope_kernel`), (L', H', 2gh - 1, 2gw - 1) float32: L' = H' = 1 for
    axial and DINOv3 RoPE (every layer and head rotates alike), one per layer and head for RoPE-Mixed (learned
    frequencies); None for a model without RoPE (a windowed spec has no such field)."""
    spec = model.spec
    if not getattr(spec, "rope", ""):
        return None
    if spec.rope != "mixed":
        return rope_kernel(model, grid)[None, None]
    return np.stack([np.stack([rope_kernel(model, grid, head=h, layer=layer) for h in range(spec.num_heads)])
                     for layer in range(spec.depth)]).astype(np.float32)


def kernel_at(kernel: np.ndarray, grid: tuple[int, int], patch: tuple[int, int]) -> np.ndarray:
    """The (gh, gw) map of a (2gh - 1, 2gw - 1) offset kernel seen from patch (r, c): entry (i, j) is
    kernel[i - r + gh - 1, j - c + gw - 1]."""
    gh, gw = grid
    r, c = patch
    if not (0 <= r < gh and 0 <= c < gw):
        raise ValueError(f"patch {patch} outside the {gh}x{gw} grid")
    return np.ascontiguousarray(kernel[gh - 1 - r: 2 * gh - 1 - r, gw - 1 - c: 2 * gw - 1 - c])


# ---------------------------------------------------------------------------------- relative position bias (BEiT)


def rel_pos_index(grid: tuple[int, int]) -> torch.Tensor:
    """BEiT's relative position index for one CLS token plus a (gh, gw) grid: (N + 1, N + 1) long into a table of
    (2gh - 1)(2gw - 1) + 3 rows, the last three being cls->token, token->cls and cls->cls (timm
    `gen_relative_position_index`)."""
    gh, gw = grid
    num_relative = (2 * gh - 1) * (2 * gw - 1) + 3
    coords = torch.stack(torch.meshgrid(torch.arange(gh), torch.arange(gw), indexing="ij")).flatten(1)  # (2, N)
    rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0).contiguous()  # (N, N, 2)
    rel[:, :, 0] += gh - 1
    rel[:, :, 1] += gw - 1
    rel[:, :, 0] *= 2 * gw - 1
    index = torch.zeros((gh * gw + 1,) * 2, dtype=rel.dtype)
    index[1:, 1:] = rel.sum(-1)
    index[0, 0:] = num_relative - 3
    index[0:, 0] = num_relative - 2
    index[0, 0] = num_relative - 1
    return index


def rel_log_coords(grid: tuple[int, int]) -> torch.Tensor:
    """timm `RelPosMlp`'s log-spaced relative coordinates ('cr' mode, `gen_relative_log_coords`) for a (gh, gw)
    grid: (2gh - 1, 2gw - 1, 2) float32, sign(d) * log(1 + |d|) of every (row, column) offset d."""
    gh, gw = int(grid[0]), int(grid[1])
    h = torch.arange(-(gh - 1), gh).to(torch.float32)
    w = torch.arange(-(gw - 1), gw).to(torch.float32)
    table = torch.stack(torch.meshgrid(h, w, indexing="ij")).permute(1, 2, 0).contiguous()  # (2gh-1, 2gw-1, 2)
    return torch.sign(table) * torch.log(1.0 + table.abs())


def resize_rel_pos_table(table: torch.Tensor, old: tuple[int, int], new: tuple[int, int],
                         recipe: str) -> torch.Tensor:
    """A BEiT relative position bias table ((2gh-1)(2gw-1) + 3, H) for another grid, as the family resizes it.

    'timm': timm `resize_rel_pos_bias_table` without scipy (unilm's geometric-progression source positions,
    linear interpolation per head); 'hf': transformers `BeitRelativePositionBias` (bilinear,
    align_corners=False). The three CLS entries are kept.
    """
    if tuple(old) == tuple(new):
        return table
    if recipe not in REL_POS_RECIPES:
        raise ValueError(f"unknown relative-position recipe {recipe!r}; expected one of {REL_POS_RECIPES}")
    src = (2 * old[0] - 1, 2 * old[1] - 1)
    dst = (2 * new[0] - 1, 2 * new[1] - 1)
    extra, body = table[-3:], table[:-3]
    heads = table.shape[1]
    if recipe == "hf":
        sub = body.reshape(1, src[1], src[0], -1).permute(0, 3, 1, 2)  # as transformers reshapes it
        sub = F.interpolate(sub, size=(dst[0], dst[1]), mode="bilinear")
        return torch.cat([sub.permute(0, 2, 3, 1).reshape(dst[0] * dst[1], -1), extra])
    yx = [torch.tensor(_geometric_positions(src[0], dst[0])), torch.tensor(_geometric_positions(src[1], dst[1]))]
    ty, tx = dst[0] // 2.0, dst[1] // 2.0
    dyx = tuple(t.contiguous() for t in torch.meshgrid(torch.arange(-ty, ty + 0.1, 1.0),
                                                       torch.arange(-tx, tx + 0.1, 1.0), indexing="ij"))
    cols = []
    for h in range(heads):
        z = body[:, h].view(src[0], src[1]).float().cpu()
        cols.append(_grid_interp(yx, z, dyx).contiguous().view(-1, 1))
    return torch.cat([torch.cat(cols, dim=-1).to(table.device, table.dtype), extra])


def _geometric_positions(src: int, dst: int) -> list[float]:
    """unilm BEiT's source positions: offsets spaced by a geometric progression that spans the target size."""
    def progression(a: float, r: float, n: int) -> float:
        return a * (1.0 - r ** n) / (1.0 - r)

    left, right = 1.01, 1.5
    while right - left > 1e-6:
        q = (left + right) / 2.0
        if progression(1, q, src // 2) > dst // 2:
            right = q
        else:
            left = q
    dis, cur = [], 1.0
    for i in range(src // 2):
        dis.append(cur)
        cur += q ** (i + 1)
    return [-d for d in reversed(dis)] + [0] + dis


def _grid_interp(points: list[torch.Tensor], values: torch.Tensor, at: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """Linear interpolation on an uneven 2-D grid, the arithmetic of timm's `RegularGridInterpolator`."""
    idxs, dists, overall = [], [], []
    for p, x in zip(points, at):
        right = torch.bucketize(x, p)
        right[right >= p.shape[0]] = p.shape[0] - 1
        left = (right - 1).clamp(0, p.shape[0] - 1)
        d_left, d_right = x - p[left], p[right] - x
        d_left[d_left < 0] = 0.
        d_right[d_right < 0] = 0.
        both = (d_left == 0) & (d_right == 0)
        d_left[both] = d_right[both] = 1.
        idxs.append((left, right))
        dists.append((d_left, d_right))
        overall.append(d_left + d_right)
    num: Any = 0.
    for a in (0, 1):
        for b in (0, 1):
            num = num + values[idxs[0][a], idxs[1][b]] * torch.prod(torch.stack([dists[0][1 - a], dists[1][1 - b]]),
                                                                   dim=0)
    return num / torch.prod(torch.stack(overall), dim=0)
