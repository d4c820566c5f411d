"""The main window: the image panel with the docks around it, composed of parts.

The panels draw themselves from the view state and the session (`ImageList.current_changed`); `FileActions` holds
the File menu's dialogs and exports, `menus` builds the menus and toolbar from a table of callbacks, `ModelsMenu`
lists models through the session and `ErrorReporter` is the one error box. The window lays the parts out, turns
user intents (open, drop, step through layers and heads, pick a query) into calls on the session and the view state,
and keeps the layout and settings.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable

import numpy as np
from PySide6.QtCore import QEvent, QMimeData, QPoint, QRect, QSettings, QSize, Qt, QTimer, Signal
from PySide6.QtGui import QCloseEvent, QDragEnterEvent, QDropEvent, QGuiApplication, QShowEvent
from PySide6.QtWidgets import (QDockWidget, QFrame, QInputDialog, QLineEdit, QMainWindow, QScrollArea, QTabBar,
                               QToolBar, QWidget)

from vitviz import catalog
from vitviz.core.analyses.mapkinds import unavailable
from vitviz.core.analyses.maps import MapKind, SelectionError
from vitviz.core.spec import ModelSpec
from vitviz.core.analyses.tokens import TokenLayout, follow_query
from vitviz.errors import VitvizError
from vitviz.gui import assumptions, bundled, dialogs, docks, help as helpdialogs, menus, settings as st
from vitviz.gui.dropping import Dropped, classify
from vitviz.gui.errors import ErrorReporter
from vitviz.gui.file_actions import FileActions
from vitviz.gui.interventions import InterventionBanner
from vitviz.gui.models_menu import ModelsMenu
from vitviz.gui.panels.base import LazyPanel, relay
from vitviz.gui.panels.controls import ControlsPanel
from vitviz.gui.panels.features import FeaturesPanel
from vitviz.gui.panels.headstats import HeadStatsPanel
from vitviz.gui.panels.image import ImagePanel
from vitviz.gui.panels.image_list import ImageListPanel
from vitviz.gui.panels.info import InfoPanel
from vitviz.gui.panels.matrix import MatrixPanel
from vitviz.gui.panels.overview import OverviewPanel
from vitviz.gui.panels.posembed import PosEmbedPanel
from vitviz.gui.panels.rollout import RolloutPanel
from vitviz.gui.relevance import RelevanceSource
from vitviz.gui.session import Session
from vitviz.gui.state import (QUERY_SOURCES, ROLLOUT_FIELDS, QueryScaleRule, ViewState, default_source, map_kind,
                              query_source, view_for_model)
from vitviz.gui.status import StatusArea, WrappingStatusBar
from vitviz.gui.verdict import Verifier

PROBE_DELAY_MS = 300
DEFAULT_SIZE = QSize(1400, 900)      # the window's size on a large screen; smaller screens get `default_size`
NAME_EXAMPLES = "hf:facebook/dinov2-small, timm:vit_small_patch14_reg4_dinov2.lvd142m, torchvision:vit_b_16"
DIFFERS = "Differs from the original"      # the error title of a model whose maps are not its original's

# dock object name -> (tab title, full name, what it shows): short tab titles, so five tabs fit side by side
# without being elided; the full name is the tab's tooltip, the View menu entry and the floating dock's title.
# The docks below the image (Compare, Timeline, Ablate, ...) are rows of `vitviz.gui.docks`, with their parts.
DOCKS = {
    "controlsDock": ("Controls", "Controls", "model, device, input size and every view setting"),
    "imagesDock": ("Images", "Images", "the images with their top-5 predictions; Delete removes, right-click for "
                                       "more"),
    "overviewDock": ("Overview", "Layer × head overview", "the current map for every layer and head; click a tile"),
    "matrixDock": ("Matrix", "Attention matrix", "the T × T attention of the selected layer and head"),
    "rolloutDock": ("Rollout", "Rollout", "attention rollout with live settings, beside the raw attention"),
    "posEmbedDock": ("Positions", "Position embedding", "how similar the learned position embeddings are"),
    "headStatsDock": ("Heads", "Head statistics", "attention distance, entropy and attention by token kind"),
    "featuresDock": ("Features", "Token features", "feature PCA, patch similarity within and across images, and "
                                                   "token norms"),
    "infoDock": ("Info", "Model info", "what was detected and where each value came from"),
}


def default_size(available: QRect) -> QSize:
    """The window's first size on a screen with `available` room: `DEFAULT_SIZE`, or what fits with a margin
    for the window frame (1280 × 800 screens get about 1216 × 736)."""
    return QSize(min(DEFAULT_SIZE.width(), int(available.width() * 0.95)),
                 min(DEFAULT_SIZE.height(), int(available.height() * 0.92)))


class ScrollingPanel(QScrollArea):
    """A panel in a vertical scroll area, as wide as the panel needs: the Controls panel with Model settings
    unfolded (about 880 px) is taller than a 1280 x 800 screen, and unscrolled its minimum height made the window
    taller than the screen (977 px on one 800 px high). Its minimum width follows the panel's (which grows when
    Model settings unfolds), so nothing is cut off at the side."""

    MIN_HEIGHT = 120

    def __init__(self, panel: QWidget) -> None:
        super().__init__()
        self.setObjectName(f"{panel.objectName() or 'panel'}Scroll")
        self.setWidgetResizable(True)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setWidget(panel)

    def _width(self, hint: QSize) -> int:
        return hint.width() + self.verticalScrollBar().sizeHint().width() + 2 * self.frameWidth()

    def minimumSizeHint(self) -> QSize:  # noqa: N802 - Qt override
        panel = self.widget()
        return QSize(self._width(panel.minimumSizeHint()) if panel else 0, self.MIN_HEIGHT)

    def sizeHint(self) -> QSize:  # noqa: N802 - Qt override
        panel = self.widget()
        return QSize(self._width(panel.sizeHint()), panel.sizeHint().height()) if panel else super().sizeHint()

    def event(self, event: QEvent) -> bool:
        if event.type() == QEvent.Type.LayoutRequest:
            self.updateGeometry()         # the panel's minimum width changed (Model settings folded or unfolded)
        return super().event(event)


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
        self.session.model.ask_assumptions = True                   # what the file does not say is asked, not assumed
                                                              # silently
        self.reporter = ErrorReporter(self)
        self.notes: list[str] = []                            # status-bar notes (the screenshot prints them)
        self._last_map_source = "cls"
        self.requested_view: dict[str, Any] = {}              # layer/head/query asked for on the command line
        self.demo_instead_of_model = False                    # images were named without a model: the demo runs them
        self.demo_fallback = False                            # a failed load with nothing open opens the demo
        self._demo_fallback_done = False                      # (run_app switches it on, except for --screenshot)
        self.persist_settings = True
        self.trust_code = False                               # --screenshot: the --code flag is the confirmation
        self._trusted_code: set[str] = set()                  # FILE.py:FACTORY the user agreed to run this session
        self.assumptions_dialog: dialogs.AssumptionsDialog | None = None   # open while what the file does not
                                                                           # say is asked
        self._differs_reported: object = None                 # the Verification whose 'differs' was reported
        self.code_box: Any = None                             # open while running a file's code is asked
        self._layout_now: TokenLayout | None = None           # the loaded model's tokens at the current size
        self._previous_depth = 0                              # the depth of the model shown before this one
        self.query_scale_rule = QueryScaleRule(self.state, note=self._query_note)
        self.state.subscribe(self.query_scale_rule)           # first: the panels draw with the rule applied
        self.state.subscribe(self._withdraw_query_note)
        self.state.subscribe(self._precompute_rule)
        self._precompute_rule({"source"})                     # the map on show from the start (the CLS map)
        self.panel = ImagePanel(self.state, self.session.model, self.session.image_list)
        self.setCentralWidget(self.panel)
        self._add_docks()
        self._add_side_docks()
        self.file_actions = FileActions(self.session, self.state, settings, self, self.reporter.show)
        self.menus = menus.build(self, self._menu_callbacks())
        self.intervention_banner = InterventionBanner(self.interventions, self.menus.toolbar)   # while intervened
        menus.fill_view_menu(self.menus.view, self.docks + self.side_docks, self.findChildren(QToolBar),
                             self.menus.actions["reset_layout"])
        self._fill_recent(st.recent_models(settings))
        self._add_image_list_actions()
        self.models = ModelsMenu(self.session, self.menus.models, settings, self.choose_model, self.load_demo, self)
        self.models.add_extra(self._side_actions())
        self.models.open_by_name.connect(self.open_by_name_dialog)
        self.setStatusBar(WrappingStatusBar())
        self.status = StatusArea(self.statusBar())
        self.verifier = Verifier(self.session, settings, self, self.with_code_trust)
        self.hover_label, self.busy_bar = self.status.hover_label, self.status.busy_bar
        self.session.stop_waiting_after = st.stop_waiting_seconds(settings)   # the user's code that never returns
        self.resize(default_size(self._available()))
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
        self.images = ImageListPanel(session.image_list, session.cached)
        self.images.current_requested.connect(session.set_current)
        self.images.remove_requested.connect(session.remove_images)
        self.overview = OverviewPanel(state, session.model, session.image_list)
        self.matrix = MatrixPanel(state, session.image_list, session.image_list.current_maps)
        self.rollout_panel = RolloutPanel(state, session.image_list, session.image_list.current_maps)
        self.posembed = PosEmbedPanel(state, session.model)
        self.headstats = HeadStatsPanel(state, session)
        self.info = InfoPanel(session)
        self.features = FeaturesPanel(state, session)
        self.relevance_source = RelevanceSource(state, session, self)
        left, right = Qt.DockWidgetArea.LeftDockWidgetArea, Qt.DockWidgetArea.RightDockWidgetArea
        self.docks = [self._dock("controlsDock", ScrollingPanel(self.controls), left),
                      self._dock("imagesDock", self.images, right),
                      self._dock("overviewDock", self.overview, right)]
        overview, images = self.docks[2], self.docks[1]
        for name, widget in (("matrixDock", self.matrix), ("rolloutDock", self.rollout_panel),
                             ("posEmbedDock", self.posembed), ("headStatsDock", self.headstats),
                             ("featuresDock", self.features)):
            self.docks.append(self._dock(name, widget, right))
            self.tabifyDockWidget(overview, self.docks[-1])
        self.docks.append(self._dock("infoDock", self.info, right))
        self.tabifyDockWidget(images, self.docks[-1])
        overview.raise_()
        images.raise_()
        self._tab_tips_timer = QTimer(self)
        self._tab_tips_timer.setSingleShot(True)
        self._tab_tips_timer.timeout.connect(self.update_tab_tips)
        for dock in self.docks:
            for signal in (dock.dockLocationChanged, dock.topLevelChanged, dock.visibilityChanged):
                signal.connect(lambda *_a: self._tab_tips_timer.start(0))

    def _add_side_docks(self) -> None:
        """The docks below the image, one per registered `docks.SideDock`, each with its session part
        (`self.<attribute>`), all hidden until their work is opened or asked for. A dock shown only with its work
        gets its panel the first time it is shown, not at startup (`side_panel`)."""
        self.side_rows: dict[str, docks.SideDock] = {row.name: row for row in docks.registered()}
        self._side_panels: dict[str, QWidget] = {}
        self.side_docks: list[QDockWidget] = []
        bottom = Qt.DockWidgetArea.BottomDockWidgetArea
        for row in self.side_rows.values():
            part = row.part(self)
            setattr(self, row.attribute, part)
            dock = self._dock(row.name, QWidget() if row.work else row.panel(self, part), bottom, row)
            dock.hide()
            self.side_docks.append(dock)
            if row.work:
                dock.visibilityChanged.connect(lambda visible, n=row.name: visible and self.side_panel(n))
                getattr(part, row.work_changed).connect(lambda n=row.name: self._show_side(n))
            else:
                getattr(part, row.reveal_on).connect(lambda d=dock: self._reveal(d))
            row.attach(self, part, dock)

    def _reveal(self, dock: QDockWidget) -> None:
        """Show a hidden dock below the image (a tab beside another one open there) and raise it."""
        if not dock.isVisible():
            other = next((d for d in self.side_docks if d is not dock and d.isVisible()), None)
            if other is not None and not dock.isFloating() and not self.tabifiedDockWidgets(dock):
                self.tabifyDockWidget(other, dock)
            dock.show()
        dock.raise_()

    def side_panel(self, name: str) -> QWidget:
        """The panel of the side dock `name` shown with its work, built (and put in its dock) the first time it is
        asked for."""
        panel = self._side_panels.get(name)
        if panel is None:
            row = self.side_rows[name]
            panel = self._side_panels[name] = row.panel(self, getattr(self, row.attribute))
            dock = self.dock(name)
            dock.setWidget(panel)
            if isinstance(panel, LazyPanel):
                dock.visibilityChanged.connect(panel.on_dock_visibility)
                panel.on_dock_visibility(dock.isVisible())
        return panel

    @property
    def compare_panel(self) -> Any:
        return self.side_panel("compareDock")

    @property
    def timeline_panel(self) -> Any:
        return self.side_panel("timelineDock")

    def _show_side(self, name: str) -> None:
        """Show the side dock `name` while its part has work (a tab beside another such dock open), hide it
        otherwise."""
        row, dock = self.side_rows[name], self.dock(name)
        active = row.work is not None and row.work(getattr(self, row.attribute))
        if active:
            self.side_panel(name)
        if active and not dock.isVisible():
            other = next((d for d in self.side_docks if d is not dock and self.side_rows[d.objectName()].work
                          and d.isVisible()), None)
            if other is not None and not dock.isFloating() and not self.tabifiedDockWidgets(dock):
                self.tabifyDockWidget(other, dock)       # both open: tabs below the image
            dock.show()
            dock.raise_()
        elif not active and not dock.isHidden():   # isHidden: also before the window is shown (a restored layout)
            dock.hide()

    def _side_actions(self) -> list[Any]:
        """Models › Verify against…, then each side dock's entries (Compare with…, Open training run…)."""
        from PySide6.QtGui import QAction

        verify = QAction("&Verify against…", self)
        verify.setObjectName("verify_against")
        verify.setStatusTip("Check the loaded model against an original you name: a library architecture, or your "
                            "own code")
        verify.triggered.connect(lambda _checked=False: self.verifier.open_dialog())
        self.verify_action = verify
        rows = self.side_rows.values()
        return [verify] + [act for row in rows for act in row.actions(self, getattr(self, row.attribute))]

    def compare_with(self, path: str, **overrides: Any) -> None:
        """Compare the loaded model (A) with model B at `path` (loaded in the worker with `overrides`, heads=...;
        B is another model, so A's settings are not carried over; what B's file does not say is named in the
        dock)."""
        self.compare.open(path, **overrides)

    def open_run(self, folder: str, **overrides: Any) -> None:
        """Open a folder of checkpoints as a timeline: the training of the loaded model, so its settings (heads=...,
        chosen for it) go to every checkpoint unless given (the dock says which)."""
        self.timeline.open(folder, **{**self.session.model.load_overrides, **overrides})

    def _dock(self, name: str, widget: QWidget, area: Qt.DockWidgetArea,
              row: docks.SideDock | None = None) -> QDockWidget:
        """A dock `name` holding `widget` in `area`, titled from `DOCKS` or, below the image, from its `row`."""
        title, full, what = DOCKS[name] if row is None else (row.title, row.full, row.what)
        dock = QDockWidget(title, self)
        dock.setObjectName(name)
        dock.setWidget(widget)
        dock.setToolTip(f"{full}: {what}")
        dock.toggleViewAction().setText(full)
        dock.toggleViewAction().setStatusTip(f"Show or hide the {full} panel: {what}")
        self.addDockWidget(area, dock)
        if isinstance(widget, LazyPanel):
            dock.visibilityChanged.connect(widget.on_dock_visibility)
        return dock

    def update_tab_tips(self) -> None:
        """Give every dock tab the full name of its panel as a tooltip (Qt rebuilds the tab bars whenever the
        docks are rearranged, so this runs after every change)."""
        tips = {title: f"{full}: {what}" for title, full, what in DOCKS.values()}
        tips.update({row.title: row.tip for row in self.side_rows.values()})
        for bar in self.findChildren(QTabBar):
            for i in range(bar.count()):
                tip = tips.get(bar.tabText(i).replace("&", ""))
                if tip:
                    bar.setTabToolTip(i, tip)

    def _available(self) -> QRect:
        screen = self.screen() or QGuiApplication.primaryScreen()
        return screen.availableGeometry() if screen is not None else QRect(0, 0, 1600, 1000)

    def _add_image_list_actions(self) -> None:
        """The image list's remove, remove-failed and clear actions, also in the File menu."""
        sub = self.menus.file.addMenu("Image &list")
        sub.setObjectName("imageListMenu")
        sub.addActions([self.images.remove_action, self.images.remove_failed_action])
        sub.addSeparator()
        sub.addAction(self.images.clear_action)
        sub.aboutToShow.connect(self.images.update_actions)
        self.menus.file.insertMenu(self.menus.actions["quit"], sub)
        self.menus.file.insertSeparator(self.menus.actions["quit"])

    def dock(self, name: str) -> QDockWidget:
        """A dock by object name."""
        return next(d for d in self.docks + self.side_docks if d.objectName() == name)

    def use_size(self, size: QSize) -> None:
        """Resize the window and lay the docks out for that size as the default layout (`--screenshot` uses
        `DEFAULT_SIZE` whatever the screen, so screenshots look the same everywhere)."""
        self.resize(size)
        self._size_docks()
        self._default_layout = self.saveState(st.SETTINGS_VERSION)

    def _size_docks(self) -> None:
        """Controls a quarter of the width at most; the right column wide enough for its tabs to be read whole
        (at most 40 % of the window), about a third otherwise; images a third of the height."""
        controls, images, overview = self.docks[:3]
        horizontal, vertical = Qt.Orientation.Horizontal, Qt.Orientation.Vertical
        width, height = self.width(), self.height()
        right = min(int(width * 0.4), max(min(430, int(width * 0.33)), self._tabs_width()))
        self.resizeDocks([controls, images], [min(320, width // 4), right], horizontal)
        self.resizeDocks([images, overview], [int(height * 0.33), int(height * 0.62)], vertical)

    def _tabs_width(self) -> int:
        """The width the analysis docks' tabs need side by side, unelided (from the tab bar when Qt has made it,
        else estimated from the titles)."""
        titles = [d.windowTitle() for d in self.docks if self.tabifiedDockWidgets(d) and d.objectName() != "infoDock"
                  and d.objectName() != "imagesDock"]
        for bar in self.findChildren(QTabBar):
            if bar.parent() is self and {bar.tabText(i) for i in range(bar.count())} == set(titles):
                return sum(bar.tabSizeHint(i).width() for i in range(bar.count())) + 6
        metrics = self.fontMetrics()
        return sum(metrics.horizontalAdvance(t) + 26 for t in titles) + 6

    def _menu_callbacks(self) -> dict[str, Callable[[], object]]:
        """What each action of `menus.ACTIONS` does."""
        files = self.file_actions
        return {"open_model": files.open_model_dialog, "open_images": files.open_images_dialog,
                "open_model_folder": files.open_model_folder_dialog,
                "open_image_folder": files.open_image_folder_dialog,
                "shortcuts": self.show_shortcuts, "about": self.show_about,
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
        s.model.model_loaded.connect(self._on_model_loaded)
        s.image_list.run_failed.connect(self.reporter.show_run_error)
        s.error.connect(self._on_error)
        s.note.connect(self.note)
        s.model.device_changed.connect(self._on_device_changed)
        s.status.connect(self.status.show)
        s.busy_changed.connect(self.status.set_busy)
        s.progress.connect(self.status.show_progress)
        self.status.cancel_button.clicked.connect(s.cancel_download)
        self.status.stop_button.clicked.connect(s.stop_waiting)
        s.stuck.connect(self.status.show_stuck)
        s.image_list.run_progress.connect(self.status.set_runs)
        s.model.size_changed.connect(self._on_size_changed)
        s.model.assumptions_asked.connect(self.ask_assumptions)
        s.model.verification_changed.connect(self._show_verdict)
        self.status.review_button.clicked.connect(self.review_assumptions)
        self.info.review_requested.connect(self.review_assumptions)
        self.controls.overrides_requested.connect(self.reload_with)
        self.controls.model_settings.forget_requested.connect(self.forget_answers)
        self.controls.model_settings.half_maps_changed.connect(self._on_half_maps)
        self.controls.model_settings.half_box.setChecked(bool(self.settings.value("maps/float16", False, type=bool)))
        self.panel.hovered.connect(self._on_hover)
        self.panel.values_changed.connect(lambda: self._on_hover(*self.panel.hovered_patch))   # the new map's value
        self.panel.hovered.connect(self.posembed.hover)
        self.panel.query_clicked.connect(self.select_query)
        self.overview.tile_clicked.connect(self._on_tile_clicked)
        self.overview.tile_menu.connect(self._tile_menu)
        self.interventions.changed.connect(self._mark_ablated)
        self.matrix.query_clicked.connect(self.select_query)
        self.rollout_panel.query_clicked.connect(self.select_query)
        self.headstats.head_clicked.connect(self._on_head_clicked)
        self.info.class_clicked.connect(self.show_relevance)
        self.file_actions.model_chosen.connect(self.load_model)
        self.file_actions.exported.connect(self._on_exported)
        # last: the panels subscribed when they were made, so these fire once they have redrawn
        self.state.subscribe(self._after_redraw)
        s.image_list.current_changed.connect(self._after_redraw)

    def _query_note(self, text: str) -> None:
        """The query-scale rule's note; with no query token chosen yet, how to choose one and what is shown until
        then (the map menu's 'Attention of query token' alone showed CLS attention without a word)."""
        if self.state.query is None:
            instead = "the attention every patch receives" if self.state.source == "query" else "CLS attention"
            text = f"Click a patch on the image to choose the query token (until then the map is {instead}). {text}"
        self._query_note_text = text
        self.status.note(text)

    def _withdraw_query_note(self, changed: set[str]) -> None:
        """Leaving the query map (or unticking Normalise each map) takes back the note that says the query's map is
        on its own scale: it went on saying so over the next map, with the box unticked again."""
        s = self.state
        if changed & {"source", "normalize"} and not (s.source in QueryScaleRule.QUERY_SOURCES and s.normalize):
            self.status.withdraw(getattr(self, "_query_note_text", ""))

    def _precompute_rule(self, changed: set[str]) -> None:
        """Runs of new images make the map on show in the worker too (`Run.also`), so showing the next image never
        computes it on this thread (entropy or max of a large model)."""
        if changed & {"source", "query", "rollout_pool"} | ROLLOUT_FIELDS:
            try:
                kind = map_kind(self.state)
            except (SelectionError, ValueError):
                return
            self.session.precompute = (kind,) if kind.source == "attention" else ()

    def _after_redraw(self, *_what: object) -> None:
        self.refreshed.emit()

    @property
    def _values(self) -> np.ndarray | None:
        """The map the image panel shows (`ImagePanel.values`; tests/gui/test_panels_rollout.py reads it here)."""
        return self.panel.values

    # ------------------------------------------------------------------------------------------ user intents

    def load_model(self, path: str, device: str | None = None, **overrides: Any) -> None:
        """Load a checkpoint in the worker (on `device`, else the session's preferred device); the current model and
        results stay until it has loaded. The settings the user chose for this file before ("remember for this
        file": heads, norm order, activation, attention scale) are used unless given here, said as remembered
        (`vitviz.load(_remembered=)`: their provenance says so wherever the model is shown)."""
        remembered = {} if bundled.is_demo(path) else {
            k: v for k, v in self._remembered_settings(path).items() if overrides.get(k) is None}
        if remembered:
            overrides.update(remembered, _remembered=frozenset(remembered))
            self.note(f"{remembered_text(remembered)}, as chosen for {Path(path).name} before (Controls › Model "
                      "settings to change or forget)")
        self.statusBar().showMessage(f"Loading {path}…")
        self.session.load_model(path, device=device, **overrides)

    def _remembered_settings(self, path: str) -> dict[str, Any]:
        """The settings remembered for `path`; an answers store that cannot be read (a FIFO, not JSON, nested too
        deeply...) is said in the error box, naming the file and what is wrong, and the model loads without it."""
        import warnings

        from vitviz.catalog.answers import UnreadableStoreWarning

        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always", UnreadableStoreWarning)
            found = st.remembered_settings(self.settings, path)
        for warning in said:
            if issubclass(warning.category, UnreadableStoreWarning):
                self.reporter.show("Remembered settings not read", str(warning.message), "",
                                   informative=f"{Path(path).name} loads without remembered settings.")
            else:
                warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
        return found

    def load_code(self, code: str, weights: str | None = None, **overrides: Any) -> None:
        """Build the model by running FILE.py:FACTORY (`vitviz.load(weights, code=...)`, in the worker) -- only
        once the user has agreed to run that file's code (`with_code_trust`)."""
        def run() -> None:
            self.statusBar().showMessage(f"Building the model with {code}…")
            self.session.load_model(weights, code=code, **overrides)

        self.with_code_trust(code, weights, run)

    def with_code_trust(self, code: str, weights: str | None, run: Callable[[], object]) -> None:
        """Call `run` once the user has agreed to run the code of FILE.py:FACTORY (a confirm dialog; `trust_code`
        or an earlier yes for the same code this session skips it): building a model with it, or verifying
        against it."""
        def agreed() -> None:
            self._trusted_code.add(code)
            self.code_box = None
            run()

        if self.trust_code or code in self._trusted_code:
            agreed()
            return
        self.code_box = dialogs.confirm_code(self, code, weights, agreed)
        self.code_box.finished.connect(lambda _r: setattr(self, "code_box", None))

    def ask_assumptions(self, spec: ModelSpec) -> None:
        """The loaded model's file does not say settings its attention depends on: ask for them (the images run
        once answered; the answer can be remembered for the file)."""
        self._open_assumptions(spec, prompted=True)

    def review_assumptions(self) -> dialogs.AssumptionsDialog | None:
        """"Review assumptions…": the same question for a model that has run (an answer reloads it); None when
        there is nothing to ask."""
        spec = self.session.model.spec
        if spec is None or self.assumptions_dialog is not None or not assumptions.asked(spec):
            return None
        return self._open_assumptions(spec, prompted=False)

    def _open_assumptions(self, spec: ModelSpec, prompted: bool) -> dialogs.AssumptionsDialog:
        s = self.session
        path = s.model.model_path
        self.assumptions_dialog = dialog = dialogs.AssumptionsDialog(
            self, spec, window_name(path), s.model.described, prompted=prompted, can_remember=not s.model.model_code)
        dialog.accepted.connect(lambda: self._assumptions_answered(path, dialog.values(), dialog.remember(),
                                                                   prompted))
        dialog.rejected.connect(lambda: self._assumptions_answered(path, None, False, prompted))
        dialog.open()
        return dialog

    def _assumptions_answered(self, path: str, values: dict[str, Any] | None, remember: bool,
                              prompted: bool) -> None:
        self.assumptions_dialog = None
        if path != self.session.model.model_path:
            return                          # another model has loaded meanwhile: the answer was about the old one
        if values and remember and not self.session.model.model_code:
            st.remember_settings(self.settings, path, values)
            values = {**values, "_remembered": self.session.model.remembered | set(values)}   # said as remembered
        if prompted:
            self.session.answer_assumptions(values)
        elif values:
            self.session.reload(**values)

    def _on_half_maps(self, on: bool) -> None:
        """Model settings › Maps in float16: the runs keep float16 maps (remembered for the next start)."""
        self.session.set_half_maps(on)
        self.settings.setValue("maps/float16", bool(on))

    def reload_with(self, changes: dict[str, Any]) -> None:
        """The Controls panel's model settings changed: load the model again with them (a model built by its own
        code runs that code again, as agreed before). Settings remembered for the file follow the newest choice."""
        s = self.session
        if s.model.model_path and not s.model.model_code and st.remembered_settings(self.settings, s.model.model_path):
            newest = {k: v for k, v in changes.items() if k in st.REMEMBERED}
            if newest:
                st.remember_settings(self.settings, s.model.model_path, newest)
                changes = {**changes, "_remembered": s.model.remembered | set(newest)}
        s.reload(**changes)

    def forget_answers(self) -> None:
        """"Forget remembered answers": the loaded file's remembered settings are dropped from the store and the
        model loads again without them, so that what its file does not say is assumed (and flagged) again."""
        s = self.session
        if not s.model.model_path or s.model.model_code:
            return
        forgotten = st.remembered_settings(self.settings, s.model.model_path)
        st.forget_settings(self.settings, s.model.model_path)
        if forgotten:
            self.note(f"Forgot {remembered_text(forgotten)} for {window_name(s.model.model_path)}: assumed again")
        if s.model.remembered:
            s.model.kept.add(s.model.model_path)      # asked for: not asked about again by itself ("Review assumptions…")
            s.reload(**{k: None for k in s.model.remembered}, _remembered=frozenset())

    def _show_verdict(self) -> None:
        """The status bar's verdict line follows the session; a model that differs from its original is an error,
        reported once, that says where it differs, what could explain it and offers to change it."""
        s = self.session
        line = s.verdict_line()
        converted = s.model.spec is not None and not assumptions.runs_own_code(s.model.spec)
        self.status.set_verdict(line, s.model.spec is not None and bool(assumptions.asked(s.model.spec)), converted)
        self.verify_action.setEnabled(converted)
        if line.level == "differs" and self._differs_reported is not s.model.verification:
            self._differs_reported = s.model.verification
            self._report_differs(line)

    def _report_differs(self, line: assumptions.VerdictLine) -> None:
        """The error box of a model that differs: the first differing layer, the settings that could explain it
        and a button that reloads with the check's suggestion (the route the assumptions dialog's answers take),
        else Review assumptions… -- never "everything already loaded is still available": what is shown is not
        the original's."""
        s = self.session
        verification, path = s.model.verification, s.model.model_path
        layer = getattr(verification, "first_differing_layer", None)
        where = f" from layer {layer} on" if layer is not None else ""
        causes = assumptions.causes_text(verification)
        suggestion = assumptions.suggested(verification)
        actions: list[tuple[str, Callable[[], object]]] = []
        if suggestion:
            actions.append((assumptions.fix_label(verification),
                            lambda: self._assumptions_answered(path, suggestion, False, False)))
        elif s.model.spec is not None and assumptions.asked(s.model.spec):
            actions.append(("Review assumptions…", self.review_assumptions))
        informative = (f"The maps shown are not the original model's: vitviz computes different attention{where}."
                       + (f" {causes}." if causes else " The check names no setting that explains it; review what "
                          "the file does not say, or check it against another original (Verify against…).")
                       + (f" {actions[0][0]} loads the model again with it and checks it again." if suggestion
                          else ""))
        details = getattr(verification, "to_dict", None)
        self.reporter.show(DIFFERS, f"{window_name(path)}: {line.text}",
                           f"{line.tooltip}\n\n{details() if callable(details) else ''}", informative=informative,
                           actions=actions)

    def _on_error(self, title: str, summary: str, details: str) -> None:
        """An error from the session, in the error box. A model that failed to load while none is open (a bad
        --model at start-up, the first model of a session) leaves no empty window: the demo model opens instead,
        and the box says so rather than promising that what was loaded is still there."""
        from vitviz.gui.session import LOAD_FAILED

        model = self.session.model
        fallback = (self.demo_fallback and title == LOAD_FAILED and model.spec is None and not model.loading
                    and bundled.demo_model() is not None and not self._demo_fallback_done)
        if fallback:
            self._demo_fallback_done = True
        self.reporter.show(title, summary, details,
                           informative="Nothing was loaded before it, so the demo model is open instead."
                           if fallback else None)
        if fallback:
            self.load_demo(images=not self.session.image_list.paths, instead_of_model=True)

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
        self.add_bundled_images_after_load()

    def add_bundled_images_after_load(self) -> None:
        """When the next model has loaded, give an empty image list the bundled images that suit it: the shapes for
        the demo, the photographs for a 3-channel model; none for another input (a 1-channel MNIST model: the status
        bar asks for its own images). Only after the load: added at once, the photographs stayed when the model
        failed and the demo that opened instead ran on them ('92.5 % circle' for the astronaut)."""
        def on_loaded(spec: Any, _device: str) -> None:
            self.session.model.model_loaded.disconnect(on_loaded)
            if self.session.image_list.paths:
                return
            chans = getattr(spec, "in_chans", 3)
            if bundled.is_demo(self.session.model.model_path) or chans == 3:
                self.session.add_images(bundled.images_for(self.session.model.model_path))
            else:
                self.note(f"The model takes {chans}-channel images: the bundled photographs do not suit it — open "
                          "your own with File ▸ Open images… or drop them on the window")

        self.session.model.model_loaded.connect(on_loaded)

    def open_paths(self, paths: list[str], strict: bool = False) -> None:
        """Open what was dropped or named on the command line: checkpoints load, images are added. What is neither
        is named in the status bar, or (`strict`, for the command line) reported as an error."""
        self.open_classified(classify(paths), strict=strict)

    def open_classified(self, dropped: Dropped, strict: bool = False) -> None:
        """`open_paths` for paths already sorted by `classify` (folders are walked once)."""
        if dropped.models:
            self.load_model(dropped.models[-1])
        if dropped.images:
            self.session.add_images(dropped.images, show=True)
        if dropped.ignored and strict:
            self.reporter.show("Could not open", "; ".join(f"{p}: {_not_openable(p)}" for p in dropped.ignored), "")
        elif dropped.ignored:
            self.statusBar().showMessage("Ignored (not an image or checkpoint): " + ", ".join(
                Path(p).name for p in dropped.ignored[:5]), 8000)

    def note(self, text: str) -> None:
        """Tell the user something that is not an error, in the status bar (it outlasts the worker's status)."""
        self.notes.append(text)
        self.status.note(text)

    def open_by_name(self, name: str) -> bool:
        """Load a model by its hub or torchvision name (`hf:ORG/NAME[@REV]`, `timm:NAME[.TAG]`,
        `torchvision:ARCH[:WEIGHTS]`): from the cache, else downloaded with progress in the status bar. False,
        with the reason in the error box, for text that is not such a name."""
        name = name.strip()
        if not catalog.is_named_model(name):
            self.reporter.show("Not a model name", f"{name!r} is not a model name; expected one such as "
                               f"{NAME_EXAMPLES}", "")
            return False
        try:   # the library's check (a revision that could lead out of the cache...), before the worker is asked
            catalog.check_model_name(name)
        except VitvizError as exc:
            self.reporter.show("Not a model name", str(exc), "")
            return False
        self.choose_model(name)
        return True

    def open_by_name_dialog(self) -> None:
        """Models › Open by name…: ask for a name and load it."""
        name, ok = QInputDialog.getText(
            self, "Open model by name", "Hugging Face, timm or torchvision name:\n"
            "  hf:ORG/NAME[@REVISION]   timm:NAME[.TAG]   torchvision:ARCH[:WEIGHTS]\n"
            f"e.g. {NAME_EXAMPLES.replace(', ', ' · ')}", QLineEdit.EchoMode.Normal, "hf:")
        if ok and name.strip() and name.strip() not in ("hf:", "timm:"):
            self.open_by_name(name)

    def show_shortcuts(self) -> QWidget:
        """Help › Keyboard and mouse shortcuts."""
        actions = list(self.menus.actions.values()) + [self.models.by_name_action, self.images.remove_action]
        return helpdialogs.text_dialog(self, "vitviz — shortcuts", helpdialogs.shortcuts_html(actions),
                                       "shortcutsDialog")

    def show_about(self) -> QWidget:
        """Help › About vitviz: versions of vitviz and what it runs on, and the device."""
        return helpdialogs.text_dialog(self, "About vitviz", helpdialogs.about_html(self.session), "aboutDialog")

    def step_layer(self, delta: int) -> None:
        spec = self.session.model.spec
        if spec is not None:
            layer = self.state.layer
            start = -1 if layer == "mean" else int(layer)
            self.state.update(layer=(start + delta) % spec.depth)

    def step_head(self, delta: int) -> None:
        spec = self.session.model.spec
        if spec is not None:
            head = self.state.head
            start = -1 if isinstance(head, str) else int(head)
            self.state.update(head=(start + delta) % spec.num_heads)

    def select_query(self, token: int) -> None:
        """Make `token` the query everywhere (a negative token, or the selected one again, clears it). With the
        rollout map showing, the rollout starts from it; otherwise the map shows the token's attention."""
        spec, can = self.session.model.spec, self.session.model.capabilities or None
        if token < 0 or token == self.state.query:
            source = self._last_map_source if self.state.source in QUERY_SOURCES else self.state.source
            if spec is not None and unavailable(source, spec, can) is not None:
                source = default_source(spec, can)
            self.state.update(query=None, source=source)
            return
        if self.state.source == "rollout":
            self.state.update(query=token, rollout_pool=False)    # a patch's rollout, not the pooling query's
            return
        if self.state.source == "relevance":     # a class's or a prompt's relevance answers no patch: it stays, the
            self.state.update(query=token)        # patch is picked for the other docks, and the status bar says so
            self.note(f"Token {token} picked (Matrix, Rollout, Features follow); the map stays the class relevance — "
                      "Map: Attention of query token shows its own attention")
            return
        source = QUERY_SOURCES[0] if spec is None else query_source(self.state.source, spec, can)
        if self.state.source != source:
            self._last_map_source = self.state.source
        self.state.update(query=token, source=source)

    def show_relevance(self, target: int | None) -> None:
        """Show the class relevance of class `target` (None: the image's top class) with the method chosen."""
        self.state.update(source="relevance", relevance_class=target)

    def reset_layout(self) -> None:
        self.restoreState(self._default_layout, st.SETTINGS_VERSION)
        for dock in self.docks:
            dock.setVisible(True)
            dock.setFloating(False)

    def _mark_ablated(self) -> None:
        """The Overview's amber frames with the tiles they frame: back to clean at once (the clean tiles are shown
        at once), else with the run the steps ask for (held by the relay until it answers: one paint per click)."""
        iv = self.interventions
        if iv.steps:
            relay().later(self._frame_ablated)
        else:
            self._frame_ablated()

    def _frame_ablated(self) -> None:
        self.overview.mark(self.interventions.heads)

    def is_idle(self) -> bool:
        """No request queued or running in the worker, and no thumbnail still being decoded."""
        return not self.session.busy and not self.images.thumbnails.pending

    # ------------------------------------------------------------------------------------------ events

    def _on_model_loaded(self, spec: ModelSpec, device: str) -> None:
        """The view follows the new model: valid layer, head and query, the title, recent models, the status."""
        self.verifier.use_remembered()            # before its images run: the check that follows them uses it
        self._show_loaded(spec)
        told = bool(self.requested_view.get("map"))     # a --map this model lacks is reported there, not noted
        self._check_requested_view(spec)
        self.reporter.forget_repeats()
        query = self._follow_query(self._token_layout(spec), "this model")
        view = view_for_model(self.state, spec, self.session.model.capabilities or None, self._previous_depth, query, told)
        self._previous_depth = spec.depth
        for note in view.notes:
            self.note(note)
        self.state.update(**view.changes)
        self.setWindowTitle(f"vitviz — {window_name(self.session.model.model_path)}")
        self.statusBar().showMessage(f"Loaded {spec.family} on {device}", 5000)
        if spec.heads_guessed and not self.session.model.ask_assumptions:    # --screenshot: said, as the CLI says it
            self.note(f"num_heads = {spec.num_heads} is a guess ({dialogs.guess_reason(spec)}); pass --heads N "
                      f"(heads that divide {spec.attn_width}: "
                      f"{', '.join(map(str, dialogs.divisors(spec.attn_width, 64)))})")
        others = [n for n in assumptions.asked(spec) if n != "num_heads"]
        if others and not self.session.model.ask_assumptions and not self.session.model.library_layout:
            from vitviz.core.options import (
                cli_wording,  # --screenshot is a command line: its flags, not Python
            )

            described = self.session.model.described
            self.note(cli_wording("; ".join(described.get(n) or f"{n} is assumed ({dialogs.guess_reason(spec, n)})"
                                            for n in others)))

    def _show_loaded(self, spec: ModelSpec) -> None:
        """Recent models (not the demo), the Models menu and the idle status line after a model has loaded."""
        path = self.session.model.model_path
        demo = bundled.is_demo(path)
        if not demo and not self.session.model.model_code:     # a model built by code is not a file to reopen
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
        size = self.session.model.image_size or spec.image_size
        tokens = spec.num_prefix + (size[0] // spec.patch_size) * (size[1] // spec.patch_size)
        problems = []
        for name, value, count, what in (("--layer", asked.get("layer"), spec.depth, "layers"),
                                         ("--head", asked.get("head"), spec.num_heads, "heads"),
                                         ("--map token:", asked.get("query"), tokens, "tokens")):
            if isinstance(value, int) and not -count <= value < count:
                problems.append(f"{name}{'' if name.endswith(':') else ' '}{value} is out of range: the model "
                                f"has {count} {what} (0-{count - 1}, or negative counting from the end)")
        if asked.get("map"):     # a map this model cannot give (the table of map kinds says why)
            try:
                kind = MapKind.parse(str(asked["map"]))
                why = unavailable(kind.kind, spec, self.session.model.capabilities or None)
            except (SelectionError, KeyError):
                why = None
            if why is not None:
                problems.append(f"--map {asked['map']}: {why}; showing CLS attention")
        if problems:
            self.reporter.show("Command line", "; ".join(problems), "")

    def _token_layout(self, spec: ModelSpec, size: tuple[int, int] | None = None) -> TokenLayout:
        h, w = size or self.session.model.image_size or spec.image_size
        return TokenLayout(tuple(spec.prefix_names), (h // spec.patch_size, w // spec.patch_size))

    def _follow_query(self, new: TokenLayout, where: str) -> int | None:
        """The query token for a new token layout (another model, or another input size; `follow_query`), said in
        the status bar when it changes index or is dropped (the old index would point elsewhere)."""
        old, self._layout_now = self._layout_now, new
        token, note = follow_query(old, new, self.state.query, where)
        if note:
            self.note(note)
        return token

    def _on_size_changed(self, size: tuple[int, int]) -> None:
        """Another input size: the query follows the same place in the image."""
        spec = self.session.model.spec
        if spec is not None and self._layout_now is not None:
            layout = self._token_layout(spec, tuple(size))
            if layout != self._layout_now:
                query = self._follow_query(layout, "the new input size")
                if query != self.state.query:
                    self.state.update(query=query, **({"source": self._last_map_source}
                                                      if query is None and self.state.source == "token" else {}))

    def _on_device_changed(self, device: str) -> None:
        self.statusBar().showMessage(f"Model on {device}", 5000)

    def _on_exported(self, message: str) -> None:
        self.statusBar().showMessage(message, 8000)

    def _on_hover(self, row: int, col: int) -> None:
        self.hover_label.setText(self.panel.readout(row, col))

    def _on_tile_clicked(self, layer: int, head: int | str | None) -> None:
        self.state.update(layer=layer, **({} if head is None else {"head": head}))

    def _tile_menu(self, layer: int, head: int | str, where: QPoint) -> None:
        """Right-click on an overview tile: Ablate / Restore that head, or patch it (`vitviz.gui.interventions`)."""
        self.interventions.popup(self, layer, head, where)

    def _on_head_clicked(self, layer: int, head: int) -> None:
        self.state.update(layer=layer, head=head)

    # ------------------------------------------------------------------------------------------ drag and drop

    def dragEnterEvent(self, event: QDragEnterEvent) -> None:  # noqa: N802 - Qt override
        data = event.mimeData()
        if data.hasUrls() and any(u.isLocalFile() for u in data.urls()) or dropped_name(data):
            event.acceptProposedAction()
        else:
            event.ignore()

    def dropEvent(self, event: QDropEvent) -> None:  # noqa: N802 - Qt override
        """Files and folders open as `open_paths` does; text such as `hf:ORG/NAME` loads that model."""
        data = event.mimeData()
        paths = [u.toLocalFile() for u in data.urls() if u.isLocalFile()] if data.hasUrls() else []
        name = "" if paths else dropped_name(data)
        event.acceptProposedAction()
        if name:
            self.open_by_name(name)
        else:
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
            self.resize(default_size(self._available()))
            self.restoreState(self._default_layout, st.SETTINGS_VERSION)
        # a saved layout shows the Compare / Timeline docks as they were when the window closed; with no comparison
        # and no run open they would only be empty space (a third of the window): they come back with their work
        for name, row in self.side_rows.items():
            if row.work is not None:
                self._show_side(name)

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
        for box in (self.assumptions_dialog, self.code_box):
            if box is not None:          # an open question goes with the window, unanswered
                box.blockSignals(True)
                box.close()
        if self.persist_settings:
            self.save_settings()
        self.session.shutdown()      # waits a bounded time for a running request (see WorkerClient.shutdown)
        super().closeEvent(event)


HF_PAGE = re.compile(r"^https?://huggingface\.co/([A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*)/?(?:tree/([\w.-]+))?/?$")


def dropped_name(data: QMimeData) -> str:
    """The model name in dropped text (`hf:ORG/NAME`, `timm:NAME`, `torchvision:ARCH`, or a Hugging Face model
    page's address dragged from a browser, which becomes `hf:ORG/NAME[@REVISION]`), or ''."""
    if data.hasUrls() and any(u.isLocalFile() for u in data.urls()):
        return ""
    text = data.text().strip() if data.hasText() else ""
    if not text and data.hasUrls():
        text = data.urls()[0].toString()
    page = HF_PAGE.match(text)
    if page:
        text = f"hf:{page.group(1)}" + (f"@{page.group(2)}" if page.group(2) else "")
    return text if text and "\n" not in text and catalog.is_named_model(text) else ""


def remembered_text(values: dict[str, Any]) -> str:
    """'4 attention heads, post-norm blocks' for remembered overrides (in `settings.REMEMBERED` order)."""
    parts = []
    for key, value in sorted(values.items(), key=lambda kv: st.REMEMBERED.index(kv[0])
                             if kv[0] in st.REMEMBERED else len(st.REMEMBERED)):
        if key == "heads":
            parts.append(f"{value} attention heads")
        elif key == "block_norm":
            parts.append(f"{value}-norm blocks")
        elif key == "act":
            parts.append(f"activation {value}")
        elif key == "attn_scale":
            parts.append("attention scale head_dim^-0.5" if not value else f"attention scale {value:g}")
    return ", ".join(parts)


def window_name(model: str) -> str:
    """What the title says about the loaded model: the demo, a name as given, or the file's (folder's) name."""
    if bundled.is_demo(model):
        return "demo"
    return model if catalog.is_named_model(model) else Path(model).name
