"""An `ImageItem` whose rendered picture is kept in a 32-bit format Qt's raster painter scales quickly.

pyqtgraph hands Qt the image as it made it: RGB888 for an RGB photo, Indexed8 for a map through a colour table.
Drawn stretched over a view (a 64 × 64 photo over 470 × 470 screen pixels), Qt's raster engine reads such formats
through its slow generic fetch, pixel by pixel, on every paint: about 1.5–2.5 ms per item here, most of the image
panel's paint in an ablate click (issue 37). The same picture converted once, when it is rendered, to 32 bits
(RGBX8888 without alpha, ARGB32 with it: both lossless) is drawn 2–4 times faster through the same sampling, so
the screen pixels are the same (tests/gui/test_panels_image.py compares them). The ARGB32_Premultiplied format
would be faster still, but Qt scales it through another routine that rounds pixel edges differently.
"""
from __future__ import annotations

import pyqtgraph as pg
from PySide6.QtGui import QImage

FAST = (QImage.Format.Format_RGBX8888, QImage.Format.Format_ARGB32)
EIGHT_BIT = (QImage.Format.Format_RGB888, QImage.Format.Format_Indexed8, QImage.Format.Format_Grayscale8,
             QImage.Format.Format_RGBA8888)      # what pyqtgraph makes of 8-bit data: converted without loss


class ImageItem(pg.ImageItem):
    """`pg.ImageItem` with its 8-bit picture converted to a 32-bit format when it is rendered (once per new
    image, levels or colour table; not on paints that follow). Deeper pictures (16-bit) are left as they are."""

    def render(self) -> None:
        super().render()
        qimage = self.qimage
        if qimage is not None and qimage.format() in EIGHT_BIT:
            self.qimage = qimage.convertToFormat(FAST[qimage.hasAlphaChannel()])
