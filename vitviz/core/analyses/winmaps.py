"""Maps of windowed attention over the image (no Qt, no torch): what the window's views and `vitviz export` draw
for Swin and SAM / ViTDet models.

A windowed block's attention is (windows, heads, n, n); `BlockGeometry.positions` says which grid cell each window
token is (after the cyclic shift; -1 for padding). Two maps follow from it, per block and per stage:

- `query_map`: the attention one patch query gives inside its window, placed at each key's place on the stage's
  grid (zero outside the window; a shifted window is drawn where it lies after the shift, so a window rolled across
  the edge covers cells on both sides). Attention to padding tokens has no cell: `padding_share` says how much.
- `key_map`: the attention one patch receives from each query of its window, at each query's cell (the key's
  column, where `query_map` is the query's row).
- `received_map`: the attention each patch receives, stitched from the windows into one map of the grid: per key,
  the mean over the real queries of its window of their attention to it (for a global block this is the plain
  ViT's 'mean' map). 'max' takes the largest instead.

`received_stack` / `query_stack` / `key_stack` turn a stage's blocks into a `vitviz.core.analyses.maps.MapStack`
((blocks, H + 2, gh, gw): heads, head mean, head max), the unit `vitviz.core.drawing.render.draw_map` and the window's image panel draw, with the
stage's stride (input pixels per token) as its patch size. `window_labels` numbers each cell's window (the outlines
a view draws where neighbouring labels differ) and `region_labels` the shift mask's regions.

Rollout multiplies token-to-token matrices of one grid, so it is defined within a stage (SAM / ViTDet: all blocks,
global ones and windowed ones as block-diagonal matrices) but not across Swin's patch merging: `rollout_stack`
refuses that with the reason (`rollout_unavailable`).
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from vitviz.core.analyses.maps import MapStack, SelectionError, _fused_stack
from vitviz.core.analyses.rollout import RolloutEngine, RolloutParams
from vitviz.core.analyses.tokens import fuse_heads
from vitviz.core.winspec import BlockGeometry, WindowedResult, WindowedSpec



# ----------------------------------------------------------------------------------------------- one block

def received_map(attn: np.ndarray, geom: BlockGeometry, how: str = "mean") -> np.ndarray:
    """(H, gh, gw) float32: the attention each patch receives from the real queries of its window, their mean
    ('mean') or the largest ('max').

    Args:
        attn: one block's (windows, heads, n, n) attention (queries on axis 2).
    """
    pos = geom.positions                                                  # (nW, n)
    real = pos >= 0
    a = np.asarray(attn, dtype=np.float32)
    if how == "mean":
        counts = np.maximum(real.sum(axis=1), 1).astype(np.float32)      # real queries per window
        per_key = np.einsum("whqk,wq->whk", a, real.astype(np.float32)) / counts[:, None, None]
    elif how == "max":
        per_key = np.where(real[:, None, :, None], a, -np.inf).max(axis=2)
    else:
        raise SelectionError(f"how={how!r}; expected 'mean' or 'max'")
    out = np.zeros((a.shape[1], geom.grid[0] * geom.grid[1]), np.float32)
    w, t = np.nonzero(real)
    out[:, pos[w, t]] = per_key[w, :, t].T                                 # (H, cells)
    return out.reshape(a.shape[1], *geom.grid)


def query_map(attn: np.ndarray, geom: BlockGeometry, cell: tuple[int, int]) -> np.ndarray:
    """(H, gh, gw) float32: the attention row of the patch query at grid cell `cell` (row, col of this stage's
    grid), each key at its cell; 0 outside the query's window."""
    r, c = cell
    if not (0 <= r < geom.grid[0] and 0 <= c < geom.grid[1]):
        raise SelectionError(f"query cell {cell} is outside the {geom.grid[0]}x{geom.grid[1]} grid of stage "
                             f"{geom.stage}")
    w, t = geom.slot_of[r * geom.grid[1] + c]
    row = np.asarray(attn[w, :, t], dtype=np.float32)                     # (H, n) over the window's keys
    pos = geom.positions[w]
    out = np.zeros((row.shape[0], geom.grid[0] * geom.grid[1]), np.float32)
    out[:, pos[pos >= 0]] = row[:, pos >= 0]
    return out.reshape(row.shape[0], *geom.grid)


def key_map(attn: np.ndarray, geom: BlockGeometry, cell: tuple[int, int]) -> np.ndarray:
    """(H, gh, gw) float32: the attention the patch at grid cell `cell` receives from each real query of its
    window, at each query's cell (the key's column of the window's attention); 0 outside the window."""
    r, c = cell
    if not (0 <= r < geom.grid[0] and 0 <= c < geom.grid[1]):
        raise SelectionError(f"key cell {cell} is outside the {geom.grid[0]}x{geom.grid[1]} grid of stage "
                             f"{geom.stage}")
    w, t = geom.slot_of[r * geom.grid[1] + c]
    column = np.asarray(attn[w, :, :, t], dtype=np.float32)               # (H, n) over the window's queries
    pos = geom.positions[w]
    out = np.zeros((column.shape[0], geom.grid[0] * geom.grid[1]), np.float32)
    out[:, pos[pos >= 0]] = column[:, pos >= 0]
    return out.reshape(column.shape[0], *geom.grid)


def padding_share(attn: np.ndarray, geom: BlockGeometry, cell: tuple[int, int]) -> np.ndarray:
    """(H,) the part of the query's attention that goes to padding tokens (no cell of the image holds it)."""
    w, t = geom.slot_of[cell[0] * geom.grid[1] + cell[1]]
    pad = geom.positions[w] < 0
    return np.asarray(attn[w, :, t][:, pad].sum(axis=-1), np.float32)


def window_labels(geom: BlockGeometry) -> np.ndarray:
    """(gh, gw) int: the window each grid cell is in at this block (after the shift)."""
    out = np.zeros(geom.grid[0] * geom.grid[1], np.int64)
    pos = geom.positions
    w, t = np.nonzero(pos >= 0)
    out[pos[w, t]] = w
    return out.reshape(geom.grid)


def region_labels(geom: BlockGeometry) -> np.ndarray:
    """(gh, gw) int: window * 9 + the shift mask's region of each cell (cells of one window in different regions
    do not attend to each other)."""
    out = np.zeros(geom.grid[0] * geom.grid[1], np.int64)
    pos, reg = geom.positions, geom.regions()
    w, t = np.nonzero(pos >= 0)
    out[pos[w, t]] = w * 9 + reg[w, t]
    return out.reshape(geom.grid)


def stage_cell(spec: WindowedSpec, stage: int, cell0: tuple[int, int]) -> tuple[int, int]:
    """The cell of `stage` holding the first stage's cell `cell0` (patch merging joins 2x2 cells per stage)."""
    f = 1 if spec.arch == "sam" else 2 ** stage
    return (cell0[0] // f, cell0[1] // f)


def cell_of_token(spec: WindowedSpec, token: int, grid: tuple[int, int] | None = None) -> tuple[int, int]:
    """A first-stage patch index (row-major, no prefix tokens) as its (row, col)."""
    gh, gw = grid or spec.grid
    if not 0 <= int(token) < gh * gw:
        raise SelectionError(f"query patch {token} out of range: the first stage has {gh}x{gw} = {gh * gw} patches "
                             f"(0-{gh * gw - 1})")
    return divmod(int(token), gw)


# ------------------------------------------------------------------------------------------------ stacks

def stage_blocks(result: WindowedResult, stage: int) -> list[int]:
    blocks = [g.block for g in result.geometry if g.stage == stage]
    if not blocks:
        raise SelectionError(f"stage {stage} out of range: the model has {result.spec.num_stages} stages")
    return blocks


def received_stack(result: WindowedResult, stage: int, how: str = "mean") -> MapStack:
    """The received map of every block of `stage` as a MapStack (blocks, H + 2, gh, gw)."""
    blocks = stage_blocks(result, stage)
    maps = np.stack([received_map(result.blocks[b], result.geometry[b], how) for b in blocks])
    return _fused_stack(maps, f"attention received ({how} over each window's queries), stage {stage}")


def query_stack(result: WindowedResult, stage: int, cell0: tuple[int, int]) -> MapStack:
    """The window attention of the query at first-stage cell `cell0` (at this stage: the cell holding it) in every
    block of `stage`."""
    blocks = stage_blocks(result, stage)
    cell = stage_cell(result.spec, stage, cell0)
    maps = np.stack([query_map(result.blocks[b], result.geometry[b], cell) for b in blocks])
    return _fused_stack(maps, f"window attention of patch {cell0} (cell {cell} of stage {stage})")


def key_stack(result: WindowedResult, stage: int, cell0: tuple[int, int]) -> MapStack:
    """The attention paid to the patch at first-stage cell `cell0` (at this stage: the cell holding it) by the
    queries of its window, in every block of `stage`."""
    blocks = stage_blocks(result, stage)
    cell = stage_cell(result.spec, stage, cell0)
    maps = np.stack([key_map(result.blocks[b], result.geometry[b], cell) for b in blocks])
    return _fused_stack(maps, f"window attention paid to patch {cell0} (cell {cell} of stage {stage})")


def block_stack(stack: MapStack, index: int) -> MapStack:
    """One block (`index` within its stage) of a stage's stack, on that block's own colour scale."""
    one = stack.maps[index: index + 1]
    h = stack.num_heads
    vmax = np.array([one[:, :h].max(), one[:, h].max(), one[:, h + 1].max()], dtype=np.float64)
    return MapStack(maps=one, vmax=vmax, title=stack.title)


# ----------------------------------------------------------------------------------------------- rollout

def dense_block(attn: np.ndarray, geom: BlockGeometry, fusion: str = "mean") -> np.ndarray:
    """(N, N) float32: block attention with its heads fused, as one token-to-token matrix of the stage's grid
    (windows block-diagonal; attention to padding tokens dropped)."""
    fused = fuse_heads(np.asarray(attn, np.float32).transpose(1, 0, 2, 3), fusion)     # (nW, n, n)
    n_cells = geom.grid[0] * geom.grid[1]
    out = np.zeros((n_cells, n_cells), np.float32)
    for w in range(geom.num_windows):
        pos = geom.positions[w]
        keep = pos >= 0
        out[np.ix_(pos[keep], pos[keep])] = fused[w][np.ix_(keep, keep)]
    return out


def rollout_unavailable(spec: WindowedSpec, stage: int | None = None) -> str | None:
    """Why rollout is not defined for this model (or stage), or None when it is (within one stage)."""
    if spec.arch != "sam" and stage is None and spec.num_stages > 1:
        return ("rollout multiplies the token-to-token attention of one grid; Swin's patch merging changes the grid "
                "between stages, so rollout through the whole model is not defined (it is within one stage)")
    return None


def rollout_stack(result: WindowedResult, stage: int, params: RolloutParams | None = None,
                  cell0: tuple[int, int] | None = None, blocks: Sequence[int] | None = None) -> MapStack:
    """Rollout through the blocks of one stage (SAM / ViTDet: the whole encoder), rolled out from the query at
    first-stage cell `cell0` (None: the mean over the patch queries): (blocks, 1 + 2, gh, gw).

    The heads are fused first (`params.fusion`), windowed blocks enter as block-diagonal matrices. `blocks`: only
    these blocks of the stage, in order (e.g. SAM's global ones); default all."""
    params = params or RolloutParams()
    found = stage_blocks(result, stage)
    if blocks is not None:
        stray = [b for b in blocks if b not in found]
        if stray or not blocks:
            raise SelectionError(f"rollout blocks {list(blocks)}: expected some of stage {stage}'s blocks {found}")
        found = list(blocks)
    geo = result.geometry[found[0]]
    dense = np.stack([dense_block(result.blocks[b], result.geometry[b], params.fusion) for b in found])[:, None]
    query = None
    if cell0 is not None:
        r, c = stage_cell(result.spec, stage, cell0)
        query = r * geo.grid[1] + c
    engine = RolloutEngine(dense, 0, False)
    single = RolloutParams("mean", params.discard, params.start, params.residual, query)
    maps = engine.through_each_layer(single).reshape(len(found), 1, *geo.grid)
    which = "" if blocks is None else f", blocks {', '.join(map(str, found))}"
    return _fused_stack(maps, f"rollout within stage {stage} ({params.fusion}{which})")
