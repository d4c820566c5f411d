"""pyqtgraph's global options, set once on first import by every module that draws with pyqtgraph."""
from __future__ import annotations

import pyqtgraph as pg

pg.setConfigOptions(imageAxisOrder="row-major")
