"""The head-statistics dock: mean attention distance (px) and attention entropy of every head against layer depth.

One point per head (the ViT paper's figure 7), for the current image or averaged over every image run so far at
this model and input size. Hovering a point names its layer and head; clicking selects them everywhere. The
statistics themselves are computed in the worker with each result (`ResultMaps.head_stats`).
"""
from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QPointF, Qt, Signal
from PySide6.QtWidgets import QCheckBox, QLabel, QWidget

from vitviz.gui.panel_common import SELECT, TEXT, LazyPanel, bar_and_body, dark_layout, style_plot
from vitviz.gui.state import ViewState

PICK_RADIUS_PX = 9.0
JITTER = 0.35


def point_positions(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """x (layer, spread a little per head so heads stay apart), y, layer and head index of every point of an
    (L, H) array; NaN entries are left out."""
    nl, nh = values.shape
    layers, heads = np.meshgrid(np.arange(nl), np.arange(nh), indexing="ij")            # (L, H) each
    offset = (heads - (nh - 1) / 2) * (JITTER / max(nh, 1))
    ok = np.isfinite(values)
    return (layers + offset)[ok], values[ok], layers[ok], heads[ok]


class StatPlot:
    """One scatter (distance or entropy) with a ring around the selected head."""

    def __init__(self, widget: pg.GraphicsLayoutWidget, col: int, ylabel: str, title: str) -> None:
        self.plot = widget.addPlot(row=0, col=col)
        style_plot(self.plot, ylabel, "layer")
        self.plot.setTitle(title, color=TEXT, size="9pt")
        self.plot.setMouseEnabled(False, False)
        self.scatter = pg.ScatterPlotItem(size=8, pen=pg.mkPen(None))
        self.ring = pg.ScatterPlotItem(size=16, pen=pg.mkPen(SELECT, width=2), brush=pg.mkBrush(None))
        self.plot.addItem(self.scatter)
        self.plot.addItem(self.ring)
        self.x = self.y = self.layers = self.heads = np.zeros(0)

    def show(self, values: np.ndarray) -> None:
        self.x, self.y, self.layers, self.heads = point_positions(values)
        nh = values.shape[1]
        brushes = [pg.mkBrush(pg.intColor(int(h), hues=max(nh, 1), alpha=220)) for h in self.heads]
        self.scatter.setData(self.x, self.y, brush=brushes)
        self.plot.getAxis("bottom").setTicks([[(i, str(i)) for i in range(0, values.shape[0],
                                                                           max(1, values.shape[0] // 12))]])
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


class HeadStatsPanel(LazyPanel):
    """Attention distance and entropy per head.

    Signals:
        head_clicked(layer, head): a point was clicked.
    """

    head_clicked = Signal(int, int)

    def __init__(self, state: ViewState, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("headStatsPanel")
        self.state = state
        self._history: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self._current = ""
        self.shown: tuple[np.ndarray, np.ndarray] | None = None
        self.average_check = QCheckBox("Average over all images run so far")
        self.average_check.setToolTip("Mean over every image run at this model and input size")
        self.average_check.toggled.connect(lambda on: self.state.update(stats_average=bool(on)))
        self.readout = QLabel("Hover a point to name its layer and head; click it to select them")
        self.widget = dark_layout()
        self.distance = StatPlot(self.widget, 0, "mean attention distance (px)", "Mean attention distance")
        self.entropy = StatPlot(self.widget, 1, "entropy (nats)", "Attention entropy (patch queries)")
        self.widget.scene().sigMouseMoved.connect(self._on_moved)
        self.widget.scene().sigMouseClicked.connect(self._on_clicked)
        bar_and_body(self, [self.average_check, self.readout], self.widget)
        state.subscribe(self._on_state)

    # ------------------------------------------------------------------------------------------ inputs

    def reset(self) -> None:
        """Forget every image (a new model or input size)."""
        self._history.clear()
        self._current = ""
        self.request_redraw()

    def add(self, path: str, distance: np.ndarray, entropy: np.ndarray) -> None:
        """Record one image's (L, H) statistics."""
        self._history[path] = (distance, entropy)
        self._update_label()
        if self.state.stats_average or path == self._current:
            self.request_redraw()

    def set_current(self, path: str) -> None:
        if path != self._current:
            self._current = path
            self.request_redraw()

    def _on_state(self, changed: set[str]) -> None:
        if "stats_average" in changed:
            self.average_check.setChecked(self.state.stats_average)
            self.request_redraw()
        elif changed & {"layer", "head"}:
            self._mark()

    def _update_label(self) -> None:
        self.average_check.setText(f"Average over all {len(self._history)} images run so far")

    # ------------------------------------------------------------------------------------------ drawing

    def statistics(self) -> tuple[np.ndarray, np.ndarray] | None:
        """(L, H) distance and entropy shown now: the current image's, or the mean over every image."""
        if self.state.stats_average and self._history:
            dists, ents = zip(*self._history.values())
            return np.nanmean(np.stack(dists), axis=0), np.mean(np.stack(ents), axis=0)
        return self._history.get(self._current)

    def redraw(self) -> None:
        self._update_label()
        self.shown = self.statistics()
        if self.shown is None:
            self.distance.clear()
            self.entropy.clear()
            return
        self.distance.show(self.shown[0])
        self.entropy.show(self.shown[1])
        self._mark()

    def _mark(self) -> None:
        layer, head = self.state.layer, self.state.head
        if self.shown is None:
            return
        nl, nh = self.shown[0].shape
        li = None if layer == "mean" else int(layer) % nl
        hi = None if isinstance(head, str) else int(head) % nh
        for plot in (self.distance, self.entropy):
            plot.mark(li, hi)

    def point_at(self, scene_pos: QPointF) -> tuple[StatPlot, int] | None:
        for plot in (self.distance, self.entropy):
            index = plot.nearest(scene_pos)
            if index is not None:
                return plot, index
        return None

    def _on_moved(self, scene_pos: QPointF) -> None:
        hit = self.point_at(scene_pos)
        if hit is None:
            return
        plot, i = hit
        what = "images averaged: %d" % len(self._history) if self.state.stats_average else "current image"
        d, e = self.shown[0][plot.layers[i], plot.heads[i]], self.shown[1][plot.layers[i], plot.heads[i]]
        self.readout.setText(f"layer {plot.layers[i]}, head {plot.heads[i]}: distance {d:.1f} px, "
                             f"entropy {e:.3f} nats ({what})")

    def _on_clicked(self, event: object) -> None:
        if event.button() != Qt.MouseButton.LeftButton:
            return
        hit = self.point_at(event.scenePos())
        if hit is not None:
            plot, i = hit
            self.head_clicked.emit(int(plot.layers[i]), int(plot.heads[i]))
