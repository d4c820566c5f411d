"""The head-statistics dock: mean attention distance (px) and attention entropy of every head against layer depth,
and where the patches' attention goes by token kind (CLS, distillation, register tokens, the patches) per layer.

One point per head (the ViT paper's figure 7), for the current image or averaged over every image run so far at
this model and input size. Hovering a point names its layer and head; clicking selects them everywhere. The token-kind
plot draws the head mean of every kind as a solid line and the selected head's as a dashed one; hovering it gives a
layer's values, clicking selects the layer. The statistics themselves are computed in the worker with each result
(`ResultMaps.head_stats`) and kept by the session (`Session.head_stats`, every image run at this model and size).
A windowed model's (`WindowedMaps.head_stats`) layers are its blocks over all stages, the distance in input pixels
of each block's stage and a stage's heads its own (a stage with fewer heads has no points beyond them).
"""
from __future__ import annotations

import html

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QPointF, Qt, Signal
from PySide6.QtGui import QColor
from PySide6.QtWidgets import QCheckBox, QLabel, QVBoxLayout, QWidget

from vitviz.gui.panels.base import SELECT, TEXT, LazyPanel, TitleLabel, dark_layout, pen, plural, style_plot
from vitviz.gui.session import Session
from vitviz.gui.state import ViewState

PICK_RADIUS_PX = 9.0
JITTER = 0.35
KIND_COLORS = ("#fbbc04", "#c58af9", "#4ecde6", "#81c995", "#f28b82", "#ff8bcb", "#8ab4f8", "#fcad70")
PATCH_COLOR = "#bdc1c6"
KINDS_TITLE = "Where the patches' attention goes, by token kind"
NO_KINDS_TITLE = ("Attention by token kind: not plotted. This model has no CLS, distillation or register tokens, "
                  "so all of the patches' attention goes to patches (1.0 in every layer)")


def point_positions(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """x (layer, spread a little per head so heads stay apart), y, layer and head index of every point of an
    (L, H) array; NaN entries are left out."""
    nl, nh = values.shape
    layers, heads = np.meshgrid(np.arange(nl), np.arange(nh), indexing="ij")            # (L, H) each
    offset = (heads - (nh - 1) / 2) * (JITTER / max(nh, 1))
    ok = np.isfinite(values)
    return (layers + offset)[ok], values[ok], layers[ok], heads[ok]


def head_color(head: int, heads: int) -> QColor:
    """The colour of a head's points in the distance and entropy plots."""
    return pg.intColor(int(head), hues=max(heads, 1), alpha=220)


def head_key_html(heads: int) -> str:
    """The legend of the head colours: a coloured square and the head's number for each head."""
    cells = [f"<span style='color:{head_color(h, heads).name()}'>&#9632;</span>&nbsp;{h}" for h in range(heads)]
    return "Head colours: " + " ".join(cells)


def layer_ticks(layers: int, width_px: float, room_px: float = 26.0) -> list[tuple[int, str]]:
    """Integer layer ticks, every 1, 2, 5, 10, ... layers so that each label has `room_px` pixels."""
    step = 1
    for candidate in (1, 2, 5, 10, 20, 50):
        step = candidate
        if width_px <= 0 or width_px / max(layers, 1) * step >= room_px:
            break
    return [(i, str(i)) for i in range(0, layers, step)]


def _fit_layer_ticks(plot: pg.PlotItem, layers: int) -> None:
    plot.getAxis("bottom").setTicks([layer_ticks(layers, plot.vb.width())])


def _title(widget: pg.GraphicsLayoutWidget, text: str, row: int, col: int, colspan: int = 1) -> TitleLabel:
    label = TitleLabel(text, color=TEXT, size="9pt")          # wraps: never widens the panel
    widget.addItem(label, row=row, col=col, colspan=colspan)
    return label


class StatPlot:
    """One scatter (distance or entropy) with a ring around the selected head."""

    def __init__(self, widget: pg.GraphicsLayoutWidget, col: int, ylabel: str, title: str) -> None:
        self.title = _title(widget, title, 0, col)
        self.plot = widget.addPlot(row=1, col=col)
        style_plot(self.plot, ylabel, "layer")
        self.plot.setMouseEnabled(False, False)
        self.scatter = pg.ScatterPlotItem(size=8, pen=pg.mkPen(None))
        self.ring = pg.ScatterPlotItem(size=16, pen=pg.mkPen(SELECT, width=2), brush=pg.mkBrush(None))
        self.plot.addItem(self.scatter)
        self.plot.addItem(self.ring)
        self.x = self.y = self.layers = self.heads = np.zeros(0)
        self.layers_shown = 0
        self.plot.vb.sigResized.connect(lambda *_a: _fit_layer_ticks(self.plot, self.layers_shown))

    def show(self, values: np.ndarray) -> None:
        self.x, self.y, self.layers, self.heads = point_positions(values)
        nh = values.shape[1]
        brushes = [pg.mkBrush(head_color(int(h), nh)) for h in self.heads]
        self.scatter.setData(self.x, self.y, brush=brushes)
        self.layers_shown = values.shape[0]
        _fit_layer_ticks(self.plot, self.layers_shown)
        self.plot.vb.autoRange(padding=0.12)

    def clear(self) -> None:
        self.scatter.clear()
        self.ring.clear()
        self.x = self.y = self.layers = self.heads = np.zeros(0)

    def mark(self, layer: int | None, head: int | None) -> None:
        """Ring the selected point(s): one head of one layer, or every head of the layer when head is None."""
        sel = self.layers == layer if layer is not None else np.zeros(len(self.x), bool)
        if head is not None:
            sel &= self.heads == head
        self.ring.setData(self.x[sel], self.y[sel])

    def nearest(self, scene_pos: QPointF) -> int | None:
        """Index of the point within `PICK_RADIUS_PX` screen pixels of a scene position, or None."""
        if len(self.x) == 0 or not self.plot.vb.sceneBoundingRect().contains(scene_pos):
            return None
        vb = self.plot.vb
        pts = [vb.mapViewToScene(QPointF(float(x), float(y))) for x, y in zip(self.x, self.y)]
        d = np.hypot([p.x() - scene_pos.x() for p in pts], [p.y() - scene_pos.y() for p in pts])
        i = int(np.argmin(d))
        return i if d[i] <= PICK_RADIUS_PX else None

    def scene_pos_of(self, index: int) -> QPointF:
        return self.plot.vb.mapViewToScene(QPointF(float(self.x[index]), float(self.y[index])))


class KindPlot:
    """Attention by token kind against layer: per kind (prefix tokens, then 'patches') the head mean as a solid
    line with points and the selected head as a dashed line, a legend naming the kinds (and the dashed head), a
    line at the selected layer."""

    def __init__(self, widget: pg.GraphicsLayoutWidget, row: int) -> None:
        self.title = _title(widget, KINDS_TITLE, row, 0, colspan=2)
        self.plot = widget.addPlot(row=row + 1, col=0, colspan=2)
        style_plot(self.plot, "share", "layer")
        self.plot.setMouseEnabled(False, False)
        # the legend is a line of text under the plots (`key`), so it never covers a line of the plot
        self.key = QLabel("")
        self.key.setObjectName("tokenKindKey")
        self.key.setWordWrap(True)
        self.key.setToolTip("Solid lines: the head mean of each token kind; dashed: the selected head")
        self.legend_names: list[str] = []               # what the key names, in order
        self.colors: list[str] = []
        self.layer_line = pg.InfiniteLine(angle=90, movable=False, pen=pen(SELECT, 160))
        self.layer_line.setVisible(False)
        self.plot.addItem(self.layer_line)
        self.names: tuple[str, ...] = ()                 # the legend's: prefix tokens, then 'patches'
        self.values: np.ndarray | None = None          # (L, H, P + 1) shown now
        self.mean_curves: list[pg.PlotDataItem] = []
        self.head_curves: list[pg.PlotDataItem] = []
        self.head: int | None = None
        self._labels: list[str] = []
        self.layers_shown = 0
        self.folded = False                               # patches only: nothing to plot (`_fold`)
        self.plot.vb.sigResized.connect(lambda *_a: _fit_layer_ticks(self.plot, self.layers_shown))

    def show(self, values: np.ndarray, names: tuple[str, ...]) -> None:
        """Draw (L, H, P + 1) shares; `names` are the P prefix tokens' (the last column is 'patches')."""
        kinds = tuple(names) + ("patches",)
        if len(kinds) == 1:        # patches only (Swin, SAM, a ViT without CLS): a plot of 1.0 says nothing
            self.clear()
            self._fold(True)
            return
        self._fold(False)
        if kinds != self.names or len(self.mean_curves) != len(kinds):
            self._make_curves(kinds)
        self.values = values
        layers = np.arange(values.shape[0])
        for k, curve in enumerate(self.mean_curves):
            curve.setData(layers, np.nanmean(values[:, :, k], axis=1))   # NaN: a windowed stage's missing heads
        self.plot.setXRange(-0.3, max(values.shape[0] - 1, 0) + 0.3, padding=0)
        self.plot.setYRange(0.0, 1.0, padding=0.04)
        self.layers_shown = values.shape[0]
        _fit_layer_ticks(self.plot, self.layers_shown)

    def _fold(self, folded: bool) -> None:
        """Give the plot's room to the other plots and say why there is nothing to split (`folded`), or show it."""
        self.folded = folded
        self.plot.setVisible(not folded)
        self.plot.setMaximumHeight(0 if folded else 16777215)
        self.title.setText(NO_KINDS_TITLE if folded else KINDS_TITLE)
        if folded:
            self.key.setText("")

    def _make_curves(self, kinds: tuple[str, ...]) -> None:
        for curve in self.mean_curves + self.head_curves:
            self.plot.removeItem(curve)
        self.names = kinds
        labels = kinds if len(kinds) > 1 else ("patches (no prefix tokens)",)
        self.mean_curves, self.head_curves = [], []
        self.colors = []
        for k, name in enumerate(labels):
            color = PATCH_COLOR if k == len(kinds) - 1 else KIND_COLORS[k % len(KIND_COLORS)]
            self.colors.append(color)
            mean = pg.PlotDataItem(pen=pen(color, width=2), symbol="o", symbolSize=5, symbolPen=None,
                                   symbolBrush=pg.mkBrush(color))
            head = pg.PlotDataItem(pen=pen(color, 200, width=1.5, dashed=True))
            self.plot.addItem(mean)
            self.plot.addItem(head)
            self.mean_curves.append(mean)
            self.head_curves.append(head)
        self._labels = list(labels)
        self._show_key()

    def _show_key(self) -> None:
        """The key under the plot: each kind's colour and name, then the dashed selected head."""
        self.legend_names = list(self._labels) + ([f"head {self.head}"] if self.head is not None
                                                                  else [])
        cells = [f"<span style='color:{c}'>&#9473;&#9473;</span>&nbsp;{html.escape(n).replace(' ', '&nbsp;')}"
                 for c, n in zip(self.colors, self.legend_names)]
        if self.head is not None:
            cells.append(f"<span style='color:{PATCH_COLOR}'>&#9476;&#9476;</span>&nbsp;head&nbsp;{self.head}")
        self.key.setText("Token kinds: " + " ".join(cells) if cells and not self.folded else "")

    def clear(self) -> None:
        for curve in self.mean_curves + self.head_curves:
            curve.clear()
        self.values = None
        self.layer_line.setVisible(False)
        self.head = None
        self._show_key()

    def mark(self, layer: int | None, head: int | None) -> None:
        """A line at the selected layer; the selected head's shares dashed (none for the head mean or max)."""
        self.head = head if self.values is not None else None
        self.layer_line.setVisible(layer is not None and self.values is not None)
        if layer is not None:
            self.layer_line.setValue(layer)
        for k, curve in enumerate(self.head_curves):
            if self.head is None:
                curve.clear()
            else:
                curve.setData(np.arange(self.values.shape[0]), self.values[:, self.head, k])
        self._show_key()

    def layer_at(self, scene_pos: QPointF) -> int | None:
        """The layer nearest a scene position inside the plot, or None."""
        vb = self.plot.vb
        if self.values is None or not vb.sceneBoundingRect().contains(scene_pos):
            return None
        x = vb.mapSceneToView(scene_pos).x()
        return int(np.clip(round(x), 0, self.values.shape[0] - 1))

    def describe(self, layer: int) -> str:
        """E.g. 'layer 3: cls 0.120, reg0 0.400, patches 0.480 (head mean); head 1: cls 0.2, ...'."""
        def shares(row: np.ndarray) -> str:
            return ", ".join(f"{n} {v:.3f}" for n, v in zip(self.names, row))
        text = f"layer {layer}: {shares(np.nanmean(self.values[layer], axis=0))} (head mean)"
        if self.head is not None:
            text += f"; head {self.head}: {shares(self.values[layer, self.head])}"
        return text


class HeadStatsPanel(LazyPanel):
    """Attention distance and entropy per head, and attention by token kind per layer.

    Signals:
        head_clicked(layer, head): a point was clicked.
    """

    head_clicked = Signal(int, int)

    def __init__(self, state: ViewState, session: Session, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("headStatsPanel")
        self.state, self.session = state, session
        self.shown: tuple[np.ndarray, np.ndarray] | None = None
        self.average_check = QCheckBox("Average over all images run so far")
        self.average_check.setToolTip("Mean over every image run at this model and input size")
        self.average_check.toggled.connect(lambda on: self.state.update(stats_average=bool(on)))
        self.readout = QLabel("Hover a point to name its layer and head; click it to select them")
        self.readout.setWordWrap(True)
        self.widget = dark_layout()
        # the unit alone on the axis (the title says what): at the default layout on a 1280 x 800 screen the
        # plots are about 80 px high, and 'distance (px)' set upright ran up into the title
        self.distance = StatPlot(self.widget, 0, "px", "Mean attention distance")
        self.entropy = StatPlot(self.widget, 1, "nats", "Attention entropy")
        self.kinds = KindPlot(self.widget, 2)
        self.head_key = QLabel("")
        self.head_key.setObjectName("headColourKey")
        self.head_key.setWordWrap(True)
        self.head_key.setToolTip("The colour of each head's points in the distance and entropy plots")
        self.widget.scene().sigMouseMoved.connect(self._on_moved)
        self.widget.scene().sigMouseClicked.connect(self._on_clicked)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(2, 2, 2, 2)
        for widget in (self.average_check, self.readout):
            layout.addWidget(widget)
        layout.addWidget(self.widget, 1)
        layout.addWidget(self.kinds.key)
        layout.addWidget(self.head_key)
        state.subscribe(self._on_state)
        session.image_list.current_changed.connect(self._on_current_changed)
        session.image_list.result_ready.connect(self._on_result_ready)

    # ------------------------------------------------------------------------------------------ inputs

    def _on_current_changed(self, _maps: object) -> None:
        """Another image, or its result arrived, or the statistics started over (a new model or input size)."""
        self._update_label()
        self.request_redraw()

    def _on_result_ready(self, path: str) -> None:
        """One more image's statistics: the average changes (the current image's arrive with `current_changed`)."""
        self._update_label()
        if self.state.stats_average and path != self.session.image_list.current:
            self.request_redraw()

    def _on_state(self, changed: set[str]) -> None:
        if "stats_average" in changed:
            self.average_check.setChecked(self.state.stats_average)
            self.request_redraw()
        elif changed & {"layer", "head"}:
            self._mark()

    def _update_label(self) -> None:
        self.average_check.setText(f"Average over all {plural(len(self.session.head_stats), 'image')} run so far")

    # ------------------------------------------------------------------------------------------ drawing

    def statistics(self) -> tuple[np.ndarray, np.ndarray] | None:
        """(L, H) distance and entropy shown now: the current image's, or the mean over every image."""
        stats = self.session.head_stats
        if self.state.stats_average and stats:
            dists, ents = zip(*((d, e) for d, e, _k in stats.values()))
            return np.nanmean(np.stack(dists), axis=0), np.mean(np.stack(ents), axis=0)
        current = self._current()
        return None if current is None else current[:2]

    def token_kinds(self) -> np.ndarray | None:
        """(L, H, P + 1) attention by token kind shown now: the current image's, or the mean over every image."""
        stats = self.session.head_stats
        if self.state.stats_average and stats:
            return np.mean(np.stack([k for _d, _e, k in stats.values()]), axis=0)
        current = self._current()
        return None if current is None else current[2]

    def _current(self) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """The current image's statistics: of its intervened run while that is shown (`vitviz.gui.interventions`;
        the average stays over the clean runs)."""
        maps = self.session.image_list.current_maps
        if getattr(maps, "what", ""):
            return maps.head_stats()   # type: ignore[union-attr]
        return self.session.head_stats.get(self.session.image_list.current)

    def redraw(self) -> None:
        self._update_label()
        x_label = self.session.model.traits.layer_word   # a windowed model's: blocks over all stages
        for plot in (self.distance.plot, self.entropy.plot, self.kinds.plot):
            plot.getAxis("bottom").setLabel(x_label)
        self.shown = self.statistics()
        kinds = self.token_kinds()
        if kinds is None:
            self.kinds.clear()
        else:
            self.kinds.show(kinds, self.session.model.spec.prefix_names if self.session.model.spec is not None else ())
        if self.shown is None:
            self.distance.clear()
            self.entropy.clear()
        else:
            self.distance.show(self.shown[0])
            self.entropy.show(self.shown[1])
        self.head_key.setText(head_key_html(self.shown[0].shape[1]) if self.shown is not None else "")
        self._mark()

    def _mark(self) -> None:
        layer, head = self.state.layer, self.state.head
        if self.shown is not None:
            nl, nh = self.shown[0].shape
        elif self.kinds.values is not None:
            nl, nh = self.kinds.values.shape[:2]
        else:
            return
        li = None if layer == "mean" else int(layer) % nl
        hi = None if isinstance(head, str) else int(head) % nh
        for plot in (self.distance, self.entropy):
            plot.mark(li, hi)
        self.kinds.mark(li, hi)

    def point_at(self, scene_pos: QPointF) -> tuple[StatPlot, int] | None:
        for plot in (self.distance, self.entropy):
            index = plot.nearest(scene_pos)
            if index is not None:
                return plot, index
        return None

    def _what(self) -> str:
        if self.state.stats_average:
            return "images averaged: %d" % len(self.session.head_stats)
        shown = self.session.image_list.current_maps
        return f"current image, {shown.what}" if getattr(shown, "what", "") else "current image"

    def _on_moved(self, scene_pos: QPointF) -> None:
        layer = self.kinds.layer_at(scene_pos)
        if layer is not None:
            self.readout.setText(f"{self.kinds.describe(layer)} ({self._what()})")
            return
        hit = self.point_at(scene_pos)
        if hit is None:
            return
        plot, i = hit
        what = self._what()
        d, e = self.shown[0][plot.layers[i], plot.heads[i]], self.shown[1][plot.layers[i], plot.heads[i]]
        self.readout.setText(f"layer {plot.layers[i]}, head {plot.heads[i]}: distance {d:.1f} px, "
                             f"entropy {e:.3f} nats ({what})")

    def _on_clicked(self, event: object) -> None:
        if event.button() != Qt.MouseButton.LeftButton:
            return
        layer = self.kinds.layer_at(event.scenePos())
        if layer is not None:
            self.state.update(layer=layer)
            return
        hit = self.point_at(event.scenePos())
        if hit is not None:
            plot, i = hit
            self.head_clicked.emit(int(plot.layers[i]), int(plot.heads[i]))
