"""What `vitviz export` draws: parsing the map / layer / head selections, computing the maps, rendering PNGs.

No torch here. Maps are computed the way the window computes them (`vitviz.core.maps`), and rendered with
`vitviz.core.render`, so a PNG written here is the PNG the window writes for the same choices:

- `cls`: the CLS token's attention over the patches.
- `mean` / `max`: the attention each patch receives, averaged / maximised over the patch queries (the window's
  map for models without a CLS token is `mean`).
- `token:N`: the attention row of token N (prefix tokens count: token 0 is CLS when the model has one).
- `rollout`: attention rollout through layers 0..l for layer l (by default heads fused by mean, nothing
  discarded, residual 0.5, as the window's defaults; `RolloutOptions` changes them).

Heads are reduced after the queries (head 'mean' of `mean` is the mean over heads of each head's mean over
queries), as in the window. Layer 'mean' is the mean of the per-layer maps.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Union

import numpy as np

from vitviz.core import analysis, render as draw
from vitviz.core.spec import ModelSpec
from vitviz.errors import VitvizError

Pick = Union[int, str]  # an index, or 'mean' / 'max' / 'all' / 'last'
MAP_KINDS = ("cls", "mean", "max", "rollout")


class SelectionError(VitvizError, ValueError):
    """A map, layer or head selection that is malformed or out of range for the model."""


@dataclass(frozen=True)
class MapKind:
    """One requested map: its kind ('cls', 'mean', 'max', 'rollout', 'token') and the query token for 'token'."""

    kind: str
    token: int | None = None

    @property
    def label(self) -> str:
        """The file-name part, as the window names it: 'cls', 'rollout', 'token17'."""
        return f"token{self.token}" if self.kind == "token" else self.kind


@dataclass(frozen=True)
class RolloutOptions:
    """How rollout fuses heads, how much of each row's lowest attention it discards, and the residual weight."""

    fusion: str = "mean"       # 'mean' | 'max' | 'min'
    discard: float = 0.0       # fraction of each row's lowest patch attention set to 0 (0 <= discard < 1)
    residual: float = 0.5      # weight of the identity: A' = residual * I + (1 - residual) * A


@dataclass(frozen=True)
class RenderOptions:
    """How maps become pictures (the window's defaults: viridis, opacity 0.6, smooth, shared scale)."""

    style: str = "overlay"     # 'overlay' | 'heatmap'
    cmap: str = "viridis"
    opacity: float = 0.6
    smooth: bool = True
    scale: str = "shared"      # 'shared': 0..max over all layers of that kind of head column; 'own': min..max
    colorbar: bool = False
    size: str = "original"     # 'original': the region the model saw at full resolution; 'input': the model input


def parse_maps(text: str) -> list[MapKind]:
    """'cls,rollout,token:5' -> MapKinds, in order, without duplicates."""
    out: list[MapKind] = []
    for part in _parts(text, "maps"):
        if part in MAP_KINDS:
            item = MapKind(part)
        elif re.fullmatch(r"token:\d+", part):
            item = MapKind("token", int(part.split(":")[1]))
        else:
            raise SelectionError(f"map {part!r}: expected one of {', '.join(MAP_KINDS)} or token:N (e.g. token:0)")
        if item not in out:
            out.append(item)
    return out


def parse_picks(text: str, what: str, words: tuple[str, ...]) -> list[Pick]:
    """'0-3,5,mean' -> [0, 1, 2, 3, 5, 'mean']; `words` are the keywords allowed besides indices and ranges."""
    out: list[Pick] = []
    for part in _parts(text, what):
        match = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if part in words:
            items: list[Pick] = [part]
        elif re.fullmatch(r"-\d+", part):  # counted from the end, as in Python: -1 is the last
            items = [int(part)]
        elif match:
            lo, hi = int(match.group(1)), int(match.group(2) or match.group(1))
            if hi < lo:
                raise SelectionError(f"{what} range {part!r} runs backwards; expected LOW-HIGH")
            items = list(range(lo, hi + 1))
        else:
            raise SelectionError(f"{what} {part!r}: expected indices (-1 is the last), ranges like 0-3, "
                                 f"or {', '.join(words)}")
        out.extend(i for i in items if i not in out)
    return out


def _parts(text: str, what: str) -> list[str]:
    parts = [p.strip().lower() for p in text.split(",") if p.strip()]
    if not parts:
        raise SelectionError(f"empty {what} selection {text!r}")
    return parts


def resolve_picks(picks: list[Pick], size: int, what: str) -> list[Pick]:
    """Expand 'all' / 'last' against `size` and check every index is in range."""
    out: list[Pick] = []
    for pick in picks:
        items = list(range(size)) if pick == "all" else [size - 1] if pick == "last" else [pick]
        for item in items:
            if isinstance(item, int) and not -size <= item < size:
                raise SelectionError(f"{what} {item} out of range: the model has {size} {what}s "
                                     f"(0-{size - 1}, or -{size}--1 from the end)")
            item = item + size if isinstance(item, int) and item < 0 else item
            if item not in out:
                out.append(item)
    return out


def check_maps(maps: list[MapKind], spec: ModelSpec) -> None:
    """Refuse maps the model cannot give: 'cls' without a CLS token, a token index past the last token."""
    for m in maps:
        if m.kind == "cls" and not (spec.cls_token and spec.num_prefix > 0):
            raise SelectionError("this model has no CLS token, so the 'cls' map is undefined; use --maps mean")
        if m.kind == "token" and not 0 <= int(m.token or 0) < spec.num_tokens:
            raise SelectionError(f"token:{m.token} out of range: the model has {spec.num_tokens} tokens "
                                 f"({spec.num_prefix} prefix + {spec.grid[0]}x{spec.grid[1]} patches)")


def output_name(stem: str, m: MapKind, layer: Pick, head: Pick, rollout: RolloutOptions = RolloutOptions()) -> str:
    """`{image}_{map}_L{layer}_H{head}.png`, the window's per-layer export name; rollout has only head 'mean', and
    its label carries any non-default setting (`rollout-max-d0.9-r0.3`), so a rerun with other settings writes new
    files instead of skipping the old ones as done."""
    if m.kind != "rollout":
        return f"{stem}_{m.label}_L{layer}_H{head}.png"
    return f"{stem}_{rollout_label(rollout)}_L{layer}_Hmean.png"


def rollout_label(options: RolloutOptions) -> str:
    """'rollout' for the window's defaults, else e.g. 'rollout-max-d0.9-r0.3' (only the settings that differ)."""
    parts = ["rollout"]
    if options.fusion != "mean":
        parts.append(options.fusion)
    if options.discard:
        parts.append(f"d{options.discard:g}")
    if options.residual != 0.5:
        parts.append(f"r{options.residual:g}")
    return "-".join(parts)


def query_rows(maps: list[MapKind]) -> list[int] | None:
    """The only query rows these maps read (CLS and token maps), or None when a map needs whole matrices."""
    if not all(m.kind in ("cls", "token") for m in maps):
        return None
    return sorted({0 if m.kind == "cls" else int(m.token or 0) for m in maps})


def map_stack(attn: np.ndarray, m: MapKind, spec: ModelSpec, rollout: RolloutOptions = RolloutOptions(),
              rows: list[int] | None = None) -> np.ndarray:
    """All of one map's layers and heads for one image: (L, H + 2, gh, gw), columns H, H+1 = head mean, max.

    Args:
        attn: (L, H, T, T) attention of one image, or (L, H, k, T) holding only the query rows `rows`.
    """
    p, (gh, gw) = spec.num_prefix, spec.grid
    kept = rows
    if m.kind in ("cls", "token"):
        token = 0 if m.kind == "cls" else int(m.token or 0)
        rows = attn[:, :, token if kept is None else kept.index(token), p:]  # (L, H, N)
    elif kept is not None:
        raise ValueError(f"the {m.label} map needs whole attention matrices, not rows {kept}")
    elif m.kind == "rollout":
        rows = rollout_rows(attn, p, spec.cls_token, rollout)[:, None]  # (L, 1, N)
    else:
        rows = analysis.attention_received(attn, p, m.kind)  # (L, H, N) over the patch queries, as the window
    rows = np.asarray(rows, dtype=np.float32)
    fused = np.concatenate([rows, rows.mean(1, keepdims=True), rows.max(1, keepdims=True)], axis=1)
    return fused.reshape(fused.shape[0], fused.shape[1], gh, gw)  # (L, H + 2, N) -> (L, H + 2, gh, gw)


def rollout_rows(attn: np.ndarray, num_prefix: int, has_cls: bool = True,
                 options: RolloutOptions = RolloutOptions()) -> np.ndarray:
    """Rollout through layers 0..l for every l, as the window computes it, in O(L^2 T^2) by row vectors.

    Returns:
        (L, N): the CLS row (without CLS: the mean of the patch queries) of A'_l @ ... @ A'_0 over the patches.
    """
    num_layers, t = attn.shape[0], attn.shape[-1]
    query = np.zeros(t, dtype=np.float32)  # (T,)
    if has_cls and num_prefix > 0:
        query[0] = 1.0
    else:
        query[num_prefix:] = 1.0 / (t - num_prefix)
    factors = [analysis.rollout_layer_matrix(attn[i], options.fusion, options.discard, options.residual,  # type: ignore[arg-type]
                                             num_prefix) for i in range(num_layers)]
    out = np.empty((num_layers, t - num_prefix), dtype=np.float32)
    for layer in range(num_layers):
        v = query
        for i in range(layer, -1, -1):  # v <- v @ A'_i, last layer first
            v = v @ factors[i]
        out[layer] = v[num_prefix:]
    return out


def column(stack: np.ndarray, head: Pick) -> int:
    """Index into axis 1 of an (L, H + 2, gh, gw) stack for a head (index, 'mean' or 'max'); rollout: 'mean'."""
    num_heads = stack.shape[1] - 2
    if head == "mean" or num_heads == 1:
        return num_heads
    return num_heads + 1 if head == "max" else int(head)


def select(stack: np.ndarray, layer: Pick, head: Pick) -> np.ndarray:
    """The (gh, gw) map of one layer (or 'mean' over layers) and head (index, 'mean' or 'max') of a stack."""
    maps = stack[:, column(stack, head)]  # (L, gh, gw)
    return maps.mean(axis=0) if layer == "mean" else maps[int(layer)]


def levels(values: np.ndarray, stack: np.ndarray, head: Pick, scale: str) -> tuple[float, float]:
    """Colour range, as the window's `levels_for`: the map's own min..max, or 0..the maximum over all layers of
    its kind of column (every single head, or the head means, or the head maxima), so maps of one kind compare."""
    if scale == "own":
        lo, hi = float(values.min()), float(values.max())
        return lo, hi if hi > lo else lo + 1e-12
    num_heads, col = stack.shape[1] - 2, column(stack, head)
    group = stack[:, :num_heads] if col < num_heads else stack[:, col]
    vmax = float(group.max()) if group.size else 1.0
    return 0.0, vmax if vmax > 0 else 1.0


def render(values: np.ndarray, stack: np.ndarray, head: Pick, image: np.ndarray, opts: RenderOptions) -> np.ndarray:
    """A (gh, gw) map drawn over (or beside) `image`, the (H, W, 3) region of the picture the model saw.

    Colours span `levels`; the map is stretched to cover `image` (see `cover` for partial patches).
    Returns (H, W[ + colorbar], 3) uint8.
    """
    lo, hi = levels(values, stack, head, opts.scale)
    h, w = image.shape[:2]
    heat = draw.heatmap_image(values, (h, w), opts.cmap, opts.smooth, lo, hi)
    rgb = heat if opts.style == "heatmap" else draw.overlay(image, heat, float(opts.opacity))
    return draw.add_colorbar(rgb, opts.cmap, lo, hi) if opts.colorbar else rgb


def cover(values: np.ndarray, crop: tuple[int, int], patch: int) -> np.ndarray:
    """The map padded (with its minimum) to cover a `crop` (h, w) that is not a whole number of patches."""
    gh, gw = values.shape
    ph, pw = -(-crop[0] // patch), -(-crop[1] // patch)
    if gh >= ph and gw >= pw:
        return values
    out = np.full((ph, pw), float(values.min()), dtype=np.float32)
    out[:gh, :gw] = values
    return out


def safe_stem(path: Path) -> str:
    """A file-name-safe stem of an image path (the window's `image_stem`)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", path.stem or "image")
