"""The reference windowed model (Swin v1 / v2, SAM / ViTDet image encoders) and its attention capture.

    model = vitviz.load("swin_t-704ceda3.pth")     # -> WindowedModel (built by vitviz.core.running.winload)
    result = model.run("cat.jpg")                  # -> WindowedResult: per block (windows, heads, n, n)

Written out in full, like `vitviz.core.running.model.ReferenceViT`: every block's attention is explicit,
`softmax((q * scale) @ k^T + bias [+ shift mask])` (Swin v2: `softmax(tau * cos(q, k) + bias [+ mask])`) in
float32, and passes through a `WindowProbe` right after the softmax. The relative position bias is computed here
too: Swin v1's table gathered by relative offset, Swin v2's continuous bias (an MLP over log-spaced offsets,
16 * sigmoid), SAM's decomposed bias (from q, per axis, the table resampled linearly at another grid); ViTDet's
optional convolutional bottleneck after a block (`ResBottleneck`, `WindowedSpec.residual_blocks`). Windows are
cut, shifted, padded and masked as the original does (`WindowedSpec.order` / `shift_rule`; the geometry of every
block is `WindowedSpec.geometry`, shared with the maps, so they place each window token where the model took it).
Where no gradient is needed the logits are built in place (bias, SAM's decomposed bias a slice at a time, the shift
mask, and on the CPU the softmax), so each block makes one (B', H, n, n) buffer, the one the capture keeps, with
bitwise the values of the out-of-place sums (tests/core/running/test_windowed_capture.py); at SAM's 1024 px, 4
global blocks of 12 x 4096^2, that is what keeps the capture within the original's own time.

Key names follow timm (`patch_embed.proj`, `layers.S.downsample`, `layers.S.blocks.B.attn.qkv`, `blocks.N.attn.
rel_pos_h`, `neck.N`, `head.fc`); the readers in `vitviz.core.reading.families.swin` / `sam` convert every layout to them.
"""
from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from vitviz.core.summary import model_summary
from vitviz.core.running.model import make_act
from vitviz.core.posembed import resample_grid
from vitviz.core.running.runtime import SMALLER, HostCopy, check_host_memory, move_module
from vitviz.core.spec import split_output, whole_patches
from vitviz.core.winspec import BlockGeometry, WindowedResult, WindowedSpec
from vitviz.core.protocol import WINDOWS
from vitviz.errors import DeviceError, NonFiniteError, VitvizError

CPB_HIDDEN = 512   # Swin v2's continuous-bias MLP width (every implementation)
CHUNK = 1 << 24    # elements of SAM's decomposed bias made at once (64 MB of float32)


class WindowProbe(nn.Identity):
    """Identity right after a block's softmax, (batch x windows, heads, n, n): the capture's hook point."""


def relative_index(window: tuple[int, int]) -> torch.Tensor:
    """(n, n) index into a ((2wh - 1) * (2ww - 1)) table of the offset between every two tokens of a window."""
    wh, ww = window
    coords = torch.stack(torch.meshgrid(torch.arange(wh), torch.arange(ww), indexing="ij")).flatten(1)  # (2, n)
    rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0)                       # (n, n, 2)
    return (rel[..., 0] + wh - 1) * (2 * ww - 1) + (rel[..., 1] + ww - 1)


def log_coords(window: tuple[int, int], pretrained: tuple[int, int]) -> torch.Tensor:
    """Swin v2's (1, 2wh - 1, 2ww - 1, 2) log-spaced relative coordinates: offsets divided by the pretrained
    window (or the window) minus one, times 8, then sign(x) * log2(|x| + 1) / 3."""
    wh, ww = window
    ch = torch.arange(-(wh - 1), wh, dtype=torch.float32)
    cw = torch.arange(-(ww - 1), ww, dtype=torch.float32)
    table = torch.stack(torch.meshgrid(ch, cw, indexing="ij")).permute(1, 2, 0).contiguous().unsqueeze(0)
    ph, pw = pretrained if pretrained[0] > 0 else window
    table[..., 0] /= max(ph - 1, 1)
    table[..., 1] /= max(pw - 1, 1)
    table *= 8
    return torch.sign(table) * torch.log2(torch.abs(table) + 1.0) / math.log2(8)


def rel_pos_along(size: int, rel_pos: torch.Tensor) -> torch.Tensor:
    """SAM's (size, size, hd) relative embeddings of one axis: the (L, hd) table resampled linearly to
    2 * size - 1 rows when it has another length (a global block at another grid), then gathered by offset."""
    length = 2 * size - 1
    if rel_pos.shape[0] != length:
        rel_pos = F.interpolate(rel_pos.reshape(1, rel_pos.shape[0], -1).permute(0, 2, 1), size=length,
                                mode="linear").reshape(-1, length).permute(1, 0)
    coords = torch.arange(size, dtype=torch.float32)
    index = coords[:, None] - coords[None, :] + (size - 1)
    return rel_pos[index.long()]


def shift_mask(geom: BlockGeometry, value: float, device: torch.device) -> torch.Tensor | None:
    """(windows, n, n) additive mask of a shifted block: `value` between tokens of different regions of a
    window (the cyclic shift brought them together), 0 within a region; None without a shift."""
    if not geom.shifted:
        return None
    regions = torch.as_tensor(geom.regions(), dtype=torch.float32, device=device)      # (nW, n)
    diff = regions.unsqueeze(1) - regions.unsqueeze(2)                                  # (nW, n, n)
    return diff.masked_fill(diff != 0, float(value)).masked_fill(diff == 0, 0.0)


class WindowAttention(nn.Module):
    """Multi-head attention inside windows, with the relative position bias of its architecture.

    Args:
        window: the window it was built for (sizes Swin's bias table); rel_len: SAM's (rows of rel_pos_h,
            rows of rel_pos_w).
    """

    def __init__(self, spec: WindowedSpec, dim: int, heads: int, window: tuple[int, int],
                 pretrained: tuple[int, int] = (0, 0), rel_len: tuple[int, int] = (0, 0)) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"width {dim} is not divisible by {heads} heads")
        self.heads, self.head_dim = heads, dim // heads
        self.scale = self.head_dim ** -0.5
        self.kind, self.rel_pos, self.pretrained = spec.attn_kind, spec.rel_pos, pretrained
        self.qkv = nn.Linear(dim, 3 * dim, bias=spec.qkv_bias)
        self.proj = nn.Linear(dim, dim)
        if spec.rel_pos == "table":
            self.relative_position_bias_table = nn.Parameter(torch.zeros((2 * window[0] - 1) * (2 * window[1] - 1),
                                                                         heads))
        if spec.attn_kind == "cosine":
            self.logit_scale = nn.Parameter(torch.zeros(heads, 1, 1))
        if spec.rel_pos == "cpb":
            self.cpb_mlp = nn.Sequential(nn.Linear(2, CPB_HIDDEN), nn.ReLU(), nn.Linear(CPB_HIDDEN, heads, bias=False))
        if spec.rel_pos == "decomposed":
            self.rel_pos_h = nn.Parameter(torch.zeros(rel_len[0], self.head_dim))
            self.rel_pos_w = nn.Parameter(torch.zeros(rel_len[1], self.head_dim))
        self.probe = WindowProbe()
        self._index: dict[tuple[int, int], torch.Tensor] = {}

    def _gather(self, table: torch.Tensor, window: tuple[int, int]) -> torch.Tensor:
        """A ((2wh-1)(2ww-1), H) table gathered into the (1, H, n, n) bias of `window`."""
        if window not in self._index or self._index[window].device != table.device:
            with torch.inference_mode(False):   # a plain tensor, so that a later pass with gradients can use it
                self._index[window] = relative_index(window).to(table.device)
        n = window[0] * window[1]
        return table[self._index[window].reshape(-1)].reshape(n, n, -1).permute(2, 0, 1).unsqueeze(0)

    def bias(self, window: tuple[int, int]) -> torch.Tensor | None:
        """The (1, H, n, n) relative position bias of Swin v1 (table) or v2 (16 * sigmoid of the MLP)."""
        if self.rel_pos == "table":
            return self._gather(self.relative_position_bias_table, window)
        if self.rel_pos == "cpb":
            coords = log_coords(window, self.pretrained).to(self.cpb_mlp[0].weight)
            table = self.cpb_mlp(coords).reshape(-1, self.heads)                      # ((2wh-1)(2ww-1), H)
            return 16 * torch.sigmoid(self._gather(table, window))
        return None

    def decomposed(self, q: torch.Tensor, window: tuple[int, int]) -> torch.Tensor:
        """SAM's bias from q (B', H, n, hd): rel_h[q, kh] + rel_w[q, kw] -> (B', H, n, n)."""
        rel_h, rel_w = self._rel_hw(q, window)
        b, h, n, _ = q.shape
        return (rel_h[:, :, :, :, None] + rel_w[:, :, :, None, :]).reshape(b, h, n, n)

    def _rel_hw(self, q: torch.Tensor, window: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
        """SAM's two per-axis terms from q (B', H, n, hd): (B'H, wh, ww, wh) and (B'H, wh, ww, ww)."""
        wh, ww = window
        b, h, n, hd = q.shape
        rh, rw = rel_pos_along(wh, self.rel_pos_h), rel_pos_along(ww, self.rel_pos_w)      # (wh, wh, hd), (ww, ww, hd)
        r_q = q.reshape(b * h, wh, ww, hd)
        rel_h = torch.einsum("bhwc,hkc->bhwk", r_q, rh)                                  # (B'H, wh, ww, wh)
        rel_w = torch.einsum("bhwc,wkc->bhwk", r_q, rw)                                  # (B'H, wh, ww, ww)
        return rel_h, rel_w

    def add_decomposed(self, attn: torch.Tensor, q: torch.Tensor, window: tuple[int, int]) -> torch.Tensor:
        """`attn + decomposed(q, window)` written into `attn` (B', H, n, n), the bias made a slice of (B' x H)
        rows at a time (at most ~CHUNK elements): the same sums as the original's `attn + (rel_h + rel_w)`,
        without the full-size bias (12 x 4096^2 floats in a global block of SAM at 1024 px)."""
        wh, ww = window
        rel_h, rel_w = self._rel_hw(q, window)
        flat = attn.view(-1, wh, ww, wh, ww)                                             # (B'H, wh, ww, wh, ww)
        step = max(1, CHUNK // (wh * ww) ** 2)
        for i in range(0, flat.shape[0], step):
            flat[i: i + step] += rel_h[i: i + step, :, :, :, None] + rel_w[i: i + step, :, :, None, :]
        return attn

    def forward(self, x: torch.Tensor, geom: BlockGeometry, mask: torch.Tensor | None) -> torch.Tensor:
        """(batch x windows, n, C) -> the same, attending inside each window."""
        bw, n, c = x.shape
        qkv = self.qkv(x).reshape(bw, n, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)  # (3, B', H, n, hd)
        q, k, v = qkv.unbind(0)
        # in place where nothing needs a gradient: the same values as the out-of-place sums (one rounding each,
        # same operands), but one (B', H, n, n) buffer per block instead of four -- the one the capture keeps
        inplace = not torch.is_grad_enabled() or not (q.requires_grad or k.requires_grad)
        if self.kind == "cosine":
            attn = F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-2, -1)
            scale = torch.clamp(self.logit_scale, max=math.log(100.0)).exp()
            attn = attn.mul_(scale) if inplace else attn * scale
        else:
            attn = (q * self.scale) @ k.transpose(-2, -1)
        bias = self.bias(geom.window)
        if bias is not None:
            attn = attn.add_(bias) if inplace else attn + bias
        if self.rel_pos == "decomposed":
            attn = self.add_decomposed(attn, q, geom.window) if inplace else attn + self.decomposed(q, geom.window)
        if mask is not None:
            nw = mask.shape[0]
            masked = attn.view(-1, nw, self.heads, n, n)
            m = mask.unsqueeze(1).unsqueeze(0)
            attn = (masked.add_(m) if inplace else masked + m).view(-1, self.heads, n, n)
        attn = attn.float()
        # the softmax over its own input: each CPU row is reduced before it is written (checked bitwise by the
        # tests); elsewhere out-of-place, where a device's caching allocator makes the extra buffer cheap
        attn = torch.softmax(attn, dim=-1, out=attn) if inplace and attn.device.type == "cpu" else attn.softmax(-1)
        attn = self.probe(attn).to(v.dtype)
        x = (attn @ v).transpose(1, 2).reshape(bw, n, c)                                 # (B', H, n, hd) -> (B', n, C)
        return self.proj(x)


def partition(x: torch.Tensor, window: tuple[int, int]) -> torch.Tensor:
    """(B, Hp, Wp, C) -> (B x windows, wh * ww, C), windows in row-major order."""
    b, hp, wp, c = x.shape
    wh, ww = window
    x = x.view(b, hp // wh, wh, wp // ww, ww, c).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(-1, wh * ww, c)


def unpartition(x: torch.Tensor, window: tuple[int, int], padded: tuple[int, int]) -> torch.Tensor:
    """(B x windows, wh * ww, C) -> (B, Hp, Wp, C)."""
    wh, ww = window
    hp, wp = padded
    c = x.shape[-1]
    x = x.view(-1, hp // wh, wp // ww, wh, ww, c).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(-1, hp, wp, c)


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int, kind: str) -> None:
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(dim, hidden), make_act(kind), nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class ResBottleneck(nn.Module):
    """ViTDet's residual bottleneck after a block (transformers `VitDetResBottleneckBlock`, detectron2's
    `ResBottleneckBlock`): x + norm3(conv3(act(norm2(conv2(act(norm1(conv1(x)))))))) on (B, C, H, W), 1x1, 3x3
    (padded) and 1x1 convolutions without bias, LayerNorm2d eps 1e-6 after each, the blocks' activation."""

    def __init__(self, dim: int, hidden: int, kind: str) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(dim, hidden, 1, bias=False)
        self.norm1 = LayerNorm2d(hidden, eps=1e-6)
        self.act1 = make_act(kind)
        self.conv2 = nn.Conv2d(hidden, hidden, 3, padding=1, bias=False)
        self.norm2 = LayerNorm2d(hidden, eps=1e-6)
        self.act2 = make_act(kind)
        self.conv3 = nn.Conv2d(hidden, dim, 1, bias=False)
        self.norm3 = LayerNorm2d(dim, eps=1e-6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.act1(self.norm1(self.conv1(x)))
        out = self.act2(self.norm2(self.conv2(out)))
        return x + self.norm3(self.conv3(out))


class WindowBlock(nn.Module):
    """One block: (windowed or global) attention and an MLP, pre-norm (`x + f(norm(x))`) or residual post-norm
    (`x + norm(f(x))`, Swin v2). Works on (B, H, W, C)."""

    def __init__(self, spec: WindowedSpec, dim: int, heads: int, hidden: int, window: tuple[int, int],
                 pretrained: tuple[int, int], rel_len: tuple[int, int]) -> None:
        super().__init__()
        self.pre = spec.block_norm == "pre"
        self.mask_value = spec.mask_value
        self._masks: dict[tuple, torch.Tensor | None] = {}   # shift masks by window layout and device
        self.norm1 = nn.LayerNorm(dim, eps=spec.eps)
        self.attn = WindowAttention(spec, dim, heads, window, pretrained, rel_len)
        self.norm2 = nn.LayerNorm(dim, eps=spec.eps)
        self.mlp = Mlp(dim, hidden, spec.mlp_kind)
        self.residual: ResBottleneck | None = None

    def windows(self, x: torch.Tensor, geom: BlockGeometry) -> torch.Tensor:
        """Cut (B, H, W, C) into the block's windows (shifted and padded in the original's order), attend, put
        the windows back: (B, H, W, C)."""
        _, h, w, _ = x.shape
        hp, wp = geom.padded
        sh, sw = geom.shift
        if geom.order == "pad_roll":
            x = F.pad(x, (0, 0, 0, wp - w, 0, hp - h))
        if geom.shifted:
            x = torch.roll(x, shifts=(-sh, -sw), dims=(1, 2))
        if geom.order == "roll_pad":
            x = F.pad(x, (0, 0, 0, wp - w, 0, hp - h))
        mask = self.mask(geom, x.device)
        out = unpartition(self.attn(partition(x, geom.window), geom, mask), geom.window, geom.padded)
        if geom.order == "roll_pad":
            out = out[:, :h, :w]
        if geom.shifted:
            out = torch.roll(out, shifts=(sh, sw), dims=(1, 2))
        return out[:, :h, :w].contiguous()

    def mask(self, geom: BlockGeometry, device: torch.device) -> torch.Tensor | None:
        """The block's shift mask at `geom` (`shift_mask`), made once per window layout and device."""
        key = (geom.grid, geom.window, geom.shift, geom.padded, geom.order, str(device))
        if key not in self._masks:
            if len(self._masks) > 8:      # runs at many sizes: keep the last few
                self._masks.pop(next(iter(self._masks)))
            with torch.inference_mode(False):   # a plain tensor, usable by a later pass with gradients
                self._masks[key] = shift_mask(geom, self.mask_value, device)
        return self._masks[key]

    def forward(self, x: torch.Tensor, geom: BlockGeometry) -> torch.Tensor:
        if self.pre:
            x = x + self.windows(self.norm1(x), geom)
            x = x + self.mlp(self.norm2(x))
            if self.residual is not None:   # ViTDet's bottleneck on (B, C, H, W)
                x = self.residual(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)
            return x
        x = x + self.norm1(self.windows(x, geom))
        return x + self.norm2(self.mlp(x))


class PatchMerging(nn.Module):
    """2x2 neighbouring tokens concatenated ((0, 0), (1, 0), (0, 1), (1, 1), an odd side padded), then
    norm and reduction to twice the width (v1: norm(4C) first; v2: reduction first, norm(2C))."""

    def __init__(self, dim: int, out: int, norm_before: bool, eps: float) -> None:
        super().__init__()
        self.before = norm_before
        self.reduction = nn.Linear(4 * dim, out, bias=False)
        self.norm = nn.LayerNorm(4 * dim if norm_before else out, eps=eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _, h, w, _ = x.shape
        x = F.pad(x, (0, 0, 0, w % 2, 0, h % 2))
        x = torch.cat([x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2]], dim=-1)  # (B, h, w, 4C)
        return self.reduction(self.norm(x)) if self.before else self.norm(self.reduction(x))


class Stage(nn.Module):
    def __init__(self, downsample: nn.Module, blocks: list[WindowBlock]) -> None:
        super().__init__()
        self.downsample = downsample
        self.blocks = nn.ModuleList(blocks)


class PatchEmbed(nn.Module):
    def __init__(self, spec: WindowedSpec) -> None:
        super().__init__()
        p, d = spec.patch_size, spec.dims[0]
        self.proj = nn.Conv2d(spec.in_chans, d, kernel_size=p, stride=p)
        self.norm = nn.LayerNorm(d, eps=spec.eps_embed) if spec.patch_norm else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.proj(x).permute(0, 2, 3, 1))             # (B, D, gh, gw) -> (B, gh, gw, D)


class LayerNorm2d(nn.LayerNorm):
    """LayerNorm over the channels of (B, C, H, W) (SAM's neck)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class Head(nn.Module):
    def __init__(self, dim: int, classes: int) -> None:
        super().__init__()
        self.fc = nn.Linear(dim, classes) if classes else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


class WindowedNet(nn.Module):
    """The reference windowed model of a `WindowedSpec`: Swin (stages with patch merging) or SAM / ViTDet (one
    stage of windowed and global blocks, then the neck). `forward` returns the head's output (class scores, or
    the averaged features of a model without a classifier); `forward_features` the last tokens (Swin: after the
    final norm, (B, H, W, C); SAM: the neck's (B, C, H, W))."""

    def __init__(self, spec: WindowedSpec) -> None:
        super().__init__()
        self.spec = spec
        self.patch_embed = PatchEmbed(spec)
        geo = spec.geometry()
        if spec.pos_embed:
            gh, gw = spec.pos_grid
            shape = (1, gh, gw, spec.dims[0]) if spec.arch == "sam" else (1, gh * gw, spec.dims[0])
            name = "pos_embed" if spec.arch == "sam" else "absolute_pos_embed"
            setattr(self, name, nn.Parameter(torch.zeros(shape)))
        blocks = []
        for g in geo:
            s = g.stage
            pre = spec.pretrained_windows[s] if spec.pretrained_windows else (0, 0)
            rel_len = (2 * g.window[0] - 1, 2 * g.window[1] - 1)
            blocks.append(WindowBlock(spec, spec.dims[s], spec.heads[s], spec.mlp_hidden[s], g.window, pre, rel_len))
        if spec.arch == "sam":
            for b in spec.residual_blocks:
                blocks[b].residual = ResBottleneck(spec.dims[0], spec.dims[0] // 2, spec.mlp_kind)
            self.blocks = nn.ModuleList(blocks)
            c, d = spec.dims[-1], spec.num_features
            if spec.neck == "conv":
                self.neck = nn.Sequential(nn.Conv2d(c, d, 1, bias=False), LayerNorm2d(d, eps=spec.eps_neck),
                                          nn.Conv2d(d, d, 3, padding=1, bias=False), LayerNorm2d(d, eps=spec.eps_neck))
            elif spec.neck == "norm":
                self.neck = LayerNorm2d(c, eps=spec.eps_neck)
            else:
                self.neck = nn.Identity()
        else:
            stages, b = [], 0
            for s, depth in enumerate(spec.depths):
                down = PatchMerging(spec.dims[s - 1], spec.dims[s], spec.merge_norm == "before", spec.eps_embed) \
                    if s else nn.Identity()
                stages.append(Stage(down, blocks[b: b + depth]))
                b += depth
            self.layers = nn.ModuleList(stages)
            self.norm = nn.LayerNorm(spec.dims[-1], eps=spec.eps) if spec.final_norm else nn.Identity()
        self.head = Head(spec.num_features, spec.num_classes)

    def all_blocks(self) -> list[WindowBlock]:
        if self.spec.arch == "sam":
            return list(self.blocks)
        return [blk for stage in self.layers for blk in stage.blocks]

    def _positions(self, x: torch.Tensor) -> torch.Tensor:
        """Add the absolute position table, resampled to the grid of `x` (B, gh, gw, D) when it differs."""
        spec = self.spec
        gh, gw = x.shape[1:3]
        if spec.arch == "sam":
            table = self.pos_embed
            if tuple(table.shape[1:3]) != (gh, gw):
                flat = resample_grid(table.reshape(1, -1, table.shape[-1]), spec.pos_grid, (gh, gw), spec.pos_interp)
                table = flat.reshape(1, gh, gw, -1)
            return x + table
        flat = resample_grid(self.absolute_pos_embed, spec.pos_grid, (gh, gw), spec.pos_interp)
        return x + flat.reshape(1, gh, gw, -1)

    def forward_features(self, x: torch.Tensor, geometry: Sequence[BlockGeometry] | None = None,
                         upto: int | None = None) -> torch.Tensor:
        """(B, C, H, W) image -> the last tokens; `upto` stops after that block (its output tokens)."""
        spec = self.spec
        geometry = geometry or spec.geometry((int(x.shape[-2]), int(x.shape[-1])))
        x = self.patch_embed(x)
        if spec.pos_embed:
            x = self._positions(x)
        blocks = self.all_blocks()
        b = 0
        if spec.arch == "sam":
            for blk, g in zip(blocks, geometry):
                x = blk(x, g)
                if upto is not None and g.block == upto:
                    return x
            return self.neck(x.permute(0, 3, 1, 2))                                     # (B, H, W, C) -> (B, C, H, W)
        for stage in self.layers:
            x = stage.downsample(x)
            for blk in stage.blocks:
                x = blk(x, geometry[b])
                if upto is not None and b == upto:
                    return x
                b += 1
        return self.norm(x)

    def pool(self, feats: torch.Tensor) -> torch.Tensor:
        """The head's average over the last tokens: (B, H, W, C) or SAM's (B, C, H, W) -> (B, C)."""
        return feats.mean(dim=(2, 3)) if self.spec.arch == "sam" else feats.mean(dim=(1, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.pool(self.forward_features(x)))


# The parts of a windowed model a parameter count is split into: (part, the names of its parameters).
WINDOWED_PARTS = (("patch embedding", ("patch_embed.",)), ("position embedding", ("pos_embed", "absolute_pos_embed")),
                  ("patch merging", (".downsample.",)), ("blocks", ("blocks.", "layers.")), ("final norm", ("norm.",)),
                  ("neck", ("neck.",)), ("head", ("head",)))


class WindowedHandle:
    """What every model of the windowed lane shares (`WindowedModel`, a live `StagedModel`): its capabilities say
    `WINDOWS` (`vitviz.core.protocol`: what asks a model what it can do asks it, not its class), its one-line
    summary, the device it runs on and moving it. Subclasses set `net`, `spec` and `_device`."""

    capabilities = frozenset({WINDOWS})
    net: nn.Module
    spec: WindowedSpec
    _device: torch.device

    def __repr__(self) -> str:
        return model_summary(self)

    @property
    def device(self) -> str:
        return str(self._device)

    def to(self, device: str | None) -> "WindowedHandle":
        self._device = move_module(self.net, device, self._device, f"{self.spec.source}: the model does not fit")
        return self

    def run(self, image: Any, image_size: tuple[int, int] | None = None, half: bool = False,
            logits: bool = True) -> WindowedResult:
        """Run one image and capture every block's windowed attention.

        Args:
            image: a path, PIL image, (H, W[, C]) array, or a ready (1, C, H, W) tensor (used as is).
            image_size: run at another (h, w): the windows follow the original's rule (`WindowedSpec.
                shift_rule`), a position table is resampled with the family's recipe.
            half: store attentions as float16.
            logits: False skips the neck and head (the result's logits are empty).

        Subclasses give `prepare` and `forward_captured` (its third value SAM's neck output, else None).
        """
        x, disp, spec, src, seen = self.prepare(image, image_size)
        size, box = seen or (None, None)
        maps, out, fmap = self.forward_captured(x, half, logits)
        scores, features = split_output(out[0], spec)  # type: ignore[arg-type]  # only num_classes is read
        return WindowedResult(blocks=tuple(m[0] for m in maps), geometry=spec.geometry(), logits=scores,
                              input=x[0].cpu().numpy(), image=disp, spec=spec, source=src, features=features,
                              feature_map=None if fmap is None else fmap[0], source_box=box, source_size=size)

    def parameter_counts(self) -> dict[str, int]:
        """Parameters per part (`WINDOWED_PARTS`: Swin's stages' blocks and patch mergings, SAM's blocks and neck),
        by name (plain ints); the parts it has."""
        counts = {name: 0 for name, _ in WINDOWED_PARTS}
        counts["other"] = 0
        for key, param in self.net.named_parameters():
            part = next((name for name, keys in WINDOWED_PARTS if key.startswith(keys) or
                         (name == "patch merging" and any(k in key for k in keys))), "other")
            counts[part] += int(param.numel())
        return {k: v for k, v in counts.items() if v}

    def described_assumptions(self) -> tuple[tuple[str, str], ...]:
        """Each setting its spec assumes, with what it assumes and how to say otherwise, as `vitviz.load` warns it
        (`WindowedSpec.describe_guess`: a windowed spec's own settings)."""
        return tuple((name, self.spec.describe_guess(name)) for name, _source in self.spec.assumptions)

    def hook_points(self) -> list[nn.Module]:
        """The modules a forward pass can be stopped before: a live staged model's blocks, found as a plain model's
        are (`ImageModel.hook_points`)."""
        from vitviz.core.running.capture import ImageModel

        return ImageModel.hook_points(self)  # type: ignore[arg-type]  # it asks only net and layers


class WindowedModel(WindowedHandle):
    """A loaded windowed checkpoint: the reference model, its spec, the device it runs on.

    `run` gives a `WindowedResult`; `forward_captured` is the batch form (the export's)."""

    def __init__(self, net: WindowedNet, spec: WindowedSpec, device: torch.device, dropped: list[str]) -> None:
        self.net, self.spec, self._device = net, spec, device
        self.dropped = dropped
        self._lock = threading.Lock()

    def hook_points(self) -> list[nn.Module]:
        """The modules a forward pass can be stopped before: every block of every stage."""
        return list(self.net.all_blocks())

    def spec_at(self, image_size: tuple[int, int] | None) -> WindowedSpec:
        """The spec of a run at `image_size` (whole patches), or the native spec; a size the original cannot
        run is refused with its reason."""
        if isinstance(image_size, int) and not isinstance(image_size, bool):
            image_size = (image_size, image_size)     # as VitModel.run takes it
        if image_size is None or tuple(image_size) == tuple(self.spec.image_size):
            return self.spec
        p = self.spec.patch_size
        h, w = int(image_size[0]), int(image_size[1])
        if h < p or w < p:
            raise VitvizError(f"image size {(h, w)} is smaller than one patch ({p} px)")
        size = whole_patches((h, w), p)
        spec = replace(self.spec, image_size=size, preprocess=self.spec.preprocess.at_size(size))
        try:
            spec.geometry()
        except ValueError as e:
            raise VitvizError(f"{self.spec.source}: {e}") from None
        return spec

    def prepare(self, image: Any, image_size: tuple[int, int] | None = None) -> tuple[
            torch.Tensor, np.ndarray, WindowedSpec, str,
            tuple[tuple[int, int], tuple[float, float, float, float]] | None]:
        """A path / PIL image / array / (1, C, H, W) tensor -> (input, display image, spec, source, box), as
        `VitModel.prepare` (the same code: only the spec differs)."""
        from vitviz.core.running.capture import VitModel

        return VitModel.prepare(self, image, image_size)  # type: ignore[arg-type]  # it asks only spec_at / spec

    def capture_bytes(self, spec: WindowedSpec, batch: int, half: bool) -> int:
        """Bytes of every block's captured attention for `batch` inputs at `spec`'s size."""
        return batch * sum(g.num_windows * spec.heads[g.stage] * g.window_tokens ** 2 for g in spec.geometry()) \
            * (2 if half else 4)

    def forward_captured(self, x: torch.Tensor, half: bool = False, logits: bool = True,
                         upto: int | None = None) -> tuple[list[np.ndarray], np.ndarray, np.ndarray | None]:
        """(B, C, H, W) -> per block (B, windows, heads, n, n) attention, the output (B, C) (class scores or a
        headless model's averaged features; (B, 0) with `logits=False`, which stops after block `upto`, default
        the last) and SAM's neck output (B, C', h, w) (None otherwise, or with `logits=False`)."""
        size = (int(x.shape[-2]), int(x.shape[-1]))
        spec = self.spec_at(size)
        if size != tuple(spec.image_size):   # a tensor that is not whole patches: its top-left part
            x = x[..., : spec.image_size[0], : spec.image_size[1]]
        geometry = spec.geometry()
        depth = spec.depth
        last = depth - 1 if upto is None else (upto + depth if upto < 0 else upto)
        if not 0 <= last < depth:
            raise VitvizError(f"upto={upto}: the model has {depth} blocks (0-{depth - 1})")
        if logits and upto is not None:
            raise VitvizError("upto= stops the forward pass early, so it needs logits=False")
        check_host_memory(self.capture_bytes(spec, int(x.shape[0]), half), x, half)
        kept: list[torch.Tensor] = []
        probes = [blk.attn.probe for blk in self.net.all_blocks()]
        dtype = torch.float16 if half else torch.float32
        host = HostCopy(self._device)   # each block's maps leave the device as computed (async on CUDA)
        handles = [p.register_forward_hook(lambda _m, _i, out: kept.append(host.take(out.detach(), dtype)))
                   for p in probes]
        feature_map = None
        try:
            with self._lock, torch.inference_mode():
                xd = x.to(self._device)
                if logits:
                    feats = self.net.forward_features(xd, geometry)
                    out = self.net.head(self.net.pool(feats)).float().cpu().numpy()
                    if spec.arch == "sam":
                        feature_map = feats.float().cpu().numpy()
                else:
                    self.net.forward_features(xd, geometry, upto=last)
                    out = np.zeros((x.shape[0], 0), np.float32)
        except torch.cuda.OutOfMemoryError as e:
            torch.cuda.empty_cache()
            raise DeviceError(f"out of memory on {self._device} for input {tuple(x.shape)} ({e}); {SMALLER}") from e
        except (MemoryError, RuntimeError) as e:
            if not isinstance(e, MemoryError) and "allocate" not in str(e):
                raise
            raise DeviceError(f"not enough memory for input {tuple(x.shape)} ({type(e).__name__}: {e}); "
                              f"{SMALLER}") from e
        finally:
            for h in handles:
                h.remove()
        b = int(x.shape[0])
        maps = []
        for g, a in zip(geometry, kept):
            arr = host.numpy(a).reshape(b, g.num_windows, spec.heads[g.stage], g.window_tokens, g.window_tokens)
            # a softmax row is all finite or all NaN (a NaN or infinite logit makes its sum NaN, and every entry
            # is divided by it), so one key per row tells: 1/n of the data read, not a pass over 3.6 GB at SAM's size
            if not np.isfinite(arr[..., 0]).all():
                raise NonFiniteError(f"{spec.source}: block {g.block} ({g.describe()}) gives NaN or infinite "
                                     "attention for this input; the weights or the input hold NaN or infinite values")
            maps.append(arr)
        return maps, out, feature_map

    def pos_embed(self, grid: tuple[int, int] | None = None) -> np.ndarray | None:
        """(N, D) absolute position table (resampled to `grid`); None when the model has none."""
        if not self.spec.pos_embed:
            return None
        table = self.net.pos_embed if self.spec.arch == "sam" else self.net.absolute_pos_embed
        flat = table.reshape(1, -1, table.shape[-1])
        with torch.no_grad():
            return resample_grid(flat, self.spec.pos_grid, tuple(grid or self.spec.pos_grid),
                                 self.spec.pos_interp)[0].float().cpu().numpy()

