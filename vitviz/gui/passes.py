"""One on-demand pass over the cached image results, as one small state machine used for every such pass.

The class relevance (keyed by class), the LeGrad map of a text prompt (keyed by prompt) and the token features (no
key) are each a `PassStore` over their request class (`vitviz.gui.protocol.PassRequest`): asked for an image whose
result is cached, it submits the request unless the result holds the answer already, one is on its way, or it
failed before (then it is not asked again until the model or input size changes); the answer is kept in the
image's `ResultMaps` by the request itself (`keep`), a failure remembered with its reason -- for the run it was
made for: a pass that failed under an intervention says nothing of the clean run's, nor of another intervention's
(`why`). A new on-demand pass is one more request class and one more store.
"""
from __future__ import annotations

from typing import Any, Protocol
from weakref import WeakKeyDictionary

from PySide6.QtCore import QObject, Signal

from vitviz.core.analyses.maps import ResultMaps
from vitviz.gui.client import WorkerClient
from vitviz.gui.images import ImageList
from vitviz.gui.model_slot import ModelSlot
from vitviz.gui.protocol import PassRequest


class Host(Protocol):
    """What a store needs of the session that holds it (`vitviz.gui.session.Session`)."""

    model: ModelSlot                  # the loaded model: its spec, capabilities, input size
    image_list: ImageList             # the current image and its `current_changed`
    client: WorkerClient
    intervened: dict[str, Any]        # image -> its intervened run's maps (`vitviz.gui.interventions.IntervenedMaps`)

    def cached(self, path: str) -> ResultMaps | None: ...

    def show_current(self) -> None: ...

    def evict(self, keep: str) -> None: ...

ANY = object()   # `pending(path)`: for any key


class PassStore(QObject):
    """The requests of one pass kind for the session's cached results."""

    ready = Signal(str)                 # image path whose pass (for some key) is now kept in its result
    failed = Signal(str, object, str)   # image path, key, summary

    def __init__(self, session: Host, request: type[PassRequest]) -> None:
        super().__init__(session)  # type: ignore[arg-type]  # the session is a QObject
        self.session, self.request_type = session, request
        self.failures: dict[tuple[str, Any], str] = {}   # the clean runs': (image, key) -> why (not asked again)
        # an intervened run's (`vitviz.gui.interventions.IntervenedMaps`), kept while the run is
        self.failures_under: WeakKeyDictionary[ResultMaps, dict[tuple[str, Any], str]] = WeakKeyDictionary()

    def _failures(self, under: ResultMaps | None) -> dict[tuple[str, Any], str]:
        """The failures of the clean runs (`under` None) or of the intervened run `under`."""
        return self.failures if under is None else self.failures_under.setdefault(under, {})

    def why(self, path: str, key: Any = None) -> str | None:
        """Why the pass of `key` cannot be had for the run of `path` shown now (its intervened run while there
        is one, else the clean one); None when it has not failed there."""
        return self._failures(self.session.intervened.get(path)).get((path, key))

    def request(self, path: str, key: Any = None) -> bool:
        """Ask for the pass of `key` on an image whose result is cached, ahead of queued runs; answered by `ready`
        (and `current_changed` for the current image when the pass changes its maps) or `failed`. False when
        there is nothing to ask: no result yet, held already, failed before, or refused for this model (then
        `failures` says why)."""
        s = self.session
        maps = s.cached(path)
        shown = s.intervened.get(path, maps)     # an intervened run's pass runs under its intervention
        failures = self._failures(None if shown is maps else shown)
        if maps is None or self.request_type.held(shown, key) or (path, key) in failures:
            return False
        why = self.request_type.refused(s.model.capabilities, key)
        if why:                       # said where the pass is shown, not in a dialog
            failures[(path, key)] = why
            return False
        if not self.pending(path, key, shown is not maps):
            request = self.request_type.of(path, s.model.image_size, key)
            s.client.submit(request if shown is maps else shown.under(request), first=True)
        return True

    def pending(self, path: str, key: Any = ANY, intervened: bool | None = None) -> bool:
        """Whether the pass of `path` (of `key`; any key by default) at the current size is on its way (for the
        intervened run with `intervened` True, the clean one with False; either by default)."""
        return any(r.image == path and r.image_size == self.session.model.image_size and (key is ANY or r.key == key)
                   and (intervened is None or (r.intervened is not None) == intervened)
                   for r in self.session.client.pending(self.request_type))   # type: ignore[attr-defined]

    def answer(self, request: PassRequest, answer: Any) -> None:
        """Keep an answer in its image's result, or in the intervened run it was made under (`request.intervened`)
        while that is still shown (dropped when the size changed or the result left the cache)."""
        s = self.session
        under = request.intervened
        maps = s.cached(request.image) if under is None else under
        if request.image_size != s.model.image_size or maps is None or \
                (under is not None and s.intervened.get(request.image) is not under):
            return
        request.keep(maps, answer)
        s.evict(keep=request.image)
        self.ready.emit(request.image)
        if request.redraws and request.image == s.image_list.current:
            # what the current image shows has changed (the intervened run, while there is one, says its passes are
            # not for it)
            s.show_current()

    def fail(self, request: PassRequest, summary: str) -> None:
        """Remember why the pass failed for the run it was made for (it is not asked again there) and say so."""
        self.remember(request, summary)
        self.failed.emit(request.image, request.key, summary)

    def remember(self, request: PassRequest, why: str) -> None:
        """Keep why `request` failed, for its run (the intervened one it was made under, or the clean one)."""
        self._failures(request.intervened)[(request.image, request.key)] = why

    def forget(self) -> None:
        """A new model or input size: no failure of the old one holds."""
        self.failures.clear()
        self.failures_under.clear()
