"""The image panel: the image as the model saw it, the attention map over it, a colorbar and the patch grid."""
from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QPointF, QRectF, Qt, Signal
from PySide6.QtGui import QColor, QPainterPath, QPen
from PySide6.QtWidgets import QGraphicsPathItem, QGraphicsRectItem, QVBoxLayout, QWidget

from vitviz.gui import colors
from vitviz.gui.panels import base  # noqa: F401 - sets row-major order


class TitleLabel(pg.LabelItem):
    """A title that wraps at the panel's width instead of widening the layout (a long title in a narrow panel
    used to push the image partly out of view)."""

    def resizeEvent(self, ev: object) -> None:  # noqa: N802 - Qt override
        if self.width() > 0:
            self.item.setTextWidth(self.width())
        super().resizeEvent(ev)

    def updateMin(self) -> None:  # noqa: N802 - pyqtgraph override
        super().updateMin()
        height = self.itemRect().height()
        self.setMinimumWidth(0)
        self._sizeHint[Qt.SizeHint.MinimumSize] = (0, height)
        self._sizeHint[Qt.SizeHint.PreferredSize] = (0, height)
        self.updateGeometry()


class ImagePanel(QWidget):
    """Shows one image with a heatmap overlay.

    Signals:
        hovered(row, col): the patch under the mouse, (-1, -1) when the mouse leaves the patch grid.
        clicked(row, col): a left click on a patch.
    """

    hovered = Signal(int, int)
    clicked = Signal(int, int)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("imagePanel")
        self._grid: tuple[int, int] = (0, 0)
        self._patch = 1
        self._last_hover = (-1, -1)
        self._cmap_name = "viridis"
        self._levels: tuple[float, float] = (0.0, 1.0)
        self.view_widget = pg.GraphicsLayoutWidget()
        self.view_widget.setBackground("#202124")
        self.view_widget.ci.setContentsMargins(4, 4, 4, 4)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.view_widget)
        self.title = TitleLabel("Open a model and drop images here", color="#e8eaed", size="11pt")
        self.view_widget.addItem(self.title, row=0, col=0, colspan=2)
        self.view = self.view_widget.addViewBox(row=1, col=0, lockAspect=True, invertY=True, enableMenu=False)
        self.image_item = pg.ImageItem()
        self.overlay_item = pg.ImageItem()
        self.overlay_item.setZValue(1)
        self.grid_item = QGraphicsPathItem()
        self.grid_item.setPen(_pen("#ffffff", 90))
        self.grid_item.setZValue(2)
        self.grid_item.setVisible(False)
        self.highlight_item = QGraphicsRectItem()
        self.highlight_item.setPen(_pen("#ff3b30", 255, 2.0))
        self.highlight_item.setZValue(3)
        self.highlight_item.setVisible(False)
        for item in (self.image_item, self.overlay_item, self.grid_item, self.highlight_item):
            self.view.addItem(item)
        self.colorbar = pg.ColorBarItem(values=(0.0, 1.0), colorMap=colors.colormap("viridis"),
                                        interactive=False, width=14)
        self.view_widget.addItem(self.colorbar, row=1, col=1)
        self.colorbar.setVisible(False)
        scene = self.view_widget.scene()
        scene.sigMouseMoved.connect(self._on_mouse_moved)
        scene.sigMouseClicked.connect(self._on_mouse_clicked)

    def set_image(self, image: np.ndarray, grid: tuple[int, int], patch: int) -> None:
        """Show an (H, W, 3) uint8 image whose patch grid is `grid` patches of `patch` pixels."""
        resized = (self._grid, self._patch) != (grid, patch)
        self._grid, self._patch = grid, patch
        self.image_item.setImage(image, autoLevels=False, levels=(0, 255))
        self.image_item.setRect(QRectF(0, 0, image.shape[1], image.shape[0]))
        self._build_grid()
        if resized:
            self.view.autoRange(padding=0.01)

    def clear(self, message: str) -> None:
        """Remove the image and the map and show `message` instead."""
        self.image_item.clear()
        self.overlay_item.clear()
        self.colorbar.setVisible(False)
        self.highlight_item.setVisible(False)
        self.grid_item.setVisible(False)
        self.title.setText(message)

    def show_map(self, values: np.ndarray, levels: tuple[float, float], cmap: str, opacity: float,
                 title: str) -> None:
        """Overlay a map (any resolution; it is stretched over the patch grid) with the given colour scale."""
        gh, gw = self._grid
        self.overlay_item.setImage(values, autoLevels=False, levels=levels, lut=colors.lut(cmap))
        self.overlay_item.setRect(QRectF(0, 0, gw * self._patch, gh * self._patch))
        self.overlay_item.setOpacity(opacity)
        if self._cmap_name != cmap:
            self._cmap_name = cmap
            self.colorbar.setColorMap(colors.colormap(cmap))
        if levels != self._levels:
            self._levels = levels
            colors.set_colorbar_levels(self.colorbar, levels)
        self.colorbar.setVisible(True)
        self.title.setText(title)

    def set_opacity(self, opacity: float) -> None:
        self.overlay_item.setOpacity(opacity)

    def set_grid_visible(self, visible: bool) -> None:
        self.grid_item.setVisible(visible)

    def set_highlight(self, patch: tuple[int, int] | None) -> None:
        """Outline one patch (row, col), or nothing."""
        if patch is None:
            self.highlight_item.setVisible(False)
            return
        r, c = patch
        p = self._patch
        self.highlight_item.setRect(QRectF(c * p, r * p, p, p))
        self.highlight_item.setVisible(True)

    def patch_at(self, scene_pos: QPointF) -> tuple[int, int] | None:
        """The (row, col) of the patch under a scene position, or None outside the grid."""
        if self._grid == (0, 0):
            return None
        point = self.view.mapSceneToView(scene_pos)
        col, row = int(np.floor(point.x() / self._patch)), int(np.floor(point.y() / self._patch))
        if 0 <= row < self._grid[0] and 0 <= col < self._grid[1]:
            return row, col
        return None

    def _build_grid(self) -> None:
        gh, gw = self._grid
        p = self._patch
        path = QPainterPath()
        for r in range(gh + 1):
            path.moveTo(0, r * p)
            path.lineTo(gw * p, r * p)
        for c in range(gw + 1):
            path.moveTo(c * p, 0)
            path.lineTo(c * p, gh * p)
        self.grid_item.setPath(path)

    def _on_mouse_moved(self, scene_pos: QPointF) -> None:
        patch = self.patch_at(scene_pos) or (-1, -1)
        if patch != self._last_hover:
            self._last_hover = patch
            self.hovered.emit(*patch)

    def _on_mouse_clicked(self, event: object) -> None:
        if event.button() != Qt.MouseButton.LeftButton or event.double():
            return
        patch = self.patch_at(event.scenePos())
        if patch is not None:
            self.clicked.emit(*patch)


def _pen(color: str, alpha: int, width: float = 1.0) -> QPen:
    qcolor = QColor(color)
    qcolor.setAlpha(alpha)
    pen = QPen(qcolor)
    pen.setWidthF(width)
    pen.setCosmetic(True)
    return pen
