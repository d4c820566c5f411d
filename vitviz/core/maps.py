"""The maps the window shows, derived from one `AttentionResult` and cached (no Qt here).

Everything a layer or head change needs is precomputed per (source, query) as a (L, H + 2, gh, gw) stack: the
H heads followed by the head mean and the head max. Switching layer or head is then an index into that stack,
which keeps every panel update inside one frame even for ViT-L/16 at 384 px.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vitviz.core import analysis
from vitviz.core.analysis import attention_by_token_kind
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


@dataclass(frozen=True)
class RolloutParams:
    """The rollout's knobs (see `vitviz.core.analysis`); `query` None: CLS, or the mean of the patches without it."""

    fusion: str = "mean"
    discard: float = 0.0
    start: int = 0
    residual: float = 0.5
    query: int | None = None

    @classmethod
    def of(cls, state: ViewState) -> "RolloutParams":
        return cls(state.rollout_fusion, float(state.rollout_discard), int(state.rollout_start),
                   float(state.rollout_residual), state.query)


MAX_ROLLOUT_STACKS = 8


class ResultMaps:
    """Lazily computed, cached map stacks for one result."""

    def __init__(self, result: AttentionResult) -> None:
        self.result = result
        self.rollout = RolloutEngine(result.attentions, result.num_prefix, result.spec.cls_token)
        self._stacks: dict[tuple[object, ...], MapStack] = {}
        self._stats: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    @property
    def grid(self) -> tuple[int, int]:
        return self.result.grid

    @property
    def nbytes(self) -> int:
        """Memory held by the result and the caches derived from it."""
        return self.result.nbytes + self.rollout.nbytes + sum(s.maps.nbytes for s in self._stacks.values())

    def stack(self, source: str, query: int | None = None, rollout: RolloutParams | None = None) -> MapStack:
        """The stack for 'cls', 'rollout' (with `rollout` parameters, default ones when None) or 'token' (with
        `query`); 'token' without a query falls back to cls."""
        if source == "token" and query is None:
            source = "cls"
        if source == "rollout":
            key: tuple[object, ...] = (source, rollout or RolloutParams())
        else:
            key = (source, query if source == "token" else None)
        if key not in self._stacks:
            self._stacks[key] = self._compute(source, query, rollout or RolloutParams())
            self._forget_old_rollouts()
        return self._stacks[key]

    def stack_for(self, state: ViewState) -> MapStack:
        """The stack the state's map source selects."""
        return self.stack(state.source, state.query, RolloutParams.of(state) if state.source == "rollout" else None)

    def precompute(self) -> None:
        """Build what every image needs (CLS and rollout stacks, head statistics); the worker calls this off the
        GUI thread."""
        self.stack("cls")
        self.stack("rollout")
        self.head_stats()

    def head_stats(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(L, H) mean attention distance in pixels, (L, H) attention entropy in nats (patch queries) and
        (L, H, P + 1) attention by token kind (`core.analysis.attention_by_token_kind`)."""
        if self._stats is None:
            r = self.result
            self._stats = (analysis.mean_attention_distance(r),
                           analysis.attention_entropy(r.attentions, num_prefix=r.num_prefix),
                           attention_by_token_kind(r))
        return self._stats

    def current(self, state: ViewState) -> tuple[np.ndarray, MapStack]:
        """The (gh, gw) map the state selects and the stack it comes from."""
        stack = self.stack_for(state)
        return stack.select(state.layer, state.head), stack

    def _forget_old_rollouts(self) -> None:
        keys = [k for k in self._stacks if k[0] == "rollout" and k[1] != RolloutParams()]
        for key in keys[: max(0, len(keys) - MAX_ROLLOUT_STACKS)]:
            del self._stacks[key]

    def _compute(self, source: str, query: int | None, params: RolloutParams) -> MapStack:
        attn = self.result.attentions
        p, (gh, gw) = self.result.num_prefix, self.grid
        if source == "rollout":
            rows = self.rollout.through_each_layer(params)[:, None, p:]   # (L, 1, N)
            title = rollout_title(params, self.result.spec)
        elif source == "token":
            q = min(int(query or 0), attn.shape[-1] - 1)
            rows = attn[:, :, q, p:]                             # (L, H, N)
            title = f"attention of token {q}"
        elif source in ("mean", "max"):
            rows = analysis.attention_received(attn, p, source)  # (L, H, N) over the patch queries
            title = f"{source} attention received (over the patch queries)"
        elif p > 0 and self.result.spec.cls_token:
            rows = attn[:, :, 0, p:]                             # (L, H, N)
            title = "CLS attention"
        else:
            rows = analysis.attention_received(attn, p, "mean")  # (L, H, N): mean over the patch queries
            title = "mean patch attention (no CLS token)"
        rows = np.asarray(rows, dtype=np.float32)
        fused = np.concatenate([rows, rows.mean(1, keepdims=True), rows.max(1, keepdims=True)], axis=1)
        maps = fused.reshape(fused.shape[0], fused.shape[1], gh, gw)   # (L, H + 2, N) -> (L, H + 2, gh, gw)
        h = rows.shape[1]
        vmax = np.array([maps[:, :h].max(), maps[:, h].max(), maps[:, h + 1].max()], dtype=np.float64)
        return MapStack(maps=maps, vmax=vmax, title=title)


def rollout_title(params: RolloutParams, spec: object) -> str:
    """E.g. 'rollout of cls (max, discard 0.9, from layer 2, residual 0.5)'."""
    q = params.query
    who = spec.token_name(q) if q is not None else ("cls" if spec.cls_token and spec.num_prefix else "mean patch")
    knobs = [params.fusion]
    if params.discard > 0:
        knobs.append(f"discard {params.discard:.2f}")
    if params.start > 0:
        knobs.append(f"from layer {params.start}")
    knobs.append(f"residual {params.residual:.2f}")
    return f"rollout of {who} ({', '.join(knobs)})"


class RolloutEngine:
    """Attention rollout for live controls, by row vectors (O(L·T²) per map) with per-layer caches.

    Same convention and numbers as `analysis.rollout_vector`; what makes it fast enough for a slider is that the
    head-fused layers are computed once per fusion, and the discard threshold of every row comes from patch keys
    sorted once per fusion (only computed when a discard ratio is first used). Rows are discarded by value
    (`key <= k-th smallest`), which matches core's exactly-k rule except for ties at the threshold.
    """

    def __init__(self, attentions: np.ndarray, num_prefix: int, has_cls: bool) -> None:
        self.attn, self.num_prefix, self.has_cls = attentions, num_prefix, has_cls
        self._fused: dict[str, np.ndarray] = {}
        self._sorted: dict[str, np.ndarray] = {}

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self._fused.values()) + sum(a.nbytes for a in self._sorted.values())

    @property
    def depth(self) -> int:
        return int(self.attn.shape[0])

    def query_vector(self, query: int | None) -> np.ndarray:
        """(T,) one-hot of `query`, of CLS, or uniform over the patches when the model has no CLS."""
        t, p = self.attn.shape[-1], self.num_prefix
        v = np.zeros(t, dtype=np.float32)
        if query is not None:
            v[min(int(query), t - 1)] = 1.0
        elif self.has_cls and p > 0:
            v[0] = 1.0
        else:
            v[p:] = 1.0 / (t - p)
        return v

    def vector(self, params: RolloutParams, end_layer: int | None = None) -> np.ndarray:
        """(T,) the query's rollout row through `end_layer` (default: the last layer)."""
        end = self.depth - 1 if end_layer is None else end_layer
        factors = {layer: self._factor(layer, params) for layer in range(params.start, end + 1)}
        return self._pull(self.query_vector(params.query), factors, end, params)

    def through_each_layer(self, params: RolloutParams) -> np.ndarray:
        """(L, T): row l is the rollout through layer l (rows before `start` are zeros)."""
        out = np.zeros((self.depth, self.attn.shape[-1]), dtype=np.float32)
        factors = {layer: self._factor(layer, params) for layer in range(params.start, self.depth)}
        v0 = self.query_vector(params.query)
        for end in range(params.start, self.depth):
            out[end] = self._pull(v0, factors, end, params)
        return out

    def _pull(self, v: np.ndarray, factors: dict, end: int, params: RolloutParams) -> np.ndarray:
        """v @ A'_end @ ... @ A'_start, with A' = diag(1/s)(r·I + (1 - r)·D)."""
        r = params.residual
        for layer in range(end, params.start - 1, -1):
            kept, sums = factors[layer]
            u = np.where(sums > 0, v / np.where(sums > 0, sums, 1.0), 0.0).astype(np.float32)   # (T,)
            v = r * u + (1.0 - r) * (u @ kept)
        return v

    def _factor(self, layer: int, params: RolloutParams) -> tuple[np.ndarray, np.ndarray]:
        """The fused, discarded (T, T) layer D and the row sums s of r·I + (1 - r)·D."""
        fused = self._fused_layer(params.fusion, layer)
        kept = fused
        n = fused.shape[1] - self.num_prefix
        k = int(np.floor(params.discard * n + 1e-9))
        if k > 0:
            p = self.num_prefix
            threshold = self._sorted_keys(params.fusion)[layer][:, k - 1]      # (T,) k-th smallest patch key
            kept = np.empty_like(fused)
            kept[:, :p] = fused[:, :p]
            np.multiply(fused[:, p:], fused[:, p:] > threshold[:, None], out=kept[:, p:])   # (T, N)
        sums = params.residual + (1.0 - params.residual) * kept.sum(axis=1)   # (T,)
        return kept, sums

    def _fused_layer(self, fusion: str, layer: int) -> np.ndarray:
        if fusion not in self._fused:
            a = self.attn
            fused = np.empty(a.shape[:1] + a.shape[2:], dtype=np.float32)      # (L, T, T)
            reduce = {"mean": np.mean, "max": np.max, "min": np.min}[fusion]
            for i in range(a.shape[0]):
                fused[i] = reduce(np.asarray(a[i], dtype=np.float32), axis=0)   # (H, T, T) -> (T, T)
            self._fused[fusion] = fused
        return self._fused[fusion][layer]

    def _sorted_keys(self, fusion: str) -> np.ndarray:
        if fusion not in self._sorted:
            p = self.num_prefix
            self._sorted[fusion] = np.stack([np.sort(self._fused_layer(fusion, i)[:, p:], axis=1)
                                             for i in range(self.depth)])     # (L, T, N)
        return self._sorted[fusion]


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


MOSAIC_MAX_POSITIONS = 50 * 50   # the all-pairs similarity and the mosaic only up to this many grid positions
LEVEL_SAMPLE_ROWS = 64            # beyond that, the colour scale's low end comes from this many positions' rows


@dataclass(frozen=True)
class PosEmbedData:
    """A model's position embedding at one grid, with the similarities the position-embedding panel shows.

    Only what the panel shows is computed: the row of one position (`similarity_to`, on demand) and the CLS row;
    the all-pairs similarity and the mosaic only for grids of at most `MOSAIC_MAX_POSITIONS` positions (a 500 × 500
    grid would need 250 000² similarities).

    Attributes:
        grid: (gh, gw) the embedding was resampled to.
        pos: (N_pos, D) float32, `prefix_rows` prefix rows (0 for no_embed_class models) then the grid row-major.
        unit: (gh·gw, D) float32, the grid rows scaled to unit length (zero rows stay zero).
        similarity: (gh, gw, gh, gw) float32 cosine similarity between every pair of positions, or None for a grid
            too large for it.
        cls_similarity: (gh, gw) similarity of the first prefix row (CLS) to every position, or None.
        mosaic: the ViT-paper figure as one image, tiles of (gh, gw) separated by a NaN gap of `gap`; None for a
            grid too large for it.
        low: the lowest similarity (exact with `similarity`; else over the CLS row and `LEVEL_SAMPLE_ROWS` evenly
            spread positions), for the colour scale.
    """

    grid: tuple[int, int]
    pos: np.ndarray
    prefix_rows: int
    unit: np.ndarray
    similarity: np.ndarray | None
    cls_similarity: np.ndarray | None
    mosaic: np.ndarray | None
    gap: int
    low: float

    @property
    def has_mosaic(self) -> bool:
        return self.mosaic is not None

    def similarity_to(self, row: int, col: int) -> np.ndarray:
        """(gh, gw) cosine similarity of position (row, col) to every position."""
        if self.similarity is not None:
            return self.similarity[row, col]
        gh, gw = self.grid
        return (self.unit @ self.unit[row * gw + col]).reshape(gh, gw)


def pos_embed_data(pos: np.ndarray, grid: tuple[int, int], prefix_rows: int) -> PosEmbedData:
    """Similarities (and, for grids up to `MOSAIC_MAX_POSITIONS`, the mosaic) of a resampled position embedding
    (the worker calls this, off the GUI thread)."""
    from vitviz.gui.panels.overview import mosaic

    pos = np.asarray(pos, dtype=np.float32).reshape(-1, np.shape(pos)[-1])          # (1, N_pos, D) -> (N_pos, D)
    gh, gw = int(grid[0]), int(grid[1])
    rows = pos[prefix_rows:]
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    unit = (rows / np.where(norms > 0, norms, 1.0)).astype(np.float32)               # (N, D)
    gap = 1
    if gh * gw <= MOSAIC_MAX_POSITIONS:
        cls_sim = analysis.prefix_pos_similarity(pos, grid, prefix_rows).astype(np.float32) if prefix_rows else None
        sim = analysis.pos_embed_similarity(pos, grid, prefix_rows).astype(np.float32)  # (gh, gw, gh, gw)
        return PosEmbedData((gh, gw), pos, prefix_rows, unit, sim, cls_sim, mosaic(sim, False, gap), gap,
                            float(np.nanmin(sim)))
    cls_sim = None  # a large grid: from the unit rows already made, not another float64 copy of the embedding
    if prefix_rows:
        c = pos[0] / max(float(np.linalg.norm(pos[0])), np.finfo(np.float32).tiny)
        cls_sim = (unit @ c.astype(np.float32)).reshape(gh, gw)
    low = float(cls_sim.min()) if cls_sim is not None else 1.0
    picks = np.linspace(0, gh * gw - 1, LEVEL_SAMPLE_ROWS).astype(int)
    for chunk in np.array_split(picks, 4):
        low = min(low, float((unit[chunk] @ unit.T).min()))                          # (16, N) at a time
    return PosEmbedData((gh, gw), pos, prefix_rows, unit, None, cls_sim, None, gap, low)
