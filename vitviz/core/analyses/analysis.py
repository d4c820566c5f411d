"""Analyses over captured attention: token maps, attention distance, entropy, position-embedding similarity,
token kinds; and, re-exported from `vitviz.core.analyses.rollout` where it is implemented, attention rollout.

Plain NumPy (no torch, no Qt), cheap enough to run on the GUI thread for one view.

Every function takes either an `AttentionResult` (prefix count, grid and patch size come from its spec) or a raw
`(L, H, T, T)` array with `num_prefix` and `grid` passed explicitly; the grid is never guessed from `sqrt(T)`.
Token order is the reference ViT's (see `vitviz.core.analyses.tokens`): `num_prefix` prefix tokens (cls, dist, registers)
first, then the patches in row-major order, so token `num_prefix + r * gw + c` is patch (r, c). For a raw array,
token 0 is taken to be the CLS token whenever `num_prefix > 0`; for an `AttentionResult`, `spec.cls_token` decides.
The rollout convention is in `vitviz.core.analyses.rollout`'s docstring.
"""
from __future__ import annotations

import numpy as np

from vitviz.core.analyses.rollout import rollout, rollout_layer_matrix, rollout_matrix, rollout_naive, rollout_vector
from vitviz.core.spec import AttentionResult
from vitviz.core.analyses.tokens import (TINY, AnalysisError, AttentionLike, Fusion, Head, Query, check_index, fuse_heads,
                                query_rows, to_grid, tokens_of)

__all__ = [
    "AnalysisError", "AttentionLike", "Fusion", "Head", "Query",
    "attention_row", "token_map", "cls_attention", "attention_received", "attention_column",
    "rollout", "rollout_vector", "rollout_matrix", "rollout_naive", "rollout_layer_matrix",  # from core.rollout
    "mean_attention_distance", "attention_entropy", "pos_embed_similarity", "prefix_pos_similarity",
    "attention_by_token_kind",
]


def attention_row(attn: AttentionLike, layer: int, head: Head, token: int) -> np.ndarray:
    """What `token` attends to in one layer: its full attention row, prefix tokens included.

    Returns:
        (T,) float32; sums to 1 for a single head or 'mean'.
    """
    tok = tokens_of(attn, None if isinstance(attn, AttentionResult) else 0, None, need_grid=False)
    li = check_index(layer, tok.attn.shape[0], "layer")
    ti = check_index(token, tok.attn.shape[2], "token")
    return fuse_heads(tok.attn[li, :, ti, :], head)  # (H, T) -> (T,)


def token_map(attn: AttentionLike, layer: int, head: Head, query: Query,
              num_prefix: int | None = None, grid: tuple[int, int] | None = None) -> np.ndarray:
    """What `query` attends to over the patches, as a map; prefix keys are left out (not renormalised).

    `query` is a token index, 'cls', or 'mean' (the mean of the patch queries' rows, for models without CLS).
    Heads are fused per entry first ('max' is the maximum over heads), then averaged over queries for 'mean'.

    Returns:
        (gh, gw) float32.
    """
    tok = tokens_of(attn, num_prefix, grid)
    rows = tok.attn[check_index(layer, tok.attn.shape[0], "layer"), :, query_rows(tok, query), :]  # (H, [nq,] T)
    fused = fuse_heads(rows, head)  # ([nq,] T)
    if fused.ndim == 2:
        fused = fused.mean(axis=0)
    return to_grid(fused, tok)


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
    tok = tokens_of(attn, num_prefix, grid)
    li = check_index(layer, tok.attn.shape[0], "layer")
    ti = check_index(token, tok.attn.shape[2], "token")
    column = fuse_heads(tok.attn[li, :, :, ti], head)  # (H, T) -> (T,)
    return to_grid(column, tok)


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
    tok = tokens_of(attn, num_prefix, grid)
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
    arr = tokens_of(attn, 0, None, need_grid=False).attn
    first = 0 if num_prefix is None else int(num_prefix)
    if not 0 <= first < arr.shape[2]:
        raise AnalysisError(f"num_prefix must lie in [0, {arr.shape[2]}), found {num_prefix}")
    out = np.empty(arr.shape[:2], dtype=np.float64)  # (L, H)
    for layer in range(arr.shape[0]):
        a = np.asarray(arr[layer, :, first:, :], dtype=np.float32)  # (H, nq, T)
        ent = -(a * np.log(np.maximum(a, TINY))).sum(axis=-1, dtype=np.float64)  # (H, nq)
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
    row = unit[check_index(index, num_prefix_in_pos, "prefix index")]  # (D,)
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
    tok = tokens_of(attn, num_prefix, None, need_grid=False)
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
