"""The 'Class relevance' map source: asks the session for the gradient maps the view shows, when it shows them.

Gradient maps need a forward and backward pass per image and class, so they are made only for the image on screen
and the class chosen (`ViewState.relevance_class`, None: its top class), in the worker; until they arrive the
panels draw a placeholder (`vitviz.gui.state.stack_for`), and the image list says `current_changed` again once they
are cached with the result. A class whose maps cannot be made (a model run from its own code, a headless model)
is said once in the error box and the view goes back to the map it showed before.
"""
from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QObject, QTimer

from vitviz.core.spec import ModelSpec
from vitviz.gui.session import Session
from vitviz.gui.signals import wire
from vitviz.gui.state import RELEVANCE_FIELDS, ViewState


class RelevanceSource(QObject):
    """Keeps the gradient maps of the current image and chosen class on their way while the view shows them."""

    def __init__(self, state: ViewState, session: Session, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.state, self.session = state, session
        self._previous = "cls" if state.source == "relevance" else state.source   # where a failure goes back to
        state.subscribe(self._on_state_changed)
        wire(session.image_list, current_changed=self._on_session_changed, result_ready=self._on_session_changed)
        session.relevance_pass.failed.connect(self._on_failed)
        session.text_pass.failed.connect(self._on_text_failed)
        session.model.model_loaded.connect(self._on_model_loaded)

    def _on_session_changed(self, *_what: object) -> None:
        self.ensure()

    def _on_state_changed(self, changed: set[str]) -> None:
        if "source" in changed and self.state.source != "relevance":
            self._previous = self.state.source
        if changed & (RELEVANCE_FIELDS | {"source"}):
            self.ensure()

    def ensure(self) -> bool:
        """Ask for the current image's gradient maps of the chosen class if the view shows them and they are
        neither cached nor on their way; True when asked."""
        path, target = self.session.image_list.current, self.state.relevance_class
        if self.state.source != "relevance" or not path:
            return False
        prompt = self.state.relevance_prompt
        if prompt:
            why = self.session.text_pass.why(path, prompt)
            if why is not None:
                self.session.note.emit(f"No relevance of {prompt!r} for {Path(path).name}: {why}")
                self._go_back()
                return False
            return self.session.text_pass.request(path, prompt)
        why = self.session.relevance_pass.why(path, target)
        if why is not None:     # failed before (the error box said why): say it again in the status bar
            self.session.note.emit(f"No class relevance for {Path(path).name}: {why}")
            self._go_back()
            return False
        return self.session.relevance_pass.request(path, target)

    def _on_model_loaded(self, spec: ModelSpec, _device: str) -> None:
        """A class the new model does not have becomes its top class."""
        target = self.state.relevance_class
        if target is not None and target >= spec.num_classes:
            self.state.update(relevance_class=None)

    def _on_failed(self, path: str, target: object, _summary: str) -> None:
        if (self.state.source == "relevance" and path == self.session.image_list.current
                and target == self.state.relevance_class):
            self._go_back()

    def _on_text_failed(self, path: str, prompt: str, _summary: str) -> None:
        if (self.state.source == "relevance" and path == self.session.image_list.current
                and prompt == self.state.relevance_prompt):
            self._go_back()

    def _go_back(self) -> None:
        """Show the map shown before (after the listeners of the current change have run)."""
        QTimer.singleShot(0, lambda: self.state.update(source=self._previous, relevance_prompt="")
                          if self.state.source == "relevance" else None)
