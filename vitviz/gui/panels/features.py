"""The Features dock: what the blocks' output tokens say, for the current image, at a chosen layer.

- PCA: the DINOv2/DINOv3-style feature PCA colours (`vitviz.core.analyses.features.feature_pca`) beside the image, fitted on
  this image alone or on every open image together, so that the colours agree across images.
- Similarity: hover (or click, to hold) a patch of either image: the cosine similarity of its features to every
  patch of this image and of a second image chosen beside it (`PatchSimilarity`), on one colour scale.
- Norms: every patch's output-token norm at the layer over the image, the norms' histogram across layers with a
  draggable threshold, the patches above it outlined, and the share of attention they receive per layer.

The token features take a pass of their own, made in the worker only while this dock is on screen; the PCA fit,
the similarity's unit features and the attention share are computed there too (`vitviz.gui.analyses`:
`fit_pca`, `compare_patches`, `measure_share`), so nothing here runs longer than a frame: a hover is two
matrix-vector products on features prepared in the worker.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QPointF, QRectF, Qt, Signal
from PySide6.QtGui import QFontMetricsF, QPainterPath, QResizeEvent
from PySide6.QtWidgets import (
    QComboBox, QDoubleSpinBox, QFileDialog, QFrame, QGraphicsPathItem, QGraphicsRectItem, QGridLayout, QHBoxLayout,
    QLabel, QPushButton, QScrollArea, QSpinBox, QTabWidget, QVBoxLayout, QWidget,
)

from vitviz.core.drawing import render
from vitviz.core.analyses.maps import ResultMaps
from vitviz.gui import colors, dialogs, features_export
from vitviz.gui.panels import blit
from vitviz.gui.panels.base import (
    SELECT, TEXT, LazyPanel, TitleLabel, compact, dark_layout, index_ticks, pen, style_plot, tick_step,
)
from vitviz.gui.session import Session
from vitviz.gui.signals import wire
from vitviz.gui.state import FEATURES_FIELDS, ViewState
from vitviz.gui.protocol import Analysis, Compared, PcaFitted, Shared
from vitviz.gui.numbers import number, number_range

TABS = ("pca", "similarity", "norms")
SCOPES = {"image": "this image", "all": "all open images"}
VIEW_FIELDS = {"colormap", "opacity", "smooth", "normalize"}
PCA_LEGEND = ("PC1 → <span style='color:#ff5050'>red</span> · PC2 → <span style='color:#50e050'>green</span> · "
              "PC3 → <span style='color:#6080ff'>blue</span> · black: background (below the first component's "
              "threshold). Colours are sigmoid(2x) of the whitened projections.")
OUTLINE = "#ff3b30"
SHARE_PENS = {"mean": "#4fc3f7", "max": "#ffb74d", "uniform": "#9e9e9e"}
SHARE_LEGEND = (f"<span style='color:{SHARE_PENS['mean']}'>━●━</span> mean over heads &nbsp; "
                f"<span style='color:{SHARE_PENS['max']}'>╍╍</span> max head &nbsp; "
                f"<span style='color:{SHARE_PENS['uniform']}'>╍╍</span> their share of the patches (what uniform "
                "attention would give them)")
NORMS_WIDE_PX = 760        # from this width the map sits beside the two plots; narrower, above them (and it scrolls)
NORMS_MIN_PX = {"map": 240, "hist": 220, "share": 200}    # each plot's least height: room for its labels


class GridView:
    """One view box of a dark layout: an image, a map or colour image over its patch grid, outlined patches and a
    highlighted patch, with a title above and an optional colorbar beside it."""

    def __init__(self, widget: pg.GraphicsLayoutWidget, row: int, col: int, colorbar: bool = False) -> None:
        self.title = TitleLabel("", color=TEXT, size="9pt")
        widget.addItem(self.title, row=row, col=col, colspan=2 if colorbar else 1)
        self.view = widget.addViewBox(row=row + 1, col=col, lockAspect=True, invertY=True, enableMenu=False)
        self.image_item, self.overlay = blit.ImageItem(), blit.ImageItem()   # 32-bit pictures: painted faster
        self.marks = QGraphicsPathItem()
        self.marks.setPen(pen(OUTLINE, 255, 1.5))
        self.box = QGraphicsRectItem()
        self.box.setPen(pen(SELECT, 255, 2.0))
        for z, item in enumerate((self.image_item, self.overlay, self.marks, self.box)):
            item.setZValue(z)
            self.view.addItem(item)
        self.box.setVisible(False)
        self.colorbar: pg.ColorBarItem | None = None
        self._cmap = ""
        if colorbar:
            self.colorbar = pg.ColorBarItem(values=(0.0, 1.0), colorMap=colors.colormap("viridis"),
                                            interactive=False, width=12)
            widget.addItem(self.colorbar, row=row + 1, col=col + 1)
        self.grid: tuple[int, int] = (0, 0)
        self.patch = 1

    def set_image(self, image: np.ndarray | None, grid: tuple[int, int], patch: int) -> None:
        """The picture under the map (None: none, a black ground), whose patch grid is `grid` patches of `patch`."""
        resized = (grid, patch) != (self.grid, self.patch)
        self.grid, self.patch = grid, patch
        if image is None:
            self.image_item.clear()
        else:
            self.image_item.setImage(image, autoLevels=False, levels=(0, 255))
            self.image_item.setRect(QRectF(0, 0, image.shape[1], image.shape[0]))
        if resized:
            self.view.setRange(self._rect(), padding=0.01)

    def _rect(self) -> QRectF:
        return QRectF(0, 0, self.grid[1] * self.patch, self.grid[0] * self.patch)

    def show_values(self, values: np.ndarray, levels: tuple[float, float], cmap: str, opacity: float,
                    smooth: bool, label: str = "") -> None:
        """A (gh, gw) map over the image on the colour scale `levels`, shown on the colorbar."""
        shown = render.upsample(values, (self.grid[0] * self.patch, self.grid[1] * self.patch)) if smooth else values
        self.overlay.setImage(shown, autoLevels=False, levels=levels, lut=colors.lut(cmap))
        self.overlay.setRect(self._rect())
        self.overlay.setOpacity(opacity)
        self.overlay.setVisible(True)
        if self.colorbar is not None:
            if cmap != self._cmap:
                self._cmap = cmap
                self.colorbar.setColorMap(colors.colormap(cmap))
            colors.set_colorbar_levels(self.colorbar, levels)
            self.colorbar.axis.setLabel(label, color=TEXT)
            self.colorbar.setVisible(True)

    def show_colors(self, rgb: np.ndarray, input_hw: tuple[int, int], smooth: bool) -> None:
        """A (gh, gw, 3) colour image in [0, 1] (feature PCA) at full opacity, as `vitviz export` draws it."""
        size = (self.grid[0] * self.patch, self.grid[1] * self.patch)
        self.overlay.setImage(render.color_pixels(rgb, size, input_hw, self.patch, smooth), autoLevels=False,
                              levels=(0, 255))
        self.overlay.setRect(self._rect())
        self.overlay.setOpacity(1.0)
        self.overlay.setVisible(True)

    def outline(self, mask: np.ndarray | None) -> None:
        """Outline the patches of a (gh, gw) bool mask (None: none)."""
        path = QPainterPath()
        if mask is not None:
            p = self.patch
            for r, c in zip(*np.nonzero(mask)):
                path.addRect(QRectF(float(c * p), float(r * p), float(p), float(p)))
        self.marks.setPath(path)

    def highlight(self, patch: tuple[int, int] | None) -> None:
        if patch is not None:
            self.box.setRect(QRectF(patch[1] * self.patch, patch[0] * self.patch, self.patch, self.patch))
        self.box.setVisible(patch is not None)

    def patch_at(self, scene_pos: QPointF) -> tuple[int, int] | None:
        """The (row, col) under a scene position, or None outside this view's grid."""
        if self.grid == (0, 0) or not self.view.sceneBoundingRect().contains(scene_pos):
            return None
        point = self.view.mapSceneToView(scene_pos)
        row, col = int(np.floor(point.y() / self.patch)), int(np.floor(point.x() / self.patch))
        return (row, col) if 0 <= row < self.grid[0] and 0 <= col < self.grid[1] else None

    def clear(self, title: str = "") -> None:
        self.image_item.clear()
        self.overlay.clear()
        self.overlay.setVisible(False)
        self.marks.setPath(QPainterPath())
        self.box.setVisible(False)
        self.grid = (0, 0)
        if self.colorbar is not None:
            self.colorbar.setVisible(False)
        self.title.setText(title)


def count_ticks(most: float) -> list[tuple[float, str]]:
    """Ticks of a colorbar of log1p(counts) up to `most` patches: 0, 1, 10, 100, ... (whole counts when there
    are fewer than three decades), at log1p of the count."""
    counts = [0.0] + [10.0 ** k for k in range(int(np.floor(np.log10(most))) + 1)] if most >= 1 else [0.0]
    if len(counts) < 3:
        counts = [c for c in colors.nice_ticks(0.0, most, 4) if float(c).is_integer()]
    return [(float(np.log1p(c)), f"{c:.0f}") for c in counts]


class NormsBody(QWidget):
    """The Norms view's plots laid out for the room they get: in a narrow dock the map, the histogram and the
    share plot are stacked, each at least `NORMS_MIN_PX` high (the page scrolls); from `NORMS_WIDE_PX` the map
    sits beside the two plots."""

    def __init__(self, map_widget: QWidget, hist_widget: QWidget, share_widget: QWidget, legend: QWidget) -> None:
        super().__init__()
        self.parts = (map_widget, hist_widget, share_widget, legend)
        for widget, key in zip(self.parts, ("map", "hist", "share")):
            widget.setMinimumHeight(NORMS_MIN_PX[key])
        self.grid = QGridLayout(self)
        self.grid.setContentsMargins(0, 0, 0, 0)
        self.grid.setSpacing(2)
        self.wide: bool | None = None
        self.arrange(False)

    def arrange(self, wide: bool) -> None:
        """Side by side (`wide`) or stacked."""
        if wide == self.wide:
            return
        self.wide = wide
        for widget in self.parts:
            self.grid.removeWidget(widget)
        map_widget, hist, share, legend = self.parts
        if wide:
            places = ((map_widget, 0, 0, 3, 1), (hist, 0, 1, 1, 1), (share, 1, 1, 1, 1), (legend, 2, 1, 1, 1))
            rows, cols = (1, 1, 0, 0), (1, 1)
        else:
            places = ((map_widget, 0, 0, 1, 1), (hist, 1, 0, 1, 1), (share, 2, 0, 1, 1), (legend, 3, 0, 1, 1))
            rows, cols = (1, 1, 1, 0), (1, 0)
        for widget, *where in places:
            self.grid.addWidget(widget, *where)
        for i, stretch in enumerate(rows):
            self.grid.setRowStretch(i, stretch)
        for i, stretch in enumerate(cols):
            self.grid.setColumnStretch(i, stretch)

    def resizeEvent(self, event: QResizeEvent) -> None:  # noqa: N802 - Qt override
        self.arrange(event.size().width() >= NORMS_WIDE_PX)
        super().resizeEvent(event)


class FeaturesPanel(LazyPanel):
    """Feature PCA, patch similarity and token norms of the current image at one layer.

    Attributes:
        pca_colors: the (gh, gw, 3) PCA colours shown for the current image, or None.
        similarity: the (gh, gw) and (gh', gw') similarity maps shown (the second None without a second image).
        share: the last `Shared` answer shown (mask and (L, H) attention share), or None.

    Signals:
        shown(str): the view ('pca', 'similarity', 'norms') has been drawn from a result (tests wait on it).
    """

    shown = Signal(str)

    def __init__(self, state: ViewState, session: Session, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("featuresPanel")
        self.state, self.session = state, session
        self._maps: ResultMaps | None = session.image_list.current_maps
        self._pca: PcaFitted | None = None
        self._sim: Compared | None = None
        self._share: Shared | None = None
        self._asked: set[str] = set()            # images whose features the joint PCA asked for (once each)
        self._query: tuple[str, int, int] | None = None      # ('a' | 'b', row, col): the patch compared
        self._held = False
        self._syncing = False                    # a state update made by the dock itself: no redraw
        self.pca_colors: np.ndarray | None = None
        self.similarity: tuple[np.ndarray, np.ndarray | None] | None = None
        self.share: Shared | None = None
        self._build()
        state.subscribe(self._on_state)
        wire(session.image_list, current_changed=self._on_current_changed, result_ready=self._on_result_ready,
             images_added=self._on_images_changed, images_removed=self._on_images_changed)
        session.model.model_loaded.connect(self._on_model_loaded)
        wire(session.features_pass, ready=self._on_features_ready, failed=self._on_features_failed)
        wire(session.analyses, pca_ready=self._on_pca, similarity_ready=self._on_similarity)
        session.analyses.share_ready.connect(self._on_share)
        session.analyses.analysis_failed.connect(self._on_analysis_failed)
        if session.model.spec is not None:
            self._on_model_loaded(session.model.spec, session.model.device)

    # ------------------------------------------------------------------------------------------ layout

    def _build(self) -> None:
        self.layer_spin = QSpinBox()
        self.layer_spin.setObjectName("featuresLayer")
        self.layer_spin.setToolTip("The block whose output tokens are used (0-based; the last is the recipe's)")
        self.layer_spin.valueChanged.connect(lambda v: self.state.update(features_layer=int(v)))
        self.layer_spin.setRange(0, 0)                  # no model, no layers: '–', not QSpinBox's default 0-99 (the
        self.layer_spin.setSpecialValueText("–")        # last layer of a depth of 100 read 'Layer 99')
        self.layer_spin.setEnabled(False)
        self.status = QLabel("")
        self.status.setWordWrap(True)
        top = QHBoxLayout()
        top.addWidget(QLabel("Layer"))
        top.addWidget(self.layer_spin)
        top.addWidget(self.status, 1)
        self.tabs = QTabWidget()
        self.tabs.setObjectName("featuresTabs")
        self.tabs.setDocumentMode(True)
        self.tabs.addTab(self._build_pca(), "PCA")
        self.tabs.addTab(self._build_similarity(), "Similarity")
        self.tabs.addTab(self._build_norms(), "Norms")
        self.tabs.currentChanged.connect(lambda i: self.state.update(features_view=TABS[i]))
        layout = QVBoxLayout(self)
        layout.setContentsMargins(2, 2, 2, 2)
        layout.addLayout(top)
        layout.addWidget(self.tabs, 1)

    def _build_pca(self) -> QWidget:
        page = QWidget()
        self.scope_combo = QComboBox()
        self.scope_combo.setObjectName("pcaScope")
        for key, text in SCOPES.items():
            self.scope_combo.addItem(text, key)
        self.scope_combo.setToolTip("Fit the PCA on this image alone, or on every open image together so that the "
                                    "same parts get the same colours in every image")
        self.scope_combo.activated.connect(lambda _i: self.state.update(features_scope=self.scope_combo.currentData()))
        self.pca_export = QPushButton("Export…")
        self.pca_export.setToolTip("Write the PCA colours of this image as vitviz export --maps pca names them "
                                   "({image}_pca_L{layer}.png; pca-joint for a fit on all images)")
        self.pca_export.clicked.connect(self._export_pca_dialog)
        bar = QHBoxLayout()
        bar.addWidget(QLabel("Fit on"))
        bar.addWidget(self.scope_combo)
        bar.addStretch(1)
        bar.addWidget(self.pca_export)
        self.pca_widget = dark_layout()
        self.pca_image = GridView(self.pca_widget, 0, 0)
        self.pca_view = GridView(self.pca_widget, 0, 1)
        self.pca_legend = QLabel(PCA_LEGEND)
        self.pca_legend.setWordWrap(True)
        self.pca_legend.setTextFormat(Qt.TextFormat.RichText)
        layout = QVBoxLayout(page)
        layout.setContentsMargins(0, 2, 0, 0)
        layout.addLayout(bar)
        layout.addWidget(self.pca_widget, 1)
        layout.addWidget(self.pca_legend)
        return page

    def _build_similarity(self) -> QWidget:
        page = QWidget()
        self.other_combo = QComboBox()
        self.other_combo.setObjectName("similarityOther")
        compact(self.other_combo, 14)
        self.other_combo.setToolTip("The second image: the same patch's similarity to its patches (correspondence)")
        self.other_combo.activated.connect(
            lambda _i: self.state.update(features_other=str(self.other_combo.currentData() or "")))
        hint = QLabel("Hover a patch of either image; click to hold it (click again to let go)")
        hint.setWordWrap(True)
        bar = QHBoxLayout()
        bar.addWidget(QLabel("Compare with"))
        bar.addWidget(self.other_combo, 1)
        self.sim_widget = dark_layout()
        self.sim_a = GridView(self.sim_widget, 0, 0)
        self.sim_b = GridView(self.sim_widget, 0, 1, colorbar=True)
        scene = self.sim_widget.scene()
        scene.sigMouseMoved.connect(self._on_sim_moved)
        scene.sigMouseClicked.connect(self._on_sim_clicked)
        layout = QVBoxLayout(page)
        layout.setContentsMargins(0, 2, 0, 0)
        layout.addLayout(bar)
        layout.addWidget(self.sim_widget, 1)
        layout.addWidget(hint)
        return page

    def _build_norms(self) -> QWidget:
        page = QWidget()
        self.threshold_spin = QDoubleSpinBox()
        self.threshold_spin.setObjectName("normThreshold")
        self.threshold_spin.setDecimals(3)
        self.threshold_spin.setRange(0.0, 1e9)
        self.threshold_spin.setToolTip("Patches whose output-token norm at this layer exceeds it are outlined; drag "
                                       "the line in the histogram too")
        self.threshold_spin.valueChanged.connect(lambda v: self.state.update(norm_threshold=float(v)))
        self.norms_export = QPushButton("Export…")
        self.norms_export.setToolTip("Write this layer's norm map as vitviz export --maps norms names it "
                                     "({image}_norms_L{layer}.png)")
        self.norms_export.clicked.connect(self._export_norms_dialog)
        bar = QHBoxLayout()
        bar.addWidget(QLabel("Threshold"))
        bar.addWidget(self.threshold_spin)
        bar.addStretch(1)
        bar.addWidget(self.norms_export)
        self.norm_widget = dark_layout()
        self.norm_view = GridView(self.norm_widget, 0, 0, colorbar=True)
        self.hist_widget = dark_layout()
        self.hist_title = TitleLabel("", color=TEXT, size="9pt")
        self.hist_widget.addItem(self.hist_title, row=0, col=0, colspan=2)
        self.hist_plot = self.hist_widget.addPlot(row=1, col=0)
        style_plot(self.hist_plot, "layer", "output-token norm")
        self.hist_plot.setMouseEnabled(False, False)         # a fixed overview; the wheel scrolls the page
        self.hist_plot.invertY(True)
        self.hist_item = blit.ImageItem()
        self.hist_plot.addItem(self.hist_item)
        self.hist_bar = pg.ColorBarItem(values=(0.0, 1.0), colorMap=colors.colormap("magma"), interactive=False,
                                        width=12)
        self.hist_bar.axis.setLabel("patches (log scale)", color=TEXT)
        self.hist_widget.addItem(self.hist_bar, row=1, col=1)
        self.threshold_line = pg.InfiniteLine(angle=90, movable=True, pen=pen(OUTLINE, 255, 2.0))  # value: title
        self.threshold_line.sigPositionChanged.connect(
            lambda line: self.threshold_spin.setValue(float(line.value())))
        self.hist_plot.addItem(self.threshold_line)
        self.layer_band = pg.LinearRegionItem(orientation="horizontal", movable=False,
                                              brush=pg.mkBrush(0, 0, 0, 0), pen=pen(TEXT, 255, 1.5))
        self.hist_plot.addItem(self.layer_band)
        self.hist_plot.vb.sigResized.connect(lambda _vb: self._fit_hist_ticks())
        self.share_widget = dark_layout()
        self.share_title = TitleLabel("", color=TEXT, size="9pt")
        self.share_widget.addItem(self.share_title, row=0, col=0)
        self.share_plot = self.share_widget.addPlot(row=1, col=0)
        style_plot(self.share_plot, "attention share", "layer")
        self.share_plot.setMouseEnabled(False, False)
        self.share_plot.getAxis("left").enableAutoSIPrefix(False)
        self.share_mean = self.share_plot.plot([], [], pen=pen(SHARE_PENS["mean"], 255, 2.0), symbol="o",
                                               symbolSize=5, symbolBrush=SHARE_PENS["mean"])
        self.share_max = self.share_plot.plot([], [], pen=pen(SHARE_PENS["max"], 255, 1.2, dashed=True))
        self.share_uniform = self.share_plot.plot([], [], pen=pen(SHARE_PENS["uniform"], 255, 1.0, dashed=True))
        self.share_plot.vb.sigResized.connect(lambda _vb: self._fit_share_ticks())
        self.share_legend = QLabel(SHARE_LEGEND)              # beside the plot, never over its curves
        self.share_legend.setObjectName("shareLegend")
        self.share_legend.setTextFormat(Qt.TextFormat.RichText)
        self.share_legend.setWordWrap(True)
        self.share_legend.setMargin(4)
        self.norms_body = NormsBody(self.norm_widget, self.hist_widget, self.share_widget, self.share_legend)
        scroll = QScrollArea()
        scroll.setObjectName("normsScroll")
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QFrame.Shape.NoFrame)
        scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        scroll.setWidget(self.norms_body)
        self.norms_scroll = scroll
        layout = QVBoxLayout(page)
        layout.setContentsMargins(0, 2, 0, 0)
        layout.addLayout(bar)
        layout.addWidget(scroll, 1)
        return page

    # ------------------------------------------------------------------------------------------ inputs

    @property
    def tab(self) -> str:
        """The view on show: 'pca', 'similarity' or 'norms' (`ViewState.features_view`)."""
        return self.state.features_view

    def show_tab(self, name: str) -> None:
        self.state.update(features_view=name)

    @property
    def layer(self) -> int:
        """The block whose output tokens are shown (`ViewState.features_layer`, resolved against the depth)."""
        depth = max(1, self.layer_spin.maximum() + 1)
        layer = int(self.state.features_layer)
        return min(max(layer + depth if layer < 0 else layer, 0), depth - 1)

    @property
    def other(self) -> str:
        """The second image of the similarity ('' for none; `ViewState.features_other`)."""
        return self.state.features_other

    def _on_model_loaded(self, spec: object, _device: str) -> None:
        depth = int(getattr(spec, "depth", 1))
        self._pca = self._sim = self._share = None
        self._asked.clear()
        self._query, self._held = None, False
        self.layer_spin.blockSignals(True)
        self.layer_spin.setSpecialValueText("")
        self.layer_spin.setRange(0, max(0, depth - 1))
        self.layer_spin.setEnabled(True)
        self.layer_spin.blockSignals(False)
        self._quiet(features_layer=-1, norm_threshold=None)     # a new model: its last block, its own threshold
        self._sync_widgets()
        self._fill_others()

    def _quiet(self, **values: object) -> None:
        """Update the view state without redrawing (the caller draws, or is drawing)."""
        self._syncing = True
        try:
            self.state.update(**values)
        finally:
            self._syncing = False

    def _sync_widgets(self) -> None:
        """Show the state's Features fields in the dock's widgets (without their signals)."""
        s = self.state
        widgets = (self.layer_spin, self.tabs, self.scope_combo, self.other_combo, self.threshold_spin)
        for widget in widgets:
            widget.blockSignals(True)
        try:
            self.layer_spin.setValue(self.layer)
            self.tabs.setCurrentIndex(TABS.index(s.features_view))
            self.scope_combo.setCurrentIndex(max(0, self.scope_combo.findData(s.features_scope)))
            self.other_combo.setCurrentIndex(max(0, self.other_combo.findData(s.features_other)))
            if s.norm_threshold is not None:
                self.threshold_spin.setValue(float(s.norm_threshold))
        finally:
            for widget in widgets:
                widget.blockSignals(False)
        if s.norm_threshold is not None and abs(self.threshold_line.value() - float(s.norm_threshold)) > 1e-12:
            self.threshold_line.setValue(float(s.norm_threshold))

    def _on_current_changed(self, maps: ResultMaps | None) -> None:
        if maps is self._maps and maps is not None:
            return      # the same result again (its class relevance arrived): nothing here changed
        self._maps = maps
        self._query, self._held = None, False
        self._fill_others()
        self.request_redraw()

    def _on_state(self, changed: set[str]) -> None:
        if changed & FEATURES_FIELDS:
            self._sync_widgets()
        if "features_layer" in changed:
            self._query = None if not self._held else self._query
        if "features_scope" in changed:
            self._asked.clear()
        if self._syncing:
            return
        if changed & (VIEW_FIELDS | FEATURES_FIELDS - {"norm_threshold"}) or (
                "norm_threshold" in changed and self.tab == "norms"):
            self.request_redraw()

    def _on_features_ready(self, path: str) -> None:
        if path == self.session.image_list.current or path == self.other or (
                self.state.features_scope == "all" and path in self._asked):
            self.request_redraw()

    def _on_features_failed(self, path: str, _key: object, _why: str) -> None:
        self._on_features_ready(path)

    def _on_images_changed(self, _paths: list[str]) -> None:
        self._fill_others()

    def _on_result_ready(self, path: str) -> None:
        if path == self.other:
            self.request_redraw()

    def _on_pca(self, answer: PcaFitted) -> None:
        self._pca = answer
        if self.tab == "pca":
            self.request_redraw()

    def _on_similarity(self, answer: Compared) -> None:
        self._sim = answer
        if self.tab == "similarity":
            self.request_redraw()

    def _on_share(self, answer: Shared) -> None:
        self._share = answer
        if self.tab == "norms":
            self.request_redraw()

    def _on_analysis_failed(self, kind: type[Analysis], summary: str) -> None:
        self.status.setText(summary)

    def _fill_others(self) -> None:
        """The second image's choices: every open image but the current one."""
        keep = self.state.features_other
        self.other_combo.blockSignals(True)
        self.other_combo.clear()
        self.other_combo.addItem("(no second image)", "")
        for path in self.session.image_list.paths:
            if path != self.session.image_list.current:
                self.other_combo.addItem(Path(path).name, path)
                self.other_combo.setItemData(self.other_combo.count() - 1, path, Qt.ItemDataRole.ToolTipRole)
        index = self.other_combo.findData(keep) if keep else -1
        if index < 0 and self.other_combo.count() > 1:
            index = 1           # another image by default: the point of the view is the correspondence
        self.other_combo.setCurrentIndex(max(0, index))
        self.other_combo.blockSignals(False)
        self._quiet(features_other=str(self.other_combo.currentData() or ""))

    def set_other(self, path: str) -> None:
        """Compare with `path` ('' for no second image)."""
        self.state.update(features_other=path if self.other_combo.findData(path) >= 0 else "")

    def set_scope(self, scope: str) -> None:
        """Fit the PCA on 'image' (this one) or 'all' (every open image)."""
        self.state.update(features_scope=scope)

    # ------------------------------------------------------------------------------------------ drawing

    def redraw(self) -> None:
        maps = self._maps
        if maps is None:
            for view in (self.pca_image, self.pca_view, self.sim_a, self.sim_b, self.norm_view):
                view.clear()
            self.status.setText("Open a model and an image: the features of the one shown appear here")
            return
        why = maps.why_not("features")      # a windowed model's: none captured
        self.tabs.setEnabled(why is None)      # no features, so no settings for them
        if why is not None:     # nothing is asked of the worker for it
            for view in (self.pca_image, self.pca_view, self.sim_a, self.sim_b, self.norm_view):
                view.clear()
            self.layer_spin.setEnabled(False)
            self.status.setText(why)
            return
        self.layer_spin.setEnabled(True)
        if maps.features is None:
            path = self.session.image_list.current
            why = self.session.features_pass.why(path)
            if why is None and self.session.features_pass.request(path):
                self.status.setText(f"Capturing the token features of {Path(path).name}…")
            else:
                why = why or self.session.features_pass.why(path)  # refused, not asked
                self.status.setText(f"No token features for {Path(path).name}: {why or 'no result yet'}")
            return
        self.status.setText("")
        {"pca": self._draw_pca, "similarity": self._draw_similarity, "norms": self._draw_norms}[self.tab](maps)

    def _pca_sources(self) -> tuple[list[str], bool]:
        """The images the PCA is fitted on, in the image list's order (a fit does not change when another of them
        becomes current), and whether features are still on their way. Each image's features are asked for once
        per fit, so a cache too small for all of them fits on those it holds instead of asking forever."""
        current = self.session.image_list.current
        if self.state.features_scope != "all":
            return [current], False
        waiting = False
        for path in self.session.image_list.paths:
            maps = self.session.shown(path)     # its intervened run while there is one: that is what is fitted
            if maps is None or maps.features is not None:
                continue
            if path not in self._asked:
                self._asked.add(path)
                self.session.features_pass.request(path)
            waiting = waiting or self.session.features_pass.pending(path)
        held = [p for p in self.session.image_list.paths
                if (m := self.session.shown(p)) is not None and m.features is not None]
        return (held if current in held else [current, *held]), waiting

    def _draw_pca(self, maps: ResultMaps) -> None:
        result = maps.result
        self.pca_image.set_image(result.image, result.grid, result.spec.patch_size)
        self.pca_view.set_image(None, result.grid, result.spec.patch_size)
        self.pca_image.title.setText(f"{Path(result.source).name}")
        sources, waiting = self._pca_sources()
        if waiting:
            self.status.setText("Capturing the token features of the open images for a joint fit…")
            return
        pca = self._pca
        runs = [self.session.shown(p) for p in sources]
        if pca is None or pca.sources != tuple(sources) or pca.layer != self.layer or \
                any(r is None or r.features is not f for r, f in zip(runs, pca.features, strict=True)):
            # none yet, or of other images, another layer or other runs' features (the clean run's fit answered
            # after a head was ablated; re-captured features): fit these
            self.session.analyses.fit_pca(sources, self.layer)
            self.pca_view.title.setText("fitting the PCA…")
            return
        self.pca_colors = pca.pca.colors[sources.index(self.session.image_list.current)]
        self.pca_view.show_colors(self.pca_colors, result.image.shape[:2], self.state.smooth)
        fg = pca.pca.foreground[sources.index(self.session.image_list.current)]
        fitted = "this image" if len(sources) == 1 else f"{len(sources)} images together"
        self.pca_view.title.setText(f"feature PCA · layer {self.layer} · fitted on {fitted} · foreground "
                                    f"{int(fg.sum())}/{fg.size} patches")
        self.shown.emit("pca")

    def _draw_similarity(self, maps: ResultMaps) -> None:
        result, path = maps.result, self.session.image_list.current
        other = self.other
        self.sim_a.set_image(result.image, result.grid, result.spec.patch_size)
        self.sim_a.title.setText(Path(path).name)
        if other:
            second = self.session.shown(other)     # its intervened run while there is one, as compared
            if second is None:
                self.session.ensure(other, first=True)
                self.sim_b.clear(f"running {Path(other).name}…")
                return
            if second.features is None:
                why = self.session.features_pass.why(other)
                asked = why is None and self.session.features_pass.request(other)
                self.sim_b.clear(f"capturing the features of {Path(other).name}…" if asked else
                                 f"no features for {Path(other).name}: {why}")
                return
            self.sim_b.set_image(second.result.image, second.result.grid, second.result.spec.patch_size)
            self.sim_b.title.setText(Path(other).name)
        else:
            self.sim_b.clear("no second image")
        sim = self._sim
        if sim is None or sim.sources != (path, other) or sim.layer != self.layer or sim.features[0] is not \
                maps.features or sim.features[1] is not (second.features if other else None):
            # of other images, another layer or other runs' features (the clean run's, answered after an ablation)
            self.session.analyses.compare_patches(path, other, self.layer)
            return
        if self._query is None:
            gh, gw = result.grid
            self._query = ("a", gh // 2, gw // 2)        # the middle patch until the mouse says otherwise
        self._show_similarity()

    def _show_similarity(self) -> None:
        sim = self._sim
        if sim is None or self._query is None:
            return
        image, row, col = self._query
        here, there = sim.similarity.maps(row, col, image)   # type: ignore[arg-type]
        self.similarity = (here, there)
        values = [here] + ([there] if there is not None else [])
        lo = float(min(v.min() for v in values))
        hi = float(max(v.max() for v in values))
        levels = (lo, hi if hi > lo else lo + 1e-6)
        s = self.state
        self.sim_a.show_values(here, levels, s.colormap, s.opacity, s.smooth)
        if there is not None:
            self.sim_b.show_values(there, levels, s.colormap, s.opacity, s.smooth, "cosine similarity (both images)")
        self.sim_a.highlight((row, col) if image == "a" else None)
        self.sim_b.highlight((row, col) if image == "b" else None)
        who = Path(sim.sources[0] if image == "a" else sim.sources[1]).name
        held = " (held)" if self._held else ""
        self.sim_a.title.setText(f"{Path(sim.sources[0]).name} · similarity to patch ({row}, {col}) of {who}{held} · "
                                 f"layer {sim.layer} · {number_range(lo, hi)}")
        self.shown.emit("similarity")

    def query_patch(self, image: str, row: int, col: int, hold: bool = False) -> None:
        """Compare patch (row, col) of image 'a' (this one) or 'b' (the second) -- what a hover does; `hold` keeps
        it until the next click."""
        self._query, self._held = (image, row, col), hold
        self._show_similarity()

    def _view_at(self, scene_pos: QPointF) -> tuple[str, tuple[int, int]] | None:
        for name, view in (("a", self.sim_a), ("b", self.sim_b)):
            patch = view.patch_at(scene_pos)
            if patch is not None and (name == "a" or self.other):
                return name, patch
        return None

    def _on_sim_moved(self, scene_pos: QPointF) -> None:
        hit = self._view_at(scene_pos)
        if hit is not None and not self._held and (hit[0], *hit[1]) != self._query:
            self.query_patch(hit[0], *hit[1])

    def _on_sim_clicked(self, event: object) -> None:
        if event.button() != Qt.MouseButton.LeftButton:  # type: ignore[attr-defined]
            return
        hit = self._view_at(event.scenePos())  # type: ignore[attr-defined]
        if hit is None:
            return
        release = self._held and (hit[0], *hit[1]) == self._query
        self.query_patch(hit[0], *hit[1], hold=not release)

    def _draw_norms(self, maps: ResultMaps) -> None:
        result, layer, s = maps.result, self.layer, self.state
        assert maps.norms is not None
        self._choose_threshold(maps.norms)
        stack = maps.stack("norms")
        values = stack.select(layer, "mean")
        levels = stack.levels(values, "mean", own=s.normalize)
        self.norm_view.set_image(result.image, result.grid, result.spec.patch_size)
        scale = "own scale: this layer" if s.normalize else "shared scale: all layers"
        self.norm_view.show_values(values, levels, s.colormap, s.opacity, s.smooth, "output-token norm")
        threshold = float(self.state.norm_threshold or 0.0)
        self._draw_histogram(maps, layer, threshold)
        heading = f"{Path(result.source).name} · output-token norm · layer {layer} · {scale}"
        share = self._share
        if share is None or share.image != self.session.image_list.current or share.layer != layer or \
                share.threshold != threshold or share.result is not result:    # or another run's (see `_draw_pca`)
            self.session.analyses.measure_share(self.session.image_list.current, layer, threshold)
            self.norm_view.title.setText(heading)
            return
        self.share = share
        self.norm_view.outline(share.mask)
        count, total = int(share.mask.sum()), share.mask.size
        self.norm_view.title.setText(f"{heading} · {count}/{total} patches above {number(threshold, 3)} outlined")
        layers = np.arange(share.share.shape[0])
        mean, top = share.share.mean(axis=1), share.share.max(axis=1)
        self.share_mean.setData(layers, mean)
        self.share_max.setData(layers, top)
        self.share_uniform.setData(layers, np.full(layers.shape, count / total))
        high = max(float(top.max()) if top.size else 0.0, count / total)
        self.share_plot.setXRange(-0.5, len(layers) - 0.5, padding=0)      # the last layer's label inside
        self.share_plot.setYRange(0.0, high * 1.1 if high > 0 else 1.0, padding=0)
        self._fit_share_ticks()
        self.share_title.setText(f"attention the {count} outlined patches receive · per layer · mean over all "
                                 "queries")
        self.shown.emit("norms")

    def _choose_threshold(self, norms: np.ndarray) -> None:
        """A first threshold for a new model (unless one was chosen): three standard deviations above the mean norm
        over all layers."""
        if self.state.norm_threshold is None:    # none chosen for this model yet (a new model resets it)
            self._quiet(norm_threshold=round(float(norms.mean() + 3 * norms.std()), 3))

    def _draw_histogram(self, maps: ResultMaps, layer: int, threshold: float) -> None:
        if maps.norm_histogram is None:
            return
        counts, edges = maps.norm_histogram
        shown = np.log1p(counts.astype(np.float32))            # (L, bins)
        top = float(shown.max()) or 1.0
        self.hist_item.setImage(shown, autoLevels=False, levels=(0.0, top), lut=colors.lut("magma"))
        self.hist_item.setRect(QRectF(float(edges[0]), 0.0, float(edges[-1] - edges[0]), float(counts.shape[0])))
        self.hist_plot.setXRange(float(edges[0]), float(edges[-1]), padding=0)      # the strip fills the plot
        self.hist_plot.setYRange(0.0, float(counts.shape[0]), padding=0)
        colors.set_colorbar_levels(self.hist_bar, (0.0, top), count_ticks(float(np.expm1(top))))
        self.layer_band.setRegion((layer, layer + 1))
        self._fit_hist_ticks()
        self.hist_title.setText(f"patches by norm, every layer (rows) · layer {layer} framed · red line: "
                                f"threshold {number(threshold, 3)} (drag it)")

    def _fit_hist_ticks(self) -> None:
        """Label every few layers of the histogram, as many as the strip's height has room for."""
        maps = self._maps
        if maps is None or maps.norm_histogram is None:
            return
        depth = maps.norm_histogram[0].shape[0]
        axis = self.hist_plot.getAxis("left")
        per_layer = self.hist_plot.vb.height() / max(1, depth)
        step = tick_step(per_layer, QFontMetricsF(axis.style.get("tickFont") or axis.font()).height())
        axis.setTicks([index_ticks(depth, step, 0.5), []])

    def _fit_share_ticks(self) -> None:
        """Label every few layers of the share plot, as many as its width has room for."""
        share = self.share
        if share is None:
            return
        depth = share.share.shape[0]
        axis = self.share_plot.getAxis("bottom")
        per_layer = self.share_plot.vb.width() / max(1, depth)
        widest = QFontMetricsF(axis.style.get("tickFont") or axis.font()).horizontalAdvance(str(depth - 1))
        axis.setTicks([index_ticks(depth, tick_step(per_layer, widest)), []])

    # ------------------------------------------------------------------------------------------ export

    def _export_folder(self) -> Path | None:
        folder = QFileDialog.getExistingDirectory(self, "Export into")
        return Path(folder) if folder else None

    def _export_pca_dialog(self) -> None:
        maps = self._maps
        if maps is None or self.pca_colors is None or self._pca is None:
            return
        folder = self._export_folder()
        if folder is None:
            return
        joint = len(self._pca.sources) > 1
        target = features_export.pca_path(maps, self.layer, folder, joint)
        if dialogs.confirm_overwrite(self, [target]):
            features_export.export_pca(maps, self.pca_colors, self.layer, self.state, folder, joint, colorbar=True,
                                       overwrite=True)
            self.status.setText(f"Exported {target.name}")

    def _export_norms_dialog(self) -> None:
        maps = self._maps
        if maps is None or maps.norms is None:
            return
        folder = self._export_folder()
        if folder is None:
            return
        target = features_export.norms_path(maps, self.layer, folder)
        if dialogs.confirm_overwrite(self, [target]):
            features_export.export_norms(maps, [self.layer], self.state, folder, colorbar=True, overwrite=True)
            self.status.setText(f"Exported {target.name}")
