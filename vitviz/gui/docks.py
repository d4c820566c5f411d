"""The docks below the image, each with the session part whose work it shows: one table the window reads.

A kind of background work (a comparison, a training run's timeline, interventions) is a session part (its requests
routed with `Session.route`) and a panel; `SideDock` is the row that puts it in the window: its dock's name and
titles, how to build its part and its panel, its Models-menu actions, and whether it is shown only with its work.
`MainWindow` builds every registered row in one loop and names none of them.

A row is registered by `register(SideDock(...))` in the part's own module: `registered()` imports every module of
`vitviz.gui`, as `vitviz.core.reading.families` finds its families, so a new part is its module and its panel, and
neither the window nor this file is edited (each row is in its part's module: Compare's in `vitviz.gui.compare`,
the Timeline's in `vitviz.gui.timeline`, Interventions' in `vitviz.gui.interventions`).
"""
from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from typing import Any, Callable

from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import QDockWidget, QWidget

MainWindow = Any    # vitviz.gui.window.MainWindow, which only the application imports (test_gui_structure)


@dataclass(frozen=True)
class SideDock:
    """One dock below the image and the session part behind it.

    `part(window)` builds the part (kept as `window.<attribute>`), `panel(window, part)` its panel. A `work` dock
    is shown only while `work(part)` is true, checked whenever the part emits `work_changed` and when a saved layout
    is restored (an empty comparison would only take a third of the window); its panel (pyqtgraph plots, ~0.1 s) is
    built the first time the dock is shown. A dock without `work` has its panel built at once and is revealed
    when the part emits `reveal_on`. `actions(window, part)` are its Models-menu entries; `attach(window, part,
    dock)` any other wiring. `order` places the dock in the View menu and among its neighbours."""

    name: str
    title: str
    full: str
    what: str
    attribute: str
    part: Callable[[MainWindow], Any]
    panel: Callable[[MainWindow, Any], QWidget]
    order: int
    work: Callable[[Any], bool] | None = None
    work_changed: str = ""
    reveal_on: str = ""
    actions: Callable[[MainWindow, Any], list[QAction]] = lambda _window, _part: []
    attach: Callable[[MainWindow, Any, QDockWidget], None] = lambda _window, _part, _dock: None

    @property
    def tip(self) -> str:
        return f"{self.full}: {self.what}"


_REGISTERED: dict[str, SideDock] = {}
_DISCOVERED = False


def register(dock: SideDock) -> SideDock:
    """Add `dock` to the table every window reads (a name registered twice is a bug)."""
    if dock.name in _REGISTERED and _REGISTERED[dock.name] != dock:
        raise AssertionError(f"side dock {dock.name!r} is registered twice")
    _REGISTERED[dock.name] = dock
    return dock


def registered() -> list[SideDock]:
    """Every side dock, in `order`, once every module of `vitviz.gui` has been imported (and so has registered
    its rows; all of them are imported by the time the window is up anyway)."""
    global _DISCOVERED
    if not _DISCOVERED:
        from vitviz import gui

        for info in pkgutil.iter_modules(gui.__path__):
            if not info.name.startswith("_"):
                importlib.import_module(f"{gui.__name__}.{info.name}")
        _DISCOVERED = True
    return sorted(_REGISTERED.values(), key=lambda dock: dock.order)


def panel_of(where: str) -> Callable[[MainWindow, Any], QWidget]:
    """The `panel` of a row whose panel shows the view state and the part, `Panel(window.state, part)`, with the
    panel's class named 'module:Class' and imported when the panel is first built (a panel module imports its
    part's module, which registers the row, so the part's module cannot import it)."""
    def build(window: MainWindow, part: Any) -> QWidget:
        module, name = where.split(":")
        return getattr(importlib.import_module(module), name)(window.state, part)
    return build


def ask_then(window: MainWindow, ask: Callable[[QWidget], str], then: Callable[[str], object]) -> Callable[[], None]:
    """A Models-menu entry's `run`: `ask(window)` for a path (a file dialog; '' when cancelled), then `then(path)`."""
    def run() -> None:
        path = ask(window)
        if path:
            then(path)
    return run


def action(window: MainWindow, text: str, name: str, tip: str, run: Callable[[], object],
           shortcut: str = "") -> QAction:
    """A Models-menu entry of a side dock: `text`, object name `name`, status tip `tip`, `run` when triggered."""
    act = QAction(text, window)
    act.setObjectName(name)
    act.setStatusTip(tip)
    if shortcut:
        act.setShortcut(QKeySequence(shortcut))
    act.triggered.connect(lambda _checked=False: run())
    return act
