"""One image's result may be read from two threads (the window's worker measures a timeline's held results while
the GUI draws them; the comparison prepares stacks in the worker while the GUI reads the view): its caches are
guarded, so neither thread ever sees them change under it (without the lock this raised 'dictionary changed size
during iteration' and KeyErrors within a few thousand rounds)."""
from __future__ import annotations

import threading

import numpy as np

from vitviz.core.analyses.maps import MapKind, ResultMaps
from vitviz.core.analyses.rollout import RolloutParams
from vitviz.core.spec import AttentionResult, ModelSpec


def _result() -> AttentionResult:
    spec = ModelSpec(family="test", source="x", image_size=(64, 64), patch_size=8, embed_dim=32, depth=4, num_heads=4)
    t = spec.num_tokens
    a = np.random.default_rng(0).random((4, 4, t, t), dtype=np.float32)
    return AttentionResult(attentions=a / a.sum(-1, keepdims=True), logits=np.zeros(0, np.float32),
                           input=np.zeros((3, 64, 64), np.float32), image=np.zeros((64, 64, 3), np.uint8), spec=spec)


def test_stacks_made_on_one_thread_while_another_measures_and_makes_its_own() -> None:
    maps = ResultMaps(_result())
    errors: list[str] = []
    stop = threading.Event()

    def other() -> None:
        i = 0
        while not stop.is_set():
            try:
                maps.stack(MapKind("rollout", rollout=RolloutParams(discard=(i % 50) / 100)))
            except Exception as exc:  # noqa: BLE001 - what the test counts
                errors.append(repr(exc))
            i += 1

    thread = threading.Thread(target=other)
    thread.start()
    try:
        for i in range(3000):
            try:
                assert maps.nbytes > 0
                maps.stack(MapKind("rollout", rollout=RolloutParams(residual=0.3 + (i % 40) / 100)))
                maps.arrays()
            except Exception as exc:  # noqa: BLE001
                errors.append(repr(exc))
    finally:
        stop.set()
        thread.join()
    assert errors == []
    rolled = maps.stack(MapKind("rollout", rollout=RolloutParams(residual=0.35)))
    fresh = ResultMaps(maps.result).stack(MapKind("rollout", rollout=RolloutParams(residual=0.35)))
    np.testing.assert_array_equal(rolled.maps, fresh.maps)      # and what was made is what one thread makes
