"""Window outlines over the image panel's image, for windowed models (Swin, SAM / ViTDet).

`WindowOutlineItem` is a graphics item for a pyqtgraph `ViewBox` (the image panel's view, whose units are the
image's pixels): it draws one block's window outlines and the query's own window (highlighted), from the line segments of `vitviz.core.analyses.winview` (cells of the block's stage)
times a scale (image pixels per cell: the stage's stride for an image shown at input size). Pure drawing: no
session, no state; the panel that owns it says what to draw.
"""
from __future__ import annotations

import numpy as np
from PySide6.QtGui import QPainterPath
from PySide6.QtWidgets import QGraphicsItem, QGraphicsPathItem

from vitviz.gui.panels import base

Scale = float | tuple[float, float]


def segments_path(segments: np.ndarray, scale: Scale = 1.0, offset: tuple[float, float] = (0.0, 0.0)) -> QPainterPath:
    """A path of (K, 2, 2) segments `[[x0, y0], [x1, y1]]` (cells) times `scale` ((sx, sy) or one number) plus
    `offset` (pixels)."""
    sx, sy = (scale, scale) if isinstance(scale, (int, float)) else scale
    path = QPainterPath()
    segs = np.asarray(segments, np.float64).reshape(-1, 2, 2)
    for (x0, y0), (x1, y1) in segs:
        path.moveTo(offset[0] + x0 * sx, offset[1] + y0 * sy)
        path.lineTo(offset[0] + x1 * sx, offset[1] + y1 * sy)
    return path


class WindowOutlineItem(QGraphicsPathItem):
    """A block's window outlines (this item) and the query's window (a highlighted child), drawn with cosmetic
    pens over the image.

    Args:
        color / alpha / width: the outlines' pen; the query's window is drawn in `highlight` at twice the width.
    """

    def __init__(self, color: str = "#ffffff", alpha: int = 200, width: float = 1.0,
                 highlight: str = base.SELECT, parent: QGraphicsItem | None = None) -> None:
        super().__init__(parent)
        self.setPen(base.pen(color, alpha, width))
        self.query_item = QGraphicsPathItem(self)
        self.query_item.setPen(base.pen(highlight, 255, 2 * width))
        self.setZValue(2)
        self.counts = (0, 0)      # segments drawn: outlines, the query's window

    def set_outlines(self, segments: np.ndarray, scale: Scale, offset: tuple[float, float] = (0.0, 0.0)) -> None:
        """Draw a block's outlines at `scale` image pixels per cell (of the block's stage)."""
        segs = np.asarray(segments)
        self.setPath(segments_path(segs, scale, offset))
        self.counts = (len(segs.reshape(-1, 4)), self.counts[1])

    def set_query_window(self, segments: np.ndarray | None, scale: Scale = 1.0,
                         offset: tuple[float, float] = (0.0, 0.0)) -> None:
        """Highlight the query's window (its outline segments), or nothing (None)."""
        segs = np.zeros((0, 2, 2), np.float32) if segments is None else np.asarray(segments)
        self.query_item.setPath(segments_path(segs, scale, offset))
        self.counts = (self.counts[0], len(segs.reshape(-1, 4)))

    def clear(self) -> None:
        self.set_outlines(np.zeros((0, 2, 2), np.float32), 1.0)
        self.set_query_window(None)
