"""Where attention goes, token kind by token kind: how much each layer sends to CLS, distillation and register
tokens versus the image patches.

Register tokens (Darcet et al., "Vision Transformers Need Registers") exist because large ViTs otherwise park
attention on a few low-information patches; this is the measurement that shows it. Plain NumPy.
"""
from __future__ import annotations

import numpy as np

from vitviz.core.analysis import AnalysisError, AttentionLike, _tokens


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
