"""The maps the window shows, derived from one `AttentionResult` and cached (no Qt here).

Everything a layer or head change needs is precomputed per (source, query) as a (L, H + 2, gh, gw) stack: the
H heads followed by the head mean and the head max. Switching layer or head is then an index into that stack,
which keeps every panel update inside one frame even for ViT-L/16 at 384 px.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vitviz.core import analysis
from vitviz.core.spec import AttentionResult
from vitviz.gui.state import HeadSel, LayerSel, ViewState, resolve_index


@dataclass(frozen=True)
class MapStack:
    """Maps for every layer and head of one source.

    Attributes:
        maps: (L, H + 2, gh, gw) float32; columns H and H + 1 are the head mean and max. For rollout H is 1.
        vmax: (3,) the largest value over all layers of the single heads, of the head means and of the head
            maxima: the shared colour scale of a map is 0..vmax of its group, so maps of one kind compare.
        title: what the maps are, for labels.
    """

    maps: np.ndarray
    vmax: np.ndarray
    title: str

    def scale_max(self, column: int) -> float:
        """Top of the shared colour scale for a column of `maps` (heads, mean or max)."""
        group = min(2, max(0, column - self.num_heads + 1))
        value = float(self.vmax[group])
        return value if value > 0 else 1.0

    def shared_scaled(self) -> np.ndarray:
        """`maps` divided by the scale of their group: every column on one 0..1 scale."""
        scale = np.array([self.scale_max(c) for c in range(self.maps.shape[1])], dtype=np.float32)
        return self.maps / scale[None, :, None, None]

    @property
    def num_heads(self) -> int:
        return self.maps.shape[1] - 2

    def column(self, head: HeadSel) -> int:
        """Index into axis 1 of `maps` for a head selection."""
        if head == "mean":
            return self.num_heads
        if head == "max":
            return self.num_heads + 1
        return int(resolve_index(head, self.num_heads))

    def select(self, layer: LayerSel, head: HeadSel) -> np.ndarray:
        """The (gh, gw) map of one layer (or the mean over layers) and one head selection."""
        col = self.maps[:, self.column(head)]          # (L, gh, gw)
        if layer == "mean":
            return col.mean(axis=0)
        return col[int(resolve_index(layer, col.shape[0]))]


class ResultMaps:
    """Lazily computed, cached map stacks for one result."""

    def __init__(self, result: AttentionResult) -> None:
        self.result = result
        self._stacks: dict[tuple[str, int | None], MapStack] = {}

    @property
    def grid(self) -> tuple[int, int]:
        return self.result.grid

    def stack(self, source: str, query: int | None = None) -> MapStack:
        """The stack for 'cls', 'rollout' or 'token' (with `query`); 'token' without a query falls back to cls."""
        if source == "token" and query is None:
            source = "cls"
        key = (source, query if source == "token" else None)
        if key not in self._stacks:
            self._stacks[key] = self._compute(source, query)
        return self._stacks[key]

    def precompute(self) -> None:
        """Build the stacks every image needs (CLS and rollout); the worker calls this off the GUI thread."""
        self.stack("cls")
        self.stack("rollout")

    def current(self, state: ViewState) -> tuple[np.ndarray, MapStack]:
        """The (gh, gw) map the state selects and the stack it comes from."""
        stack = self.stack(state.source, state.query)
        return stack.select(state.layer, state.head), stack

    def _compute(self, source: str, query: int | None) -> MapStack:
        attn = self.result.attentions
        p, (gh, gw) = self.result.num_prefix, self.grid
        if source == "rollout":
            rows = rollout_rows(attn, p, self.result.spec.cls_token)[:, None]   # (L, 1, N)
            title = "attention rollout"
        elif source == "token":
            q = min(int(query or 0), attn.shape[-1] - 1)
            rows = attn[:, :, q, p:]                             # (L, H, N)
            title = f"attention of token {q}"
        elif p > 0 and self.result.spec.cls_token:
            rows = attn[:, :, 0, p:]                             # (L, H, N)
            title = "CLS attention"
        else:
            rows = attn[:, :, p:, p:].mean(axis=2)               # (L, H, N): mean over the patch queries
            title = "mean patch attention (no CLS token)"
        rows = np.asarray(rows, dtype=np.float32)
        fused = np.concatenate([rows, rows.mean(1, keepdims=True), rows.max(1, keepdims=True)], axis=1)
        maps = fused.reshape(fused.shape[0], fused.shape[1], gh, gw)   # (L, H + 2, N) -> (L, H + 2, gh, gw)
        h = rows.shape[1]
        vmax = np.array([maps[:, :h].max(), maps[:, h].max(), maps[:, h + 1].max()], dtype=np.float64)
        return MapStack(maps=maps, vmax=vmax, title=title)


def rollout_rows(attn: np.ndarray, num_prefix: int, has_cls: bool = True) -> np.ndarray:
    """Attention rollout through each layer, with `vitviz.core.analysis`'s convention (mean heads, residual 0.5).

    Returns (L, N): for each layer l, the row of R_l = A'_l @ ... @ A'_0 of the CLS token (without CLS, the mean
    of the patch queries) over the patches. The last entry equals `analysis.rollout(attn)`.
    """
    num_layers, t = attn.shape[0], attn.shape[-1]
    query = np.zeros(t, dtype=np.float32)                   # (T,) which output row(s) to read
    if has_cls and num_prefix > 0:
        query[0] = 1.0
    else:
        query[num_prefix:] = 1.0 / (t - num_prefix)
    joint = np.eye(t, dtype=np.float32)                     # (T, T)
    out = np.empty((num_layers, t - num_prefix), dtype=np.float32)
    for layer in range(num_layers):
        joint = analysis.rollout_layer_matrix(attn[layer], "mean", 0.0, 0.5, num_prefix) @ joint
        out[layer] = (query @ joint)[num_prefix:]
    return out


def normalized(values: np.ndarray) -> np.ndarray:
    """`values` stretched to 0..1 (a constant map becomes zeros)."""
    lo, hi = float(values.min()), float(values.max())
    if hi - lo <= 0:
        return np.zeros_like(values, dtype=np.float32)
    return ((values - lo) / (hi - lo)).astype(np.float32)


def levels_for(state: ViewState, values: np.ndarray, stack: MapStack) -> tuple[float, float]:
    """Colour-scale range: the map's own min..max when normalising, else 0..the shared maximum of its kind
    (all single heads of all layers, or all head means, or all head maxima)."""
    if state.normalize:
        lo, hi = float(values.min()), float(values.max())
        return (lo, hi if hi > lo else lo + 1e-12)
    return (0.0, stack.scale_max(stack.column(state.head)))


def upsample(values: np.ndarray, size: tuple[int, int], smooth: bool) -> np.ndarray:
    """Resize a (gh, gw) map to (H, W): bilinear (pixel-centre aligned) or nearest (blocky)."""
    gh, gw = values.shape
    h, w = size
    ys = (np.arange(h) + 0.5) * gh / h - 0.5
    xs = (np.arange(w) + 0.5) * gw / w - 0.5
    if not smooth:
        yi = np.clip(np.round(ys).astype(int), 0, gh - 1)
        xi = np.clip(np.round(xs).astype(int), 0, gw - 1)
        return values[yi][:, xi]
    y0 = np.clip(np.floor(ys).astype(int), 0, gh - 1)
    x0 = np.clip(np.floor(xs).astype(int), 0, gw - 1)
    y1, x1 = np.minimum(y0 + 1, gh - 1), np.minimum(x0 + 1, gw - 1)
    fy = np.clip(ys - y0, 0, 1)[:, None].astype(np.float32)
    fx = np.clip(xs - x0, 0, 1)[None, :].astype(np.float32)
    top = values[y0][:, x0] * (1 - fx) + values[y0][:, x1] * fx
    bottom = values[y1][:, x0] * (1 - fx) + values[y1][:, x1] * fx
    return (top * (1 - fy) + bottom * fy).astype(np.float32)
