"""The Compare dock: model A (the loaded one), model B and A − B for the current image, linked to the view state.

The three maps follow the main controls' layer, head, map and query (`ViewState`): A's selection, B's partner (its
layer by relative depth, its head matched by similarity or by index, its query token by place) on A's grid, and
A − B. A and B are drawn on one shared colour scale (`vitviz.core.analyses.compare.shared_scale`), A − B on the diverging
colormap `rdbu` centred on 0 (symmetric scale); the colorbars and the scale line say so, and the mapping line says
which layer, head and token of B each view shows. Below, the per-layer mean Jensen–Shannon divergence of the CLS
attention and the linear CKA of the token features against A's layers, over every open image both models have run;
clicking a layer selects it everywhere. Everything drawn here only indexes arrays built in the worker
(`vitviz.gui.compare.CompareSession`).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QPointF, QRectF, QSize, Signal
from PySide6.QtWidgets import (QComboBox, QFileDialog, QGraphicsItem, QHBoxLayout, QLabel, QSizePolicy, QVBoxLayout,
                               QWidget)

from vitviz.core.drawing.colormaps import DIVERGING, colormap
from vitviz.gui.compare import HEAD_MODES, CompareSession, export_view
from vitviz.gui.panels.base import (LazyPanel, TEXT, dark_layout, display_name, image_view, pen, style_plot,
                                    push_button, wrapped_label)
from vitviz.gui.state import ViewState
from vitviz.gui.numbers import number, number_range

REDRAW_FIELDS = {"layer", "head", "query", "source", "colormap", "opacity", "rollout_fusion", "rollout_discard",
                 "rollout_start", "rollout_residual", "rollout_pool"}
JSD_COLOR, CKA_COLOR = "#f28b82", "#8ab4f8"


def _colour_map(name: str) -> pg.ColorMap:
    lut = colormap(name)
    return pg.ColorMap(np.linspace(0.0, 1.0, len(lut)), lut)


class SteadyLabel(QWidget):
    """A wrapped line of text (`label`, named for tests and style sheets) whose new words lay the dock out again only
    when they need another height. A QLabel's new text invalidates its parent's layout every time, and the mapping
    line changes with every linked layer or head: the dock was laid out anew and the summary plot beside it partly
    repainted on each change. Here the label's parent has no layout (nothing handles the request), and this holder's
    fixed height changes, and lays the dock out, only when the text's height at this width does."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.label = wrapped_label(name)
        self.label.setParent(self)
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Fixed)
        self._fit()

    def text(self) -> str:
        return self.label.text()

    def setText(self, text: str) -> None:  # noqa: N802 - QLabel's name
        if text != self.label.text():
            self.label.setText(text)
            self._fit()

    def sizeHint(self) -> QSize:  # noqa: N802 - Qt override
        return QSize(self.label.minimumSizeHint().width(), self.height())

    def minimumSizeHint(self) -> QSize:  # noqa: N802 - Qt override
        return QSize(0, self.height())

    def resizeEvent(self, event: object) -> None:  # noqa: N802 - Qt override
        self.label.setGeometry(0, 0, self.width(), self.label.heightForWidth(self.width()))
        self._fit()
        super().resizeEvent(event)

    def _fit(self) -> None:
        height = self.label.heightForWidth(self.width()) if self.label.text() else 0
        self.label.resize(self.width(), height)
        if height != self.height():
            self.setFixedHeight(height)


class ComparePanel(LazyPanel):
    """A, B and A − B of the current image, the mapping in words and the per-layer summary (see the module
    docstring). `exported(paths)` after the export button wrote the three pictures."""

    exported = Signal(list)

    def __init__(self, state: ViewState, compare: CompareSession, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("comparePanel")
        self.state, self.compare, self.session = state, compare, compare.session
        self.frame = None               # the CompareFrame shown (None: a message instead)
        self.models_label = wrapped_label("compareModels")
        self.heads_combo = QComboBox()
        self.heads_combo.setObjectName("compareHeads")
        for mode, text in HEAD_MODES.items():
            self.heads_combo.addItem(text, mode)
        self.heads_combo.setToolTip("How A's heads are paired with B's: a Hungarian assignment on the similarity of "
                                    "their CLS attention over every open image, or head i with head i")
        self.heads_combo.currentIndexChanged.connect(
            lambda _i: compare.set_heads(str(self.heads_combo.currentData())))
        self.match_button = push_button("Match again", compare.rematch,
                                        "Match the heads again over every open image both models have run")
        self.export_button = push_button("Export A/B/Δ…", self.export_dialog, "Save the three pictures as `vitviz "
                                         "export --compare B` writes them (the same names and bytes)")
        self.close_button = push_button("Close comparison", compare.close, name="closeComparison")
        self.message = wrapped_label("compareMessage")
        self.mapping = SteadyLabel("compareMapping")
        self.scale = wrapped_label("compareScale")
        self.widget = dark_layout()
        self.widget.setMinimumHeight(150)
        self.titles, self.views, self.items = [], [], []
        self.bases: list[pg.ImageItem] = []          # A's input image under each map
        # maps in columns 0, 1 and 3, each colour bar upright beside what it scales (2: A and B's, 4: A − B's): a
        # horizontal bar under the maps took a third of a short dock's height and left the maps ~80 px
        for col, title in zip((0, 1, 3), ("A", "B (on A's grid, by place)", "A − B")):
            label = self.widget.addLabel(title, row=0, col=col, color=TEXT)
            view, base = image_view(self.widget, 1, col)
            # A's input image under the map changes once per image, but every new map above it repainted it
            # (scaled from the full picture): drawn once into a pixmap at the view's size, it is copied instead
            base.setCacheMode(QGraphicsItem.CacheMode.DeviceCoordinateCache)
            item = pg.ImageItem()
            item.setZValue(1)
            view.addItem(item)
            self.titles.append(label)
            self.views.append(view)
            self.bases.append(base)
            self.items.append(item)
        self._base_of: object = None
        self.bar_ab = pg.ColorBarItem(values=(0, 1), width=10, colorMap=_colour_map(state.colormap), interactive=False,
                                      orientation="vertical", label="A and B",
                                      colorMapMenu=False)
        self.bar_diff = pg.ColorBarItem(values=(-1, 1), width=10, colorMap=_colour_map(DIVERGING), interactive=False,
                                        orientation="vertical", label="A − B",
                                        colorMapMenu=False)
        self.widget.addItem(self.bar_ab, row=1, col=2)
        self.widget.addItem(self.bar_diff, row=1, col=4)
        for bar in (self.bar_ab, self.bar_diff):
            for side in ("top", "bottom", "left", "right"):
                axis = bar.getAxis(side)
                if axis is not None:
                    axis.enableAutoSIPrefix(False)
        self.widget.ci.layout.setRowStretchFactor(1, 10)
        self.plot_widget = dark_layout()
        self.plot_widget.setMinimumHeight(150)
        self.plot = self.plot_widget.addPlot(row=0, col=0)
        style_plot(self.plot, "JSD (bits) · CKA", "A layer (B's by relative depth)")
        # the key is a line of text under the plot: a legend inside it lay over the CKA curve (near 1 at the top)
        self.key = QLabel("Key: " + " ".join(
            f"<span style='color:{color}'>&#9473;{mark}&#9473;</span>&nbsp;{name.replace(' ', '&nbsp;')}"
            for color, mark, name in ((JSD_COLOR, "&#9679;", "mean JSD of CLS attention"),
                                      (CKA_COLOR, "&#9632;", "linear CKA of the token features"))))
        self.key.setObjectName("compareKey")
        self.key.setWordWrap(True)
        self.jsd_curve = self.plot.plot([], [], pen=pen(JSD_COLOR, width=2), symbol="o", symbolSize=6,
                                        symbolBrush=JSD_COLOR, name="mean JSD of CLS attention")
        self.cka_curve = self.plot.plot([], [], pen=pen(CKA_COLOR, width=2), symbol="s", symbolSize=6,
                                        symbolBrush=CKA_COLOR, name="linear CKA of the token features")
        self.layer_line = pg.InfiniteLine(angle=90, movable=False, pen=pen("#fbbc04", 200, 1.5, dashed=True))
        self.plot.addItem(self.layer_line)
        self.plot.setYRange(0, 1.05)
        self.summary_note = wrapped_label("compareSummaryNote")
        self.plot_widget.scene().sigMouseClicked.connect(self._on_clicked)
        bar = QHBoxLayout()
        for w in (self.heads_combo, self.match_button, self.export_button, self.close_button):
            bar.addWidget(w)
        bar.addStretch(1)
        left, right = QVBoxLayout(), QVBoxLayout()
        left.addWidget(self.message)
        left.addWidget(self.widget, 1)
        left.addWidget(self.mapping)
        left.addWidget(self.scale)
        right.addWidget(self.plot_widget, 1)
        right.addWidget(self.key)
        right.addWidget(self.summary_note)
        body = QHBoxLayout()
        body.addLayout(left, 3)
        body.addLayout(right, 2)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(2, 2, 2, 2)
        layout.addWidget(self.models_label)
        layout.addLayout(bar)
        layout.addLayout(body, 1)
        self._summary_shown = None
        self._shape: tuple[int, ...] | None = None
        self._cmap = state.colormap
        self._levels: tuple | None = None
        compare.bind(state)
        state.subscribe(self._on_state)
        compare.changed.connect(self.request_redraw)
        self.session.image_list.current_changed.connect(lambda _maps: self.request_redraw())

    # ------------------------------------------------------------------------------------------ inputs
    def _on_state(self, changed: set[str]) -> None:
        if changed & REDRAW_FIELDS:
            self.request_redraw()

    def layer_at(self, scene_pos: QPointF) -> int | None:
        """A's layer nearest a scene position inside the summary plot, or None (no summary, outside the plot)."""
        vb = self.plot.vb
        summary = self.compare.summary
        if summary is None or not vb.sceneBoundingRect().contains(scene_pos):
            return None
        return int(np.clip(round(vb.mapSceneToView(scene_pos).x()), 0, len(summary.jsd) - 1))

    def _on_clicked(self, event: object) -> None:
        layer = self.layer_at(event.scenePos())  # type: ignore[attr-defined]
        if layer is not None:
            self.state.update(layer=layer)

    # ------------------------------------------------------------------------------------------ drawing
    def redraw(self) -> None:
        c = self.compare
        spec_a = self.session.model.spec
        a_name = display_name(self.session.model.model_path) if spec_a is not None else "no model"
        b_name = display_name(c.b_path) if c.b_path else "none"
        assumed = [name for name, _source in c.b_spec.assumptions] if c.b_spec is not None else []
        self.models_label.setText(f"A: {a_name} · B: {b_name}"
                                  + (f" ({c.b_spec.family}, {c.b_spec.depth} layers, {c.b_spec.num_heads} heads)"
                                     if c.b_spec is not None else "")
                                  + (f" · B's file does not say {len(assumed)} setting(s), assumed: "
                                     f"{', '.join(assumed)}" if assumed else ""))
        self.models_label.setToolTip("\n".join(f"{name}: {source}" for name, source in c.b_spec.assumptions)
                                     if c.b_spec is not None else "")
        for w in (self.heads_combo, self.match_button, self.export_button, self.close_button):
            w.setEnabled(c.active)
        frame, note = c.frame_for(self.state)
        self.frame = frame
        self.export_button.setEnabled(frame is not None)
        self.message.setVisible(bool(note))
        if frame is None:
            self.message.setText(note)
            for item in self.items + self.bases:
                item.clear()
            self._base_of, self._shape = None, None
            self.mapping.setText("")
            self.scale.setText("")
        else:
            self.message.setText(note)
            self._draw(frame)
        self._draw_summary()

    def _draw(self, frame: object) -> None:
        f = frame
        lut = colormap(self.state.colormap)
        for item, values in ((self.items[0], f.a), (self.items[1], f.b)):           # type: ignore[attr-defined]
            item.setImage(np.nan_to_num(values, nan=f.vmin), levels=(f.vmin, f.vmax), lut=lut)  # type: ignore
        self.items[2].setImage(np.nan_to_num(f.diff, nan=0.0), levels=(-f.dmax, f.dmax),        # type: ignore
                               lut=colormap(DIVERGING))
        shape = f.a.shape                                                            # type: ignore[attr-defined]
        maps = self.session.image_list.current_maps
        if maps is not None and maps is not self._base_of:     # A's input image under the maps, once per image
            self._base_of = maps
            for base in self.bases:
                base.setImage(maps.result.image)
            self._shape = None
        opacity = float(self.state.opacity) if maps is not None else 1.0
        for item in self.items:
            item.setOpacity(opacity)
        if shape != self._shape:                    # the range and the colour maps change rarely: set them then
            self._shape = shape
            rect = QRectF(0, 0, shape[1], shape[0])
            for view, item, base in zip(self.views, self.items, self.bases):
                item.setRect(rect)
                base.setRect(rect)
                view.setRange(xRange=(0, shape[1]), yRange=(0, shape[0]), padding=0)
        if self.state.colormap != self._cmap:
            self._cmap = self.state.colormap
            self.bar_ab.setColorMap(_colour_map(self.state.colormap))
        levels = ((f.vmin, f.vmax), (-f.dmax, f.dmax))                               # type: ignore[attr-defined]
        if levels != self._levels:
            self._levels = levels
            self.bar_ab.setLevels(levels[0])
            self.bar_diff.setLevels(levels[1])
        self.mapping.setText(f.label)                                                # type: ignore[attr-defined]
        missing = " (B's head has no partner: blank)" if f.head_b is None else ""    # type: ignore[attr-defined]
        self.scale.setText(f"A and B on one shared scale {number_range(f.vmin, f.vmax)} ({self.state.colormap})"
                           f"{missing} · A − B on {DIVERGING}, centred on 0, "
                           f"−{number(f.dmax, 3)}…{number(f.dmax, 3)}")  # type: ignore

    def _draw_summary(self) -> None:
        s = self.compare.summary
        if s is None:
            if self._summary_shown is not None:
                self.jsd_curve.setData([], [])
                self.cka_curve.setData([], [])
                self._summary_shown = None
            self.summary_note.setText("The per-layer summary appears once the heads are matched."
                                      if self.compare.active else "")
            self.layer_line.setVisible(False)
        else:
            if self._summary_shown is not s:
                x = np.arange(len(s.jsd))
                self.jsd_curve.setData(x, s.jsd)
                if s.cka is not None:
                    self.cka_curve.setData(x, np.nan_to_num(s.cka, nan=0.0))
                else:
                    self.cka_curve.setData([], [])
                self.plot.setXRange(-0.5, len(s.jsd) - 0.5, padding=0)
                step = max(1, len(s.jsd) // 12)
                self.plot.getAxis("bottom").setTicks([[(i, str(i)) for i in range(0, len(s.jsd), step)], []])
                self._summary_shown = s
                self.summary_note.setText(f"Over {s.images} image(s) · " + " · ".join(s.notes[1:])
                                          + " · click a layer to select it")
            layer = self.state.layer
            self.layer_line.setVisible(isinstance(layer, int))
            if isinstance(layer, int):
                self.layer_line.setValue(layer % len(s.jsd))

    # ------------------------------------------------------------------------------------------ export
    def export_to(self, folder: Path, overwrite: bool = True) -> list[Path]:
        """Write A's, B's and A − B's pictures of the current image and selection into `folder` (as `vitviz export
        --compare B` names and draws them)."""
        view = self.compare.view
        if view is None or self.session.image_list.current not in view.sources:
            raise RuntimeError("nothing to export: the comparison of this image is not ready")
        paths = export_view(view, self.session.image_list.current, self.state, Path(folder), overwrite=overwrite)
        self.exported.emit([str(p) for p in paths])
        return paths

    def export_dialog(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Export A, B and A − B into a folder")
        if folder:
            try:
                self.export_to(Path(folder))
            except (OSError, RuntimeError, ValueError) as exc:
                self.message.setText(f"Could not export: {exc}")
