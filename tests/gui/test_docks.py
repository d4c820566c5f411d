"""The side docks' table (`vitviz.gui.docks`): a dock registered outside the window is built, listed in the View and
Models menus, shown only with its work and its panel built on first show, as Compare and the Timeline are."""
from __future__ import annotations

from typing import Any

import pytest
from PySide6.QtCore import QObject, Signal
from PySide6.QtGui import QKeySequence
from PySide6.QtWidgets import QLabel

from vitviz.gui import docks


class NotesPart(QObject):
    """A stand-in kind of background work: it has work while `active`, and says so with `changed`."""

    changed = Signal()

    def __init__(self, window: Any) -> None:
        super().__init__(window)
        self.active = False
        self.opened = 0


NOTES = docks.SideDock(
    "notesDock", "Notes", "Model notes", "notes kept beside the model", attribute="notes",
    part=NotesPart, panel=lambda _window, part: QLabel(f"notes of {type(part).__name__}"), order=40,
    work=lambda part: part.active, work_changed="changed",
    actions=lambda window, part: [docks.action(window, "Open &notes…", "open_notes", "Open the model's notes",
                                               lambda: setattr(part, "opened", part.opened + 1), "Ctrl+Shift+N")])


@pytest.fixture(autouse=True)
def notes_registered(monkeypatch) -> None:  # noqa: ANN001 - autouse: before the conftest `window` is built
    docks.registered()                                 # the built-in rows first, as in the application
    monkeypatch.setitem(docks._REGISTERED, NOTES.name, NOTES)   # removed again after the test


def test_the_table_holds_todays_docks_in_order() -> None:
    names = [row.name for row in docks.registered()]
    assert names == ["compareDock", "timelineDock", "interventionsDock", "notesDock"]


def test_a_name_registered_twice_is_refused() -> None:
    with pytest.raises(AssertionError, match="notesDock"):
        docks.register(docks.SideDock("notesDock", "N", "N", "n", attribute="n", part=NotesPart,
                                      panel=lambda _w, _p: QLabel(), order=50))
    assert docks.register(NOTES) is NOTES          # the same row again is no conflict


def test_a_dock_registered_outside_the_window_is_in_it_and_its_menus(qtbot, window) -> None:  # noqa: ANN001
    dock = window.dock("notesDock")
    assert dock in window.side_docks and dock.windowTitle() == "Notes"
    assert dock.toolTip() == "Model notes: notes kept beside the model"
    assert isinstance(window.notes, NotesPart) and window.notes.parent() is window
    assert "Model notes" in [a.text() for a in window.menus.view.actions()]
    entry = next(a for a in window.menus.models.actions() if a.objectName() == "open_notes")
    assert entry.shortcut() == QKeySequence("Ctrl+Shift+N")
    entry.trigger()
    assert window.notes.opened == 1
    names = [a.objectName() for a in window.menus.models.actions() if a.objectName()]
    assert names.index("compare_with") < names.index("open_training_run") < names.index("open_notes")


def test_it_is_shown_only_with_its_work_and_its_panel_built_then(qtbot, window) -> None:  # noqa: ANN001
    dock = window.dock("notesDock")
    assert not dock.isVisible() and not isinstance(dock.widget(), QLabel)     # no work yet: no panel either
    window.notes.active = True
    window.notes.changed.emit()
    qtbot.waitUntil(dock.isVisible)
    assert dock.widget() is window.side_panel("notesDock") and dock.widget().text() == "notes of NotesPart"
    window.notes.active = False
    window.notes.changed.emit()
    assert not dock.isVisible()


def test_a_saved_layout_brings_it_back_only_with_its_work(qtbot, window, settings) -> None:  # noqa: ANN001
    from vitviz.gui.window import MainWindow

    window.notes.active = True
    window.notes.changed.emit()
    qtbot.waitUntil(window.dock("notesDock").isVisible)
    window.save_settings()
    again = MainWindow(settings)
    qtbot.addWidget(again)
    again.persist_settings = False
    again.show()
    assert again.dock("notesDock").isHidden()        # the new window's notes part has no work
    again.close()
    again.session.shutdown()
