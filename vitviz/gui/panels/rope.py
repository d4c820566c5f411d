"""The RoPE part of the position dock: what a rotary position embedding does to attention, for models that have one
(EVA-02, DINOv3, Perception Encoder, RoPE-ViT; `ModelSpec.rope`).

RoPE has no learned table to compare positions with: it turns every patch token's q and k by angles that grow
with the patch's coordinates, so a query and a key with the same content score by how far apart they are. The
section shows that q·k rotation kernel as seen from the hovered patch (`RopeKernels.at`: the mean cos of the
rotation to every patch; 1 at the patch itself) beside the whole kernel by 2-D offset, with the hovered patch's
window framed. The kernels are computed in the worker (`vitviz.core.posembed.rope_kernels`, torch); a hover only
slices one (gh, gw) window out of a (2gh - 1, 2gw - 1) array.
"""
from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QPointF, QRectF, Signal
from PySide6.QtWidgets import QVBoxLayout, QWidget

from vitviz.core.spec import ModelSpec
from vitviz.gui import colors
from vitviz.gui.panels.base import TEXT, Recolourable, dark_layout, image_view, select_frame, wrapped_label
from vitviz.gui.protocol import RopeKernels

ROPE_ONLY = "RoPE — no learned absolute position embedding"
ROPE_MIN_PX = 220           # the kernel maps never get less (the position dock scrolls)
KIND_NAMES = {"axial": "axial 2-D RoPE", "dinov3": "DINOv3 RoPE", "mixed": "RoPE-Mixed (learned frequencies)"}


class RopeSection(Recolourable, QWidget):
    """The rotation kernel of a RoPE model from the hovered patch, and by offset.

    Signals:
        hovered(row, col): the mouse is over a patch of the kernel-from-patch map.
    """

    hovered = Signal(int, int)

    def __init__(self, cmap: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("ropeSection")
        self.rope: RopeKernels | None = None
        self.spec: ModelSpec | None = None
        self.position: tuple[int, int] | None = None
        self.layer: int | str = 0
        self.head: int | str = "mean"
        self.values: np.ndarray | None = None       # the (gh, gw) map shown now
        self._cmap = cmap
        self._learned = False                        # the model also has a learned table (shown above this)
        self._ranged = False                         # the kernel-from-patch view is fitted to the grid
        self._levels = (-1.0, 1.0)
        self.title = wrapped_label("ropeTitle")
        self.widget = dark_layout()
        self.widget.setMinimumHeight(ROPE_MIN_PX)
        w = self.widget
        self.at_label = w.addLabel("", row=0, col=0, color=TEXT, size="9pt")
        self.offset_label = w.addLabel("by offset (dy, dx)", row=0, col=1, color=TEXT, size="9pt")
        self.at_view, self.at_item = image_view(w, 1, 0)
        self.offset_view, self.offset_item = image_view(w, 1, 1)
        w.ci.layout.setColumnStretchFactor(0, 1)
        w.ci.layout.setColumnStretchFactor(1, 1)
        self.at_frame = select_frame(self.at_view, 2.0)
        self.window_frame = select_frame(self.offset_view, 1.5)
        self.colorbar = pg.ColorBarItem(values=self._levels, colorMap=colors.colormap(cmap), interactive=False,
                                        width=12, label="mean cos of the q·k rotation")
        w.addItem(self.colorbar, row=1, col=2)
        w.scene().sigMouseMoved.connect(self._on_mouse_moved)
        column = QVBoxLayout(self)
        column.setContentsMargins(0, 0, 0, 0)
        column.addWidget(self.title)
        column.addWidget(self.widget, 1)

    def set_kernels(self, rope: RopeKernels, spec: ModelSpec | None, learned: bool) -> None:
        """Show a model's kernels at their grid; `learned`: the model also has a learned table (shown above)."""
        self.rope, self.spec = rope, spec
        self._learned = learned
        gh, gw = rope.grid
        keep = self.position if self.position and self.position[0] < gh and self.position[1] < gw else None
        self._draw_offsets()
        self._ranged = False                         # the next hover fits the view to the new grid
        self.hover(*(keep or (gh // 2, gw // 2)))

    def select(self, layer: int | str, head: int | str) -> None:
        """The layer and head whose kernel is shown (only RoPE-Mixed differs per layer and head)."""
        if (layer, head) == (self.layer, self.head):
            return
        self.layer, self.head = layer, head
        if self.rope is not None and self.rope.per_head:
            self._draw_offsets()
            self.hover(*(self.position or (0, 0)))

    def _recolour(self) -> None:
        if self.rope is not None:
            self._draw_offsets()
            self.hover(*(self.position or (0, 0)))

    def which(self) -> str:
        """Which kernel is shown: 'the same for every layer and head', or the layer and head (or their mean)."""
        rope = self.rope
        if rope is None or not rope.per_head:
            return "the same for every layer and head (fixed frequencies)"
        layer = "mean over layers" if isinstance(self.layer, str) else f"layer {self.layer}"
        head = "mean over heads" if isinstance(self.head, str) else f"head {self.head}"
        return f"{layer}, {head} (the Controls' layer and head)"

    def _draw_offsets(self) -> None:
        rope = self.rope
        assert rope is not None
        kernel = rope.kernel(self.layer, self.head)
        low = float(kernel.min())
        self._levels = (min(low, 1.0 - 1e-6), 1.0)
        self.offset_item.setImage(kernel, autoLevels=False, levels=self._levels, lut=colors.lut(self._cmap))
        self.offset_view.autoRange(padding=0.02)
        colors.set_colorbar_levels(self.colorbar, self._levels)
        gh, gw = rope.grid
        kind = KIND_NAMES.get(rope.kind, rope.kind)
        spec = self.spec
        theta = f", θ {spec.rope_theta:g}" if spec is not None else ""
        head = ROPE_ONLY if not self._learned else "Rotary position embedding (RoPE) as well"
        self.title.setText(f"{head} · {kind}{theta} at {gh}×{gw} · hover a patch: how RoPE alone turns the q·k "
                           "score between it and every patch (1: unchanged, lower: turned away), for the same "
                           f"content · {self.which()}")

    def hover(self, row: int, col: int) -> None:
        """Show the kernel from patch (row, col) (ignored outside the grid)."""
        rope = self.rope
        if rope is None or row < 0 or col < 0 or row >= rope.grid[0] or col >= rope.grid[1]:
            return
        self.position = (row, col)
        self.values = rope.at((row, col), self.layer, self.head)
        self.at_item.setImage(self.values, autoLevels=False, levels=self._levels, lut=colors.lut(self._cmap))
        if not self._ranged:
            self._ranged = True
            self.at_view.autoRange(padding=0.02)
        self.at_frame.setRect(QRectF(col, row, 1, 1))
        self.at_frame.setVisible(True)
        gh, gw = rope.grid
        self.window_frame.setRect(QRectF(gw - 1 - col, gh - 1 - row, gw, gh))   # the window `at` slices
        self.window_frame.setVisible(True)
        self.at_label.setText(f"RoPE kernel from ({row}, {col})")

    def position_at(self, scene_pos: QPointF) -> tuple[int, int] | None:
        """The patch under the mouse in the kernel-from-patch map."""
        rope = self.rope
        if rope is None or not self.at_view.sceneBoundingRect().contains(scene_pos):
            return None
        point = self.at_view.mapSceneToView(scene_pos)
        row, col = int(np.floor(point.y())), int(np.floor(point.x()))
        return (row, col) if 0 <= row < rope.grid[0] and 0 <= col < rope.grid[1] else None

    def _on_mouse_moved(self, scene_pos: QPointF) -> None:
        position = self.position_at(scene_pos)
        if position is not None and position != self.position:
            self.hovered.emit(*position)

