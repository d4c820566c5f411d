"""The status bar: what the worker is doing, a busy/progress bar, the hovered patch, a standing hint when idle, and
the loaded model's verdict ("Verified against timm 1.0.31 (max 3e-7)", "Not verified — 3 assumptions", "Differs
from the original — from layer 1", in red) with "Review assumptions…" beside it when there is something to review.

While several images run, the running image's line says how far the run has got and about how long is left
("Running img_018.jpg… — 18/200, about 2 min left") and the bar fills with it. The model's own code (`--code`) that
runs longer than the Stop-waiting time (settings) gets a Stop waiting button.
"""
from __future__ import annotations

import math

from PySide6.QtCore import QRect, Qt, QTimer
from PySide6.QtGui import QPainter, QPaintEvent, QResizeEvent
from PySide6.QtWidgets import QLabel, QProgressBar, QStatusBar, QToolButton, QWidget

from vitviz.gui.assumptions import LEVEL_STYLES, VerdictLine

IDLE_HINT = "Open a model (Ctrl+O), pick one in the Models menu, or drop a checkpoint and images on the window"
PROGRESS_STEPS = 1000
NOTE_MS = 20000         # how long a note stands in for the idle message
RUNNING = "Running "    # how the worker's line for an image run begins


def time_left(seconds: float) -> str:
    """'about 40 s left', 'about 3 min left', 'about 1 h 5 min left'; '' when not known yet."""
    if not math.isfinite(seconds) or seconds < 0:
        return ""
    if seconds < 60:
        return f"about {max(1, int(round(seconds)))} s left"
    minutes = int(round(seconds / 60))
    if minutes < 60:
        return f"about {minutes} min left"
    return f"about {minutes // 60} h {minutes % 60} min left"


MESSAGE_LINES = 2       # a message wider than the bar's room wraps onto this many lines (the bar grows)


class WrappingStatusBar(QStatusBar):
    """A status bar whose message wraps onto a second line when it is wider than the room left of the permanent
    widgets (Qt draws it on one line, cut at the edge: at 1280 × 800 most notes lost their end). Only while a
    message needs it is the bar two lines high."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._lines: dict[tuple[str, int, str], int] = {}    # (text, room, font) -> lines: measured once each
        self.messageChanged.connect(lambda _text: QTimer.singleShot(0, self, self._fit_height))

    def message_rect(self) -> QRect:
        """Where the message is drawn: from the left edge to the first shown permanent widget."""
        right = min((w.geometry().left() for w in self.findChildren(QWidget, options=Qt.FindChildOption.
                     FindDirectChildrenOnly) if w.isVisible() and w.geometry().left() > 0), default=self.width())
        return QRect(6, 0, max(0, right - 12), self.height())

    def lines_needed(self, text: str) -> int:
        """How many lines `text` takes wrapped in the message's room (1 for none). Measured once per text, room and
        font: the bar asks on every message (twice: its height and its tooltip), and the worker's lines come back
        to the same few texts."""
        if not text:
            return 1
        key = (text, self.message_rect().width(), self.font().key())
        lines = self._lines.get(key)
        if lines is None:
            if len(self._lines) >= 256:
                self._lines.clear()
            metrics = self.fontMetrics()
            box = metrics.boundingRect(QRect(0, 0, max(1, key[1]), 10_000), int(Qt.TextFlag.TextWordWrap), text)
            lines = self._lines[key] = max(1, -(-box.height() // metrics.lineSpacing()))
        return lines

    def _fit_height(self) -> None:
        """Two lines while the message needs them; not shrunk for a passing status line while the worker is busy
        (an ablate click's 'Running …' between two long idle hints laid the whole window out, every dock
        repainted, twice per click)."""
        lines = min(MESSAGE_LINES, self.lines_needed(self.currentMessage()))
        height = self.fontMetrics().lineSpacing() * lines + 8 if lines > 1 else 0
        busy = any(isinstance(w, QProgressBar) and w.isVisible() for w in self.children())
        if height >= self.minimumHeight() or not busy:
            self.setMinimumHeight(height)
        self.update()

    def resizeEvent(self, event: QResizeEvent) -> None:  # noqa: N802 - Qt override
        super().resizeEvent(event)
        QTimer.singleShot(0, self, self._fit_height)

    def paintEvent(self, event: QPaintEvent) -> None:  # noqa: N802 - Qt override
        text = self.currentMessage()
        if not text:
            super().paintEvent(event)
            return
        painter = QPainter(self)
        painter.setPen(self.palette().windowText().color())
        flags = Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter | Qt.TextFlag.TextWordWrap
        painter.drawText(self.message_rect(), int(flags), text)
        painter.end()


def tool_button(name: str, text: str, tip: str, flat: bool = False) -> QToolButton:
    """A status-bar button, hidden until there is something for it to do; `name` its object name ('' none),
    `flat` drawn without a frame until hovered (auto-raise)."""
    button = QToolButton()
    if name:
        button.setObjectName(name)
    button.setText(text)
    button.setToolTip(tip)
    button.setAutoRaise(flat)
    button.setVisible(False)
    return button


class StatusArea:
    """Shows the worker's status while busy, and `ready_message` whenever it becomes idle."""

    def __init__(self, bar: QStatusBar) -> None:
        self.bar = bar
        self.hover_label = QLabel("")
        self.busy_bar = QProgressBar()
        self.busy_bar.setRange(0, 0)
        self.busy_bar.setMaximumWidth(160)
        self.busy_bar.setVisible(False)
        self.cancel_button = tool_button(     # shown while a named model downloads
            "", "Cancel", "Stop this download (what is downloaded so far is kept for the next try where the hub "
            "allows; the model loaded before stays)")
        self.stop_button = tool_button(       # shown while the user's own code runs too long
            "stopWaitingButton", "Stop waiting", "Give up on the model's own code that has not finished: vitviz "
            "starts a fresh worker and loads the model it had before (the code may still run in the background "
            "until it returns)")
        self.verdict_label = QLabel("")             # the loaded model's verdict, its assumptions in the tooltip
        self.verdict_label.setObjectName("verdictLabel")
        self.verdict_label.setVisible(False)
        self.verdict = VerdictLine("", "", "none")
        self.review_button = tool_button(     # opens the "what the file does not say" dialog
            "reviewAssumptions", "Review assumptions…", "The settings the file does not say (heads, norm order, "
            "activation, attention scale): see why each was assumed and set the right ones", flat=True)
        self.verify_button = tool_button(     # Verify against…: another original, or the user's code
            "verifyAgainst", "Verify against…", "Check the model against an original you name: a library "
            "architecture, or your own code (FILE.py and the function that builds the model)", flat=True)
        bar.addPermanentWidget(self.verdict_label)
        bar.addPermanentWidget(self.verify_button)
        bar.addPermanentWidget(self.review_button)
        bar.addPermanentWidget(self.hover_label)
        bar.addPermanentWidget(self.busy_bar)
        bar.addPermanentWidget(self.cancel_button)
        bar.addPermanentWidget(self.stop_button)
        self.ready_message = IDLE_HINT
        self.busy = False
        self.runs = (0, 0, float("nan"))        # images answered, in all, seconds left (`set_runs`)
        self._last = ""                          # the worker's latest line, before the run suffix
        self._note = ""
        self._note_timer = QTimer(bar)          # running while the note stands in for the idle message
        self._note_timer.setSingleShot(True)
        self._note_timer.timeout.connect(self._note_expired)
        self._permanent = [self.verdict_label, self.verify_button, self.review_button, self.hover_label, self.busy_bar,
                           self.cancel_button, self.stop_button]
        bar.messageChanged.connect(self._tip_if_cut)
        bar.showMessage(self.ready_message)

    def set_verdict(self, line: VerdictLine, reviewable: bool, verifiable: bool = False) -> None:
        """Show the loaded model's verdict line (hidden without one) and, with `reviewable`, the review button; with
        `verifiable` (a converted model), Verify against…."""
        self.verdict = line
        self.verify_button.setVisible(verifiable)
        self.verdict_label.setText(line.text)
        self.verdict_label.setToolTip(line.tooltip)
        self.verdict_label.setStyleSheet(LEVEL_STYLES.get(line.level, ""))
        self.verdict_label.setVisible(bool(line.text))
        self.review_button.setVisible(reviewable)

    def show(self, text: str, timeout_ms: int = 0) -> None:
        """Show the worker's status line; an image run's line gets the run's progress (several images)."""
        self._last = text
        self.bar.showMessage(text + self.run_suffix() if text.startswith(RUNNING) else text, timeout_ms)

    def run_suffix(self) -> str:
        """' — 18/200, about 2 min left' while more than one image runs; '' otherwise."""
        done, total, left = self.runs
        if total <= 1 or done >= total:
            return ""
        eta = time_left(left)
        return f" — {done + 1}/{total}" + (f", {eta}" if eta else "")

    def set_runs(self, done: int, total: int, seconds_left: float) -> None:
        """How far the current run of images has got (`ImageList.run_progress`): the bar fills with it."""
        self.runs = (done, total, seconds_left)
        if total > 1 and done < total and self.busy:
            self.busy_bar.setRange(0, total)
            self.busy_bar.setValue(done)
            if self._last.startswith(RUNNING):
                self.bar.showMessage(self._last + self.run_suffix())

    def note(self, text: str, timeout_ms: int = NOTE_MS) -> None:
        """Something the user should read (e.g. an adjusted input size): shown now and, for `timeout_ms`, in
        place of the idle message, so the worker's status lines do not wipe it out."""
        self._note = text
        self.bar.showMessage(text)
        self._note_timer.start(timeout_ms)

    def _tip_if_cut(self, text: str) -> None:
        """A message longer than the bar's room beside its permanent widgets (two lines of a `WrappingStatusBar`,
        one of a plain bar) is cut at the edge ('… or pick one in t' at 1280 px): hovering the bar then shows it
        whole."""
        bar = self.bar
        if isinstance(bar, WrappingStatusBar):
            cut = bool(text) and bar.lines_needed(text) > MESSAGE_LINES
        else:
            room = bar.width() - sum(w.width() + 8 for w in self._permanent if w.isVisible()) - 16
            cut = bool(text) and bar.fontMetrics().horizontalAdvance(text) > room
        bar.setToolTip(text if cut else "")

    def withdraw(self, text: str) -> None:
        """Take back the note `text` (if it is the one standing) once it no longer holds: the idle message
        returns at once instead of the note going on saying what is no longer so."""
        if self._note != text or not self._note_timer.isActive():
            return
        self._note_timer.stop()
        if not self.busy and self.bar.currentMessage() == text:
            self.bar.showMessage(self.ready_message)

    def idle_message(self) -> str:
        """What the bar says when nothing runs: a standing note, else `ready_message`."""
        return self._note if self._note_timer.isActive() else self.ready_message

    def set_ready_message(self, text: str) -> None:
        """What the status bar says whenever nothing is running (shown now when idle)."""
        self.ready_message = text
        if not self.busy:
            self.bar.showMessage(self.idle_message())

    def show_stuck(self, text: str) -> None:
        """The user's code has run too long (`Session.stuck`): say so, with Stop waiting; '' hides it again."""
        self.stop_button.setVisible(bool(text))
        if text:
            self.bar.showMessage(f"{text} — Stop waiting gives up on it and loads the model again")

    def set_busy(self, busy: bool) -> None:
        self.busy = busy
        self.busy_bar.setVisible(busy)
        if not busy:
            self.cancel_button.setVisible(False)
            self.stop_button.setVisible(False)
            self.busy_bar.setRange(0, 0)
            self.bar.showMessage(self.idle_message())

    def _note_expired(self) -> None:
        if not self.busy and self.bar.currentMessage() == self._note:
            self.bar.showMessage(self.ready_message)

    def show_progress(self, text: str, fraction: float) -> None:
        """A determinate bar for a fraction in [0, 1]; a busy indicator for -1 (size unknown). A download gets
        a Cancel button."""
        self.bar.showMessage(text)
        self.cancel_button.setVisible(text.startswith("Downloading"))
        if fraction < 0:
            self.busy_bar.setRange(0, 0)
        else:
            self.busy_bar.setRange(0, PROGRESS_STEPS)
            self.busy_bar.setValue(int(round(fraction * PROGRESS_STEPS)))
