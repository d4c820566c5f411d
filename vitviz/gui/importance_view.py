"""The Importance view of the Overview dock: the current image's layers × heads grid of head importance.

The grid is `vitviz.core.drawing.importance.draw_importance` of the worker's scan (`vitviz.gui.interventions.
HeadScan`: every head ablated alone, the drop of the top class's probability), scaled to the dock's width; a click
on a cell of the exact grid ablates that head (or restores it) and every panel then shows that run; the ablated
heads are outlined in amber on the grid as on the overview's tiles. It sits beside the overview's tiles (below
them in a tall dock), shown while the current image has a grid or one is being computed (`attach`), and can be
closed.
"""
from __future__ import annotations

from typing import Any

import numpy as np
from PySide6.QtCore import QPointF, QRectF, Qt
from PySide6.QtGui import QColor, QImage, QMouseEvent, QPainter, QPaintEvent, QPen, QPixmap
from PySide6.QtWidgets import QHBoxLayout, QLabel, QSizePolicy, QSplitter, QToolButton, QVBoxLayout, QWidget

InterventionSession = Any   # vitviz.gui.interventions.InterventionSession, which imports this module (its dock's row)
MARK = "#ffb000"   # amber: what is intervened (the overview's frames, the head selector, the banner, the grid)
MAX_SCALE = 1.5    # the grid drawn at most this much enlarged


class ImportanceGrid(QWidget):
    """The drawn grid, scaled to fit (up to `MAX_SCALE`: a demo's 3 × 4 grid is small at 1:1); a click on a cell
    goes to `InterventionSession.toggle`."""

    def __init__(self, iv: InterventionSession, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.iv = iv
        self.imp: Any = None
        self.pixmap = QPixmap()
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Expanding)
        self.setMinimumHeight(60)
        self.setToolTip("click a cell of the exact grid to ablate (or restore) that head")

    def show_importance(self, imp: Any) -> None:
        if imp is self.imp:
            return
        self.imp = imp
        if imp is None:
            self.pixmap = QPixmap()
        else:
            from vitviz.core.drawing.importance import draw_importance

            rgb = np.ascontiguousarray(draw_importance(imp, legend=False))   # the caption says the legend
            self.pixmap = QPixmap.fromImage(QImage(rgb.data, rgb.shape[1], rgb.shape[0], 3 * rgb.shape[1],
                                                   QImage.Format.Format_RGB888).copy())
        self.update()

    def placement(self) -> tuple[float, float, float]:
        """(scale, x, y) of the drawn grid in the widget: fitted, centred horizontally, at the top."""
        if self.pixmap.isNull():
            return 1.0, 0.0, 0.0
        scale = min(MAX_SCALE, self.width() / self.pixmap.width(), self.height() / self.pixmap.height())
        return scale, (self.width() - scale * self.pixmap.width()) / 2, 0.0

    def cell_at(self, pos: QPointF) -> tuple[int, int] | None:
        """The (layer, head) of the exact grid's cell under a widget position, or None."""
        from vitviz.core.drawing.importance import cell_at

        if self.imp is None:
            return None
        scale, x0, y0 = self.placement()
        return cell_at(self.imp, int((pos.x() - x0) / scale), int((pos.y() - y0) / scale), legend=False)

    def paintEvent(self, _event: QPaintEvent) -> None:  # noqa: N802 - Qt override
        if self.pixmap.isNull():
            return
        from vitviz.core.drawing.importance import cell_rect

        painter = QPainter(self)
        painter.setRenderHint(QPainter.RenderHint.SmoothPixmapTransform)
        scale, x0, y0 = self.placement()
        painter.drawPixmap(QRectF(x0, y0, scale * self.pixmap.width(), scale * self.pixmap.height()), self.pixmap,
                           QRectF(self.pixmap.rect()))
        pen = QPen(QColor(MARK))
        pen.setWidthF(2.5)
        pen.setStyle(Qt.PenStyle.DashLine)
        painter.setPen(pen)
        layers, heads = self.imp.drop.shape
        for layer, head in self.iv.heads:
            if layer < layers and head < heads:
                x, y, size = cell_rect(self.imp, layer, head, legend=False)
                painter.drawRect(QRectF(x0 + scale * x, y0 + scale * y, scale * size, scale * size))
        painter.end()

    def mousePressEvent(self, event: QMouseEvent) -> None:  # noqa: N802 - Qt override
        cell = self.cell_at(event.position()) if event.button() == Qt.MouseButton.LeftButton else None
        if cell is not None:
            self.iv.toggle(*cell)


class ImportanceView(QWidget):
    """The grid with its caption (computing, or what it is) and a close button; hidden while the current image has
    no grid and none is on its way."""

    def __init__(self, iv: InterventionSession, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("importanceView")
        self.iv = iv
        self.hidden_by_user = False          # closed (until the next scan is asked for)
        self.caption = QLabel()
        self.caption.setWordWrap(True)
        close = QToolButton()
        close.setText("×")
        close.setToolTip("hide the importance grid (the tile menu's 'Importance of every head' shows it again)")
        close.clicked.connect(self.close_grid)
        self.grid = ImportanceGrid(iv)
        bar = QHBoxLayout()
        bar.setContentsMargins(4, 0, 4, 0)
        bar.addWidget(self.caption, 1)
        bar.addWidget(close)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 2, 0, 0)
        layout.addLayout(bar)
        layout.addWidget(self.grid, 1)
        iv.changed.connect(self.refresh)
        iv.scan_asked.connect(self._on_scan_asked)
        iv.session.image_list.current_changed.connect(lambda _maps: self.refresh())
        iv.session.client.busy_changed.connect(lambda _busy: self.refresh())
        self.setVisible(False)

    def scanning(self) -> bool:
        path = self.iv.session.image_list.current
        return self.iv.scanning(path)

    def close_grid(self) -> None:
        self.hidden_by_user = True
        self.setVisible(False)

    def _on_scan_asked(self) -> None:
        self.hidden_by_user = False
        self.refresh()

    def refresh(self) -> None:
        imp = self.iv.current_importance()
        self.grid.show_importance(imp)
        self.grid.update()           # the ablated heads' outlines
        shown = (imp is not None or self.scanning()) and not self.hidden_by_user
        appears = shown and not self.isVisibleTo(self.parentWidget())
        self.setVisible(shown)
        if appears and isinstance(self.parentWidget(), FittingSplitter):
            self.parentWidget().share()
        if imp is None:
            self.caption.setText("Head importance: ablating each head alone in the worker…")
        else:
            from vitviz.core.drawing.importance import legend_lines

            title, drops, label = legend_lines(imp)
            self.caption.setText(f"<b>Head importance</b> · {drops} · click a cell: ablate that head")
            self.caption.setToolTip(f"{title}\neach cell: the {label} when that head alone is ablated (red: the "
                                    f"model loses without it)")


class FittingSplitter(QSplitter):
    """Side by side where the dock is wider than tall (the usual Overview dock at 1280 × 800: both get the whole
    height), one above the other where it is taller than wide."""

    SHARE = (1, 1)   # of the length along the split: the tiles', the grid's (until the user drags the handle)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.dragged = False
        self.splitterMoved.connect(lambda *_a: setattr(self, "dragged", True))

    def resizeEvent(self, event: Any) -> None:  # noqa: N802 - Qt override
        wide = event.size().width() > event.size().height()
        orientation = Qt.Orientation.Horizontal if wide else Qt.Orientation.Vertical
        if orientation != self.orientation():
            self.setOrientation(orientation)
        super().resizeEvent(event)
        self.share()

    def share(self) -> None:
        """The tiles and the grid at `SHARE` of the length (nothing to share while the grid is hidden)."""
        if not self.dragged and self.count() == 2 and self.widget(1).isVisibleTo(self):
            length = self.width() if self.orientation() == Qt.Orientation.Horizontal else self.height()
            total = sum(self.SHARE)
            self.setSizes([length * self.SHARE[0] // total, length * self.SHARE[1] // total])


def attach(overview: Any, iv: InterventionSession) -> ImportanceView:
    """Put the Importance view beside (or below) the overview's tiles in the Overview dock, a splitter between
    them; returns it. Only the tiles' widget (`overview.widget`) moves into the splitter, in its place."""
    view = ImportanceView(iv, overview)
    layout = overview.layout()
    splitter = FittingSplitter(overview)
    splitter.setChildrenCollapsible(False)
    if layout.replaceWidget(overview.widget, splitter) is not None:
        splitter.addWidget(overview.widget)
        splitter.addWidget(view)
        splitter.setStretchFactor(0, 1)
        splitter.setStretchFactor(1, 1)
    else:                        # the panel laid out otherwise: below its tiles
        splitter.deleteLater()
        layout.addWidget(view)
    return view
