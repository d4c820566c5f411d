"""Attention rollout, written once: the window's rollout panel and map, `vitviz export` and `vitviz.core.analyses.analysis`.

Convention (Abnar & Zuidema 2020, as in vit-explain, with its known bugs fixed):
    A'_l = rownorm(residual * I + (1 - residual) * discard(fuse_heads(A_l)))
    R = A'_{L-1} @ ... @ A'_{start_layer}
and the rollout of a query is its row of R: what the query token, at the output, draws from each input token.
`residual=0.5` is vit-explain's `(A + I) / 2`. Discarding is per row: in every row of the fused matrix the lowest
`floor(discard_ratio * num_patches)` patch entries are zeroed (exactly that many; among equal values the leftmost
go first); prefix columns (CLS, dist, registers) are never discarded and neither is the identity added
afterwards. Per row, not vit-explain's one threshold per layer, because rows are distributions of different queries:
a global threshold empties diffuse rows and spares peaked ones.

`RolloutEngine` computes a query's row by pulling a row vector back through the layers, last first
(`v <- v @ A'_l`, O(L·T²)), with `A'_l` kept factored as `diag(1 / s) (r·I + (1 - r)·D)` (D the fused, discarded
layer, s its row sums); the fused layers and their sorted patch keys are cached per fusion, so a slider only
redoes the cheap part. The functions at the bottom (`rollout`, `rollout_vector`, `rollout_matrix`,
`rollout_naive`, `rollout_layer_matrix`) are the public API re-exported by `vitviz.core.analyses.analysis`; they run this
engine, `rollout_matrix` by the full matrix chain (O(L·T³), for tests and benchmarks).
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from vitviz.core.analyses.tokens import (TINY, AnalysisError, AttentionLike, Fusion, Query, Tokens, check_index, fuse_heads,
                                query_rows, to_grid, tokens_of)

FUSIONS: tuple[str, ...] = ("mean", "max", "min")


@dataclass(frozen=True)
class RolloutParams:
    """One rollout's settings.

    Attributes:
        fusion: how each layer's heads are fused: 'mean', 'max' or 'min'.
        discard: fraction in [0, 1) of each row's lowest patch attention set to 0.
        start: the first layer multiplied in (0: all of them).
        residual: weight in [0, 1] of the identity, `A' = residual * I + (1 - residual) * A` before rownorm.
        query: the token whose row is rolled out; None: CLS, or the mean of the patch queries without CLS.
    """

    fusion: Fusion = "mean"
    discard: float = 0.0
    start: int = 0
    residual: float = 0.5
    query: int | None = None

    def __post_init__(self) -> None:
        if self.fusion not in FUSIONS:
            raise AnalysisError(f"rollout head fusion must be 'mean', 'max' or 'min', found {self.fusion!r}")
        if not 0.0 <= self.discard < 1.0:
            raise AnalysisError(f"rollout discard ratio must lie in [0, 1), found {self.discard}")
        if not 0.0 <= self.residual <= 1.0:
            raise AnalysisError(f"rollout residual must lie in [0, 1], found {self.residual}")
        if isinstance(self.start, bool) or not isinstance(self.start, (int, np.integer)) or self.start < 0:
            raise AnalysisError(f"rollout start layer must be an integer >= 0, found {self.start!r}")
        if self.query is not None and (isinstance(self.query, bool) or not isinstance(self.query, (int, np.integer))
                                       or self.query < 0):
            raise AnalysisError(f"rollout query must be a token index >= 0 or None, found {self.query!r}")


def discard_count(discard: float, num_patches: int) -> int:
    """How many patch entries of every row `discard` zeroes: floor(discard * N)."""
    return int(np.floor(discard * num_patches + 1e-9))


def discard_lowest(fused: np.ndarray, discard: float, num_prefix: int,
                   sorted_keys: np.ndarray | None = None) -> np.ndarray:
    """A (T, T) fused layer with the lowest `discard_count` patch entries of every row set to 0 (a copy; `fused`
    itself when nothing is discarded).

    Exactly that many go in every row; among entries equal to the row's cut value the leftmost (lowest patch
    index) go first, so the result depends on the values only, never on a sorting algorithm.

    Args:
        sorted_keys: (T, N) the patch columns of every row sorted ascending, when already known.
    """
    keys = fused[:, num_prefix:]                                      # (T, N) view; prefix columns never go
    k = discard_count(discard, keys.shape[1])
    if k == 0:
        return fused
    sorted_keys = np.sort(keys, axis=1) if sorted_keys is None else sorted_keys
    cut = sorted_keys[:, k - 1:k]                                     # (T, 1) the k-th smallest key of each row
    keep = keys > cut                                                 # (T, N) drops k or more (ties at the cut)
    tied = np.flatnonzero(keys.shape[1] - keep.sum(axis=1) > k)
    if tied.size:                                                     # drop only the leftmost of the tied keys
        sub, at_cut = keys[tied], cut[tied]                           # (r, N), (r, 1)
        at = sub == at_cut
        need = k - (sub < at_cut).sum(axis=1, keepdims=True)         # (r, 1) how many tied keys go
        keep[tied] = (sub > at_cut) | (at & (np.cumsum(at, axis=1) > need))
    kept = np.empty_like(fused)
    kept[:, :num_prefix] = fused[:, :num_prefix]
    np.multiply(keys, keep, out=kept[:, num_prefix:])
    return kept


Factor = tuple[np.ndarray, np.ndarray]  # (D, s): the fused, discarded (T, T) layer and the (T,) row sums


class RolloutEngine:
    """Attention rollout of one image's attention, by row vectors, with per-fusion caches.

    Args:
        attentions: (L, H, T, T) attention (float32 or float16); None with `fused`.
        num_prefix: prefix tokens (cls, dist, registers) before the patches.
        has_cls: token 0 is a CLS token (the default query); without it the default is the mean of the patches.
        fused: {fusion: (L, T, T)} each layer's heads already fused (`fuse_heads`), as a streamed capture keeps
            them instead of the (L, H, T, T) stack (`vitviz export`); a fusion not given needs `attentions`.
    """

    def __init__(self, attentions: np.ndarray | None, num_prefix: int, has_cls: bool,
                 fused: dict[str, np.ndarray] | None = None) -> None:
        self.attn, self.num_prefix, self.has_cls = attentions, num_prefix, has_cls
        self._fused: dict[tuple[str, int], np.ndarray] = {   # (fusion, layer) -> (T, T) float32
            (fusion, layer): stack[layer] for fusion, stack in (fused or {}).items() for layer in range(len(stack))}
        self._sorted: dict[tuple[str, int], np.ndarray] = {}   # (fusion, layer) -> (T, N) its patch keys sorted
        whole = attentions if attentions is not None else next(iter((fused or {}).values()), None)
        if whole is None:
            raise AnalysisError("a rollout needs the attention or its fused layers")
        self._depth, self._tokens = int(whole.shape[0]), int(whole.shape[-1])

    @property
    def nbytes(self) -> int:
        """Memory held by the caches."""
        return sum(a.nbytes for a in self._fused.values()) + sum(a.nbytes for a in self._sorted.values())

    @property
    def depth(self) -> int:
        return self._depth

    @property
    def num_tokens(self) -> int:
        return self._tokens

    def query_vector(self, query: int | None) -> np.ndarray:
        """(T,) one-hot of `query` (clamped to the last token), of CLS, or uniform over the patches without CLS."""
        t, p = self.num_tokens, self.num_prefix
        v = np.zeros(t, dtype=np.float32)
        if query is not None:
            v[min(int(query), t - 1)] = 1.0
        elif self.has_cls and p > 0:
            v[0] = 1.0
        else:
            v[p:] = 1.0 / (t - p)
        return v

    def vector(self, params: RolloutParams, end_layer: int | None = None) -> np.ndarray:
        """(T,) the rollout row of `params.query` through `end_layer` (default: the last layer)."""
        return self.pull(self.query_vector(params.query), params, end_layer)

    def pull(self, v: np.ndarray, params: RolloutParams, end_layer: int | None = None) -> np.ndarray:
        """(T,) `v @ A'_end @ ... @ A'_start` for any (T,) row vector `v` (`params.query` is not used)."""
        end = self.depth - 1 if end_layer is None else end_layer
        layers = range(end, params.start - 1, -1)
        return self._pull(np.asarray(v, dtype=np.float32), ((i, self.factor(i, params)) for i in layers), params)

    def through_each_layer(self, params: RolloutParams) -> np.ndarray:
        """(L, T): row l is the rollout row of `params.query` through layer l (rows before `start` are zeros)."""
        out = np.zeros((self.depth, self.num_tokens), dtype=np.float32)
        factors = {i: self.factor(i, params) for i in range(params.start, self.depth)}
        v0 = self.query_vector(params.query)
        for end in range(params.start, self.depth):
            out[end] = self._pull(v0, ((i, factors[i]) for i in range(end, params.start - 1, -1)), params)
        return out

    def layer_matrix(self, layer: int, params: RolloutParams) -> np.ndarray:
        """(T, T) float32 A'_layer, rows summing to 1 (a row that lost all its mass stays 0)."""
        kept, sums = self.factor(layer, params)
        r = params.residual
        mat = (1.0 - r) * kept                                       # a new (T, T) array
        mat[np.diag_indices_from(mat)] += r
        mat /= np.maximum(sums, TINY)[:, None]
        return mat

    def matrix(self, params: RolloutParams) -> np.ndarray:
        """(T, T) R = A'_{L-1} @ ... @ A'_start by the matrix chain, O(L·T³); row q is `pull(one_hot(q))`."""
        result = np.eye(self.num_tokens, dtype=np.float32)           # (T, T)
        for layer in range(params.start, self.depth):
            result = self.layer_matrix(layer, params) @ result
        return result

    def factor(self, layer: int, params: RolloutParams) -> Factor:
        """The fused, discarded (T, T) layer D and the (T,) row sums s of `r·I + (1 - r)·D`."""
        fused = self.fused_layer(params.fusion, layer)
        kept = fused
        if discard_count(params.discard, fused.shape[1] - self.num_prefix) > 0:
            kept = discard_lowest(fused, params.discard, self.num_prefix, self._sorted_keys(params.fusion, layer))
        sums = params.residual + (1.0 - params.residual) * kept.sum(axis=1)   # (T,)
        return kept, sums

    @staticmethod
    def _pull(v: np.ndarray, factors: Iterator[tuple[int, Factor]], params: RolloutParams) -> np.ndarray:
        """v @ A'_i for the factors in the order given (last layer first), with A' = diag(1/s)(r·I + (1 - r)·D)."""
        r = params.residual
        for _layer, (kept, sums) in factors:
            u = np.where(sums > 0, v / np.where(sums > 0, sums, 1.0), 0.0).astype(np.float32, copy=False)   # (T,)
            v = r * u + (1.0 - r) * (u @ kept)
        return v

    def has_fused(self, fusion: str, layer: int) -> bool:
        """Whether `fused_layer(fusion, layer)` is made already (reading it costs nothing)."""
        return (fusion, layer) in self._fused

    def fused_layer(self, fusion: str, layer: int) -> np.ndarray:
        """(T, T) float32 layer `layer`'s heads fused ('mean', 'max', 'min'), made once per fusion and layer and
        kept: the rollout's factors and the attention-matrix view (`ResultMaps.matrix`) share it. Read only."""
        key = (fusion, layer)
        if key not in self._fused:
            if self.attn is None:
                fusions = sorted({f for f, _ in self._fused})
                raise AnalysisError(f"a rollout with {fusion!r} head fusion needs the whole attention; only the "
                                    f"{', '.join(fusions)} fusion of each layer was kept as it was computed")
            self._fused[key] = fuse_heads(self.attn[layer], fusion)  # type: ignore[arg-type]  # (H, T, T) -> (T, T)
        return self._fused[key]

    def _sorted_keys(self, fusion: str, layer: int) -> np.ndarray:
        key = (fusion, layer)
        if key not in self._sorted:
            self._sorted[key] = np.sort(self.fused_layer(fusion, layer)[:, self.num_prefix:], axis=1)   # (T, N)
        return self._sorted[key]


# ------------------------------------------------------------------ the public API (re-exported by core.analysis)


def _params(tok: Tokens, head_fusion: Fusion, discard_ratio: float, start_layer: int,
            residual: float) -> RolloutParams:
    """Checked settings, the start layer resolved (negative counts from the end)."""
    start = check_index(start_layer, tok.attn.shape[0], "start_layer")
    return RolloutParams(head_fusion, discard_ratio, start, residual)


def _engine(tok: Tokens) -> RolloutEngine:
    return RolloutEngine(tok.attn, tok.num_prefix, tok.has_cls)


def _query_vector(tok: Tokens, query: Query) -> np.ndarray:
    """A (T,) row vector selecting the query: one-hot, or uniform over the patch tokens for 'mean'."""
    v = np.zeros(tok.attn.shape[2], dtype=np.float32)
    rows = query_rows(tok, query)
    if isinstance(rows, slice):
        v[rows] = 1.0 / (rows.stop - rows.start)
    else:
        v[rows] = 1.0
    return v


def rollout_layer_matrix(attn_layer: np.ndarray, head_fusion: Fusion = "mean", discard_ratio: float = 0.0,
                         residual: float = 0.5, num_prefix: int = 1) -> np.ndarray:
    """One layer's rollout factor A' = rownorm(residual * I + (1 - residual) * discard(fuse(A))).

    Args:
        attn_layer: (H, T, T) attention of one layer.

    Returns:
        (T, T) float32, rows sum to 1 (a row that lost all its mass stays 0).
    """
    params = RolloutParams(head_fusion, discard_ratio, 0, residual)
    return RolloutEngine(np.asarray(attn_layer)[None], num_prefix, num_prefix > 0).layer_matrix(0, params)


def rollout_vector(attn: AttentionLike, head_fusion: Fusion = "mean", discard_ratio: float = 0.0,
                   start_layer: int = 0, query: Query = "cls", residual: float = 0.5,
                   num_prefix: int | None = None) -> np.ndarray:
    """The query's row of the rollout R = A'_{L-1} ... A'_{start_layer}, in O(L * T^2).

    Returns:
        (T,) float32 over all input tokens (prefix first); sums to 1 unless a row lost all its mass.
    """
    tok = tokens_of(attn, num_prefix, None, need_grid=False)
    params = _params(tok, head_fusion, discard_ratio, start_layer, residual)
    return _engine(tok).pull(_query_vector(tok, query), params)


def rollout(attn: AttentionLike, head_fusion: Fusion = "mean", discard_ratio: float = 0.0, start_layer: int = 0,
            query: Query = "cls", residual: float = 0.5, num_prefix: int | None = None,
            grid: tuple[int, int] | None = None) -> np.ndarray:
    """Attention rollout of `query` over the patches (see the module docstring for the convention), O(L * T^2).

    `query` is a token index, 'cls' (raises for models without CLS) or 'mean' (mean over patch queries).
    Values are rollout mass, not rescaled; the mass on prefix tokens is left out (see `rollout_vector`).

    Returns:
        (gh, gw) float32.
    """
    tok = tokens_of(attn, num_prefix, grid)
    params = _params(tok, head_fusion, discard_ratio, start_layer, residual)
    return to_grid(_engine(tok).pull(_query_vector(tok, query), params), tok)


def rollout_matrix(attn: AttentionLike, head_fusion: Fusion = "mean", discard_ratio: float = 0.0,
                   start_layer: int = 0, residual: float = 0.5, num_prefix: int | None = None) -> np.ndarray:
    """The full rollout matrix R = A'_{L-1} @ ... @ A'_{start_layer}, by the matrix chain, O(L * T^3).

    Returns:
        (T, T) float32; row q is what token q at the output draws from each input token.
    """
    tok = tokens_of(attn, num_prefix, None, need_grid=False)
    return _engine(tok).matrix(_params(tok, head_fusion, discard_ratio, start_layer, residual))


def rollout_naive(attn: AttentionLike, head_fusion: Fusion = "mean", discard_ratio: float = 0.0,
                  start_layer: int = 0, query: Query = "cls", residual: float = 0.5,
                  num_prefix: int | None = None, grid: tuple[int, int] | None = None) -> np.ndarray:
    """`rollout` through the full matrix chain (`rollout_matrix`); for tests and benchmarks. (gh, gw) float32."""
    tok = tokens_of(attn, num_prefix, grid)
    matrix = _engine(tok).matrix(_params(tok, head_fusion, discard_ratio, start_layer, residual))  # (T, T)
    return to_grid(_query_vector(tok, query) @ matrix, tok)
