"""What the window's panels ask of a windowed result (Swin, SAM / ViTDet), as plain NumPy (no Qt, no torch).

`WindowedMaps` is the per-image holder (the windowed sibling of `vitviz.core.analyses.maps.ResultMaps`): it makes and caches,
per stage,

- `stack('received', stage)`: the attention each patch receives, stitched from its windows, per block and head
  with the head mean and max (`vitviz.core.analyses.maps.MapStack`, (blocks, H + 2, gh, gw) on the stage's grid);
- `stack('query:N', stage)`: first-stage patch N's attention inside its window in every block of the stage, each
  key drawn at its cell of the unshifted image (a shifted window is drawn as it is after the model's roll: a
  window rolled across the edge covers cells on both sides);
- `stack('rollout', stage)`: rollout through the blocks of one grid (SAM / ViTDet: the encoder, or its global
  blocks only with `rollout(blocks='global')`); for Swin across stages `rollout_reason` says why not
  (`RolloutUndefined` when asked);
- `outlines(block)`: the block's window outlines as line segments on the unshifted image (`WindowOutlines`; a
  shifted block's windows that wrap around the edge show as the pieces they are there, and the shift mask's
  region boundaries fall on those outlines), `query_outline(block, cell0)` the outline of the query's own window;
- `overview(stage)`: the layer x head overview of a stage (mean attention distance in cells of that stage and
  entropy, per block and head: `StageOverview`);
- `info_rows()`: Model-info rows listing the stages (depth, heads, width, window, grid) and every block
  ('windowed (7×7, shift 3)' / 'global (64×64)');
- `arrays()`: exactly what `vitviz export --npz` writes for this image (the export calls it), `nbytes`: the
  memory held;
- what every per-image holder answers (`vitviz.core.analyses.maps.ImageMaps`, as `ResultMaps` does; the window,
  export and `vitviz.show` ask only this): `view(kind, layer)` (the stack, row and stride that show one block, the
  layer counting blocks over all stages; `view_or_pending` a placeholder titled with why where there is none: a
  plain ViT's map, rollout across Swin's patch merging), `has`, `unshown`, `stack_or_pending`, `head_stats()`
  (distance in pixels, entropy, patch share per block and head), `resolved`; `holder_of(result)` makes the holder
  of a result of either lane.

A stack's rows are the blocks of its stage (`layers(kind, stage)` gives their block indices); its patch size for
drawing is the stage's stride (`stride(stage)`, input pixels per cell), so the image panel's `MapStack` drawing
works unchanged. Segments are (K, 2, 2) float32 `[[x0, y0], [x1, y1]]` in cells of the block's stage (x: column,
y: row; cell (r, c) covers [c, c + 1] x [r, r + 1]); times the stride they are input pixels.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vitviz.core.analyses.mapkinds import KINDS, WINDOWED_KINDS
from vitviz.core.analyses.maps import ImageMaps, MapKind, MapStack, ResultMaps, SelectionError
from vitviz.core.analyses.rollout import RolloutParams
from vitviz.core.analyses.winmaps import (cell_of_token, key_stack, query_stack, received_stack, region_labels,
                                          rollout_stack, rollout_unavailable, stage_blocks, stage_cell, window_labels)
from vitviz.core.protocol import windowed
from vitviz.core.spec import AttentionResult
from vitviz.core.winspec import BlockGeometry, WindowedResult, WindowedSpec

ROLLOUT_BLOCKS = ("all", "global")
CHUNK = 1 << 22          # attention elements handled at once by the overview (16 MB of float32)


class RolloutUndefined(SelectionError):
    """Rollout asked where it is not defined (across Swin's patch merging); the message says why."""


# ------------------------------------------------------------------------------------------------ outlines

def _runs(flags: np.ndarray) -> list[tuple[int, int]]:
    """[start, stop) of every run of True in a 1-D bool array."""
    d = np.diff(np.concatenate([[0], flags.astype(np.int8), [0]]))
    return list(zip(np.flatnonzero(d == 1).tolist(), np.flatnonzero(d == -1).tolist()))


def edge_segments(horizontal: np.ndarray, vertical: np.ndarray) -> np.ndarray:
    """(K, 2, 2) float32 segments from edge flags: `horizontal` (gh + 1, gw), True where the edge along y = r
    over column c is drawn; `vertical` (gh, gw + 1), the edge along x = c beside row r. Neighbouring edges on
    one line join into one segment."""
    segs: list[tuple[tuple[float, float], tuple[float, float]]] = []
    for y in range(horizontal.shape[0]):
        segs += [((a, y), (b, y)) for a, b in _runs(horizontal[y])]
    for x in range(vertical.shape[1]):
        segs += [((x, a), (x, b)) for a, b in _runs(vertical[:, x])]
    return np.asarray(segs, np.float32).reshape(-1, 2, 2)


def _edges(labels: np.ndarray, outside: int = -1) -> tuple[np.ndarray, np.ndarray]:
    """Edge flags where neighbouring cells of `labels` (gh, gw) differ, the grid's border counting as cells
    labelled `outside`."""
    p = np.pad(labels, 1, constant_values=outside)
    return p[:-1, 1:-1] != p[1:, 1:-1], p[1:-1, :-1] != p[1:-1, 1:]


def label_outlines(labels: np.ndarray) -> np.ndarray:
    """Segments along every edge between cells of different labels, and around the grid."""
    return edge_segments(*_edges(np.asarray(labels, np.int64)))


def mask_outline(mask: np.ndarray) -> np.ndarray:
    """Segments around the cells of a (gh, gw) bool mask (where they meet the rest or the border)."""
    return edge_segments(*_edges(np.asarray(mask, np.int64), outside=0))


def window_outlines(geom: BlockGeometry) -> np.ndarray:
    """The block's window outlines on the unshifted grid: edges between cells of different windows (after the
    shift) and the grid's border. An unshifted 8 x 8 grid of 4 x 4 windows: the border, x = 4 and y = 4; shifted
    by 2: x = 2, 6 and y = 2, 6 (the window holding the four corners has no inner edge of its own)."""
    return label_outlines(window_labels(geom))


def region_outlines(geom: BlockGeometry) -> np.ndarray:
    """Segments between cells of different shift-mask regions (`region_labels`). On the unshifted image these
    are the window outlines themselves: cells of one window in different regions are never neighbours there (the
    mask cuts a window where the roll joined far sides of the grid; tests check this), so a view needs
    `window_outlines` only."""
    return label_outlines(region_labels(geom))


@dataclass(frozen=True)
class WindowOutlines:
    """What the outline item draws for one block: `segments` (K, 2, 2) in cells of the block's stage, `stride`
    input pixels per cell, `grid` the stage's grid, `text` the block's attention ('windowed (7×7, shift 3)')."""

    block: int
    segments: np.ndarray
    stride: int
    grid: tuple[int, int]
    text: str

    def pixels(self) -> np.ndarray:
        """The segments in input pixels."""
        return self.segments * np.float32(self.stride)


# ------------------------------------------------------------------------------------------------ overview

def _pieces(shape: tuple[int, ...]) -> list[tuple[slice, slice, slice]]:
    """(windows, heads, queries) slices of a (windows, heads, n, n) array, each about CHUNK elements or fewer
    (whole windows while they fit, else one window's heads, else one head's query rows), so that the overview of
    SAM's global blocks (12 x 4096^2) needs no full-size temporaries."""
    nw, h, n, k = shape
    per_window = h * n * k
    if per_window <= CHUNK:
        step = CHUNK // per_window
        return [(slice(w, w + step), slice(None), slice(None)) for w in range(0, nw, step)]
    if n * k <= CHUNK:
        step = CHUNK // (n * k)
        return [(slice(w, w + 1), slice(i, i + step), slice(None)) for w in range(nw) for i in range(0, h, step)]
    step = max(1, CHUNK // k)
    return [(slice(w, w + 1), slice(i, i + 1), slice(q, q + step)) for w in range(nw) for i in range(h)
            for q in range(0, n, step)]


def block_distance(attn: np.ndarray, geom: BlockGeometry) -> np.ndarray:
    """(H,) float64 mean attention distance in cells of the block's stage (between cell centres on the unshifted
    image), as `vitviz.core.analyses.analysis.mean_attention_distance` for plain ViTs: real queries only; attention to
    padding tokens dropped and each row renormalised over the real keys; a row with no mass on real keys is
    left out (NaN when all are)."""
    pos = geom.positions                                                    # (nW, n)
    real = pos >= 0
    r, c = np.divmod(np.where(real, pos, 0), geom.grid[1])
    r, c = r.astype(np.float32), c.astype(np.float32)
    a = np.asarray(attn)
    total, count = np.zeros(a.shape[1]), np.zeros(a.shape[1])
    for ws, hs, qs in _pieces(a.shape):
        keep = real[ws]                                                     # (w, n) keys
        dist = np.hypot(r[ws, qs, None] - r[ws, None, :], c[ws, qs, None] - c[ws, None, :])   # (w, q, n)
        dist *= keep[:, None, :]
        block = np.asarray(a[ws, hs, qs], np.float32)                       # (w, h, q, n)
        weighted = np.einsum("whqk,wqk->whq", block, dist)
        mass = np.einsum("whqk,wk->whq", block, keep.astype(np.float32))
        ok = (mass > 0) & real[ws, None, qs]
        per_query = np.where(ok, weighted / np.where(ok, mass, 1.0), 0.0)
        total[hs] += per_query.sum(axis=(0, 2), dtype=np.float64)
        count[hs] += ok.sum(axis=(0, 2))
    return np.where(count > 0, total / np.maximum(count, 1), np.nan)


def block_patch_share(attn: np.ndarray, geom: BlockGeometry) -> np.ndarray:
    """(H,) float64 the share of the real queries' attention that lands on real patches (the rest goes to the
    padding tokens of windows cut past the image's edge); 1 without padding."""
    real = geom.positions >= 0
    a = np.asarray(attn)
    total = np.zeros(a.shape[1])
    for ws, hs, qs in _pieces(a.shape):
        block = np.asarray(a[ws, hs, qs], np.float32)
        mass = np.einsum("whqk,wk->whq", block, real[ws].astype(np.float32))
        total[hs] += (mass * real[ws, None, qs]).sum(axis=(0, 2), dtype=np.float64)
    return total / max(int(real.sum()), 1)


def block_entropy(attn: np.ndarray, geom: BlockGeometry) -> np.ndarray:
    """(H,) float64 mean Shannon entropy (nats) of the real queries' rows over their window's tokens (padding
    tokens included: the row sums to 1 over them); 0 log 0 counts as 0. A uniform 7 x 7 window: log 49."""
    real = geom.positions >= 0
    a = np.asarray(attn)
    total = np.zeros(a.shape[1])
    for ws, hs, qs in _pieces(a.shape):
        block = np.asarray(a[ws, hs, qs], np.float32)
        ent = -(block * np.log(np.where(block > 0, block, 1.0))).sum(axis=-1)   # (w, h, q)
        total[hs] += (ent * real[ws, None, qs]).sum(axis=(0, 2), dtype=np.float64)
    return total / max(int(real.sum()), 1)


@dataclass(frozen=True)
class StageOverview:
    """The layer x head overview of one stage: per block (rows) and head (columns).

    Attributes:
        blocks: the blocks' indices over the model; labels: 'block 3 · windowed (7×7, shift 3)'.
        distance: (B, H) mean attention distance in cells of this stage (times `stride`: input pixels).
        entropy: (B, H) mean attention entropy in nats (a uniform row over n tokens: log n).
    """

    stage: int
    blocks: tuple[int, ...]
    labels: tuple[str, ...]
    distance: np.ndarray
    entropy: np.ndarray
    stride: int
    grid: tuple[int, int]

    @property
    def nbytes(self) -> int:
        return int(self.distance.nbytes + self.entropy.nbytes)


# ------------------------------------------------------------------------------------------------ info rows

def _size(hw: tuple[int, int]) -> str:
    return f"{hw[0]}×{hw[1]}"


def info_rows(spec: WindowedSpec, geometry: tuple[BlockGeometry, ...] | None = None) -> list[tuple[str, str]]:
    """(label, value) rows for Model info: the architecture, one row per stage (blocks, heads, width, window,
    grid and stride) and one per block ('windowed (7×7, shift 3)', 'global (64×64)'), at a run's `geometry`
    (default: the native size)."""
    geo = geometry or spec.geometry()
    kind = {"swin": "Swin", "swinv2": "Swin v2", "sam": "SAM / ViTDet image encoder"}.get(spec.arch, spec.arch)
    n_global = sum(g.is_global for g in geo)
    what = f"{kind}: {spec.num_stages} stage{'s' * (spec.num_stages != 1)}, {spec.depth} blocks"
    if n_global:
        what += f" ({n_global} global)"
    rows = [("architecture", what)]
    for s, depth in enumerate(spec.depths):
        blocks = [g for g in geo if g.stage == s]
        windows = sorted({_size(g.window) for g in blocks if not g.is_global})
        shifts = sorted({g.shift[0] if g.shift[0] == g.shift[1] else _size(g.shift) for g in blocks if g.shifted},
                        key=str)
        heads = spec.heads[s]
        parts = [f"{depth} block{'s' * (depth != 1)}", f"{heads} head{'s' * (heads != 1)}", f"width {spec.dims[s]}"]
        if windows:
            parts.append("window " + ", ".join(windows) + (f" (shift {', '.join(map(str, shifts))})" if shifts
                                                           else ""))
        if any(g.is_global for g in blocks):
            parts.append(f"{sum(g.is_global for g in blocks)} global")
        grid = blocks[0].grid if blocks else spec.stage_grids()[s]
        parts.append(f"{_size(grid)} tokens of {spec.stride(s)} px")
        rows.append((f"stage {s}", ", ".join(parts)))
    for g in geo:
        rows.append((f"stage {g.stage} block {g.index} (block {g.block})", g.describe()))
    return rows


# ------------------------------------------------------------------------------------------------ holder

WHY_NOT = {        # what a windowed result has not, that a plain ViT's has (`WindowedMaps.why_not`)
    "matrix": "No token matrix: this windowed model (Swin, SAM / ViTDet) attends inside windows, not over all tokens "
              "at once. The image panel shows its maps: 'Attention received (windows)', and 'Attention of a patch in "
              "its window' (click a patch); `vitviz export --npz` writes every window's matrix",
    "features": "No token features: this dock shows the block outputs of vitviz's reference ViT; a windowed model's "
                "(Swin, SAM / ViTDet) are not captured (Swin's grid changes at every patch merging). Its attention "
                "maps are in the image panel",
}

class WindowedMaps:
    """Lazily computed, cached views of one windowed result (the window keeps one per image).

    Besides its own views it is an `vitviz.core.analyses.maps.ImageMaps`, as `ResultMaps` is: `view(kind, layer)`
    is the stack, row and stride that show one block's map (the layer selection counts blocks over all stages),
    `outlines` / `query_outline` the block's windows, `caption`, `row_blocks`, `picks`, `has`, `unshown`,
    `stack_or_pending`, `resolved`, `head_stats`, `heads_of`, `nbytes`, `write_npz`, `result`, `grid`, `title`."""

    title = ""   # what every stack's title starts with before its own (a clean run's: nothing)

    def __init__(self, result: WindowedResult) -> None:
        self.result = result
        self._stacks: dict[tuple, MapStack] = {}
        self._overviews: dict[int, StageOverview] = {}
        self._outlines: dict[int, WindowOutlines] = {}
        self._stats: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        # what the on-demand passes of a plain ViT keep (none of them runs for a windowed model)
        self.features = None
        self.norms = None
        self.prefix_norms = None
        self.norm_histogram = None
        self.texts: dict[str, object] = {}

    # ------------------------------------------------------------------ structure
    @property
    def spec(self) -> WindowedSpec:
        return self.result.spec

    @property
    def geometry(self) -> tuple[BlockGeometry, ...]:
        return self.result.geometry

    @property
    def num_stages(self) -> int:
        return self.spec.num_stages

    def stage_grid(self, stage: int) -> tuple[int, int]:
        return self.geometry[stage_blocks(self.result, stage)[0]].grid

    def stride(self, stage: int) -> int:
        """Input pixels per cell of `stage` (the patch size a stage's stack is drawn with)."""
        return self.geometry[stage_blocks(self.result, stage)[0]].stride

    def _stage(self, stage: int | None) -> int:
        if stage is None:
            return 0
        stage_blocks(self.result, stage)      # in range, or SelectionError
        return int(stage)

    @property
    def grid(self) -> tuple[int, int]:
        """The first stage's grid at this run (what a query patch index counts in)."""
        return self.geometry[0].grid

    def block_of(self, layer: int | str) -> BlockGeometry:
        """The block a layer selection names: an index over all blocks (negative from the end, clamped into
        range); 'mean' / 'all' (no mean over blocks: the stages' grids differ) name the last block."""
        n = len(self.geometry)
        b = n - 1 if isinstance(layer, str) else int(layer) + n if int(layer) < 0 else int(layer)
        return self.geometry[max(0, min(n - 1, b))]

    def heads_of(self, layer: int | str) -> int:
        return int(self.result.blocks[self.block_of(layer).block].shape[1])

    @property
    def rollout_depth(self) -> int:
        """The blocks a rollout multiplies (`ImageMaps.rollout_depth`): SAM / ViTDet's global ones where it has
        some, a Swin of one stage all its blocks; 1 where rollout is not defined (across Swin's patch merging)."""
        return len(self.layers("rollout", 0, self.rollout_blocks())) if self.num_stages == 1 else 1

    @property
    def query_count(self) -> int:
        """The token indices a query may name: the first stage's patches, no prefix tokens (`ImageMaps.query_count`)."""
        return self.grid[0] * self.grid[1]

    def why_not(self, what: str) -> str | None:
        """Why this result has no token matrix ('matrix') or token features ('features') (`ImageMaps.why_not`)."""
        return WHY_NOT.get(what)

    def rollout_blocks(self) -> str:
        """The blocks the window's rollout goes through: SAM / ViTDet's global ones where it has some, else all
        (within one grid)."""
        return "global" if any(g.is_global for g in self.geometry) else "all"

    def unshown(self, kind: MapKind) -> str | None:
        """Why this result has no map of `kind` (None: it has): a plain ViT's map (the table of map kinds says
        which a windowed model gives), or rollout across Swin's patch merging."""
        if kind.kind == "rollout":
            return self.rollout_reason(None, self.rollout_blocks())
        if KINDS[kind.kind].windows:
            return None
        if kind.kind == "cls":
            return ("a windowed model (Swin, SAM / ViTDet) has no CLS token: see 'Attention received (windows)' or "
                    "'Attention of a patch in its window'")
        return (f"the {kind.label} map is a plain ViT's (attention over all tokens); a windowed model attends inside "
                "windows: see 'Attention received (windows)' or 'Attention of a patch in its window'")

    def has(self, kind: MapKind) -> bool:
        """Whether this result gives maps of `kind` (the windowed kinds, rollout where it is defined)."""
        return self.unshown(kind) is None

    def relevance(self, target: int | None = None) -> None:
        """No class relevance: its gradient passes are the reference ViT's (`ResultMaps.relevance`)."""
        return None

    def resolved(self, kind: MapKind) -> MapKind:
        """The kind a map really is, which names its files (a windowed map is what it says)."""
        return kind

    def view(self, kind: MapKind | str, layer: int | str = -1) -> tuple[MapStack, int, int]:
        """The stack that shows block `layer`'s (`block_of`) map of `kind`, the block's row in it and the input
        pixels per cell of the stack's grid (`vitviz.core.analyses.maps.ImageMaps`): its stage's stack for
        'received', 'query:N' and 'key:N'; for rollout (where defined: SAM / ViTDet's global blocks, a Swin of
        one stage) the rollout through the last of its blocks up to this one (the first when none is).

        Raises:
            RolloutUndefined: rollout across Swin's patch merging; SelectionError: a plain ViT's map."""
        kind = MapKind.parse(kind) if isinstance(kind, str) else kind
        g = self.block_of(layer)
        if kind.kind != "rollout":
            why = self.unshown(kind)
            if why is not None:
                raise SelectionError(why)
            return self.stack(kind, g.stage), g.index, g.stride
        blocks = self.rollout_blocks()
        why = self.rollout_reason(None, blocks)
        if why is not None:
            raise RolloutUndefined(why)
        rows = self.layers(kind, 0, blocks)
        p = kind.rollout
        params = RolloutParams(p.fusion, p.discard, min(p.start, len(rows) - 1), p.residual, p.query)
        cell0 = None if p.query is None else cell_of_token(self.spec, int(p.query), self.grid)
        below = [i for i, b in enumerate(rows) if b <= g.block]
        return self.rollout(0, params, cell0, blocks), (below[-1] if below else 0), self.stride(0)

    def view_or_pending(self, kind: MapKind | str, layer: int | str = -1) -> tuple[MapStack, int, int]:
        """`view`, or where this result has no such map a placeholder of zeros on the block's stage titled with why
        (`MapStack.pending`: never drawn into a file)."""
        try:
            return self.view(kind, layer)
        except SelectionError as exc:
            g = self.block_of(layer)
            kind = MapKind.parse(kind) if isinstance(kind, str) else kind
            depth = len(stage_blocks(self.result, g.stage))
            columns = self.heads_of(layer) if kind.per_head else 1
            return MapStack(np.zeros((depth, columns + 2, *g.grid), np.float32), np.zeros(3), str(exc),
                            pending=True), g.index, g.stride

    def stack_or_pending(self, kind: MapKind, stage: int | None = None) -> MapStack:
        """The stack of `kind` over the blocks of `stage` (default 0), or a placeholder titled with why."""
        first = stage_blocks(self.result, self._stage(stage))[0]
        if kind.kind == "rollout":
            return self.view_or_pending(kind, first)[0]
        if not self.has(kind):
            return self.view_or_pending(kind, first)[0]
        return self.stack(kind, stage)

    # ------------------------------------------------------------------ stacks
    def stack(self, kind: MapKind | str, stage: int | None = None) -> MapStack:
        """The stack of a map kind ('received', 'query:N', 'key:N', 'rollout', 'rollout:N', or a `MapKind`) over the
        blocks of `stage` (default 0; SAM / ViTDet have one). Rollout of a Swin with more than one stage is within
        the stage asked for, and refused without one (`RolloutUndefined`, saying why)."""
        kind = MapKind.parse(kind) if isinstance(kind, str) else kind
        if kind.kind == "rollout":
            cell0 = None if kind.rollout.query is None else cell_of_token(self.spec, kind.rollout.query)
            return self.rollout(stage, kind.rollout, cell0)
        s = self._stage(stage)
        key = (kind, s)
        if key not in self._stacks:
            if kind.kind == "received":
                self._stacks[key] = received_stack(self.result, s)
            elif kind.kind == "query":
                self._stacks[key] = query_stack(self.result, s, cell_of_token(self.spec, int(kind.token or 0)))
            elif kind.kind == "key":
                self._stacks[key] = key_stack(self.result, s, cell_of_token(self.spec, int(kind.token or 0)))
            else:
                raise SelectionError(f"the {kind.label} map is not a windowed model's view; expected "
                                     f"{', '.join(KINDS[k].syntax for k in WINDOWED_KINDS)}")
        return self._stacks[key]

    def received(self, stage: int | None = None, how: str = "mean") -> MapStack:
        """The received stack with the queries' 'mean' (the 'received' map) or their 'max'."""
        if how == "mean":
            return self.stack("received", stage)
        s = self._stage(stage)
        key = ("received", how, s)
        if key not in self._stacks:
            self._stacks[key] = received_stack(self.result, s, how)
        return self._stacks[key]

    def layers(self, kind: MapKind | str, stage: int | None = None, blocks: str = "all") -> list[int]:
        """The block index (over the model) of each row of `stack(kind, stage)`."""
        kind = MapKind.parse(kind) if isinstance(kind, str) else kind
        found = stage_blocks(self.result, self._stage(stage))
        if kind.kind == "rollout" and blocks == "global":
            found = [b for b in found if self.geometry[b].is_global]
        return found

    def rollout_reason(self, stage: int | None = None, blocks: str = "all") -> str | None:
        """Why rollout is not defined here, or None when it is: across Swin's patch merging (`stage` None with
        more than one stage) it is not; within one stage's grid it is; SAM / ViTDet's global-only rollout needs
        global blocks."""
        if blocks not in ROLLOUT_BLOCKS:
            return f"rollout blocks={blocks!r}: expected one of {', '.join(ROLLOUT_BLOCKS)}"
        if stage is None:
            why = rollout_unavailable(self.spec)
            if why is not None:
                return why + "; pick a stage to roll out within it"
        if blocks == "global" and not any(self.geometry[b].is_global for b in
                                          stage_blocks(self.result, self._stage(stage))):
            return (f"stage {self._stage(stage)} has no global blocks (every block attends inside windows); "
                    "rollout with blocks='all' takes the windowed blocks as block-diagonal matrices")
        return None

    def rollout(self, stage: int | None = None, params: RolloutParams | None = None,
                cell0: tuple[int, int] | None = None, blocks: str = "all") -> MapStack:
        """Rollout within one stage's grid from the query at first-stage cell `cell0` (None: the mean of the
        patch queries), through all its blocks (windowed ones as block-diagonal matrices) or, with
        blocks='global', through the global blocks only (SAM / ViTDet). Raises `RolloutUndefined` with the reason
        where it is not defined (a Swin with several stages and no stage given)."""
        why = self.rollout_reason(stage, blocks)
        if why is not None:
            raise RolloutUndefined(why)
        s = self._stage(stage)
        params = params or RolloutParams()
        key = ("rollout", s, params, cell0, blocks)
        if key not in self._stacks:
            only = self.layers("rollout", s, blocks) if blocks == "global" else None
            self._stacks[key] = rollout_stack(self.result, s, params, cell0, only)
        return self._stacks[key]

    # ------------------------------------------------------------------ outlines
    def outlines(self, block: int | str) -> WindowOutlines:
        """Block `block`'s window outlines on the unshifted image (cells of its stage); a layer selection as `view`
        takes it (negative from the end, 'mean' / 'all': the last block)."""
        n = len(self.geometry)
        if not isinstance(block, str) and not -n <= block < n:
            raise SelectionError(f"block {block} out of range: the model has {n} blocks (0-{n - 1})")
        block = self.block_of(block).block
        if block not in self._outlines:
            g = self.geometry[block]
            self._outlines[block] = WindowOutlines(block, window_outlines(g), g.stride, g.grid, g.describe())
        return self._outlines[block]

    def query_outline(self, block: int | str, cell0: tuple[int, int]) -> np.ndarray:
        """Segments around the window that holds the query at first-stage cell `cell0` in block `block` (after
        the shift: a window rolled across the edge gives the pieces on both sides)."""
        g = self.geometry[self.outlines(block).block]     # in range, or SelectionError
        r, c = stage_cell(self.spec, g.stage, cell0)
        if not (0 <= r < g.grid[0] and 0 <= c < g.grid[1]):
            raise SelectionError(f"query cell {cell0} is outside the image's first-stage grid")
        window = int(g.slot_of[r * g.grid[1] + c][0])
        return mask_outline(g.window_cells(window))

    def row_blocks(self, kind: MapKind, layer: int | str) -> list[int]:
        """The block (over the model) each row of `view(kind, layer)`'s stack shows: the selected block's stage,
        or the blocks a rollout goes through."""
        if kind.kind == "rollout" and self.unshown(kind) is None:
            return self.layers(kind, 0, self.rollout_blocks())
        g = self.block_of(layer)
        return [b.block for b in self.geometry if b.stage == g.stage]

    def caption(self, kind: MapKind, layer: int | str, row: int, stack: MapStack) -> tuple[str, str]:
        """(what the map is, which block it shows) for a title (`vitviz.core.analyses.maps.ImageMaps.caption`):
        the stack's title without its stage, 'stage 1 · block 0 (block 2: windowed (7×7))'; a rollout 'through
        block 5 (global blocks)'."""
        g = self.block_of(layer)
        what = stack.title.removesuffix(f", stage {g.stage}")          # the stage is said with the block
        if kind.kind == "rollout" and not stack.pending:
            through = self.layers(kind, 0, self.rollout_blocks())[row]
            return what, f"through block {through}" + (" (global blocks)" if self.rollout_blocks() == "global" else "")
        return what, f"stage {g.stage} · block {g.index} (block {g.block}: {g.describe()})"

    # ------------------------------------------------------------------ overview and info
    def overview(self, stage: int | None = None) -> StageOverview:
        """Mean attention distance and entropy per block and head of `stage` (`StageOverview`)."""
        s = self._stage(stage)
        if s not in self._overviews:
            blocks = stage_blocks(self.result, s)
            geo = [self.geometry[b] for b in blocks]
            dist = np.stack([block_distance(self.result.blocks[b], g) for b, g in zip(blocks, geo)])
            ent = np.stack([block_entropy(self.result.blocks[b], g) for b, g in zip(blocks, geo)])
            labels = tuple(f"block {g.block} · {g.describe()}" for g in geo)
            self._overviews[s] = StageOverview(s, tuple(blocks), labels, dist, ent, geo[0].stride, geo[0].grid)
        return self._overviews[s]

    def info_rows(self) -> list[tuple[str, str]]:
        """Model-info rows at this result's size (`info_rows`)."""
        return info_rows(self.spec, self.geometry)

    def head_stats(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """What the head-statistics dock shows, per block (over all stages) and head, as `ResultMaps.head_stats`:
        (B, H) mean attention distance in input pixels (cells of the block's stage times its stride), (B, H)
        entropy in nats, and (B, H, 1) the share of attention on the patches (no prefix tokens; below 1 only
        where windows hold padding). H is the most heads of any stage; a stage with fewer heads has NaN beyond
        its own."""
        if self._stats is None:
            n, h = len(self.geometry), self.spec.num_heads
            dist, ent, share = (np.full((n, h), np.nan) for _ in range(3))
            for s in range(self.num_stages):
                ov = self.overview(s)
                for row, b in enumerate(ov.blocks):
                    k = ov.distance.shape[1]
                    dist[b, :k] = ov.distance[row] * ov.stride
                    ent[b, :k] = ov.entropy[row]
                    share[b, :k] = block_patch_share(self.result.blocks[b], self.geometry[b])
            self._stats = (dist, ent, share[:, :, None])
        return self._stats

    # ------------------------------------------------------------------ export and memory
    def arrays(self) -> dict[str, np.ndarray]:
        """Exactly the arrays `vitviz export --npz` writes for this image (`vitviz.batch.windowed` calls this):
        'block{i}' (windows, heads, n, n) and 'block{i}_positions' per block, 'logits', 'input', 'image', 'spec',
        'source', 'geometry', and 'features' / 'feature_map' when present."""
        return self.result.arrays()

    def write_npz(self, path: str | Path, overwrite: bool = False) -> Path:
        """Write `arrays()` as `vitviz export --npz` does (`vitviz.core.files.write_arrays_atomic`); returns the
        path written."""
        from vitviz.core import files

        return files.write_arrays_atomic(path, self.arrays(), overwrite)

    def picks(self, kind: MapKind) -> list[tuple[int, int | str]]:
        """Every (block, head) this result has a map of `kind` at, as `vitviz export` names them: every block with
        its own stage's heads; a rollout's blocks with head 'mean' (none where rollout is not defined)."""
        if kind.kind == "rollout":
            blocks = [] if self.unshown(kind) else self.layers(kind, 0, self.rollout_blocks())
            return [(b, "mean") for b in blocks]
        return [(g.block, h) for g in self.geometry for h in [*range(self.heads_of(g.block)), "mean", "max"]]

    @property
    def nbytes(self) -> int:
        """Memory held by the result and the views made from it."""
        stacks = sum(s.maps.nbytes for s in self._stacks.values())
        outlines = sum(o.segments.nbytes for o in self._outlines.values())
        stats = 0 if self._stats is None else sum(a.nbytes for a in self._stats)
        return int(self.result.nbytes + stacks + outlines + stats + sum(o.nbytes for o in self._overviews.values()))

    def precompute(self, stages: bool = True) -> None:
        """What the window shows first for every image (received stacks and overviews of every stage, the
        outlines, the head statistics); the worker calls this off the GUI thread."""
        for s in range(self.num_stages if stages else 1):
            self.stack("received", s)
            self.overview(s)
        for g in self.geometry:
            self.outlines(g.block)
        if stages:
            self.head_stats()


def holder_of(result: AttentionResult | WindowedResult) -> ImageMaps:
    """The per-image holder (`ImageMaps`) of a result of either lane: `WindowedMaps` for a windowed model's
    (`vitviz.core.protocol.windowed`), `ResultMaps` for a plain ViT's."""
    return WindowedMaps(result) if windowed(result) else ResultMaps(result)  # type: ignore[arg-type]
