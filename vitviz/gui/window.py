"""The main window: docks around the image panel, wired to the view state and the session.

Drawing lives in `drawing.DrawingMixin`, the File menu's actions in `file_actions.FileActionsMixin`, the menus in
`menus`.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from PySide6.QtCore import QSettings, Qt, QTimer, Signal
from PySide6.QtGui import QCloseEvent, QDragEnterEvent, QDropEvent, QShowEvent
from PySide6.QtWidgets import QDockWidget, QMainWindow, QMessageBox, QWidget

from vitviz.core.spec import ModelSpec, whole_patches
from vitviz.gui import bundled, dialogs, menus, settings as st
from vitviz.gui.panels.controls import ControlsPanel
from vitviz.gui.drawing import MAP_FIELDS, DrawingMixin
from vitviz.gui.dropping import Dropped, classify
from vitviz.gui.file_actions import FileActionsMixin
from vitviz.gui.panels.headstats import HeadStatsPanel
from vitviz.gui.panels.image_list import ImageListPanel
from vitviz.gui.panels.image import ImagePanel
from vitviz.gui.panels.info import InfoPanel
from vitviz.gui.panels.matrix import MatrixPanel
from vitviz.gui.models_menu import ModelsMenu
from vitviz.gui.panels.overview import OverviewPanel
from vitviz.gui.panels.base import LazyPanel
from vitviz.gui.panels.posembed import PosEmbedPanel
from vitviz.gui.panels.rollout import RolloutPanel
from vitviz.gui.session import Session
from vitviz.gui.state import ViewState, resolve_index
from vitviz.gui.status import StatusArea

PROBE_DELAY_MS = 300
RUN_FAILED = "Could not run image"


def _not_openable(path: str) -> str:
    """Why a path named on the command line was not opened."""
    if not Path(path).exists():
        return "no such file or folder"
    if Path(path).is_dir():
        return "a folder without images or a checkpoint"
    return "not an image (PNG, JPEG, BMP, GIF, TIFF, WebP, PPM/PGM) or a checkpoint"


class MainWindow(FileActionsMixin, DrawingMixin, QMainWindow):
    """vitviz's window. `refreshed` fires after every redraw of the panels (tests and the screenshot wait on
    it)."""

    refreshed = Signal()

    def __init__(self, settings: QSettings, session: Session | None = None, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("vitvizMainWindow")
        self.setWindowTitle("vitviz")
        self.setAcceptDrops(True)
        self.settings = settings
        self.state = ViewState()
        self.session = session or Session(parent=self)
        self.error_box: QMessageBox | None = None
        self.errors: list[tuple[str, str]] = []
        self.notes: list[str] = []                            # status-bar notes (the screenshot prints them)
        self._values: Any = None
        self._last_map_source = "cls"
        self.pending_size: tuple[int, int] | None = None     # input size to use once the model has loaded
        self.requested_view: dict[str, Any] = {}              # layer/head/query asked for on the command line
        self.device_preference: str | None = None            # --device: where loads go (None: CUDA when available)
        self.demo_instead_of_model = False                    # images were named without a model: the demo runs them
        self._run_errors: dict[str, int] = {}                 # why images failed -> index into `errors` (repeats join)
        self.persist_settings = True
        self.panel = ImagePanel()
        self.setCentralWidget(self.panel)
        self.controls = ControlsPanel(self.state)
        self.images = ImageListPanel()
        self.overview = OverviewPanel()
        self.docks = [self._dock("Controls", "controlsDock", self.controls, Qt.DockWidgetArea.LeftDockWidgetArea),
                      self._dock("Images", "imagesDock", self.images, Qt.DockWidgetArea.RightDockWidgetArea),
                      self._dock("Layer × head overview", "overviewDock", self.overview,
                                 Qt.DockWidgetArea.RightDockWidgetArea)]
        self._add_analysis_docks()
        self.actions_by_name = menus.build(self)
        menus.fill_view_menu(self, self.view_menu, self.actions_by_name["reset_layout"])
        menus.fill_recent_menu(self, self.recent_menu, st.recent_models(settings))
        self.models = ModelsMenu(self, self.models_menu)
        self.status = StatusArea(self.statusBar())
        self.hover_label, self.busy_bar = self.status.hover_label, self.status.busy_bar
        self.resize(1400, 900)
        self._size_docks()
        self._default_layout = self.saveState(st.SETTINGS_VERSION)
        self._connect()
        self._restore_settings()
        self._probed = False
        self._refresh(MAP_FIELDS)

    def _dock(self, title: str, name: str, widget: QWidget, area: Qt.DockWidgetArea) -> QDockWidget:
        dock = QDockWidget(title, self)
        dock.setObjectName(name)
        dock.setWidget(widget)
        self.addDockWidget(area, dock)
        if isinstance(widget, LazyPanel):
            dock.visibilityChanged.connect(widget.on_dock_visibility)
        return dock

    def _add_analysis_docks(self) -> None:
        """The analysis panels: tabs next to the overview; model info as a tab next to the image list."""
        self.matrix = MatrixPanel(self.state)
        self.rollout_panel = RolloutPanel(self.state)
        self.posembed = PosEmbedPanel()
        self.headstats = HeadStatsPanel(self.state)
        self.info = InfoPanel()
        right = Qt.DockWidgetArea.RightDockWidgetArea
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

    def dock(self, name: str) -> QDockWidget:
        """A dock by object name."""
        return next(d for d in self.docks if d.objectName() == name)

    def _size_docks(self) -> None:
        controls, images, overview = self.docks[:3]
        horizontal, vertical = Qt.Orientation.Horizontal, Qt.Orientation.Vertical
        self.resizeDocks([controls, images], [320, 400], horizontal)
        self.resizeDocks([images, overview], [300, 560], vertical)

    def _connect(self) -> None:
        self.state.subscribe(self._refresh)
        s = self.session
        s.model_loaded.connect(self._on_model_loaded)
        s.result_ready.connect(self._on_result_ready)
        s.run_failed.connect(self._on_run_failed)
        s.run_started.connect(self.images.set_pending)
        s.error.connect(self.show_error)
        s.devices_found.connect(self.controls.set_devices)
        s.device_changed.connect(self._on_device_changed)
        s.device_refused.connect(self._on_device_refused)
        s.client.status.connect(self.status.show)
        s.client.busy_changed.connect(self.status.set_busy)
        s.client.progress.connect(self.status.show_progress)
        self.images.current_changed.connect(self._on_current_image)
        self.controls.device_requested.connect(self.session.set_device)
        self.controls.size_requested.connect(self.set_image_size)
        self.panel.hovered.connect(self._on_hover)
        self.panel.clicked.connect(self._on_patch_clicked)
        self.overview.tile_clicked.connect(self._on_tile_clicked)
        self.panel.hovered.connect(self.posembed.hover)
        self.matrix.query_clicked.connect(self.select_query)
        self.rollout_panel.query_clicked.connect(self.select_query)
        self.headstats.head_clicked.connect(lambda layer, head: self.state.update(layer=layer, head=head))
        s.pos_embed_ready.connect(lambda: self.posembed.set_data(s.pos_embed, s.spec))
        s.device_changed.connect(lambda _d: self._update_info())

    # ------------------------------------------------------------------------------------------ user intents

    def load_model(self, path: str, device: str | None = None, **overrides: Any) -> None:
        """Load a checkpoint in the worker (on `device`, else `device_preference`); the current model and results
        stay until it has loaded."""
        self.statusBar().showMessage(f"Loading {path}…")
        self.session.load_model(path, device=device or self.device_preference, **overrides)

    def add_images(self, paths: list[str]) -> list[str]:
        """Add images to the list and run them (the current one first)."""
        added = self.images.add_paths(paths)
        self.session.add_images(added)
        self.session.ensure_all()
        return added

    def open_paths(self, paths: list[str], strict: bool = False) -> None:
        """Open what was dropped or named on the command line: checkpoints load, images are added. What is neither
        is named in the status bar, or (`strict`, for the command line) reported as an error."""
        self.open_classified(classify(paths), strict=strict)

    def open_classified(self, dropped: Dropped, strict: bool = False) -> None:
        """`open_paths` for paths already sorted by `classify` (folders are walked once)."""
        if dropped.models:
            self.load_model(dropped.models[-1])
        if dropped.images:
            self.add_images(dropped.images)
        if dropped.ignored and strict:
            self.show_error("Could not open", "; ".join(f"{p}: {_not_openable(p)}" for p in dropped.ignored), "")
        elif dropped.ignored:
            self.statusBar().showMessage("Ignored (not an image or checkpoint): " + ", ".join(
                Path(p).name for p in dropped.ignored[:5]), 8000)

    def set_image_size(self, height: int, width: int) -> None:
        """Run every image at (height, width) in whole patches; results at the previous size are dropped."""
        size = self.whole_patches((height, width))
        self.session.set_image_size(size)
        self.controls.show_size(size)
        self.headstats.reset()
        self.session.ensure_all()
        self.session.request_pos_embed()
        self._refresh({"image"})

    def whole_patches(self, size: tuple[int, int]) -> tuple[int, int]:
        """`size` rounded down to whole patches of the loaded model (at least one), as the model runs it; a note
        in the status bar says so when that changes the size."""
        spec = self.session.spec
        if spec is None:
            return tuple(size)
        p = spec.patch_size
        used = whole_patches(size, p, at_least_one=True)
        if used != tuple(size):
            why = "is smaller than one" if min(size) < p else "is not a multiple of the"
            self.note(f"Input size {size[0]}×{size[1]} {why} {p} px patch; using {used[0]}×{used[1]}")
        return used

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

    # ------------------------------------------------------------------------------------------ session events

    def _on_model_loaded(self, spec: ModelSpec, device: str) -> None:
        self.controls.set_spec(spec, device)
        self._show_loaded(spec)
        if self.pending_size is not None:
            self.pending_size = self.whole_patches(self.pending_size)
        self._check_requested_view(spec)
        self._run_errors.clear()
        query = self.state.query if self.state.query is not None and self.state.query < spec.num_tokens else None
        self.state.update(layer=resolve_index(self.state.layer, spec.depth),
                          head=resolve_index(self.state.head, spec.num_heads), query=query,
                          source=self.state.source if query is not None or self.state.source != "token" else "cls")
        self.setWindowTitle(f"vitviz — {Path(self.session.model_path).name}")
        self.headstats.reset()
        self.posembed.set_model(spec)
        if self.session.pos_embed is not None or self.session.pos_grid is not None:
            self.posembed.set_data(self.session.pos_embed, spec)
        self.statusBar().showMessage(f"Loaded {spec.family} on {device}", 5000)
        if self.pending_size is not None:
            self.session.set_image_size(self.pending_size)
            self.controls.show_size(self.pending_size)
            self.pending_size = None
            self.session.request_pos_embed()
        self.session.ensure_all()
        self._refresh({"image"})
        self._update_info()

    def _show_loaded(self, spec: ModelSpec) -> None:
        """Recent models (not the demo), the Models menu and the idle status line after a model has loaded."""
        path = self.session.model_path
        demo = bundled.is_demo(path)
        if not demo:
            menus.fill_recent_menu(self, self.recent_menu, st.add_recent_model(self.settings, path))
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
        size = self.pending_size or spec.image_size
        tokens = spec.num_prefix + (size[0] // spec.patch_size) * (size[1] // spec.patch_size)
        problems = []
        for name, value, count, what in (("--layer", asked.get("layer"), spec.depth, "layers"),
                                         ("--head", asked.get("head"), spec.num_heads, "heads"),
                                         ("--map token:", asked.get("query"), tokens, "tokens")):
            if isinstance(value, int) and not -count <= value < count:
                problems.append(f"{name}{'' if name.endswith(':') else ' '}{value} is out of range: the model "
                                f"has {count} {what} (0-{count - 1}, or negative counting from the end)")
        if problems:
            self.show_error("Command line", "; ".join(problems), "")

    def _on_device_refused(self, device: str) -> None:
        """--device named a device that is not here: the model runs on the CPU and later loads go there too."""
        self.device_preference = None

    def _on_device_changed(self, device: str) -> None:
        self.controls.set_device(device)
        self.statusBar().showMessage(f"Model on {device}", 5000)

    def _on_result_ready(self, path: str) -> None:
        maps = self.session.result(path)
        if maps is not None:
            self.images.set_predictions(path, maps.result.top_k(5))
            self.headstats.add(path, *maps.head_stats(), names=maps.result.spec.prefix_names)
        if path == self.session.current:
            self._refresh({"image"})
        self._update_info()

    def _on_run_failed(self, path: str, summary: str, details: str) -> None:
        self.images.set_failed(path, summary)
        if path == self.session.current:
            self._refresh({"image"})
        self._report_run_error(path, summary, details)

    def _report_run_error(self, path: str, summary: str, details: str) -> None:
        """One error per distinct reason: an image failing like an earlier one (the maps of every image too large
        for memory) joins that error as '(and the same for N more images)' while the open error box holds it; once
        that box is closed, the next such failure is a new error. The path is named once."""
        if path in summary or Path(path).name in summary:     # about this file: its own error, path named once
            self.show_error(RUN_FAILED, summary, details)
            return
        key = re.sub(r"\d+(\.\d+)?", "#", summary)             # 'only 21.4 GiB available' then '21.0 GiB': same
        first = self._run_errors.get(key)
        box = self.error_box
        if first is None or not self._box_holds(first):
            self._run_errors[key] = len(self.errors)
            self.show_error(RUN_FAILED, f"{path}: {summary}", details)
            return
        title, text = self.errors[first]
        base, _sep, _count = text.partition(" (and the same for ")
        more = int(_count.split()[0]) + 1 if _count else 1
        text = f"{base} (and the same for {more} more image{'s' if more > 1 else ''})"
        self.errors[first] = (title, text)
        if int(box.property("count")) == 1:                    # the box shows that error alone: its new text
            box.setText(text)
        box.setDetailedText(box.detailedText() + f"\n\n=== the same for {path}")

    def _box_holds(self, index: int) -> bool:
        """Whether the error box is open and holds `errors[index]` (it holds `count` errors from `first` on)."""
        box = self.error_box
        if box is None or not box.isVisible():
            return False
        first = int(box.property("first"))
        return first <= index < first + int(box.property("count"))

    def _on_current_image(self, path: str) -> None:
        self.session.current = path
        self.session.ensure(path, first=True)
        self._refresh({"image"})
        self._update_info()

    def show_error(self, title: str, summary: str, details: str) -> None:
        """One dialog at a time: further errors while it is open are added to it."""
        self.errors.append((title, summary))
        box = self.error_box
        if box is not None and box.isVisible():
            count = int(box.property("count") or 1) + 1
            box.setProperty("count", count)
            box.setText(f"{count} errors; the latest: {summary}")
            box.setDetailedText(box.detailedText() + f"\n\n=== {title}: {summary}\n{details}")
            return
        self.error_box = dialogs.error_box(self, title, summary, details)
        self.error_box.setProperty("first", len(self.errors) - 1)   # the index of its first error in `errors`
        self.error_box.setProperty("count", 1)
        self.error_box.destroyed.connect(self._forget_error_box)

    def _forget_error_box(self) -> None:
        self.error_box = None

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

