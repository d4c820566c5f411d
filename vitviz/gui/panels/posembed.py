"""The position dock: for a learned position table, the similarity map of the position under the mouse, the CLS
embedding's similarity and the ViT-paper mosaic of every position's map, on one shared colour scale; for a RoPE
model, the q·k rotation kernel from the hovered patch (`RopeSection`) -- "RoPE — no learned absolute position
embedding" when that is all it has, both when it has both.

Everything heavy (resampling, all N × N similarities, the mosaic, the RoPE kernels) is computed in the worker
(`PosEmbedData`, `RopeKernels`); a hover only swaps one (gh, gw) image and moves frames, so it follows the mouse at
37 × 37 and beyond. Grids too large for N × N similarities (more than `MOSAIC_MAX_POSITIONS`) get no mosaic, and a
hover computes its one row. A model with both (EVA-02) gets both stacked, each at a readable height, and the dock
scrolls when it is shorter than that.
"""
from __future__ import annotations

import time

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QPointF, QRectF, Qt
from PySide6.QtWidgets import QFrame, QScrollArea, QSizePolicy, QStackedLayout, QVBoxLayout, QWidget

from vitviz.core.analyses.maps import MOSAIC_MAX_POSITIONS, PosEmbedData
from vitviz.core.spec import ModelSpec
from vitviz.gui import colors
from vitviz.gui.panels.base import (TEXT, Recolourable, dark_layout, image_view, message_label, select_frame,
                                    waiting_text, wrapped_label)
from vitviz.gui.panels.rope import RopeSection
from vitviz.gui.model_slot import ModelSlot
from vitviz.gui.state import ViewState
from vitviz.gui.protocol import RopeKernels

MOSAIC_TEXT = "every position's map"
LEARNED_MIN_PX = 240        # the learned table's maps never get less (with RoPE below them the dock scrolls)
NO_MODEL_TEXT = "Open a model to see its position embedding."
NO_POS_TEXT = ("This model has no learned absolute position embedding (for example, it uses relative or rotary "
               "positions), so there is nothing to show here.")


def windowed_note(spec: ModelSpec) -> str:
    """The title's note on a windowed model's absolute table (SAM / ViTDet): what else its positions are."""
    return ("SAM / ViTDet's learned absolute table, added before the blocks; every block also adds decomposed "
            "relative positions (rel_pos_h, rel_pos_w) computed from q, not shown here")


def windowed_text(spec: ModelSpec) -> str:
    """What the dock says for a windowed model without an absolute table (Swin), whose positions it does not
    show."""
    if spec.arch == "sam":
        what = ("SAM / ViTDet adds decomposed relative positions (rel_pos_h, rel_pos_w) computed from q in every "
                "block" + (", on top of a learned absolute table" if spec.pos_embed else ""))
    else:
        what = ("Swin's positions are a relative position bias inside each window"
                + (" (Swin v2: a continuous bias from a small MLP)" if spec.rel_pos == "cpb" else " (a learned table)"))
    return (f"{what}. This dock shows a plain ViT's learned absolute position table; it does not show a windowed "
            "model's positions.")


def top_aligned(view: pg.ViewBox, item: pg.ImageItem, padding: float = 0.02) -> None:
    """Fit an aspect-locked view to its image with the image at the top of the view, the spare height below it: a
    small map centred in a tall cell floated ~40-100 px under its caption ('CLS vs all'), and squeezing the cell to
    the map's height instead starved EVA-02's stacked maps of room."""
    image = item.image
    size = view.size()
    if image is None or size.width() <= 0 or size.height() <= 0:
        view.autoRange(padding=padding)
        return
    gh, gw = image.shape[:2]
    pad = padding * max(gh, gw)
    width, height = gw + 2 * pad, gh + 2 * pad
    if size.height() / size.width() <= height / width:      # the height binds: centred across, as before
        view.autoRange(padding=padding)
        return
    view.setRange(xRange=(-pad, gw + pad), yRange=(-pad, -pad + width * size.height() / size.width()), padding=0)


class PosEmbedPanel(Recolourable, QWidget):
    """Live position-embedding similarity (and RoPE kernel) of the loaded model at the current input size;
    `hover(row, col)` is also driven by the image panel. Built from the model part it shows (`ModelSlot`: its
    embedding, spec and loading state, and the signals that say they changed)."""

    def __init__(self, state: ViewState, model: ModelSlot, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("posEmbedPanel")
        self.state, self.model = state, model
        self.data: PosEmbedData | None = None
        self.rope: RopeKernels | None = None
        self.position: tuple[int, int] | None = None
        self.last_hover_ms = 0.0
        self._cmap = state.colormap
        self._spec: ModelSpec | None = None
        self.message = message_label(NO_MODEL_TEXT)
        self.title = wrapped_label("posEmbedTitle")      # above the plots: wraps at the dock's width
        self.widget = dark_layout()
        self._build()
        self.rope_section = RopeSection(self._cmap)
        self.rope_section.hovered.connect(self.hover)
        self.widget.setMinimumHeight(LEARNED_MIN_PX)
        content = QWidget()
        column = QVBoxLayout(content)
        column.setContentsMargins(4, 2, 4, 0)
        column.addWidget(self.title)
        column.addWidget(self.widget, 1)
        column.addWidget(self.rope_section, 1)
        self.body = QScrollArea()           # a learned table and RoPE (EVA-02) stacked: it scrolls when short
        self.body.setObjectName("posEmbedScroll")
        self.body.setWidgetResizable(True)
        self.body.setFrameShape(QFrame.Shape.NoFrame)
        self.body.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.body.setWidget(content)
        self._stack = QStackedLayout(self)
        self._stack.addWidget(self.message)
        self._stack.addWidget(self.body)
        state.subscribe(self._on_state)
        model.model_loaded.connect(self._on_model_loaded)
        model.pos_embed_ready.connect(self._on_pos_embed_ready)
        model.loading_changed.connect(self._on_loading_changed)

    def _build(self) -> None:
        """Short captions over the three maps (what does not fit them is said in the title above)."""
        w = self.widget
        self.hover_label = w.addLabel("", row=0, col=0, color=TEXT, size="9pt")
        self.mosaic_label = w.addLabel(MOSAIC_TEXT, row=0, col=1, color=TEXT, size="9pt")
        self.hover_view, self.hover_item = image_view(w, 1, 0)
        self.cls_label = w.addLabel("", row=2, col=0, color=TEXT, size="9pt")
        self.cls_view, self.cls_item = image_view(w, 3, 0)
        self.mosaic_view, self.mosaic_item = image_view(w, 1, 1, rowspan=3)
        w.ci.layout.setColumnStretchFactor(0, 2)
        w.ci.layout.setColumnStretchFactor(1, 5)
        for label in (self.hover_label, self.cls_label, self.mosaic_label):   # the room goes to the maps
            label.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Fixed)
        self.hover_frame = select_frame(self.hover_view, 2.0)
        self.mosaic_frame = select_frame(self.mosaic_view, 1.5)
        self.colorbar = pg.ColorBarItem(values=(-1.0, 1.0), colorMap=colors.colormap(self._cmap), interactive=False,
                                        width=12, label="cosine similarity")
        w.addItem(self.colorbar, row=1, col=2, rowspan=3)
        w.scene().sigMouseMoved.connect(self._on_mouse_moved)
        for view, item in ((self.hover_view, self.hover_item), (self.cls_view, self.cls_item)):
            view.sigResized.connect(lambda _v, view=view, item=item: top_aligned(view, item))

    # ------------------------------------------------------------------------------------------ inputs

    def set_model(self, spec: ModelSpec | None) -> None:
        """A new model: wait for its embedding."""
        self._spec, self.data, self.rope, self.position = spec, None, None, None
        if spec is not None and not spec.traits.pos_table:   # nothing is asked of the worker for it
            self.message.setText(windowed_text(spec))                   # (`Session.request_pos_embed`)
        else:
            self.message.setText("Reading the position embedding…" if spec else waiting_text(self.model, NO_MODEL_TEXT))
        self._stack.setCurrentWidget(self.message)

    def _on_loading_changed(self, _loading: bool) -> None:
        if self._spec is None:
            self.message.setText(waiting_text(self.model, NO_MODEL_TEXT))

    def set_data(self, data: PosEmbedData | None, spec: ModelSpec | None, rope: RopeKernels | None = None) -> None:
        """Show a model's embedding and RoPE kernels at the current input size; both None say the model has no
        absolute positions of either kind."""
        self._spec = spec
        self.data, self.rope = data, rope
        if data is None and rope is None:
            self.message.setText(NO_POS_TEXT if spec is not None else waiting_text(self.model, NO_MODEL_TEXT))
            self._stack.setCurrentWidget(self.message)
            return
        self._stack.setCurrentWidget(self.body)
        self.title.setVisible(data is not None)
        self.widget.setVisible(data is not None)
        self.rope_section.setVisible(rope is not None)
        grid = data.grid if data is not None else rope.grid   # type: ignore[union-attr]  # one is there
        if rope is not None:
            self.rope_section.select(self.state.layer, self.state.head)
            self.rope_section.set_kernels(rope, spec, learned=data is not None)
        if data is not None:
            self._draw_static()
        gh, gw = grid
        keep = self.position if self.position and self.position[0] < gh and self.position[1] < gw else None
        self.hover(*(keep or (gh // 2, gw // 2)))

    def _on_model_loaded(self, spec: ModelSpec, _device: str) -> None:
        self.set_model(spec)

    def _on_pos_embed_ready(self) -> None:
        self.set_data(self.model.pos_embed, self.model.spec, self.model.rope)

    def _on_state(self, changed: set[str]) -> None:
        if "colormap" in changed:
            self.set_colormap(self.state.colormap)
        if changed & {"layer", "head"}:
            self.rope_section.select(self.state.layer, self.state.head)   # RoPE-Mixed: per layer and head

    def set_colormap(self, name: str) -> None:
        """The learned table's maps and the RoPE section's in colormap `name`."""
        self.rope_section.set_colormap(name)
        super().set_colormap(name)

    def _recolour(self) -> None:
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
            prefix = bool(spec and getattr(spec, "num_prefix", 0))
            self.cls_label.setText("no prefix rows" + (" (no_embed_class)" if prefix else ""))
            notes.append(windowed_note(spec) if spec is not None and spec.traits.blocks else
                         "the position embedding has no row for the prefix tokens" + (
                             " (no_embed_class: they get no position)" if prefix else ""))
        top_aligned(self.cls_view, self.cls_item)
        trained = spec.pos_grid if spec is not None else data.grid
        note = "" if tuple(trained) == (gh, gw) else f" · interpolated from the trained {trained[0]}×{trained[1]}"
        self.title.setText(" · ".join([f"Position embedding at {gh}×{gw}{note}", *notes,
                                       "hover a position here or in the image: cosine similarity of its embedding "
                                       "to every position's; right, every position's map (the ViT paper's "
                                       "figure 7)"]))

    def hover(self, row: int, col: int) -> None:
        """Show the similarity of position (row, col) to every position, and the RoPE kernel from it (ignored
        outside the grid)."""
        data = self.data
        t0 = time.perf_counter()
        if self.rope is not None and 0 <= row < self.rope.grid[0] and 0 <= col < self.rope.grid[1]:
            self.position = (row, col)
            self.rope_section.hover(row, col)
            self.last_hover_ms = (time.perf_counter() - t0) * 1000
        if data is None or row < 0 or col < 0 or row >= data.grid[0] or col >= data.grid[1]:
            return
        self.position = (row, col)
        self.hover_item.setImage(data.similarity_to(row, col), autoLevels=False, levels=self.levels(),
                                 lut=colors.lut(self._cmap))
        if self.hover_frame.rect().isEmpty():
            top_aligned(self.hover_view, self.hover_item)
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
