"""The text drawn inside pyqtgraph plots, measured where it is drawn, for the window's layout tests: axis tick labels
and axis titles (colorbars' included), titles and captions (`LabelItem`), legends and the labels of lines. A
plain function of a `GraphicsLayoutWidget`'s scene; nothing is painted.

`plot_text_problems` says what a reader would see as broken: two texts drawn over each other (tick labels running
into each other or into the rotated title of their axis, a title over a plot's labels), text cut by the widget's
edge, text drawn over the data of a plot (a line's label over a heat strip, a legend over the curves), an axis
title carrying pyqtgraph's '(x0.001)' scale factor, and images squeezed below a readable size.
"""
from __future__ import annotations

from dataclasses import dataclass

import pyqtgraph as pg
from PySide6.QtCore import QRectF
from PySide6.QtGui import QPainter, QPicture
from PySide6.QtWidgets import QGraphicsTextItem

MIN_IMAGE_PX = 80        # the least room an image (a map, a thumbnail, a strip of rows) gets on its shorter side


@dataclass(frozen=True)
class Text:
    """One piece of text: what it says, what drew it, and where (scene coordinates)."""

    text: str
    owner: str
    rect: QRectF
    item: object

    def __str__(self) -> str:
        r = self.rect
        return f"{self.owner} {self.text!r} at ({r.x():.0f}, {r.y():.0f}, {r.width():.0f}×{r.height():.0f})"


def _shown(item: object) -> bool:
    return bool(item.isVisible()) and item.scene() is not None   # type: ignore[attr-defined]


def _inside(item: object, kind: type) -> bool:
    """Whether `item` is part of a `kind` (a legend's entries, a colorbar's bar)."""
    parent = item.parentItem()   # type: ignore[attr-defined]
    while parent is not None:
        if isinstance(parent, kind):
            return True
        parent = parent.parentItem()
    return False


def _text_rect(item: QGraphicsTextItem) -> QRectF:
    """The scene rectangle of a text item's text (its document less the margins; a wrapped text as wide as its
    longest line)."""
    doc = item.document()
    margin = doc.documentMargin()
    local = QRectF(margin, margin, doc.idealWidth(), max(0.0, doc.size().height() - 2 * margin))
    return item.mapRectToScene(local)


def _axis_name(axis: pg.AxisItem) -> str:
    parent = axis.parentItem()
    while parent is not None and not isinstance(parent, (pg.PlotItem, pg.ColorBarItem)):
        parent = parent.parentItem()
    kind = "colorbar" if isinstance(parent, pg.ColorBarItem) else "axis"
    return f"{kind} {axis.orientation} ({axis.labelText or 'untitled'})"


def axis_texts(axis: pg.AxisItem) -> list[Text]:
    """The tick labels an axis draws (as its paint computes them) and its title."""
    out = []
    name = _axis_name(axis)
    if axis.label.isVisible() and axis.label.toPlainText().strip():
        out.append(Text(axis.label.toPlainText(), f"{name} title", _text_rect(axis.label), axis))
    picture = QPicture()
    painter = QPainter(picture)
    if axis.style["tickFont"]:
        painter.setFont(axis.style["tickFont"])
    try:
        _axis, _ticks, texts = axis.generateDrawSpecs(painter)
    finally:
        painter.end()
    for rect, _flags, text in texts:
        if text:
            out.append(Text(text, f"{name} tick", axis.mapRectToScene(rect), axis))
    return out


def scene_texts(widget: pg.GraphicsLayoutWidget) -> list[Text]:
    """Every piece of text shown in a layout widget's scene."""
    out: list[Text] = []
    for item in widget.scene().items():
        if not _shown(item):
            continue
        if isinstance(item, pg.AxisItem):
            out += axis_texts(item)
        elif isinstance(item, pg.LabelItem) and not _inside(item, pg.LegendItem) and item.item.toPlainText().strip():
            out.append(Text(item.item.toPlainText(), "title", _text_rect(item.item), item))
        elif isinstance(item, pg.LegendItem) and item.items:
            out.append(Text(" / ".join(label.text for _s, label in item.items), "legend", item.sceneBoundingRect(),
                            item))
        elif isinstance(item, pg.TextItem) and item.textItem.toPlainText().strip():
            out.append(Text(item.textItem.toPlainText(), "text in a plot", _text_rect(item.textItem), item))
    return out


def _overlap(a: QRectF, b: QRectF, tolerance: float = 1.0) -> bool:
    both = a.intersected(b)
    return both.width() > tolerance and both.height() > tolerance


def _data_items(widget: pg.GraphicsLayoutWidget) -> list[tuple[str, QRectF]]:
    """What plots draw data with: shown images (colorbars' bars too) and curves, as scene rectangles clipped to
    their view box."""
    out = []
    for item in widget.scene().items():
        if not _shown(item):
            continue
        image = isinstance(item, pg.ImageItem) and item.image is not None
        curve = isinstance(item, pg.PlotDataItem) and item.xData is not None and len(item.xData) > 0
        if image or curve:
            view = item.getViewBox()
            rect = item.sceneBoundingRect()
            if view is not None:
                rect = rect.intersected(view.sceneBoundingRect())
            if not rect.isEmpty():
                what = "curve" if curve else "colorbar" if _inside(item, pg.ColorBarItem) else "image"
                out.append((what, rect))
    return out


def plot_text_problems(widget: pg.GraphicsLayoutWidget, min_image: float = MIN_IMAGE_PX) -> list[str]:
    """Text of a layout widget drawn over other text, cut by the widget's edge or drawn over a plot's data, and
    images smaller than `min_image` pixels on their shorter side."""
    view = widget.mapToScene(widget.viewport().rect()).boundingRect().adjusted(-1, -1, 1, 1)
    texts = scene_texts(widget)
    problems = []
    for t in texts:
        if not view.contains(t.rect):
            problems.append(f"{t} is cut by the edge of the view ({view.width():.0f}×{view.height():.0f})")
    crowded = set()                    # axes whose tick labels run into each other: said once each
    for i, a in enumerate(texts):
        for b in texts[i + 1:]:
            if not _overlap(a.rect, b.rect):
                continue
            if a.item is b.item and a.owner == b.owner and a.owner.endswith("tick"):
                if a.owner not in crowded:
                    crowded.add(a.owner)
                    problems.append(f"{a.owner} labels run into each other ({a.text!r} and {b.text!r})")
                continue
            problems.append(f"{a} overlaps {b}")
    for t in texts:
        if t.owner.endswith("title") and isinstance(t.item, pg.AxisItem) and "(x" in t.text:
            problems.append(f"{t} carries pyqtgraph's scale factor")
    data = _data_items(widget)
    for t in texts:
        over = [what for what, rect in data if (what != "curve" or isinstance(t.item, (pg.LegendItem, pg.TextItem)))
                and _overlap(t.rect, rect)]
        problems += [f"{t} is drawn over the {what}" for what in over]
    for what, rect in data:
        if what == "image" and min(rect.width(), rect.height()) < min_image:
            problems.append(f"an image is squeezed to {rect.width():.0f}×{rect.height():.0f} px")
    return problems
