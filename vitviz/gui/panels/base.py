"""Small pieces the panels share: pens, dark plot styling, a wrapping title, lazy redraw of hidden docks."""
from __future__ import annotations

import html
from pathlib import Path

import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QPen, QShowEvent
from PySide6.QtWidgets import QComboBox, QGraphicsRectItem, QHBoxLayout, QLabel, QVBoxLayout, QWidget

from vitviz.gui.session import Session

pg.setConfigOptions(imageAxisOrder="row-major")   # once, before anything draws

BACKGROUND = "#202124"
TEXT = "#e8eaed"
SELECT = "#ff3b30"


def pen(color: str, alpha: int = 255, width: float = 1.0, dashed: bool = False) -> QPen:
    """A cosmetic pen (its width does not scale with zoom)."""
    qcolor = QColor(color)
    qcolor.setAlpha(alpha)
    out = QPen(qcolor)
    out.setWidthF(width)
    out.setCosmetic(True)
    if dashed:
        out.setDashPattern([4.0, 3.0])
    return out


def dark_layout() -> pg.GraphicsLayoutWidget:
    widget = pg.GraphicsLayoutWidget()
    widget.setBackground(BACKGROUND)
    widget.ci.setContentsMargins(4, 4, 4, 4)
    return widget


def style_plot(plot: pg.PlotItem, left: str, bottom: str) -> None:
    """Axis labels, no context menu or auto-range button."""
    plot.setMenuEnabled(False)
    plot.hideButtons()
    plot.getAxis("left").setLabel(left, color=TEXT)
    plot.getAxis("bottom").setLabel(bottom, color=TEXT)


PHRASE_BREAKS = (" · ", " — ", "; ")      # where a title may wrap: between its phrases


def unbreakable_phrases(text: str) -> str:
    """`text` as rich text that wraps only after ' · ', ' — ' or '; ' (never inside 'head mean' or 'scale
    0–0.02'): the spaces inside each phrase become non-breaking."""
    parts = [text]
    for sep in PHRASE_BREAKS:
        parts = [piece for part in parts for piece in _split_keep(part, sep)]
    return "".join(html.escape(p) if p in PHRASE_BREAKS else html.escape(p).replace(" ", "&nbsp;") for p in parts)


def _split_keep(text: str, sep: str) -> list[str]:
    pieces = text.split(sep)
    return [x for i, piece in enumerate(pieces) for x in ((piece, sep) if i < len(pieces) - 1 else (piece,))]


def plural(count: int, word: str, many: str = "") -> str:
    """'1 head', '12 heads' ('1 query', '3 queries' with `many`)."""
    return f"{count} {word if count == 1 else many or word + 's'}"


def waiting_text(session: Session, what: str) -> str:
    """What a panel says while it has nothing to show: 'Loading model NAME…' while the first model loads, else
    `what` (e.g. 'Open a model to see its position embedding.')."""
    loading = session.loading
    return f"Loading model {display_name(loading)}…" if loading and session.spec is None else what


def display_name(model: str) -> str:
    """A model path or name as panels name it: a file or folder's name, a hub name as given."""
    return model if ":" in model and not Path(model).exists() else Path(model).name or model


def compact(combo: QComboBox, characters: int = 10) -> QComboBox:
    """Size a combo box by `characters`, not by its longest entry, so a long entry ('patch (12, 13) · token
    201') never widens its dock; the open list still shows entries whole."""
    combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
    combo.setMinimumContentsLength(characters)
    return combo


def message_label(text: str) -> QLabel:
    """A centred, wrapped label for 'nothing to show' states."""
    label = QLabel(text)
    label.setWordWrap(True)
    label.setMargin(16)
    label.setStyleSheet("color: #5f6368;")
    return label


def image_view(widget: pg.GraphicsLayoutWidget, row: int, col: int,
               **kwargs: object) -> tuple[pg.ViewBox, pg.ImageItem]:
    """A fixed (no pan or zoom) image view box with its image item, placed in `widget`'s grid."""
    view = widget.addViewBox(row=row, col=col, lockAspect=True, invertY=True, enableMenu=False, **kwargs)
    view.setMouseEnabled(False, False)
    item = pg.ImageItem()
    view.addItem(item)
    return view, item


def select_frame(view: pg.ViewBox, width: float) -> QGraphicsRectItem:
    """A hidden selection frame (red, `width` px) in a view box."""
    frame = QGraphicsRectItem()
    frame.setPen(pen(SELECT, 255, width))
    frame.setZValue(5)
    frame.setVisible(False)
    view.addItem(frame)
    return frame


class TitleLabel(pg.LabelItem):
    """A title that wraps at the panel's width instead of widening the layout (a long title in a narrow panel
    used to push the image partly out of view). Lines break between phrases only (`unbreakable_phrases`)."""

    def setText(self, text: str, **args: object) -> None:  # noqa: N802 - pyqtgraph override
        """Show `text`, wrapping between its phrases only; `text` keeps the plain text."""
        super().setText(unbreakable_phrases(text), **args)
        self.text = text

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


class LazyPanel(QWidget):
    """A panel that skips redraws while hidden (a dock behind another tab) and catches up when shown.

    Subclasses implement `redraw()` and call `request_redraw()` whenever their input changed.
    """

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._dirty = True

    def is_shown(self) -> bool:
        """On screen: visible and not a dock behind another tab (Qt keeps those 'visible' with nothing exposed)."""
        return self.isVisible() and not self.visibleRegion().isEmpty()

    def request_redraw(self) -> None:
        if self.is_shown():
            self._dirty = False
            self.redraw()
        else:
            self._dirty = True

    def on_dock_visibility(self, visible: bool) -> None:
        """Connected to the dock's `visibilityChanged`: catch up when its tab comes to the front."""
        if visible and self._dirty:
            self._dirty = False
            self.redraw()

    def redraw(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def showEvent(self, event: QShowEvent) -> None:  # noqa: N802 - Qt override
        super().showEvent(event)
        if self._dirty:
            self._dirty = False
            self.redraw()


def bar_and_body(panel: QWidget, bar: list[QWidget], body: QWidget) -> None:
    """Lay out `panel` as a row of controls (the last one stretching) above `body`."""
    top = QHBoxLayout()
    for i, w in enumerate(bar):
        top.addWidget(w, 1 if i == len(bar) - 1 else 0)
    layout = QVBoxLayout(panel)
    layout.setContentsMargins(2, 2, 2, 2)
    layout.addLayout(top)
    layout.addWidget(body, 1)
