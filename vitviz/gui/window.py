"""The main window: the image panel with the docks around it, composed of parts.

The panels draw themselves from the view state and the session (`Session.current_changed`); `FileActions` holds
the File menu's dialogs and exports, `menus` builds the menus and toolbar from a table of callbacks, `ModelsMenu`
lists models through the session and `ErrorReporter` is the one error box. The window lays the parts out, turns
user intents (open, drop, step through layers and heads, pick a query) into calls on the session and the view state,
and keeps the layout and settings.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np
from PySide6.QtCore import QSettings, Qt, QTimer, Signal
from PySide6.QtGui import QCloseEvent, QDragEnterEvent, QDropEvent, QShowEvent
from PySide6.QtWidgets import QDockWidget, QMainWindow, QToolBar, QWidget

from vitviz.core.spec import ModelSpec
from vitviz.gui import bundled, menus, settings as st
from vitviz.gui.dropping import Dropped, classify
from vitviz.gui.errors import ErrorReporter
from vitviz.gui.file_actions import FileActions
from vitviz.gui.models_menu import ModelsMenu
from vitviz.gui.panels.base import LazyPanel
from vitviz.gui.panels.controls import ControlsPanel
from vitviz.gui.panels.headstats import HeadStatsPanel
from vitviz.gui.panels.image import ImagePanel
from vitviz.gui.panels.image_list import ImageListPanel
from vitviz.gui.panels.info import InfoPanel
from vitviz.gui.panels.matrix import MatrixPanel
from vitviz.gui.panels.overview import OverviewPanel
from vitviz.gui.panels.posembed import PosEmbedPanel
from vitviz.gui.panels.rollout import RolloutPanel
from vitviz.gui.session import Session
from vitviz.gui.state import ViewState, resolve_index
from vitviz.gui.status import StatusArea

PROBE_DELAY_MS = 300


def _not_openable(path: str) -> str:
    """Why a path named on the command line was not opened."""
    if not Path(path).exists():
        return "no such file or folder"
    if Path(path).is_dir():
        return "a folder without images or a checkpoint"
    return "not an image (PNG, JPEG, BMP, GIF, TIFF, WebP, PPM/PGM) or a checkpoint"


class MainWindow(QMainWindow):
    """vitviz's window. `refreshed` fires after the panels have redrawn for a change of the view or of the current
    result (tests and the screenshot wait on it)."""

    refreshed = Signal()

    def __init__(self, settings: QSettings, session: Session | None = None, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("vitvizMainWindow")
        self.setWindowTitle("vitviz")
        self.setAcceptDrops(True)
        self.settings = settings
        self.state = ViewState()
        self.session = session or Session(parent=self)
        self.reporter = ErrorReporter(self)
        self.notes: list[str] = []                            # status-bar notes (the screenshot prints them)
        self._last_map_source = "cls"
        self.requested_view: dict[str, Any] = {}              # layer/head/query asked for on the command line
        self.demo_instead_of_model = False                    # images were named without a model: the demo runs them
        self.persist_settings = True
        self.panel = ImagePanel(self.state, self.session)
        self.setCentralWidget(self.panel)
        self._add_docks()
        self.file_actions = FileActions(self.session, self.state, settings, self, self.reporter.show)
        self.menus = menus.build(self, self._menu_callbacks())
        menus.fill_view_menu(self.menus.view, self.docks, self.findChildren(QToolBar),
                             self.menus.actions["reset_layout"])
        self._fill_recent(st.recent_models(settings))
        self.models = ModelsMenu(self.session, self.menus.models, settings, self.choose_model, self.load_demo, self)
        self.status = StatusArea(self.statusBar())
        self.hover_label, self.busy_bar = self.status.hover_label, self.status.busy_bar
        self.resize(1400, 900)
        self._size_docks()
        self._default_layout = self.saveState(st.SETTINGS_VERSION)
        self._connect()
        self._restore_settings()
        self._probed = False

    # ------------------------------------------------------------------------------------------ layout

    def _add_docks(self) -> None:
        """Controls on the left; the image list and the overview on the right, the analysis panels as tabs next
        to the overview and the model info as a tab next to the image list."""
        state, session = self.state, self.session
        self.controls = ControlsPanel(state, session)
        self.images = ImageListPanel(session)
        self.overview = OverviewPanel(state, session)
        self.matrix = MatrixPanel(state, session)
        self.rollout_panel = RolloutPanel(state, session)
        self.posembed = PosEmbedPanel(state, session)
        self.headstats = HeadStatsPanel(state, session)
        self.info = InfoPanel(session)
        left, right = Qt.DockWidgetArea.LeftDockWidgetArea, Qt.DockWidgetArea.RightDockWidgetArea
        self.docks = [self._dock("Controls", "controlsDock", self.controls, left),
                      self._dock("Images", "imagesDock", self.images, right),
                      self._dock("Layer × head overview", "overviewDock", self.overview, right)]
        overview, images = self.docks[2], self.docks[1]
        for title, name, widget in (("Attention matrix", "matrixDock", self.matrix),
                                    ("Rollout", "rolloutDock", self.rollout_panel),
                                    ("Position embedding", "posEmbedDock", self.posembed),
                                    ("Head statistics", "headStatsDock", self.headstats)):
            self.docks.append(self._dock(title, name, widget, right))
            self.tabifyDockWidget(overview, self.docks[-1])
        self.docks.append(self._dock("Model info", "infoDock", self.info, right))
        self.tabifyDockWidget(images, self.docks[-1])
        overview.raise_()
        images.raise_()

    def _dock(self, title: str, name: str, widget: QWidget, area: Qt.DockWidgetArea) -> QDockWidget:
        dock = QDockWidget(title, self)
        dock.setObjectName(name)
        dock.setWidget(widget)
        self.addDockWidget(area, dock)
        if isinstance(widget, LazyPanel):
            dock.visibilityChanged.connect(widget.on_dock_visibility)
        return dock

    def dock(self, name: str) -> QDockWidget:
        """A dock by object name."""
        return next(d for d in self.docks if d.objectName() == name)

    def _size_docks(self) -> None:
        controls, images, overview = self.docks[:3]
        horizontal, vertical = Qt.Orientation.Horizontal, Qt.Orientation.Vertical
        self.resizeDocks([controls, images], [320, 400], horizontal)
        self.resizeDocks([images, overview], [300, 560], vertical)

    def _menu_callbacks(self) -> dict[str, Callable[[], object]]:
        """What each action of `menus.ACTIONS` does."""
        files = self.file_actions
        return {"open_model": files.open_model_dialog, "open_images": files.open_images_dialog,
                "export_png": files.export_png_dialog, "export_all": files.export_all_dialog,
                "export_npz": files.export_npz_dialog, "quit": self.close,
                "next_image": lambda: self.images.step(1), "prev_image": lambda: self.images.step(-1),
                "next_layer": lambda: self.step_layer(1), "prev_layer": lambda: self.step_layer(-1),
                "next_head": lambda: self.step_head(1), "prev_head": lambda: self.step_head(-1),
                "reset_layout": self.reset_layout}

    def _fill_recent(self, paths: list[str]) -> None:
        menus.fill_recent_menu(self.menus.recent, paths, self.choose_model)

    def _connect(self) -> None:
        s = self.session
        s.model_loaded.connect(self._on_model_loaded)
        s.run_failed.connect(self.reporter.show_run_error)
        s.error.connect(self.reporter.show)
        s.note.connect(self.note)
        s.device_changed.connect(self._on_device_changed)
        s.client.status.connect(self.status.show)
        s.client.busy_changed.connect(self.status.set_busy)
        s.client.progress.connect(self.status.show_progress)
        self.panel.hovered.connect(self._on_hover)
        self.panel.hovered.connect(self.posembed.hover)
        self.panel.query_clicked.connect(self.select_query)
        self.overview.tile_clicked.connect(self._on_tile_clicked)
        self.matrix.query_clicked.connect(self.select_query)
        self.rollout_panel.query_clicked.connect(self.select_query)
        self.headstats.head_clicked.connect(self._on_head_clicked)
        self.file_actions.model_chosen.connect(self.load_model)
        self.file_actions.exported.connect(self._on_exported)
        # last: the panels subscribed when they were made, so these fire once they have redrawn
        self.state.subscribe(self._after_redraw)
        s.current_changed.connect(self._after_redraw)

    def _after_redraw(self, *_what: object) -> None:
        self.refreshed.emit()

    @property
    def _values(self) -> np.ndarray | None:
        """The map the image panel shows (`ImagePanel.values`; tests/gui/test_panels_rollout.py reads it here)."""
        return self.panel.values

    # ------------------------------------------------------------------------------------------ user intents

    def load_model(self, path: str, device: str | None = None, **overrides: Any) -> None:
        """Load a checkpoint in the worker (on `device`, else the session's preferred device); the current model and
        results stay until it has loaded."""
        self.statusBar().showMessage(f"Loading {path}…")
        self.session.load_model(path, device=device, **overrides)

    def load_demo(self, images: bool = True, instead_of_model: bool = False) -> bool:
        """Load the bundled demo model, on the demo images (added to the list) with `images`; False, with a
        status-bar hint, when this install has no demo model. `instead_of_model`: images were named without a
        model, and the status bar says that the demo runs them and how to open one's own."""
        demo = bundled.demo_model()
        if demo is None:
            self.status.set_ready_message(bundled.missing_demo_hint())
            return False
        self.demo_instead_of_model = instead_of_model
        self.load_model(demo)
        if images:
            self.session.add_images(bundled.images_for(demo))
        return True

    def choose_model(self, path: str) -> None:
        """Load a model picked from a menu; into an empty image list, add the bundled images that suit it."""
        self.load_model(path)
        if not self.session.images:
            self.session.add_images(bundled.images_for(path))

    def open_paths(self, paths: list[str], strict: bool = False) -> None:
        """Open what was dropped or named on the command line: checkpoints load, images are added. What is neither
        is named in the status bar, or (`strict`, for the command line) reported as an error."""
        self.open_classified(classify(paths), strict=strict)

    def open_classified(self, dropped: Dropped, strict: bool = False) -> None:
        """`open_paths` for paths already sorted by `classify` (folders are walked once)."""
        if dropped.models:
            self.load_model(dropped.models[-1])
        if dropped.images:
            self.session.add_images(dropped.images)
        if dropped.ignored and strict:
            self.reporter.show("Could not open", "; ".join(f"{p}: {_not_openable(p)}" for p in dropped.ignored), "")
        elif dropped.ignored:
            self.statusBar().showMessage("Ignored (not an image or checkpoint): " + ", ".join(
                Path(p).name for p in dropped.ignored[:5]), 8000)

    def note(self, text: str) -> None:
        """Tell the user something that is not an error, in the status bar (it outlasts the worker's status)."""
        self.notes.append(text)
        self.status.note(text)

    def step_layer(self, delta: int) -> None:
        spec = self.session.spec
        if spec is not None:
            layer = self.state.layer
            start = -1 if layer == "mean" else int(layer)
            self.state.update(layer=(start + delta) % spec.depth)

    def step_head(self, delta: int) -> None:
        spec = self.session.spec
        if spec is not None:
            head = self.state.head
            start = -1 if isinstance(head, str) else int(head)
            self.state.update(head=(start + delta) % spec.num_heads)

    def select_query(self, token: int) -> None:
        """Make `token` the query everywhere (a negative token, or the selected one again, clears it). With the
        rollout map showing, the rollout starts from it; otherwise the map shows the token's attention."""
        if token < 0 or token == self.state.query:
            source = self._last_map_source if self.state.source == "token" else self.state.source
            self.state.update(query=None, source=source)
            return
        if self.state.source == "rollout":
            self.state.update(query=token)
            return
        if self.state.source != "token":
            self._last_map_source = self.state.source
        self.state.update(query=token, source="token")

    def reset_layout(self) -> None:
        self.restoreState(self._default_layout, st.SETTINGS_VERSION)
        for dock in self.docks:
            dock.setVisible(True)
            dock.setFloating(False)

    def is_idle(self) -> bool:
        """No request queued or running in the worker."""
        return not self.session.busy

    # ------------------------------------------------------------------------------------------ events

    def _on_model_loaded(self, spec: ModelSpec, device: str) -> None:
        """The view follows the new model: valid layer, head and query, the title, recent models, the status."""
        self._show_loaded(spec)
        self._check_requested_view(spec)
        self.reporter.forget_repeats()
        query = self.state.query if self.state.query is not None and self.state.query < spec.num_tokens else None
        self.state.update(layer=resolve_index(self.state.layer, spec.depth),
                          head=resolve_index(self.state.head, spec.num_heads), query=query,
                          source=self.state.source if query is not None or self.state.source != "token" else "cls")
        self.setWindowTitle(f"vitviz — {Path(self.session.model_path).name}")
        self.statusBar().showMessage(f"Loaded {spec.family} on {device}", 5000)

    def _show_loaded(self, spec: ModelSpec) -> None:
        """Recent models (not the demo), the Models menu and the idle status line after a model has loaded."""
        path = self.session.model_path
        demo = bundled.is_demo(path)
        if not demo:
            self._fill_recent(st.add_recent_model(self.settings, path))
            self.demo_instead_of_model = False
        self.models.mark_stale()
        if demo and self.demo_instead_of_model:
            message = bundled.demo_status(spec.grid, len(spec.labels), instead_of_model=True)
            self.notes.append(message)           # also on stderr under --screenshot
        else:
            message = bundled.demo_status(spec.grid, len(spec.labels)) if demo else "Ready"
        self.status.set_ready_message(message)

    def _check_requested_view(self, spec: ModelSpec) -> None:
        """Say so (once) when the command line asked for a layer, head or token this model does not have; the
        view then shows the nearest valid one."""
        asked, self.requested_view = self.requested_view, {}
        size = self.session.image_size or spec.image_size
        tokens = spec.num_prefix + (size[0] // spec.patch_size) * (size[1] // spec.patch_size)
        problems = []
        for name, value, count, what in (("--layer", asked.get("layer"), spec.depth, "layers"),
                                         ("--head", asked.get("head"), spec.num_heads, "heads"),
                                         ("--map token:", asked.get("query"), tokens, "tokens")):
            if isinstance(value, int) and not -count <= value < count:
                problems.append(f"{name}{'' if name.endswith(':') else ' '}{value} is out of range: the model "
                                f"has {count} {what} (0-{count - 1}, or negative counting from the end)")
        if problems:
            self.reporter.show("Command line", "; ".join(problems), "")

    def _on_device_changed(self, device: str) -> None:
        self.statusBar().showMessage(f"Model on {device}", 5000)

    def _on_exported(self, message: str) -> None:
        self.statusBar().showMessage(message, 8000)

    def _on_hover(self, row: int, col: int) -> None:
        self.hover_label.setText(self.panel.readout(row, col))

    def _on_tile_clicked(self, layer: int, head: int | str | None) -> None:
        self.state.update(layer=layer, **({} if head is None else {"head": head}))

    def _on_head_clicked(self, layer: int, head: int) -> None:
        self.state.update(layer=layer, head=head)

    # ------------------------------------------------------------------------------------------ drag and drop

    def dragEnterEvent(self, event: QDragEnterEvent) -> None:  # noqa: N802 - Qt override
        if event.mimeData().hasUrls() and any(u.isLocalFile() for u in event.mimeData().urls()):
            event.acceptProposedAction()
        else:
            event.ignore()

    def dropEvent(self, event: QDropEvent) -> None:  # noqa: N802 - Qt override
        paths = [u.toLocalFile() for u in event.mimeData().urls() if u.isLocalFile()]
        event.acceptProposedAction()
        self.open_paths(paths)

    # ------------------------------------------------------------------------------------------ settings

    def _restore_settings(self) -> None:
        """Apply geometry and layout only when both are from this version and both restore; else the defaults."""
        s = self.settings
        st.restore_view(s, self.state)
        if not st.is_current(s):
            return
        geometry, layout = st.read_bytes(s, "window/geometry"), st.read_bytes(s, "window/state")
        if geometry is None or layout is None:
            return
        if not (self.restoreGeometry(geometry) and self.restoreState(layout, st.SETTINGS_VERSION)):
            self.resize(1400, 900)
            self.restoreState(self._default_layout, st.SETTINGS_VERSION)

    def save_settings(self) -> None:
        s = self.settings
        s.setValue("version", st.SETTINGS_VERSION)
        s.setValue("window/geometry", self.saveGeometry())
        s.setValue("window/state", self.saveState(st.SETTINGS_VERSION))
        st.save_view(s, self.state)
        s.sync()

    def showEvent(self, event: QShowEvent) -> None:  # noqa: N802 - Qt override
        """Ask for the device list (which imports torch in the worker) only once the window is up."""
        super().showEvent(event)
        if not self._probed:
            self._probed = True
            QTimer.singleShot(PROBE_DELAY_MS, self.session.probe_devices)

    def closeEvent(self, event: QCloseEvent) -> None:  # noqa: N802 - Qt override
        if self.persist_settings:
            self.save_settings()
        self.session.shutdown()      # waits a bounded time for a running request (see WorkerClient.shutdown)
        super().closeEvent(event)
