"""`ResultMaps.matrix`, the attention-matrix view's (T, T) picture: bit for bit what the view reduced on the GUI
thread before (float32 and float16 maps, every layer and head selection), with a layer's heads' mean at hand after
`precompute` (the worker's) and every reduction made once."""
from __future__ import annotations

import dataclasses
import threading

import numpy as np
import pytest

from vitviz.core.analyses.maps import ResultMaps
from vitviz.core.spec import AttentionResult, ModelSpec


def _maps(dtype: type) -> ResultMaps:
    spec = ModelSpec(family="test", source="x", image_size=(32, 40), patch_size=8, embed_dim=32, depth=3, num_heads=4)
    t = spec.num_tokens
    a = np.random.default_rng(1).random((3, 4, t, t), dtype=np.float32) ** 4
    attn = (a / a.sum(-1, keepdims=True)).astype(dtype)
    return ResultMaps(AttentionResult(attentions=attn, logits=np.zeros(0, np.float32),
                                      input=np.zeros((3, 32, 40), np.float32), image=np.zeros((32, 40, 3), np.uint8),
                                      spec=spec))


def _old(attn: np.ndarray, layer: int | str, head: int | str) -> np.ndarray:
    """The view's reduction as it was made on the GUI thread per change (vitviz 18c531f, `layer_head_matrix`)."""
    stack = attn if layer == "mean" else attn[layer][None]
    if head == "mean":
        fused = stack.mean(axis=1, dtype=np.float32)
    elif head == "max":
        fused = stack.max(axis=1)
    else:
        fused = stack[:, head]
    return np.asarray(fused.mean(axis=0, dtype=np.float32) if fused.shape[0] > 1 else fused[0], dtype=np.float32)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_matrix_is_the_old_reduction_bit_for_bit(dtype: type) -> None:
    maps = _maps(dtype)
    maps.precompute()
    attn = maps.result.attentions
    for layer in (0, 2, -1, "mean"):
        for head in (0, 3, "mean", "max"):
            got = maps.matrix(layer, head)
            assert got.dtype == np.float32 and got.shape == attn.shape[2:]
            np.testing.assert_array_equal(got, _old(attn, layer, head), err_msg=f"layer {layer}, head {head}")


def test_what_is_at_hand_and_made_once() -> None:
    maps = _maps(np.float32)
    assert maps.has_matrix(1, 2) and not maps.has_matrix(1, "mean")
    maps.precompute()                                   # the worker's: every layer's heads' mean
    assert all(maps.has_matrix(layer, "mean") for layer in range(3)) and maps.has_matrix(-1, "mean")
    assert not maps.has_matrix(1, "max") and not maps.has_matrix("mean", "mean")
    before = maps.nbytes
    made = maps.matrix("mean", 1)
    assert maps.has_matrix("mean", 1) and maps.matrix("mean", 1) is made
    assert maps.nbytes == before + made.nbytes          # the mean over layers is counted
    assert maps.matrix(1, "max") is maps.matrix(1, "max") and maps.has_matrix(1, "max")



class _Watched(np.ndarray):
    """The attention, noting at each read whether the maps' lock is free to another thread."""

    def __getitem__(self, key: object) -> np.ndarray:
        _Watched.note()
        return np.asarray(super().__getitem__(key))

    @staticmethod
    def note() -> None: ...


@pytest.mark.parametrize("head", ["max", 1])
def test_a_mean_over_layers_is_reduced_without_the_lock(head: int | str) -> None:
    """The mean over layers is made in a pool thread (the view's); the GUI thread's `stack` takes the same lock, so
    the reduction must not hold it (the GUI would wait for all of it)."""
    maps = _maps(np.float32)
    attn = maps.result.attentions
    free: list[bool] = []

    def ask() -> None:   # from another thread, as the GUI thread's `stack` would
        if maps._lock.acquire(blocking=False):
            maps._lock.release()
            free.append(True)
        else:
            free.append(False)

    def note() -> None:
        other = threading.Thread(target=ask)
        other.start()
        other.join()

    maps.result = dataclasses.replace(maps.result, attentions=attn.view(_Watched))
    _Watched.note = staticmethod(note)   # type: ignore[method-assign]
    try:
        got = maps.matrix("mean", head)
    finally:
        _Watched.note = staticmethod(lambda: None)   # type: ignore[method-assign]
    assert free and all(free), free
    np.testing.assert_array_equal(got, _old(attn, "mean", head))
    assert maps.matrix("mean", head) is got
