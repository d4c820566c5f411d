"""Small pieces the panels share: pens, dark plot styling, a wrapping title, lazy redraw of hidden docks."""
from __future__ import annotations

import html
import re
import time
import weakref
from collections.abc import Callable
from pathlib import Path

import pyqtgraph as pg
import shiboken6
from PySide6.QtCore import QObject, QSize, Qt, QTimer
from PySide6.QtGui import QColor, QPen, QShowEvent, QTextDocument
from PySide6.QtWidgets import QComboBox, QGraphicsRectItem, QHBoxLayout, QLabel, QPushButton, QVBoxLayout, QWidget

from vitviz.core.formats import FOLDER_WEIGHT_NAMES
from vitviz.gui import colors
from vitviz.gui.model_slot import ModelSlot

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


class DarkLayout(pg.GraphicsLayoutWidget):
    """A plot area whose preferred height is its minimum height when one is set (pyqtgraph prefers 480 px, which
    a scrolling page of plots with a wrapped label beside them would make every plot's height)."""

    def sizeHint(self) -> QSize:  # noqa: N802 - Qt override
        hint = super().sizeHint()
        return QSize(hint.width(), self.minimumHeight()) if self.minimumHeight() else hint


def dark_layout() -> pg.GraphicsLayoutWidget:
    widget = DarkLayout()
    widget.setBackground(BACKGROUND)
    widget.ci.setContentsMargins(4, 4, 4, 4)
    return widget


def style_plot(plot: pg.PlotItem, left: str, bottom: str) -> None:
    """Axis labels, no context menu or auto-range button, and no '(x0.001)' scale factor on an axis title (an
    empty plot's range used to bring one)."""
    plot.setMenuEnabled(False)
    plot.hideButtons()
    for side, label in (("left", left), ("bottom", bottom)):
        axis = plot.getAxis(side)
        axis.enableAutoSIPrefix(False)
        axis.setLabel(label, color=TEXT)


def show_axes(plot: pg.PlotItem, shown: bool) -> None:
    """Show or hide a plot's left and bottom axes, touching only those that change: `showAxis` on an axis already
    shown throws away its drawn picture and sets its width again, so every redraw that called it drew its ticks
    anew."""
    for side in ("left", "bottom"):
        if plot.getAxis(side).isVisibleTo(plot) != shown:
            plot.showAxis(side, shown)


TICK_GAP_PX = 6.0           # the least room between two tick labels


def tick_step(pixels_per_unit: float, extent: float, gap: float = TICK_GAP_PX) -> int:
    """The smallest round step (1, 2, 5, 10, 20, ...) between labelled ticks `pixels_per_unit` apart that
    leaves `gap` pixels between labels taking `extent` pixels each along the axis."""
    for power in range(7):
        for mantissa in (1, 2, 5):
            if mantissa * 10 ** power * pixels_per_unit >= extent + gap:
                return mantissa * 10 ** power
    return 10 ** 7


def index_ticks(count: int, step: int, offset: float = 0.0) -> list[tuple[float, str]]:
    """Ticks naming every `step`-th index of `count` (layers, say) at index + `offset`."""
    return [(i + offset, str(i)) for i in range(0, count, max(1, step))]


PHRASE_BREAKS = (" · ", " — ", "; ")      # where a title may wrap: between its phrases


def unbreakable_phrases(text: str) -> str:
    """`text` as rich text that wraps only after ' · ', ' — ' or '; ' (never inside 'head mean' or 'scale
    0–0.02'): the spaces inside each phrase become non-breaking. A phrase too long for a line on its own ('rollout
    of cls (max, discard 0.90, from layer 2, residual 0.50)') may also wrap after a comma followed by a word, or
    (past `LONG_PHRASE` characters) before a bracket that opens words ('attention received' / '(mean over each
    window's queries)'), not inside a place like '(0, 5)': unbreakable, Qt broke it anywhere ('residual 0.5' /
    '0)', 'queries' / ')')."""
    parts = [text]
    for sep in PHRASE_BREAKS:
        parts = [piece for part in parts for piece in _split_keep(part, sep)]
    out = "".join(html.escape(p) if p in PHRASE_BREAKS or p.count(" ") >= SENTENCE_SPACES
                  else _bracket_breaks(html.escape(p).replace(" ", "&nbsp;")) if len(p) > LONG_PHRASE
                  else html.escape(p).replace(" ", "&nbsp;") for p in parts)
    return re.sub(r",&nbsp;(?=[^\W\d])", ", ", out)


LONG_PHRASE = 44      # characters: a longer phrase may also wrap before a bracket that opens words


def _bracket_breaks(phrase: str) -> str:
    return re.sub(r"&nbsp;\((?=[^\W\d])", " (", phrase)


SENTENCE_SPACES = 7   # a phrase of 8 words or more is a sentence ('rollout multiplies the token-to-token attention
                      # of one grid'): it wraps between its words, not inside them ('tok' / 'en-to-' / 'token')


def _split_keep(text: str, sep: str) -> list[str]:
    pieces = text.split(sep)
    return [x for i, piece in enumerate(pieces) for x in ((piece, sep) if i < len(pieces) - 1 else (piece,))]


def plural(count: int, word: str, many: str = "") -> str:
    """'1 head', '12 heads' ('1 query', '3 queries' with `many`)."""
    return f"{count} {word if count == 1 else many or word + 's'}"


def waiting_text(model: ModelSlot, what: str) -> str:
    """What a panel says while it has nothing to show: 'Loading model NAME…' while the first model loads, else
    `what` (e.g. 'Open a model to see its position embedding.')."""
    return f"Loading model {display_name(model.loading)}…" if model.loading and model.spec is None else what


def failure_reason(path: str, summary: str) -> str:
    """Why an image failed, without the path its message starts with ('/tmp/a/broken.png: not a recognised image
    format; ...' -> 'not a recognised image format; ...'): a title or list entry names the image once already."""
    for prefix in (path, Path(path).name):
        if summary.startswith(prefix + ": "):
            return summary[len(prefix) + 2:]
    return summary


def shortened(text: str, limit: int) -> str:
    """`text` cut at the last word boundary within `limit` characters, with '…' (the whole text when it fits):
    a list entry cut mid-word read 'expected a PN'."""
    if len(text) <= limit:
        return text
    cut = text[: limit - 1].rsplit(" ", 1)[0].rstrip(",;:")
    return cut + "…"


def display_name(model: str) -> str:
    """A model path or name as panels name it: a file or folder's name, a hub name as given; a model folder's
    weights file (`model.safetensors`: every hub folder's) by its folder, 'vit-small/model.safetensors'."""
    if ":" in model and not Path(model).exists():
        return model
    path = Path(model)
    if path.name in FOLDER_WEIGHT_NAMES and path.parent.name:
        return f"{path.parent.name}/{path.name}"
    return path.name or model


def compact(combo: QComboBox, characters: int = 10) -> QComboBox:
    """Size a combo box by `characters`, not by its longest entry, so a long entry ('patch (12, 13) · token
    201') never widens its dock; the open list still shows entries whole."""
    combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
    combo.setMinimumContentsLength(characters)
    return combo


class Recolourable:
    """A panel with one colour bar (`colorbar`) over maps drawn in the colormap `_cmap`: `set_colormap` changes
    both, and the maps are drawn again (`_recolour`) only when the colormap really changed."""

    _cmap: str
    colorbar: pg.ColorBarItem

    def set_colormap(self, name: str) -> None:
        if name != self._cmap:
            self._cmap = name
            self.colorbar.setColorMap(colors.colormap(name))
            self._recolour()

    def _recolour(self) -> None:
        """Draw the maps again in the new colormap (nothing while none is shown)."""
        raise NotImplementedError


def wrapped_label(name: str, text: str = "") -> QLabel:
    """A label that wraps at its dock's width (a long line never widens the dock), named `name` for tests and
    style sheets."""
    label = QLabel(text)
    label.setObjectName(name)
    label.setWordWrap(True)
    return label


def push_button(text: str, clicked: Callable[..., object], tip: str = "", name: str = "") -> QPushButton:
    """A button that calls `clicked` when pressed, with the tooltip `tip` and the object name `name` ('' none)."""
    button = QPushButton(text)
    if name:
        button.setObjectName(name)
    if tip:
        button.setToolTip(tip)
    button.clicked.connect(clicked)
    return button


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
    used to push the image partly out of view). Lines break between phrases only (`unbreakable_phrases`).

    Its height never shrinks while its width stays the same, and it keeps room for at least `lines` lines, so
    the plot below does not jump up and down as titles of one and two lines follow each other (a new layer, a
    new image); a new width measures again."""

    def __init__(self, text: str = "", lines: int = 1, **args: object) -> None:
        self._lines = lines
        self._tallest = (-1.0, 0.0)          # (width, the tallest text's height at that width)
        super().__init__(text, **args)

    def setText(self, text: str, **args: object) -> None:  # noqa: N802 - pyqtgraph override
        """Show `text`, wrapping between its phrases only; `text` keeps the plain text. The same text again is
        not set again (a new text lays its plot area out anew: a redraw for another image kept doing that)."""
        if text == getattr(self, "text", None) and not args:
            return
        before = dict(getattr(self, "_sizeHint", {}))
        self._quiet = True          # pyqtgraph asks for a new layout three times per text, whatever its size
        try:
            super().setText(unbreakable_phrases(text), **args)
        finally:
            self._quiet = False
        self.text = text
        if self._sizeHint != before:   # only a title of another size lays its plot area out anew (and paints it
            super().updateGeometry()   # twice: the layout comes a turn after the first paint)

    def updateGeometry(self) -> None:  # noqa: N802 - Qt override
        if not getattr(self, "_quiet", False):
            super().updateGeometry()

    def resizeEvent(self, ev: object) -> None:  # noqa: N802 - Qt override
        if self.width() > 0 and self.item.textWidth() != self.width():   # (the same width again lays the text
            self.item.setTextWidth(self.width())                         # out anew: on every new title)
        super().resizeEvent(ev)

    def reserved_height(self) -> float:
        """The height of `lines` lines of this title's font."""
        probe = QTextDocument()
        probe.setDefaultFont(self.item.font())
        probe.setDocumentMargin(self.item.document().documentMargin())
        size = self.opts.get("size")
        style = f" style='font-size: {size}'" if size else ""
        probe.setHtml(f"<span{style}>{'<br>'.join(['Xg'] * max(1, self._lines))}</span>")
        return probe.size().height()

    def updateMin(self) -> None:  # noqa: N802 - pyqtgraph override
        super().updateMin()
        height = self.itemRect().height()
        if not getattr(self, "_lines", 0):
            return                            # pyqtgraph's constructor, before ours has run
        width, tallest = self._tallest
        if self.width() != width:
            tallest = self.reserved_height()
        height = max(height, tallest)
        self._tallest = (self.width(), height)
        self.setMinimumWidth(0)
        self.setMinimumHeight(height)
        self._sizeHint[Qt.SizeHint.MinimumSize] = (0, height)
        self._sizeHint[Qt.SizeHint.PreferredSize] = (0, height)
        self.updateGeometry()


class RedrawRelay(QObject):
    """Redraws asked for during one event-loop turn, run once each at the next turn (`later`): an ablate click
    emits the interventions' `changed` four or five times and the current image's maps once, and a panel that
    redrew for each drew the same thing again. While a hold says the worker is running what the panels will show
    next (`hold_while`: the current image's intervened forward), the redraws wait for its answer, at most
    `HOLD_MS`: the worker's forward and the window's drawing shared the CPU (and Python's lock), and both took
    longer. `pending()` says a redraw is still to come (tests and bench/ wait on it)."""

    HOLD_MS = 150.0        # the longest the redraws wait for a held forward (the click's own feedback then shows)
    RECHECK_MS = 2         # how often a hold is looked at again

    def __init__(self) -> None:
        super().__init__()
        self._asked: dict[Callable[[], object], None] = {}
        self._holds: list[Callable[[], Callable[[], bool] | None]] = []   # weak: a hold never keeps its owner
        self._since = 0.0
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.timeout.connect(self._run)

    def later(self, redraw: Callable[[], object]) -> None:
        """Call `redraw()` at the next event-loop turn, once however often it is asked for until then."""
        self._asked[redraw] = None
        if not self._timer.isActive():
            self._since = time.perf_counter()
            self._timer.start(0)

    def hold_while(self, busy: Callable[[], bool]) -> None:
        """Let the redraws wait while `busy()`. A bound method is held weakly (the relay lives as long as the
        application: holding a closed window's interventions would keep its session, and its worker thread, alive);
        it is dropped with its owner, or when its QObject is deleted."""
        self._holds.append(weakref.WeakMethod(busy) if hasattr(busy, "__self__") else (lambda: busy))

    def pending(self) -> bool:
        return bool(self._asked)

    def flush(self) -> None:
        """Run what was asked for now (each once)."""
        self._timer.stop()
        asked, self._asked = list(self._asked), {}
        for redraw in asked:
            owner = getattr(redraw, "__self__", None)
            if not isinstance(owner, QObject) or shiboken6.isValid(owner):   # not a closed window's panel
                redraw()

    def _held(self) -> bool:
        alive = [(ref, busy) for ref in self._holds if (busy := ref()) is not None
                 and (not isinstance(getattr(busy, "__self__", None), QObject) or shiboken6.isValid(busy.__self__))]
        self._holds = [ref for ref, _ in alive]
        return (time.perf_counter() - self._since) * 1e3 < self.HOLD_MS and any(busy() for _, busy in alive)

    def _run(self) -> None:
        if self._held():
            self._timer.start(self.RECHECK_MS)
        else:
            self.flush()


_RELAY: RedrawRelay | None = None


def relay() -> RedrawRelay:
    """The application's redraw relay (made with the first panel that asks: it needs the QApplication)."""
    global _RELAY
    if _RELAY is None or not shiboken6.isValid(_RELAY):
        _RELAY = RedrawRelay()
    return _RELAY


def redraws_pending() -> bool:
    """Whether a redraw asked for with `relay().later` has still to run."""
    return _RELAY is not None and shiboken6.isValid(_RELAY) and _RELAY.pending()


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
