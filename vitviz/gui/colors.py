"""Colormap lookup tables for the window, taken from `vitviz.core.colormaps` so screen and export agree."""
from __future__ import annotations

from functools import lru_cache

import numpy as np
import pyqtgraph as pg


@lru_cache(maxsize=None)
def lut(name: str) -> np.ndarray:
    """(256, 3) uint8 lookup table of a colormap named in `vitviz.gui.state.COLORMAPS`."""
    from vitviz.core import colormaps

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
    """Short labels for evenly spaced ticks: plain decimals for everyday magnitudes ('0.02', '250'), else
    scientific ('2e-4', '1.5e5'), so they fit beside a narrow colorbar."""
    if not ticks:
        return []
    step = abs(ticks[1] - ticks[0]) if len(ticks) > 1 else abs(ticks[0]) or 1.0
    big = max(abs(t) for t in ticks)
    if big == 0 or 1e-3 <= big < 1e4 and step >= 1e-3:
        decimals = max(0, -int(np.floor(np.log10(step) + 1e-9)))
        return ["0" if t == 0 else f"{t:.{decimals}f}" for t in ticks]
    digits = min(8, max(2, int(np.ceil(np.log10(big / step))) + 1)) if step > 0 else 2
    out = []
    for t in ticks:
        if t == 0:
            out.append("0")
            continue
        exp = int(np.floor(np.log10(abs(t)) + 1e-9))
        mant = f"{t / 10.0 ** exp:.{digits}g}"
        if mant.lstrip("-") == "10":
            mant, exp = mant.replace("10", "1"), exp + 1
        out.append(f"{mant}e{exp}")
    return out


def set_colorbar_levels(colorbar: pg.ColorBarItem, levels: tuple[float, float]) -> None:
    """Set a colorbar's range with a few round ticks spread over the whole bar, labelled so they fit beside it
    (pyqtgraph's own labels for small ranges such as 0-0.000728 are too wide for the bar's axis, and it drops
    every label but the bottom few)."""
    lo, hi = float(levels[0]), float(levels[1])
    colorbar.axis.enableAutoSIPrefix(False)     # the labels carry their own magnitude; no '(x0.001)' on the title
    colorbar.setLevels((lo, hi))
    ticks = nice_ticks(lo, hi)
    colorbar.axis.setTicks([list(zip(ticks, tick_labels(ticks))), []])
