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
