"""Colormap lookup tables for the window, taken from `vitviz.core.drawing.colormaps` so screen and export agree, and the
colorbars' ticks: round values in one number format, on an axis as wide as its labels and title need."""
from __future__ import annotations

import weakref
from functools import lru_cache, partial

import numpy as np
import pyqtgraph as pg
import shiboken6
from PySide6.QtCore import QRectF, Qt
from PySide6.QtGui import QFont, QFontMetricsF


@lru_cache(maxsize=None)
def lut(name: str) -> np.ndarray:
    """(256, 3) uint8 lookup table of a colormap named in `vitviz.gui.state.COLORMAPS`."""
    from vitviz.core.drawing import colormaps
    return np.ascontiguousarray(colormaps.colormap(name)[:, :3])


@lru_cache(maxsize=None)
def colormap(name: str) -> pg.ColorMap:
    """The same table as a pyqtgraph ColorMap (for the colorbar)."""
    table = lut(name)
    return pg.ColorMap(np.linspace(0.0, 1.0, len(table)), table, name=name)


def nice_ticks(lo: float, hi: float, count: int = 6) -> list[float]:
    """At most about `count` round values (1, 2 or 5 times a power of ten apart) from lo to hi."""
    span = hi - lo
    if not (np.isfinite(lo) and np.isfinite(hi)) or span <= 0:
        return [lo]
    raw = span / max(1, count - 1)
    power = 10.0 ** np.floor(np.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw * (1 - 1e-9))
    first = np.ceil(lo / step - 1e-9) * step
    return [0.0 if abs(v) < step * 1e-9 else float(v) for v in np.arange(first, hi + step * 1e-6, step)]


def tick_labels(ticks: list[float]) -> list[str]:
    """Short labels for evenly spaced ticks, in one format per bar: plain decimals with the same number of
    places for everyday magnitudes ('0.02', '250'), else one exponent for every label ('4.2e-3' ... '5.0e-3', never
    '5e-3' beside '0.00454'), so they fit beside a narrow colorbar. Zero is '0'."""
    if not ticks:
        return []
    step = abs(ticks[1] - ticks[0]) if len(ticks) > 1 else abs(ticks[0]) or 1.0
    big = max(abs(t) for t in ticks)
    if big == 0 or 1e-3 <= big < 1e4 and step >= 1e-3:
        decimals = max(0, -int(np.floor(np.log10(step) + 1e-9)))
        return ["0" if t == 0 else f"{t:.{decimals}f}" for t in ticks]
    exp = int(np.floor(np.log10(big) + 1e-9))
    decimals = min(8, max(0, exp - int(np.floor(np.log10(step) + 1e-9)))) if step > 0 else 1
    return ["0" if t == 0 else f"{t / 10.0 ** exp:.{decimals}f}e{exp}" for t in ticks]


def set_colorbar_levels(colorbar: pg.ColorBarItem, levels: tuple[float, float],
                        ticks: list[tuple[float, str]] | None = None) -> None:
    """Set a colorbar's range with a few round ticks spread over the whole bar, labelled so they fit beside it
    (pyqtgraph's own labels for small ranges such as 0-0.000728 are too wide for the bar's axis, and it drops
    every label but the bottom few), or with `ticks` (value, label) of the caller's; the bar's axis is made as
    wide as its labels and its title need, so the labels never run under the title."""
    lo, hi = float(levels[0]), float(levels[1])
    if colorbar.axis.autoSIPrefix:              # (set once: each call lays the axis's label out again)
        colorbar.axis.enableAutoSIPrefix(False)     # the labels carry their own magnitude; no '(x0.001)' on the title
    colorbar.setLevels((lo, hi))
    if ticks is None:
        values = nice_ticks(lo, hi)
        ticks = list(zip(values, tick_labels(values)))
    colorbar.axis.setTicks([ticks, []])
    fit_axis_width(colorbar.axis, [text for _v, text in ticks])


def fit_axis_width(axis: pg.AxisItem, labels: list[str]) -> None:
    """Make a vertical axis exactly as wide as its widest tick label, its ticks and its title need (a
    colorbar's axis is 45 px whatever its labels, and pyqtgraph widens an axis only after drawing it once)."""
    metrics = QFontMetricsF(axis.style.get("tickFont") or QFont())
    flags = int(Qt.AlignmentFlag.AlignCenter.value)
    widest = max((metrics.boundingRect(QRectF(0, 0, 100, 100), flags, text).width() for text in labels if text),
                 default=0.0)
    width = int(np.ceil(widest)) + 1
    if axis.style.get("autoExpandTextSpace") is not False or axis.style.get("tickTextWidth") != width:
        axis.setStyle(autoExpandTextSpace=False, tickTextWidth=width)   # (each call draws the axis anew)
    axis.setWidth(None)                         # from the style: ticks, the labels' width and the title
    if not getattr(axis, "_vitviz_refits", False):
        axis._vitviz_refits = True              # a hidden axis is sized 0 wide: size it again once shown
        axis.visibleChanged.connect(partial(_refit, weakref.ref(axis)))


def _refit(axis_ref: weakref.ref) -> None:
    """Size an axis again from its style (not while Qt deletes it: hiding the items it owns says 'visible')."""
    axis = axis_ref()
    if axis is not None and shiboken6.isValid(axis):
        axis.setStyle()
