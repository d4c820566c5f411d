"""Verify's layer-by-layer comparison (`_LayerByLayer`): the largest |difference| per layer, exactly, in the
dtype of the wider side; ours refused as non-finite whenever it holds a NaN or inf (read only where the largest
difference is not finite); shapes and missing layers said."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from vitviz.core.analyses.verify import _LayerByLayer


class _Given:
    """The original's side: its layers handed over in order, then nothing (as `_Theirs.next` gives them)."""

    def __init__(self, layers: list[np.ndarray]) -> None:
        self.layers, self.error, self.taken, self.extra = list(layers), None, 0, 0

    def next(self) -> np.ndarray | None:
        if not self.layers:
            return None
        self.taken += 1
        return self.layers.pop(0)


def _layer(seed: int, shape: tuple[int, ...] = (2, 5, 5)) -> np.ndarray:
    x = np.random.default_rng(seed).random(shape).astype(np.float32)
    return x / x.sum(-1, keepdims=True)


def test_the_largest_difference_per_layer_is_exact() -> None:
    ours = [_layer(0), _layer(1)]
    theirs = [ours[0].copy(), ours[1].copy()]
    theirs[1][1, 3, 2] += np.float32(3e-4)
    sink = _LayerByLayer(_Given(theirs), (10, 10))
    for layer in ours:
        sink.append(torch.from_numpy(layer)[None])
    rows, first, notes = sink.differences()
    assert rows[0] == (0, 0.0)
    assert rows[1] == (1, float(np.abs(ours[1] - theirs[1]).max()))
    assert sink.finite and notes == [] and first == (1 if rows[1][1] > 1e-4 else None)


def test_a_float64_original_is_compared_in_float64() -> None:
    ours = _layer(2)
    theirs = ours.astype(np.float64) + 1e-9          # below float32's resolution near 0.2, not float64's
    sink = _LayerByLayer(_Given([theirs]), (10, 10))
    sink.append(torch.from_numpy(ours)[None])
    assert sink.rows[0][1] == pytest.approx(float(np.abs(ours.astype(np.float64) - theirs).max()), rel=1e-6)
    assert sink.rows[0][1] > 0


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("theirs_too", [False, True])
def test_a_non_finite_map_of_ours_is_always_found(bad: float, theirs_too: bool) -> None:
    ours = _layer(3)
    theirs = ours.copy()
    ours[0, 1, 1] = bad
    if theirs_too:                                   # the same value on both sides: inf - inf is NaN, still found
        theirs[0, 1, 1] = bad
    sink = _LayerByLayer(_Given([theirs]), (10, 10))
    sink.append(torch.from_numpy(ours)[None])
    assert sink.finite is False


def test_a_finite_map_is_finite_and_a_shape_mismatch_is_said() -> None:
    sink = _LayerByLayer(_Given([_layer(4, (3, 5, 5))]), (10, 10))
    sink.append(torch.from_numpy(_layer(4))[None])
    sink.append(torch.from_numpy(_layer(5))[None])       # the original has no second layer
    rows, first, notes = sink.differences()
    assert sink.finite and rows == ((0, math.inf), (1, math.inf)) and first == 0
    assert "the original's attention has shape (heads, T, T) = (3, 5, 5), vitviz's (2, 5, 5)" in notes[0]
