"""The position-embedding dock: the similarity map of the position under the mouse, the CLS embedding's
similarity, and the ViT-paper mosaic of every position's map, on one shared colour scale.

Everything heavy (resampling, all N × N similarities, the mosaic) is computed in the worker (`PosEmbedData`); a
hover only swaps one (gh, gw) image and moves two frames, so it follows the mouse at 37 × 37 and beyond. Grids too
large for N × N similarities (more than `MOSAIC_MAX_POSITIONS`) get no mosaic, and a hover computes its one row.
"""
from __future__ import annotations

import time

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QPointF, QRectF
from PySide6.QtWidgets import QGraphicsRectItem, QLabel, QStackedLayout, QVBoxLayout, QWidget

from vitviz.core.spec import ModelSpec
from vitviz.gui import colors
from vitviz.core.maps import MOSAIC_MAX_POSITIONS, PosEmbedData
from vitviz.gui.panels.base import SELECT, TEXT, dark_layout, message_label, pen, waiting_text
from vitviz.gui.session import Session
from vitviz.gui.state import ViewState

MOSAIC_TEXT = "every position's map"
NO_MODEL_TEXT = "Open a model to see its position embedding."
NO_POS_TEXT = ("This model has no learned absolute position embedding (for example, it uses relative or rotary "
               "positions), so there is nothing to show here.")


def _view(widget: pg.GraphicsLayoutWidget, row: int, col: int, **kwargs: object) -> tuple[pg.ViewBox, pg.ImageItem]:
    view = widget.addViewBox(row=row, col=col, lockAspect=True, invertY=True, enableMenu=False, **kwargs)
    view.setMouseEnabled(False, False)
    item = pg.ImageItem()
    view.addItem(item)
    return view, item


def _frame(view: pg.ViewBox, width: float) -> QGraphicsRectItem:
    frame = QGraphicsRectItem()
    frame.setPen(pen(SELECT, 255, width))
    frame.setZValue(5)
    frame.setVisible(False)
    view.addItem(frame)
    return frame


class PosEmbedPanel(QWidget):
    """Live position-embedding similarity of the session's model at the current input size; `hover(row, col)` is
    also driven by the image panel."""

    def __init__(self, state: ViewState, session: Session, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("posEmbedPanel")
        self.state, self.session = state, session
        self.data: PosEmbedData | None = None
        self.position: tuple[int, int] | None = None
        self.last_hover_ms = 0.0
        self._cmap = state.colormap
        self._spec: ModelSpec | None = None
        self.message = message_label(NO_MODEL_TEXT)
        self.title = QLabel("")                     # above the plots: wraps at the dock's width
        self.title.setObjectName("posEmbedTitle")
        self.title.setWordWrap(True)
        self.widget = dark_layout()
        self._build()
        body = QWidget()
        column = QVBoxLayout(body)
        column.setContentsMargins(4, 2, 4, 0)
        column.addWidget(self.title)
        column.addWidget(self.widget, 1)
        self.body = body
        self._stack = QStackedLayout(self)
        self._stack.addWidget(self.message)
        self._stack.addWidget(body)
        state.subscribe(self._on_state)
        session.model_loaded.connect(self._on_model_loaded)
        session.pos_embed_ready.connect(self._on_pos_embed_ready)
        session.loading_changed.connect(self._on_loading_changed)

    def _build(self) -> None:
        """Short captions over the three maps (what does not fit them is said in the title above)."""
        w = self.widget
        self.hover_label = w.addLabel("", row=0, col=0, color=TEXT, size="9pt")
        self.mosaic_label = w.addLabel(MOSAIC_TEXT, row=0, col=1, color=TEXT, size="9pt")
        self.hover_view, self.hover_item = _view(w, 1, 0)
        self.cls_label = w.addLabel("", row=2, col=0, color=TEXT, size="9pt")
        self.cls_view, self.cls_item = _view(w, 3, 0)
        self.mosaic_view, self.mosaic_item = _view(w, 1, 1, rowspan=3)
        w.ci.layout.setColumnStretchFactor(0, 2)
        w.ci.layout.setColumnStretchFactor(1, 5)
        self.hover_frame = _frame(self.hover_view, 2.0)
        self.mosaic_frame = _frame(self.mosaic_view, 1.5)
        self.colorbar = pg.ColorBarItem(values=(-1.0, 1.0), colorMap=colors.colormap(self._cmap), interactive=False,
                                        width=12, label="cosine similarity")
        w.addItem(self.colorbar, row=1, col=2, rowspan=3)
        w.scene().sigMouseMoved.connect(self._on_mouse_moved)

    # ------------------------------------------------------------------------------------------ inputs

    def set_model(self, spec: ModelSpec | None) -> None:
        """A new model: wait for its embedding."""
        self._spec, self.data, self.position = spec, None, None
        self.message.setText("Reading the position embedding…" if spec else waiting_text(self.session,
                                                                                          NO_MODEL_TEXT))
        self._stack.setCurrentWidget(self.message)

    def _on_loading_changed(self, _loading: bool) -> None:
        if self._spec is None:
            self.message.setText(waiting_text(self.session, NO_MODEL_TEXT))

    def set_data(self, data: PosEmbedData | None, spec: ModelSpec | None) -> None:
        """Show a model's embedding at the current input size; None says the model has none."""
        self._spec = spec
        self.data = data
        if data is None:
            self.message.setText(NO_POS_TEXT if spec is not None else waiting_text(self.session, NO_MODEL_TEXT))
            self._stack.setCurrentWidget(self.message)
            return
        self._stack.setCurrentWidget(self.body)
        self._draw_static()
        gh, gw = data.grid
        keep = self.position if self.position and self.position[0] < gh and self.position[1] < gw else None
        self.hover(*(keep or (gh // 2, gw // 2)))

    def _on_model_loaded(self, spec: ModelSpec, _device: str) -> None:
        self.set_model(spec)

    def _on_pos_embed_ready(self) -> None:
        self.set_data(self.session.pos_embed, self.session.spec)

    def _on_state(self, changed: set[str]) -> None:
        if "colormap" in changed:
            self.set_colormap(self.state.colormap)

    def set_colormap(self, name: str) -> None:
        if name != self._cmap:
            self._cmap = name
            self.colorbar.setColorMap(colors.colormap(name))
            if self.data is not None:
                self._draw_static()
                self.hover(*(self.position or (0, 0)))

    def levels(self) -> tuple[float, float]:
        """The shared colour scale: from the lowest similarity (at least -1) to 1."""
        assert self.data is not None
        return max(-1.0, min(self.data.low, 1.0 - 1e-6)), 1.0

    # ------------------------------------------------------------------------------------------ drawing

    def _draw_static(self) -> None:
        data, spec = self.data, self._spec
        assert data is not None
        gh, gw = data.grid
        self.hover_frame.setRect(QRectF())          # the next hover re-fits the view to the new grid
        levels, lut = self.levels(), colors.lut(self._cmap)
        notes = []
        if data.mosaic is not None:
            self.mosaic_item.setImage(data.mosaic, autoLevels=False, levels=levels, lut=lut)
            self.mosaic_view.autoRange(padding=0.01)
            self.mosaic_label.setText(MOSAIC_TEXT)
        else:
            self.mosaic_item.clear()
            self.mosaic_frame.setVisible(False)
            self.mosaic_label.setText("no mosaic")
            notes.append(f"grid too large for the mosaic ({gh}×{gw} = {gh * gw} positions; it is drawn for up to "
                         f"{MOSAIC_MAX_POSITIONS})")
        colors.set_colorbar_levels(self.colorbar, levels)
        if data.cls_similarity is not None:
            self.cls_item.setImage(data.cls_similarity, autoLevels=False, levels=levels, lut=lut)
            self.cls_label.setText("CLS vs all")
        else:
            self.cls_item.clear()
            self.cls_label.setText("no prefix rows" + (" (no_embed_class)" if spec and spec.num_prefix else ""))
            notes.append("the position embedding has no row for the prefix tokens" + (
                " (no_embed_class: they get no position)" if spec and spec.num_prefix else ""))
        self.cls_view.autoRange(padding=0.02)
        trained = spec.pos_grid if spec is not None else data.grid
        note = "" if tuple(trained) == (gh, gw) else f" · interpolated from the trained {trained[0]}×{trained[1]}"
        self.title.setText(" · ".join([f"Position embedding at {gh}×{gw}{note}", *notes,
                                       "hover a position here or in the image: cosine similarity of its embedding "
                                       "to every position's; right, every position's map (the ViT paper's "
                                       "figure 7)"]))

    def hover(self, row: int, col: int) -> None:
        """Show the similarity of position (row, col) to every position (ignored outside the grid)."""
        data = self.data
        if data is None or row < 0 or col < 0 or row >= data.grid[0] or col >= data.grid[1]:
            return
        t0 = time.perf_counter()
        self.position = (row, col)
        self.hover_item.setImage(data.similarity_to(row, col), autoLevels=False, levels=self.levels(),
                                 lut=colors.lut(self._cmap))
        if self.hover_frame.rect().isEmpty():
            self.hover_view.autoRange(padding=0.02)
        self.hover_frame.setRect(QRectF(col, row, 1, 1))
        self.hover_frame.setVisible(True)
        gh, gw = data.grid
        step = (gh + data.gap, gw + data.gap)
        self.mosaic_frame.setRect(QRectF(col * step[1] - 0.5, row * step[0] - 0.5, gw + 1, gh + 1))
        self.mosaic_frame.setVisible(data.has_mosaic)
        self.hover_label.setText(f"({row}, {col}) vs all")
        self.last_hover_ms = (time.perf_counter() - t0) * 1000

    def position_at(self, scene_pos: QPointF) -> tuple[int, int] | None:
        """The grid position under the mouse in the hover map or the mosaic."""
        data = self.data
        if data is None:
            return None
        gh, gw = data.grid
        for view, (sy, sx) in ((self.hover_view, (1, 1)), (self.mosaic_view, (gh + data.gap, gw + data.gap))):
            if not view.sceneBoundingRect().contains(scene_pos) or (view is self.mosaic_view and not data.has_mosaic):
                continue
            point = view.mapSceneToView(scene_pos)
            row, col = int(np.floor(point.y() / sy)), int(np.floor(point.x() / sx))
            if 0 <= row < gh and 0 <= col < gw:
                return row, col
        return None

    def _on_mouse_moved(self, scene_pos: QPointF) -> None:
        position = self.position_at(scene_pos)
        if position is not None and position != self.position:
            self.hover(*position)
