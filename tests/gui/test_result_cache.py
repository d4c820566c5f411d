"""The session's result cache counts everything an image's result holds, the passes added after its run included
(a text prompt's LeGrad map was once left out of the count), and evicts the least recently used beyond its budget."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
from _gui import random_result

from vitviz.core.analyses.maps import MapKind, ResultMaps
from vitviz.gui.cache import ResultCache


def _leg(grid: tuple[int, int], layers: int = 3) -> SimpleNamespace:
    rng = np.random.default_rng(0)
    return SimpleNamespace(map=rng.random(grid, dtype=np.float32), scores=rng.random(layers, dtype=np.float32),
                           per_layer=rng.random((layers, *grid), dtype=np.float32))


def test_a_text_prompt_counts_and_its_map_is_the_one_stack_and_array() -> None:
    maps = ResultMaps(random_result())
    before = maps.nbytes
    leg = _leg(maps.grid)
    maps.add_text("a cat", leg)
    assert maps.nbytes == before + leg.map.nbytes + leg.scores.nbytes + leg.per_layer.nbytes
    kind = MapKind.parse("text:a cat")
    assert maps.has(kind) and not maps.has(MapKind.parse("text:a dog"))
    np.testing.assert_array_equal(maps.stack(kind).select(0, 0), leg.map)
    arrays, key = maps.arrays(), kind.label.replace("-", "_")          # export's keys: 'text_a_cat_<hash>'
    np.testing.assert_array_equal(arrays[key], leg.map)
    np.testing.assert_array_equal(arrays[f"{key}_scores"], leg.scores)
    assert maps.stack_or_pending(MapKind.parse("text:a dog")).pending


def test_the_cache_evicts_the_least_recently_used_within_its_budget() -> None:
    a, b, c = (ResultMaps(random_result(seed=i)) for i in range(3))
    cache = ResultCache(budget=a.nbytes + b.nbytes)
    cache.put("a", a)
    cache.put("b", b)
    assert cache.paths() == ["a", "b"] and cache.nbytes == a.nbytes + b.nbytes
    assert cache.use("a") is a and cache.paths() == ["b", "a"]       # used: now the most recent
    cache.put("c", c)                                                # over budget: b goes, not a
    assert cache.paths() == ["a", "c"]
    a.add_text("a prompt", _leg(a.grid))                             # a pass added after the run ...
    cache.evict(keep="c")                                            # ... counts: a goes now
    assert cache.paths() == ["c"]
    tiny = ResultCache(budget=1)
    tiny.put("c", c)
    assert tiny.paths() == ["c"]                                     # the one just used always stays
