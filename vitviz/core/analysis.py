"""Analyses over captured attention: token maps, rollout, attention distance, entropy, position-embedding similarity.

Plain NumPy (no torch, no Qt), cheap enough to run on the GUI thread for one view.

Every function takes either an `AttentionResult` (prefix count, grid and patch size come from its spec) or a raw
`(L, H, T, T)` array with `num_prefix` and `grid` passed explicitly; the grid is never guessed from `sqrt(T)`.
Token order is the reference ViT's: `num_prefix` prefix tokens (cls, dist, registers) first, then the patches in
row-major order, so token `num_prefix + r * gw + c` is patch (r, c). For a raw array, token 0 is taken to be the
CLS token whenever `num_prefix > 0`; for an `AttentionResult`, `spec.cls_token` decides.

Rollout convention (Abnar & Zuidema 2020, as in vit-explain, with its known bugs fixed):
    A'_l = rownorm(residual * I + (1 - residual) * discard(fuse_heads(A_l)))
    R = A'_{L-1} @ ... @ A'_{start_layer}
and the rollout of a query is its row of R: what the query token, at the output, draws from each input token.
`residual=0.5` is vit-explain's `(A + I) / 2`. Discarding is per row: in every row of the fused matrix the lowest
`floor(discard_ratio * num_patches)` patch entries are zeroed; prefix columns (CLS, dist, registers) are never
discarded and neither is the identity added afterwards. Per row, not vit-explain's one threshold per layer, because
rows are distributions of different queries: a global threshold empties diffuse rows and spares peaked ones.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Union

import numpy as np

from vitviz.core.spec import AttentionResult
from vitviz.errors import VitvizError

Head = Union[int, Literal["mean", "max"]]
Query = Union[int, Literal["cls", "mean"]]
Fusion = Literal["mean", "max", "min"]
AttentionLike = Union[AttentionResult, np.ndarray]

_TINY = np.finfo(np.float32).tiny


class AnalysisError(VitvizError, ValueError):
    """An analysis was asked for something the attention cannot give (wrong shape, no CLS token, bad index)."""


@dataclass(frozen=True)
class _Tokens:
    """The (L, H, T, T) array and how its tokens are laid out."""

    attn: np.ndarray
    num_prefix: int
    grid: tuple[int, int] | None
    has_cls: bool


def _tokens(attn: AttentionLike, num_prefix: int | None, grid: tuple[int, int] | None,
            need_grid: bool = True) -> _Tokens:
    """Validate the attention array and resolve the prefix count and grid from a result or the arguments."""
    has_cls: bool | None = None
    if isinstance(attn, AttentionResult):
        num_prefix = attn.spec.num_prefix if num_prefix is None else num_prefix
        grid = attn.spec.grid if grid is None else grid
        has_cls = attn.spec.cls_token
        attn = attn.attentions
    arr = np.asarray(attn)
    if arr.ndim != 4 or arr.shape[2] != arr.shape[3] or 0 in arr.shape:
        raise AnalysisError(f"expected attention of shape (L, H, T, T), found {arr.shape}")
    if num_prefix is None:
        raise AnalysisError("num_prefix is required with a raw (L, H, T, T) array")
    t = arr.shape[2]
    if not 0 <= num_prefix <= t:
        raise AnalysisError(f"num_prefix must lie in [0, {t}] for T={t}, found {num_prefix}")
    if grid is not None:
        gh, gw = int(grid[0]), int(grid[1])
        if gh < 1 or gw < 1 or num_prefix + gh * gw != t:
            raise AnalysisError(f"grid {gh}x{gw} with {num_prefix} prefix tokens makes "
                                f"{num_prefix + gh * gw} tokens, but the attention has T={t}")
        grid = (gh, gw)
    elif need_grid:
        raise AnalysisError("grid (rows, columns) is required with a raw array; it is never guessed from sqrt(T)")
    return _Tokens(arr, num_prefix, grid, num_prefix > 0 if has_cls is None else has_cls)


def _index(value: int, size: int, what: str) -> int:
    """A Python-style index (negative counts from the end) checked against `size`."""
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or not -size <= int(value) < size:
        raise AnalysisError(f"{what} must be an integer in [{-size}, {size}), found {value!r}")
    return int(value) % size


def _to_grid(vec: np.ndarray, tok: _Tokens) -> np.ndarray:
    """The patch part of a (T,) token vector as a (gh, gw) map."""
    assert tok.grid is not None
    return vec[tok.num_prefix:].reshape(tok.grid)  # (N,) -> (gh, gw)


def _fuse(block: np.ndarray, head: Head | Fusion) -> np.ndarray:
    """Reduce a (H, ...) block over heads: a head index, or 'mean' / 'max' / 'min'; always a new float32 array."""
    block = np.asarray(block, dtype=np.float32)
    if head == "mean":
        return block.mean(axis=0)
    if head == "max":
        return block.max(axis=0)
    if head == "min":
        return block.min(axis=0)
    if isinstance(head, str):
        raise AnalysisError(f"head must be an index, 'mean' or 'max' (rollout: 'mean', 'max', 'min'), found {head!r}")
    return block[_index(head, block.shape[0], "head")].copy()


def _query_rows(tok: _Tokens, query: Query) -> int | slice:
    """The row index of `query`: a token index, 'cls' (token 0) or 'mean' (all patch rows, as a slice)."""
    t = tok.attn.shape[2]
    if query == "cls":
        if not tok.has_cls:
            raise AnalysisError("this model has no CLS token, so CLS maps are undefined; "
                                "use query='mean' (mean over patch queries) or a token index")
        return 0
    if query == "mean":
        if tok.num_prefix == t:
            raise AnalysisError("query='mean' needs at least one patch token")
        return slice(tok.num_prefix, t)
    return _index(query, t, "query token")  # type: ignore[arg-type]


def attention_row(attn: AttentionLike, layer: int, head: Head, token: int) -> np.ndarray:
    """What `token` attends to in one layer: its full attention row, prefix tokens included.

    Returns:
        (T,) float32; sums to 1 for a single head or 'mean'.
    """
    tok = _tokens(attn, None if isinstance(attn, AttentionResult) else 0, None, need_grid=False)
    li = _index(layer, tok.attn.shape[0], "layer")
    ti = _index(token, tok.attn.shape[2], "token")
    return _fuse(tok.attn[li, :, ti, :], head)  # (H, T) -> (T,)


def token_map(attn: AttentionLike, layer: int, head: Head, query: Query,
              num_prefix: int | None = None, grid: tuple[int, int] | None = None) -> np.ndarray:
    """What `query` attends to over the patches, as a map; prefix keys are left out (not renormalised).

    `query` is a token index, 'cls', or 'mean' (the mean of the patch queries' rows, for models without CLS).
    Heads are fused per entry first ('max' is the maximum over heads), then averaged over queries for 'mean'.

    Returns:
        (gh, gw) float32.
    """
    tok = _tokens(attn, num_prefix, grid)
    rows = tok.attn[_index(layer, tok.attn.shape[0], "layer"), :, _query_rows(tok, query), :]  # (H, [nq,] T)
    fused = _fuse(rows, head)  # ([nq,] T)
    if fused.ndim == 2:
        fused = fused.mean(axis=0)
    return _to_grid(fused, tok)


def cls_attention(attn: AttentionLike, layer: int, head: Head = "mean",
                  num_prefix: int | None = None, grid: tuple[int, int] | None = None) -> np.ndarray:
    """The CLS token's attention over the patches, (gh, gw); raises `AnalysisError` for models without CLS."""
    return token_map(attn, layer, head, "cls", num_prefix, grid)


def attention_received(attn: np.ndarray, num_prefix: int, how: str = "mean") -> np.ndarray:
    """(L, H, N): the attention each patch receives from the patch queries, averaged ('mean') or maximised ('max')
    over them; float32 sums, also for float16 maps, and no copy of the whole stack.

    Args:
        attn: (L, H, T, T) attention; the first `num_prefix` tokens are prefix tokens.
    """
    patch = np.asarray(attn)[:, :, num_prefix:, num_prefix:]  # (L, H, N, N): queries on axis 2
    if how == "mean":
        return patch.mean(axis=2, dtype=np.float32)
    if how == "max":
        return patch.max(axis=2).astype(np.float32, copy=False)
    raise AnalysisError(f"how={how!r}; expected 'mean' or 'max'")


def attention_column(attn: AttentionLike, layer: int, head: Head, token: int,
                     num_prefix: int | None = None, grid: tuple[int, int] | None = None) -> np.ndarray:
    """What attends to `token`: its attention column over the patch queries, as a map.

    Returns:
        (gh, gw) float32; entry (r, c) is how much patch (r, c) attends to `token`.
    """
    tok = _tokens(attn, num_prefix, grid)
    li = _index(layer, tok.attn.shape[0], "layer")
    ti = _index(token, tok.attn.shape[2], "token")
    column = _fuse(tok.attn[li, :, :, ti], head)  # (H, T) -> (T,)
    return _to_grid(column, tok)


def _check_rollout_args(discard_ratio: float, residual: float, head_fusion: str) -> None:
    if not 0.0 <= discard_ratio < 1.0:
        raise AnalysisError(f"discard_ratio must lie in [0, 1), found {discard_ratio}")
    if not 0.0 <= residual <= 1.0:
        raise AnalysisError(f"residual must lie in [0, 1], found {residual}")
    if head_fusion not in ("mean", "max", "min"):
        raise AnalysisError(f"head_fusion must be 'mean', 'max' or 'min', found {head_fusion!r}")


def _discard_lowest(fused: np.ndarray, discard_ratio: float, num_prefix: int) -> None:
    """Zero, in place, the lowest `floor(discard_ratio * N)` patch entries of every row of a (T, T) matrix."""
    keys = fused[:, num_prefix:]  # (T, N) view; prefix columns are never candidates
    k = int(np.floor(discard_ratio * keys.shape[1] + 1e-9))
    if k == 0:
        return
    lowest = np.argpartition(keys, k - 1, axis=1)[:, :k]  # (T, k)
    np.put_along_axis(keys, lowest, 0.0, axis=1)


def rollout_layer_matrix(attn_layer: np.ndarray, head_fusion: Fusion = "mean", discard_ratio: float = 0.0,
                         residual: float = 0.5, num_prefix: int = 1) -> np.ndarray:
    """One layer's rollout factor A' = rownorm(residual * I + (1 - residual) * discard(fuse(A))).

    Args:
        attn_layer: (H, T, T) attention of one layer.

    Returns:
        (T, T) float32, rows sum to 1 (a row that lost all its mass stays 0).
    """
    _check_rollout_args(discard_ratio, residual, head_fusion)
    fused = _fuse(attn_layer, head_fusion)  # (H, T, T) -> (T, T), a fresh array
    if discard_ratio > 0:
        _discard_lowest(fused, discard_ratio, num_prefix)
    fused *= 1.0 - residual
    fused[np.diag_indices_from(fused)] += residual
    fused /= np.maximum(fused.sum(axis=1, keepdims=True), _TINY)
    return fused


def _query_vector(tok: _Tokens, query: Query) -> np.ndarray:
    """A (T,) row vector selecting the query: one-hot, or uniform over the patch tokens for 'mean'."""
    v = np.zeros(tok.attn.shape[2], dtype=np.float32)
    rows = _query_rows(tok, query)
    if isinstance(rows, slice):
        v[rows] = 1.0 / (rows.stop - rows.start)
    else:
        v[rows] = 1.0
    return v


def _rollout_vec(tok: _Tokens, head_fusion: Fusion, discard_ratio: float, start_layer: int, query: Query,
                 residual: float) -> np.ndarray:
    """(T,) query row of the rollout, pulled back through the layers last first: v <- v @ A'_l."""
    _check_rollout_args(discard_ratio, residual, head_fusion)
    start = _index(start_layer, tok.attn.shape[0], "start_layer")
    v = _query_vector(tok, query)  # (T,)
    for layer in range(tok.attn.shape[0] - 1, start - 1, -1):
        v = v @ rollout_layer_matrix(tok.attn[layer], head_fusion, discard_ratio, residual, tok.num_prefix)
    return v


def _rollout_mat(tok: _Tokens, head_fusion: Fusion, discard_ratio: float, start_layer: int,
                 residual: float) -> np.ndarray:
    """(T, T) rollout by the matrix chain R <- A'_l @ R, first layer first."""
    _check_rollout_args(discard_ratio, residual, head_fusion)
    start = _index(start_layer, tok.attn.shape[0], "start_layer")
    result = np.eye(tok.attn.shape[2], dtype=np.float32)  # (T, T)
    for layer in range(start, tok.attn.shape[0]):
        result = rollout_layer_matrix(tok.attn[layer], head_fusion, discard_ratio, residual,
                                      tok.num_prefix) @ result
    return result


def rollout_vector(attn: AttentionLike, head_fusion: Fusion = "mean", discard_ratio: float = 0.0,
                   start_layer: int = 0, query: Query = "cls", residual: float = 0.5,
                   num_prefix: int | None = None) -> np.ndarray:
    """The query's row of the rollout R = A'_{L-1} ... A'_{start_layer}, in O(L * T^2).

    Returns:
        (T,) float32 over all input tokens (prefix first); sums to 1 unless a row lost all its mass.
    """
    tok = _tokens(attn, num_prefix, None, need_grid=False)
    return _rollout_vec(tok, head_fusion, discard_ratio, start_layer, query, residual)


def rollout(attn: AttentionLike, head_fusion: Fusion = "mean", discard_ratio: float = 0.0, start_layer: int = 0,
            query: Query = "cls", residual: float = 0.5, num_prefix: int | None = None,
            grid: tuple[int, int] | None = None) -> np.ndarray:
    """Attention rollout of `query` over the patches (see the module docstring for the convention), O(L * T^2).

    `query` is a token index, 'cls' (raises for models without CLS) or 'mean' (mean over patch queries).
    Values are rollout mass, not rescaled; the mass on prefix tokens is left out (see `rollout_vector`).

    Returns:
        (gh, gw) float32.
    """
    tok = _tokens(attn, num_prefix, grid)
    return _to_grid(_rollout_vec(tok, head_fusion, discard_ratio, start_layer, query, residual), tok)


def rollout_matrix(attn: AttentionLike, head_fusion: Fusion = "mean", discard_ratio: float = 0.0,
                   start_layer: int = 0, residual: float = 0.5, num_prefix: int | None = None) -> np.ndarray:
    """The full rollout matrix R = A'_{L-1} @ ... @ A'_{start_layer}, by the matrix chain, O(L * T^3).

    Returns:
        (T, T) float32; row q is what token q at the output draws from each input token.
    """
    tok = _tokens(attn, num_prefix, None, need_grid=False)
    return _rollout_mat(tok, head_fusion, discard_ratio, start_layer, residual)


def rollout_naive(attn: AttentionLike, head_fusion: Fusion = "mean", discard_ratio: float = 0.0,
                  start_layer: int = 0, query: Query = "cls", residual: float = 0.5,
                  num_prefix: int | None = None, grid: tuple[int, int] | None = None) -> np.ndarray:
    """`rollout` through the full matrix chain (`rollout_matrix`); for tests and benchmarks. (gh, gw) float32."""
    tok = _tokens(attn, num_prefix, grid)
    matrix = _rollout_mat(tok, head_fusion, discard_ratio, start_layer, residual)  # (T, T)
    return _to_grid(_query_vector(tok, query) @ matrix, tok)


def _patch_distances(grid: tuple[int, int], patch_size: float) -> np.ndarray:
    """(N, N) Euclidean distances in pixels between patch centres of a row-major (gh, gw) grid."""
    rows, cols = np.divmod(np.arange(grid[0] * grid[1]), grid[1])  # (N,), (N,)
    dr = rows[:, None] - rows[None, :]  # (N, N)
    dc = cols[:, None] - cols[None, :]  # (N, N)
    return (patch_size * np.hypot(dr, dc)).astype(np.float32)


def mean_attention_distance(attn: AttentionLike, grid: tuple[int, int] | None = None,
                            patch_size: float | None = None, num_prefix: int | None = None) -> np.ndarray:
    """Mean attention distance in pixels per layer and head (Dosovitskiy et al. 2021, fig. 7).

    Only patch-to-patch attention counts: prefix tokens are dropped as queries and as keys, and each patch row
    is renormalised to sum 1 before weighting the distances between patch centres. A query row whose whole mass
    went to prefix tokens has no distance and is left out of the mean (NaN if every row is like that).

    Returns:
        (L, H) float64.
    """
    if patch_size is None and isinstance(attn, AttentionResult):
        patch_size = attn.spec.patch_size
    if patch_size is None or patch_size <= 0:
        raise AnalysisError(f"patch_size must be a positive number of pixels, found {patch_size!r}")
    tok = _tokens(attn, num_prefix, grid)
    assert tok.grid is not None
    dist = _patch_distances(tok.grid, patch_size)  # (N, N)
    p = tok.num_prefix
    out = np.empty(tok.attn.shape[:2], dtype=np.float64)  # (L, H)
    for layer in range(tok.attn.shape[0]):
        pp = np.asarray(tok.attn[layer, :, p:, p:], dtype=np.float32)  # (H, N, N)
        mass = pp.sum(axis=-1, dtype=np.float64)  # (H, N)
        weighted = np.einsum("hqk,qk->hq", pp, dist, dtype=np.float64)  # (H, N)
        ok = mass > 0
        per_query = np.where(ok, weighted / np.where(ok, mass, 1.0), 0.0)  # (H, N)
        count = ok.sum(axis=-1)  # (H,)
        out[layer] = np.where(count > 0, per_query.sum(axis=-1) / np.maximum(count, 1), np.nan)
    return out


def attention_entropy(attn: AttentionLike, num_prefix: int | None = None) -> np.ndarray:
    """Mean Shannon entropy (nats) of the attention rows, per layer and head; 0 * log 0 counts as 0.

    With `num_prefix=None` every query row counts; with an integer only the patch queries (rows from
    `num_prefix` on) do. Keys are always all T tokens, so a uniform row has entropy log(T).

    Returns:
        (L, H) float64.
    """
    arr = _tokens(attn, 0, None, need_grid=False).attn
    first = 0 if num_prefix is None else int(num_prefix)
    if not 0 <= first < arr.shape[2]:
        raise AnalysisError(f"num_prefix must lie in [0, {arr.shape[2]}), found {num_prefix}")
    out = np.empty(arr.shape[:2], dtype=np.float64)  # (L, H)
    for layer in range(arr.shape[0]):
        a = np.asarray(arr[layer, :, first:, :], dtype=np.float32)  # (H, nq, T)
        ent = -(a * np.log(np.maximum(a, _TINY))).sum(axis=-1, dtype=np.float64)  # (H, nq)
        out[layer] = ent.mean(axis=-1)
    return out


def _unit_rows(pos_embed: np.ndarray, grid: tuple[int, int], num_prefix_in_pos: int) -> np.ndarray:
    """Position-embedding rows scaled to unit length (zero rows stay zero), after checking the row count."""
    pe = np.asarray(pos_embed, dtype=np.float64)
    if pe.ndim == 3 and pe.shape[0] == 1:
        pe = pe[0]  # (1, N_pos, D) -> (N_pos, D)
    gh, gw = int(grid[0]), int(grid[1])
    if pe.ndim != 2 or pe.shape[0] != num_prefix_in_pos + gh * gw:
        raise AnalysisError(f"position embedding of shape {pe.shape} does not hold {num_prefix_in_pos} prefix "
                            f"rows plus a {gh}x{gw} grid; resample it to the grid first (core.posembed)")
    norms = np.linalg.norm(pe, axis=1, keepdims=True)  # (N_pos, 1)
    return pe / np.maximum(norms, np.finfo(np.float64).tiny)


def pos_embed_similarity(pos_embed: np.ndarray, grid: tuple[int, int], num_prefix_in_pos: int = 0) -> np.ndarray:
    """Cosine similarity between the position embeddings of every pair of grid positions.

    Args:
        pos_embed: (N_pos, D) or (1, N_pos, D), already resampled to `grid`; its first `num_prefix_in_pos`
            rows belong to prefix tokens (0 for `no_embed_class` models).

    Returns:
        (gh, gw, gh, gw) float64; [r, c] is the ViT-paper tile of position (r, c). Zero vectors give 0.
    """
    unit = _unit_rows(pos_embed, grid, num_prefix_in_pos)[num_prefix_in_pos:]  # (N, D)
    gh, gw = int(grid[0]), int(grid[1])
    return (unit @ unit.T).reshape(gh, gw, gh, gw)  # (N, N) -> (gh, gw, gh, gw)


def prefix_pos_similarity(pos_embed: np.ndarray, grid: tuple[int, int], num_prefix_in_pos: int,
                          index: int = 0) -> np.ndarray:
    """Cosine similarity of prefix row `index` (0: CLS) of the position embedding to each grid position, (gh, gw)."""
    if num_prefix_in_pos < 1:
        raise AnalysisError("this position embedding has no prefix rows (no_embed_class), "
                            "so there is no CLS position embedding to compare")
    unit = _unit_rows(pos_embed, grid, num_prefix_in_pos)  # (N_pos, D)
    row = unit[_index(index, num_prefix_in_pos, "prefix index")]  # (D,)
    return (unit[num_prefix_in_pos:] @ row).reshape(int(grid[0]), int(grid[1]))  # (N,) -> (gh, gw)


# ------------------------------------------------------------------------------------- token kinds
def attention_by_token_kind(attn: AttentionLike, num_prefix: int | None = None,
                            queries: str = "patches") -> np.ndarray:
    """Share of attention each prefix token receives, and the share left for all patches together, per layer/head.

    Args:
        attn: an `AttentionResult` or an (L, H, T, T) array (then `num_prefix` is required).
        queries: 'patches' averages over the patch queries (what the image tokens look at), 'all' over every
            token, 'cls' takes token 0's row only.

    Returns:
        (L, H, P + 1) float32: columns 0..P-1 are the prefix tokens in model order (cls, dist, reg0, ...), the
        last column is the sum over all patches; every (layer, head) row sums to 1.
    """
    tok = _tokens(attn, num_prefix, None, need_grid=False)
    a, p = tok.attn, tok.num_prefix
    if queries == "patches":
        rows = a[:, :, p:, :]
    elif queries == "all":
        rows = a
    elif queries == "cls":
        if p == 0 or not tok.has_cls:
            raise AnalysisError("queries='cls' needs a model with a CLS token")
        rows = a[:, :, :1, :]
    else:
        raise AnalysisError(f"queries={queries!r}; expected 'patches', 'all' or 'cls'")
    if rows.shape[2] == 0:
        raise AnalysisError("no query tokens of that kind")
    mean = rows.mean(axis=2, dtype=np.float64)  # (L, H, T): the average query's distribution (no full copy)
    out = np.concatenate([mean[..., :p], mean[..., p:].sum(axis=-1, keepdims=True)], axis=-1)
    return out.astype(np.float32)
