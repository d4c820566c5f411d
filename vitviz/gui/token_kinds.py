"""Attention by token kind for the head-statistics dock, computed in the worker with each result (no Qt here).

A thin wrapper of `vitviz.core.prefix.attention_by_token_kind` that goes one layer at a time, so the float64 copy
the core function makes of the patch queries' rows is one layer's (40 MB for ViT-L/16 at 384 px), not the whole
stack's.
"""
from __future__ import annotations

import numpy as np

from vitviz.core.prefix import attention_by_token_kind
from vitviz.core.spec import AttentionResult


def token_kind_shares(result: AttentionResult) -> np.ndarray:
    """(L, H, P + 1) float32: the share of the patch queries' attention on each prefix token (model order, names
    `result.spec.prefix_names`) and, in the last column, on all patches together; rows sum to 1. Equal to
    `attention_by_token_kind(result)`."""
    attn, p = result.attentions, result.num_prefix
    return np.concatenate([attention_by_token_kind(attn[i:i + 1], num_prefix=p) for i in range(attn.shape[0])])
