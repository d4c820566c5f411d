"""A test-side reference of attention rollout: the convention of `vitviz.core.analyses.rollout`, written the plain way.

float64, one full matrix per layer, the matrix chain, the discard by a full sort of each row: slow and obvious, so
the product's engine (row vectors, cached fusions, factored layers) can be checked against something independent.
Random attention has no ties, so which of equal entries a discard drops never matters here.
"""
from __future__ import annotations

import numpy as np


def reference_layer(attn_layer: np.ndarray, num_prefix: int, fusion: str = "mean", discard: float = 0.0,
                    residual: float = 0.5) -> np.ndarray:
    """(T, T) A' = rownorm(residual * I + (1 - residual) * discard(fuse(A))) of one (H, T, T) layer."""
    fused = {"mean": np.mean, "max": np.max, "min": np.min}[fusion](attn_layer.astype(np.float64), axis=0)
    n = fused.shape[1] - num_prefix
    k = int(np.floor(discard * n + 1e-9))
    for row in fused:
        patches = row[num_prefix:]
        if k:
            patches[np.argsort(patches)[:k]] = 0.0   # exactly the k lowest patch entries; prefix columns stay
    mat = residual * np.eye(fused.shape[0]) + (1.0 - residual) * fused
    sums = mat.sum(axis=1, keepdims=True)
    return np.divide(mat, sums, out=np.zeros_like(mat), where=sums > 0)


def reference_rollout_rows(attn: np.ndarray, num_prefix: int, fusion: str = "mean", discard: float = 0.0,
                           residual: float = 0.5, start: int = 0, query: int | None = None,
                           has_cls: bool = True) -> np.ndarray:
    """(L, T): row l is the query's row of A'_l @ ... @ A'_start (zeros before `start`).

    The query is token `query`, else CLS (token 0) when the model has one, else the mean of the patch tokens.
    """
    depth, t = attn.shape[0], attn.shape[-1]
    v = np.zeros(t)
    if query is not None:
        v[query] = 1.0
    elif has_cls and num_prefix:
        v[0] = 1.0
    else:
        v[num_prefix:] = 1.0 / (t - num_prefix)
    out = np.zeros((depth, t))
    chain = np.eye(t)
    for layer in range(start, depth):
        chain = reference_layer(attn[layer], num_prefix, fusion, discard, residual) @ chain
        out[layer] = v @ chain
    return out
