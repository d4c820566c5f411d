"""The attention-matrix dock: the full T × T matrix of the selected layer and head, query rows × key columns.

One row-major `ImageItem` holds the matrix (a texture upload per layer/head change, nothing per hover), so it stays
responsive for DINOv2 at 518 px (T = 1370): no reduction of the (H, T, T) attention runs on the GUI thread per
change (`ResultMaps.matrix`): a layer's heads' mean is made once, in the worker after the capture; a heads' max or a
mean over the layers once, in a pool thread, while the title says so. Its picture stays Indexed8 (not
`blit.ImageItem`'s 32 bits): drawn shrunk to a few hundred screen pixels, Qt reads only the pixels it samples, so
converting all T² of them (1.9 M) costs more than the faster draw saves (bench/gui.py --matrix). Prefix tokens are
labelled on both axes and fenced off by dashed lines; the selected query's row and column are outlined. A click
selects the row's token as the query everywhere (Shift+click: the column's token). The axis labels are laid out for
the zoom they are drawn at: prefix tokens too close together to name one by one (cls, reg0-3 of a 261-token matrix)
share one label, and patch rows are labelled every few rows so the labels never run into each other.
"""
from __future__ import annotations

import weakref
from typing import Callable

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QPointF, QRectF, Qt, QThreadPool, Signal
from PySide6.QtGui import QFontMetricsF
from PySide6.QtWidgets import QCheckBox, QGraphicsRectItem, QLabel, QWidget

from vitviz.core.spec import ModelSpec
from vitviz.gui import colors
from vitviz.core.analyses.maps import ResultMaps
from vitviz.gui.panels.base import (SELECT, TEXT, LazyPanel, TitleLabel, bar_and_body, dark_layout, pen, show_axes,
                                    style_plot)
from vitviz.gui.images import ImageList
from vitviz.gui.state import ViewState
from vitviz.gui.numbers import number

LOG_DECADES = 4.0
LOG_FLOOR = 1e-12
LABEL_GAP_PX = 6.0          # the least room between two axis labels
Ticks = list[list[tuple[float, str]]]


def display_values(matrix: np.ndarray, log: bool) -> tuple[np.ndarray, tuple[float, float]]:
    """What the image shows and its colour range: 0..max, or log10 over the top `LOG_DECADES` decades."""
    top = float(matrix.max()) if matrix.size else 1.0
    if not log:
        return matrix, (0.0, top if top > 0 else 1.0)
    hi = np.log10(max(top, LOG_FLOOR))
    return np.log10(np.maximum(matrix, LOG_FLOOR)), (hi - LOG_DECADES, hi)


def axis_ticks(spec: ModelSpec, grid: tuple[int, int], pixels_per_token: float = np.inf,
               extent: Callable[[str], float] = lambda _text: 0.0) -> Ticks:
    """Major ticks naming the prefix tokens and the first token of every few patch rows; minor: other rows.

    Args:
        pixels_per_token: screen pixels between neighbouring tokens along the axis (default: room for all).
        extent: the room a label takes along the axis in pixels (its width on a horizontal axis, its line height
            on a vertical one).

    Prefix tokens are named one by one when their labels fit, else together ('cls–reg3') over the prefix block;
    patch rows are labelled every `step` rows, with `step` the smallest that leaves `LABEL_GAP_PX` between
    labels (at most about 8 labels).
    """
    p, (gh, gw) = spec.num_prefix, grid
    names = list(spec.prefix_names)
    fits = p <= 1 or pixels_per_token >= max(extent(n) for n in names) + LABEL_GAP_PX
    if fits:
        major = [(i + 0.5, name) for i, name in enumerate(names)]
    else:
        major = [(p / 2, f"{names[0]}–{names[-1]}")]
    step = max(1, int(np.ceil(gh / 8)))
    widest = extent(f"row {gh - 1}") + LABEL_GAP_PX
    while step < gh and step * gw * pixels_per_token < widest:
        step += 1
    prefix_end = (major[-1][0] * pixels_per_token + extent(major[-1][1]) / 2) if p else -np.inf
    rows = [r for r in range(step if p else 0, gh, step)
            if (p + r * gw) * pixels_per_token - extent(f"row {r}") / 2 >= prefix_end + LABEL_GAP_PX]
    major += [(p + r * gw, f"row {r}") for r in rows]
    minor = [(p + r * gw, "") for r in range(gh) if r not in rows]
    return [major, minor]


class MatrixPanel(LazyPanel):
    """The token-to-token matrix with hover readout, log scale and query selection. Built from the image list it
    follows (`current_changed`: the current image's result as shown) and `maps`, the one shown now.

    Signals:
        query_clicked(token): the user clicked a row (or Shift+clicked a column) of that token.
    """

    query_clicked = Signal(int)
    _made = Signal(object, str)     # (maps, layer, head) a pool thread made the matrix of, why it failed ('' if not)

    def __init__(self, state: ViewState, images: ImageList, maps: ResultMaps | None = None,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("matrixPanel")
        self.state = state
        self._maps: ResultMaps | None = None
        self._key: tuple[object, ...] | None = None
        self._placed: tuple[object, ...] | None = None    # (maps, tokens, prefix) the image and lines are placed for
        self._painted: tuple[str, str] | None = None      # (colormap, scale) the colorbar shows
        self.matrix: np.ndarray | None = None
        # per result, (layer, head) -> '' while made, or why it failed: weakly keyed, so a failure goes with its
        # result (never said of a later result at the same address)
        self._making: weakref.WeakKeyDictionary[ResultMaps, dict[tuple[object, ...], str]] = \
            weakref.WeakKeyDictionary()
        self._made.connect(self._on_made)
        self.log_check = QCheckBox("Log scale")
        self.log_check.setToolTip("Colour by log10(attention) over the top four decades")
        self.log_check.toggled.connect(lambda on: self.state.update(matrix_log=bool(on)))
        self.readout = QLabel("Hover the matrix: query row × key column")
        self.readout.setWordWrap(True)          # a long readout must not widen the dock
        self.readout.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.widget = dark_layout()
        self._build_plot()
        bar_and_body(self, [self.log_check, self.readout], self.widget)
        state.subscribe(self._on_state)
        images.current_changed.connect(self.set_maps)
        self.set_maps(maps)

    def _build_plot(self) -> None:
        self.title = TitleLabel("No result yet", color=TEXT, size="10pt")    # wraps: never widens the panel
        self.widget.addItem(self.title, row=0, col=0, colspan=2)
        self.plot = self.widget.addPlot(row=1, col=0)
        style_plot(self.plot, "query token (row)", "key token (column)")
        self.plot.invertY(True)
        self.plot.setAspectLocked(True)
        self.image_item = pg.ImageItem()    # Indexed8: see the module docstring
        self.plot.addItem(self.image_item)
        self.prefix_lines = [pg.InfiniteLine(angle=a, pen=pen("#ffffff", 200, 1.0, dashed=True)) for a in (0, 90)]
        self.row_box, self.col_box = QGraphicsRectItem(), QGraphicsRectItem()
        for item in (*self.prefix_lines, self.row_box, self.col_box):
            item.setZValue(5)
            item.setVisible(False)
            self.plot.addItem(item)
        for box in (self.row_box, self.col_box):
            box.setPen(pen(SELECT, 255, 1.5))
        self.colorbar = pg.ColorBarItem(values=(0.0, 1.0), colorMap=colors.colormap("viridis"), interactive=False,
                                        width=12)
        self.widget.addItem(self.colorbar, row=1, col=1)
        self._show_axes(False)
        self._ticks_for: tuple[object, ...] | None = None
        self.plot.vb.sigResized.connect(self._fit_ticks)
        self.plot.vb.sigRangeChanged.connect(self._fit_ticks)
        scene = self.widget.scene()
        scene.sigMouseMoved.connect(self._on_mouse_moved)
        scene.sigMouseClicked.connect(self._on_mouse_clicked)

    # ------------------------------------------------------------------------------------------ inputs

    def set_maps(self, maps: ResultMaps | None) -> None:
        """Show the matrix of another result (None: nothing); the image list's `current_changed` calls this."""
        if maps is not self._maps:
            self._maps = maps
            self.request_redraw()

    def _on_state(self, changed: set[str]) -> None:
        if "matrix_log" in changed:
            self.log_check.setChecked(self.state.matrix_log)
        if changed & {"layer", "head", "matrix_log", "colormap"}:
            self.request_redraw()
        elif "query" in changed:
            self._show_selection()

    # ------------------------------------------------------------------------------------------ drawing

    def redraw(self) -> None:
        maps, s = self._maps, self.state
        if maps is None:
            self._clear()
            return
        why = maps.why_not("matrix")        # a windowed model's: its attention is inside windows
        if why is not None:
            self._clear()
            self.title.setText(why)
            return
        key = (id(maps), s.layer, s.head, s.matrix_log, s.colormap)
        if key != self._key:
            if not maps.has_matrix(s.layer, s.head):
                self._make(maps, s.layer, s.head)
                return
            self._key = key
            self._draw(maps)
        self._show_selection()

    def _make(self, maps: ResultMaps, layer: int | str, head: int | str) -> None:
        """Have a reduction the view has not got (a layer's heads' max, a mean over the layers: (H, T, T) or more
        read, 20 ms and up at T = 1370) made in a pool thread, not on the GUI thread, and say so until it is
        there (`_made` draws it then). Only the picture and the outlines go meanwhile: the axes and the colour bar
        stay, so the plot does not jump."""
        self.image_item.clear()
        self.matrix, self._key = None, None
        self._show_selection()
        job = (maps, layer, head)
        made = self._making.setdefault(maps, {})
        why = made.get((layer, head))
        what = "the mean over the layers" if layer == "mean" else f"the heads' {head}"
        self.title.setText(f"layer {layer} · head {head}: " + (f"could not make {what}: {why}" if why else
                                                               f"making {what}…"))
        if why is None:
            made[(layer, head)] = ""
            QThreadPool.globalInstance().start(lambda: self._made_in_pool(job))

    def _made_in_pool(self, job: tuple[object, ...]) -> None:
        """(In a pool thread.) Make `job`'s (maps, layer, head) matrix, then say it to the GUI thread."""
        maps, layer, head = job
        why = ""
        try:
            maps.matrix(layer, head)
        except Exception as exc:  # noqa: BLE001 - said in the title, as the worker says its own failures
            why = str(exc) or type(exc).__name__
        try:
            self._made.emit(job, why)          # queued to the GUI thread
        except RuntimeError:                    # the panel was deleted meanwhile
            pass

    def _on_made(self, job: tuple[object, ...], why: str) -> None:
        maps, layer, head = job
        made = self._making.setdefault(maps, {})
        if why:
            made[(layer, head)] = why           # said in the title; not tried again for this result
        else:
            made.pop((layer, head), None)
        self._key = None
        self.request_redraw()

    def _clear(self) -> None:
        self.image_item.clear()
        self.matrix, self._key, self._placed = None, None, None
        for item in (*self.prefix_lines, self.row_box, self.col_box):
            item.setVisible(False)
        self._show_axes(False)
        self.title.setText("No result yet")

    def _show_axes(self, shown: bool) -> None:
        """The axes and the colorbar, only with a matrix to measure (an empty plot's axes said nothing)."""
        show_axes(self.plot, shown)
        self.colorbar.setVisible(shown)

    def _draw(self, maps: ResultMaps) -> None:
        s, spec = self.state, maps.result.spec
        self.matrix = maps.matrix(s.layer, s.head)          # at hand: made in the worker or a pool thread
        values, levels = display_values(self.matrix, s.matrix_log)
        t, p = self.matrix.shape[0], spec.num_prefix
        self.image_item.setImage(values, autoLevels=False, levels=levels, lut=colors.lut(s.colormap))
        self._show_axes(True)
        scale = "log10 attention" if s.matrix_log else "attention"
        # another layer or head of the same model changes the picture, its levels and the title only: the rest is
        # set again when it changes (each set lays the plot out or draws the colorbar again)
        placed, painted = (id(maps), t, p), (s.colormap, scale)
        if placed != self._placed:
            self._placed = placed
            self.image_item.setRect(QRectF(0, 0, t, t))
            for line in self.prefix_lines:
                line.setPos(p)
                line.setVisible(0 < p < t)
            self._ticks_for = None
        if painted != self._painted:
            self._painted = painted
            self.colorbar.setColorMap(colors.colormap(s.colormap))
            self.colorbar.axis.setLabel(scale, color=TEXT)
        colors.set_colorbar_levels(self.colorbar, levels)
        self.title.setText(f"layer {s.layer} · head {s.head} · {t} tokens ({p} prefix) · {scale}")
        self.plot.autoRange(padding=0.01)
        self._fit_ticks()

    def _fit_ticks(self, *_args: object) -> None:
        """Lay the axis labels out for the current zoom (`axis_ticks`); only when the zoom or the model changed."""
        maps = self._maps
        if maps is None or self.matrix is None:
            return
        pixel_x, pixel_y = self.plot.vb.viewPixelSize()          # tokens per screen pixel
        if not (np.isfinite(pixel_x) and np.isfinite(pixel_y) and pixel_x > 0 and pixel_y > 0):
            return
        key = (id(maps), round(pixel_x, 6), round(pixel_y, 6))
        if key == self._ticks_for:
            return
        self._ticks_for = key
        spec, grid = maps.result.spec, maps.grid
        for side, per_token in (("left", 1 / pixel_y), ("bottom", 1 / pixel_x)):
            axis = self.plot.getAxis(side)
            metrics = QFontMetricsF(axis.style.get("tickFont") or axis.font())
            extent = (lambda _t, h=metrics.height(): h) if side == "left" else metrics.horizontalAdvance
            axis.setTicks(axis_ticks(spec, grid, per_token, extent))

    def _show_selection(self) -> None:
        q, t = self.state.query, 0 if self.matrix is None else self.matrix.shape[0]
        visible = q is not None and q < t
        if visible:
            self.row_box.setRect(QRectF(0, q, t, 1))
            self.col_box.setRect(QRectF(q, 0, 1, t))
        self.row_box.setVisible(visible)
        self.col_box.setVisible(visible)

    # ------------------------------------------------------------------------------------------ mouse

    def cell_at(self, scene_pos: QPointF) -> tuple[int, int] | None:
        """(query, key) token indices under a scene position, or None outside the matrix."""
        if self.matrix is None:
            return None
        point = self.plot.vb.mapSceneToView(scene_pos)
        row, col = int(np.floor(point.y())), int(np.floor(point.x()))
        t = self.matrix.shape[0]
        return (row, col) if 0 <= row < t and 0 <= col < t else None

    def describe(self, row: int, col: int) -> str:
        """Readout text for one cell."""
        assert self._maps is not None and self.matrix is not None
        spec = self._maps.result.spec
        return (f"query {spec.token_name(row)} · token {row}  →  key {spec.token_name(col)} · token {col}:  "
                f"{number(self.matrix[row, col])}")

    def _on_mouse_moved(self, scene_pos: QPointF) -> None:
        cell = self.cell_at(scene_pos)
        if cell is not None:
            self.readout.setText(self.describe(*cell))

    def _on_mouse_clicked(self, event: object) -> None:
        if event.button() != Qt.MouseButton.LeftButton or event.double():
            return
        cell = self.cell_at(event.scenePos())
        if cell is not None:
            column = bool(event.modifiers() & Qt.KeyboardModifier.ShiftModifier)
            self.query_clicked.emit(cell[1] if column else cell[0])
