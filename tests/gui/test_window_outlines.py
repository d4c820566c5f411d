"""The window-outline item (vitviz.gui.panels.windows) over a pyqtgraph view like the image panel's: the segments
of `vitviz.core.analyses.winview` drawn at the stage's scale, found in the grabbed widget where they should be (and not
where they should not), the shifted block's outlines moved by the shift, the query's window highlighted."""
from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QPointF

from vitviz.core.analyses import winview
from vitviz.core.winspec import BlockGeometry
from vitviz.gui.panels.windows import WindowOutlineItem

PX = 8            # image pixels per cell


def geometry(shift: int) -> BlockGeometry:
    return BlockGeometry(0, 0, 0, (8, 8), (4, 4), (shift, shift), (8, 8), "pad_roll", False, PX)


def view_with_item(qtbot) -> tuple[pg.GraphicsLayoutWidget, pg.ViewBox, WindowOutlineItem]:
    widget = pg.GraphicsLayoutWidget()
    widget.setBackground("#000000")
    widget.resize(420, 420)
    view = widget.addViewBox(row=0, col=0, lockAspect=True, invertY=True, enableMenu=False)
    image = pg.ImageItem(np.zeros((64, 64), np.uint8), levels=(0, 255))
    item = WindowOutlineItem(color="#ffffff", alpha=255, width=2.0, highlight="#ff0000")
    view.addItem(image)
    view.addItem(item)
    view.setRange(xRange=(0, 64), yRange=(0, 64), padding=0.02)
    qtbot.addWidget(widget)
    widget.show()
    qtbot.waitExposed(widget)
    return widget, view, item


def brightness(widget: pg.GraphicsLayoutWidget, view: pg.ViewBox, x: float, y: float) -> tuple[int, int, int]:
    """The brightest pixel (r, g, b) within one pixel of image point (x, y) in a fresh grab of the widget."""
    grabbed = widget.grab().toImage()
    scene = view.mapViewToScene(QPointF(x, y))
    p = widget.mapFromScene(scene)
    ratio = grabbed.devicePixelRatio()
    best = (0, 0, 0)
    for dx in (-1, 0, 1):
        for dy in (-1, 0, 1):
            c = grabbed.pixelColor(int((p.x() + dx) * ratio), int((p.y() + dy) * ratio))
            if sum(c.getRgb()[:3]) > sum(best):
                best = c.getRgb()[:3]
    return best


def test_outlines_are_drawn_where_the_windows_meet(qtbot) -> None:
    widget, view, item = view_with_item(qtbot)
    item.set_outlines(winview.window_outlines(geometry(0)), PX)
    assert item.counts == (6, 0)
    qtbot.wait(20)
    # x = 4 cells = 32 px: a vertical line; y = 4 cells: a horizontal one; 16 px is inside a window
    assert min(brightness(widget, view, 32, 10)) > 200
    assert min(brightness(widget, view, 50, 32)) > 200
    assert max(brightness(widget, view, 16, 10)) < 40 and max(brightness(widget, view, 48, 48)) < 40


def test_shifted_outlines_and_the_query_window(qtbot) -> None:
    widget, view, item = view_with_item(qtbot)
    g = geometry(2)
    item.set_outlines(winview.window_outlines(g), PX)
    qtbot.wait(20)
    assert item.counts == (8, 0)
    assert min(brightness(widget, view, 16, 40)) > 200 and min(brightness(widget, view, 48, 40)) > 200
    assert max(brightness(widget, view, 32, 40)) < 40         # the unshifted cut is gone
    # the window of patch (0, 0) wraps over the four corners: its pieces are highlighted in red
    window = int(g.slot_of[0][0])
    item.set_query_window(winview.mask_outline(g.window_cells(window)), PX)
    qtbot.wait(20)
    assert item.counts == (8, 16)
    r, gr, b = brightness(widget, view, 16, 8)               # the right side of the top-left piece
    assert r > 200 and gr < 80 and b < 80
    r, gr, b = brightness(widget, view, 32, 16)              # a window outline, not the query's: white
    assert min(r, gr, b) > 200
    item.clear()
    qtbot.wait(20)
    assert item.counts == (0, 0) and max(brightness(widget, view, 16, 40)) < 40
