"""The one error box of the window: every failure at the GUI boundary is shown here, once, with its details.

One box at a time: errors that come while it is open are added to it ("N errors; the latest: ..."), with every
error's details kept under 'Show Details'. Images that fail for the same reason (the maps of every image too large
for memory) join one error as "(and the same for N more images)" while the box holds it. `errors` keeps every
(title, summary) shown, in order (`--screenshot` prints them and decides its exit status from their titles).
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Callable, Sequence

from PySide6.QtWidgets import QMessageBox, QWidget

from vitviz.gui import dialogs

RUN_FAILED = "Could not run image"


class ErrorReporter:
    """Shows errors in one window-modal, non-blocking box over `parent`."""

    def __init__(self, parent: QWidget) -> None:
        self.parent = parent
        self.errors: list[tuple[str, str]] = []
        self.box: QMessageBox | None = None
        self._box_first = 0               # the index in `errors` of the box's first error
        self._box_count = 0               # how many errors the box holds (from `_box_first` on)
        self._repeats: dict[str, int] = {}  # why images failed -> index into `errors` (repeats join it)

    def show(self, title: str, summary: str, details: str, informative: str | None = None,
             actions: Sequence[tuple[str, Callable[[], object]]] = ()) -> None:
        """Show an error: in a new box, or added to the open one (`informative`: the box's second line, when it
        is not 'Everything already loaded is still available'; `actions`: (button text, what it does) offered
        beside OK, each closing the box)."""
        self.errors.append((title, summary))
        box = self.box
        if box is not None and box.isVisible():
            self._box_count += 1
            box.setText(f"{self._box_count} errors; the latest: {summary}")
            box.setDetailedText(box.detailedText() + f"\n\n=== {title}: {summary}\n{details}")
            self._add_actions(box, actions)
            return
        self.box = box = dialogs.error_box(self.parent, title, summary, details, informative)
        self._add_actions(box, actions)
        self._box_first, self._box_count = len(self.errors) - 1, 1
        box.destroyed.connect(lambda *_args: self._forget_box(box))

    @staticmethod
    def _add_actions(box: QMessageBox, actions: Sequence[tuple[str, Callable[[], object]]]) -> None:
        for text, act in actions:
            button = box.addButton(text, QMessageBox.ButtonRole.AcceptRole)
            button.setObjectName("errorAction")
            button.clicked.connect(lambda _checked=False, act=act: act())

    def show_run_error(self, path: str, summary: str, details: str) -> None:
        """One error per distinct reason an image failed: an image failing like an earlier one joins that error as
        '(and the same for N more images)' while the open box holds it; once that box is closed, the next such
        failure is a new error. The path is named once."""
        if path in summary or Path(path).name in summary:     # about this file: its own error, path named once
            self.show(RUN_FAILED, summary, details)
            return
        key = re.sub(r"\d+(\.\d+)?", "#", summary)             # 'only 21.4 GiB available' then '21.0 GiB': same
        first = self._repeats.get(key)
        if first is None or not self._box_holds(first):
            self._repeats[key] = len(self.errors)
            self.show(RUN_FAILED, f"{path}: {summary}", details)
            return
        title, text = self.errors[first]
        base, _sep, count = text.partition(" (and the same for ")
        more = int(count.split()[0]) + 1 if count else 1
        text = f"{base} (and the same for {more} more image{'s' if more > 1 else ''})"
        self.errors[first] = (title, text)
        box = self.box
        assert box is not None            # `_box_holds` said it is open
        if self._box_count == 1:          # the box shows that error alone: its new text
            box.setText(text)
        box.setDetailedText(box.detailedText() + f"\n\n=== the same for {path}")

    def forget_repeats(self) -> None:
        """A new model: its images' failures are new errors, not repeats of the previous model's."""
        self._repeats.clear()

    def _box_holds(self, index: int) -> bool:
        """Whether the box is open and holds `errors[index]`."""
        box = self.box
        if box is None or not box.isVisible():
            return False
        return self._box_first <= index < self._box_first + self._box_count

    def _forget_box(self, box: QMessageBox) -> None:
        if self.box is box:           # a closed box is deleted later: a newer one may be open by then
            self.box = None
