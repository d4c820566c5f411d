"""The Features dock's analyses of cached results -- the feature PCA of several images, the patch similarity within
and across two images, the share of attention the high-norm patches receive -- as a part of the session.

Each is a request (`Pca`, `Similarity`, `Share` in `vitviz.gui.protocol`) computed in the worker, ahead of the queued
runs, a newer one of a kind replacing the one still waiting; its answer is said by this part's signal when it is for
the input size still selected. The part registers its answers and failures with `Session.route`: the session knows
nothing of them. No widgets here.
"""
from __future__ import annotations

from typing import Any

from PySide6.QtCore import QObject, Signal

from vitviz.gui.protocol import ANALYSES, Analysis, Pca, Request, Share, Similarity


class FeatureAnalyses(QObject):
    """The analyses of one session's cached features (`session.analyses`)."""

    pca_ready = Signal(object)              # PcaFitted, for the current model and input size
    similarity_ready = Signal(object)       # Compared
    share_ready = Signal(object)            # Shared
    analysis_failed = Signal(object, str)   # the class of a failed Pca / Similarity / Share request, summary

    def __init__(self, session: Any) -> None:   # the `Session` (it imports this module: not named here)
        super().__init__(session)
        self.session = session
        for kind, signal in zip(ANALYSES, (self.pca_ready, self.similarity_ready, self.share_ready)):
            session.route(kind, self._answer(signal), self._failed)

    def _run_of(self, path: str) -> Any:
        """The run the panels show of `path`: its intervened run while there is one (its features were captured
        under the intervention), else its cached result."""
        return self.session.intervened.get(path) or self.session.cached(path)

    def fit_pca(self, paths: list[str], layer: int) -> bool:
        """Fit the feature PCA of these images together at block `layer` (those whose features are cached),
        replacing any fit still waiting; answered by `pca_ready`. False when none has features."""
        held = [(p, m.features) for p in paths if (m := self._run_of(p)) is not None and m.features is not None]
        if not held:
            return False
        self._ask(Pca, features=[f for _p, f in held], sources=tuple(p for p, _f in held), layer=layer)
        return True

    def compare_patches(self, path: str, other: str, layer: int) -> bool:
        """Prepare the patch feature similarity within `path` and to `other` ('' for none) at block `layer`;
        answered by `similarity_ready`. False when the features are not cached."""
        a, b = self._run_of(path), self._run_of(other) if other else None
        if a is None or a.features is None or (other and (b is None or b.features is None)):
            return False
        self._ask(Similarity, a=a.features, b=None if b is None else b.features, sources=(path, other), layer=layer)
        return True

    def measure_share(self, path: str, layer: int, threshold: float) -> bool:
        """Find the patches of `path` whose output-token norm at block `layer` exceeds `threshold` and the share of
        attention they receive; answered by `share_ready`. False without cached features."""
        maps = self._run_of(path)
        if maps is None or maps.norms is None:
            return False
        self._ask(Share, image=path, result=maps.result, norms=maps.norms, layer=layer, threshold=float(threshold))
        return True

    def _ask(self, kind: type[Analysis], **args: Any) -> None:
        """Ask for an analysis ahead of queued runs; a newer one of the same kind replaces the one waiting."""
        client = self.session.client
        client.cancel(lambda r: r.kind is kind)
        client.submit(kind, first=True, image_size=self.session.model.image_size, **args)

    def _answer(self, signal: Any) -> Any:
        def answer(request: Request, result: Any) -> None:
            if request.image_size == self.session.model.image_size:   # else: for a size no longer shown
                signal.emit(result)
        return answer

    def _failed(self, request: Request, summary: str, details: str) -> None:
        """The panel stops waiting (`analysis_failed`), and the error is shown like any other."""
        self.analysis_failed.emit(request.kind, summary)
        self.session.error.emit(request.title, summary, details)
