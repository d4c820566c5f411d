"""Attention by token kind: shares of attention sent to CLS / registers versus the patches."""
from __future__ import annotations

import numpy as np
import pytest

from vitviz.core.analyses.analysis import attention_by_token_kind


def _attn(l: int = 2, h: int = 3, t: int = 7, seed: int = 0) -> np.ndarray:
    a = np.random.default_rng(seed).random((l, h, t, t)).astype(np.float32)
    return a / a.sum(-1, keepdims=True)


def test_shares_sum_to_one_and_match_a_direct_count() -> None:
    a = _attn()
    got = attention_by_token_kind(a, num_prefix=3)  # cls, reg0, reg1 + 4 patches
    assert got.shape == (2, 3, 4)
    np.testing.assert_allclose(got.sum(-1), 1.0, atol=1e-6)
    l, h = 1, 2
    patch_rows = a[l, h, 3:]  # the 4 patch queries
    np.testing.assert_allclose(got[l, h, 1], patch_rows[:, 1].mean(), rtol=1e-6)  # reg0
    np.testing.assert_allclose(got[l, h, 3], patch_rows[:, 3:].sum(1).mean(), rtol=1e-6)  # all patches


def test_a_register_sink_shows() -> None:
    """Every patch query sending 80 % of its attention to register 1 (token 2) reads as 0.8 in that column."""
    t, p = 6, 3
    a = np.full((1, 1, t, t), 0.2 / (t - 1), dtype=np.float32)
    a[..., 2] = 0.8
    got = attention_by_token_kind(a, num_prefix=p)
    np.testing.assert_allclose(got[0, 0], [0.04, 0.04, 0.8, 0.12], rtol=1e-5)
    cls = attention_by_token_kind(a, num_prefix=p, queries="cls")
    np.testing.assert_allclose(cls[0, 0, 2], 0.8, rtol=1e-5)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="expected 'patches', 'all' or 'cls'"):
        attention_by_token_kind(_attn(), num_prefix=1, queries="rows")
    with pytest.raises(ValueError, match="needs a model with a CLS token"):
        attention_by_token_kind(_attn(), num_prefix=0, queries="cls")
