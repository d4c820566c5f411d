"""The session's cache of image results: least recently used first out, within a memory budget (no Qt here).

Each entry is an image's `vitviz.core.analyses.maps.ResultMaps`, whose `nbytes` counts everything it holds (attention, the
passes added to it, the stacks derived from them), so the budget is kept whatever was added after a run.
"""
from __future__ import annotations

from collections import OrderedDict

from vitviz.core.analyses.maps import ResultMaps


class ResultCache:
    """Image path -> its result, evicting the least recently used beyond `budget` bytes (never the one just
    used)."""

    def __init__(self, budget: int) -> None:
        self.budget = int(budget)
        self._held: OrderedDict[str, ResultMaps] = OrderedDict()

    def __contains__(self, path: object) -> bool:
        return path in self._held

    def __len__(self) -> int:
        return len(self._held)

    def get(self, path: str) -> ResultMaps | None:
        """The result of `path`, or None, without marking it as used."""
        return self._held.get(path)

    def use(self, path: str) -> ResultMaps | None:
        """The result of `path` (marked as the most recently used), or None."""
        maps = self._held.get(path)
        if maps is not None:
            self._held.move_to_end(path)
        return maps

    def put(self, path: str, maps: ResultMaps) -> None:
        """Keep `maps` as the most recently used result, then keep the budget (never evicting `path`)."""
        self._held[path] = maps
        self._held.move_to_end(path)
        self.evict(keep=path)

    def pop(self, path: str) -> ResultMaps | None:
        return self._held.pop(path, None)

    def clear(self) -> None:
        self._held.clear()

    def paths(self) -> list[str]:
        """The cached images, least recently used first."""
        return list(self._held)

    @property
    def nbytes(self) -> int:
        """Memory held by every cached result."""
        return sum(m.nbytes for m in self._held.values())

    def evict(self, keep: str) -> None:
        """Drop the least recently used results until the cache fits the budget (never `keep`; at least one
        result stays)."""
        total = self.nbytes
        while total > self.budget and len(self._held) > 1:
            path, maps = next(iter(self._held.items()))
            if path == keep:
                self._held.move_to_end(path)
                continue
            del self._held[path]
            total -= maps.nbytes
