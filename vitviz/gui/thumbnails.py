"""Thumbnails of the image list, decoded off the GUI thread at thumbnail size.

JPEG decodes straight to a reduced size (`QImageReader.setScaledSize`), which is cheap even for 100-megapixel
photos. Formats that must be decoded whole first (PNG, TIFF, ...) can take seconds for a 12000 × 9000 image and
exceed Qt's image allocation limit (256 MB), which Qt refuses with a warning; the loader raises the limit for such
an image up to what vitviz accepts anyway (`vitviz.core.running.images.MAX_PIXELS`) and decodes it in a thread of its own
pool, so the list shows a placeholder until the thumbnail is ready and the window never waits.
"""
from __future__ import annotations

import math
from itertools import count

from PySide6.QtCore import QObject, QRunnable, QSize, Qt, QThreadPool, Signal
from PySide6.QtGui import QImage, QImageIOHandler, QImageReader

from vitviz.core.running.images import MAX_PIXELS

THUMB = 72
DECODE_THREADS = 2


class _Relay(QObject):
    """Carries finished thumbnails from the pool's threads to the GUI thread (one for the whole process, so a
    decode that outlives its list never emits on a deleted object)."""

    done = Signal(int, str, QImage)     # loader id, path, thumbnail (null: unreadable)


_relay: _Relay | None = None
_pool: QThreadPool | None = None
_ids = count(1)


def _shared() -> tuple[_Relay, QThreadPool]:
    global _relay, _pool
    if _relay is None or _pool is None:
        _relay, _pool = _Relay(), QThreadPool()
        _pool.setMaxThreadCount(DECODE_THREADS)
    return _relay, _pool


def read_thumbnail(path: str, size: int = THUMB) -> QImage:
    """The image at `path` scaled to fit `size` × `size` (aspect kept, upright), or a null image when it cannot be
    read. Safe in any thread."""
    reader = QImageReader(path)
    reader.setAutoTransform(True)
    full = reader.size()
    if full.isValid() and full.width() > 0 and full.height() > 0:
        pixels = full.width() * full.height()
        if pixels > MAX_PIXELS:
            return QImage()
        if not reader.supportsOption(QImageIOHandler.ImageOption.ScaledSize):
            needed = math.ceil(pixels * 4 / 2 ** 20) + 1          # MB for the whole decoded image (32-bit)
            if 0 < QImageReader.allocationLimit() < needed:
                QImageReader.setAllocationLimit(needed)
        reader.setScaledSize(full.scaled(size, size, Qt.AspectRatioMode.KeepAspectRatio))
    image = reader.read()
    return image if image.isNull() or image.width() <= size and image.height() <= size else image.scaled(
        QSize(size, size), Qt.AspectRatioMode.KeepAspectRatio, Qt.TransformationMode.SmoothTransformation)


class _Decode(QRunnable):
    def __init__(self, relay: _Relay, loader_id: int, path: str) -> None:
        super().__init__()
        self.relay, self.loader_id, self.path = relay, loader_id, path

    def run(self) -> None:
        self.relay.done.emit(self.loader_id, self.path, read_thumbnail(self.path))


class ThumbnailLoader(QObject):
    """Decodes thumbnails in a thread pool and answers each `request(path)` once on `ready(path, image)` (in the
    GUI thread; a null image when the file cannot be read)."""

    ready = Signal(str, QImage)

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._id = next(_ids)
        self._relay, self._pool = _shared()
        self._relay.done.connect(self._on_done)
        self.pending: set[str] = set()

    def request(self, path: str) -> None:
        if path not in self.pending:
            self.pending.add(path)
            self._pool.start(_Decode(self._relay, self._id, path))

    def wait(self, timeout_ms: int = 30000) -> bool:
        """Wait until the pool is idle (tests and the screenshot script); True when it is."""
        return self._pool.waitForDone(timeout_ms)

    def _on_done(self, loader_id: int, path: str, image: QImage) -> None:
        if loader_id == self._id and path in self.pending:
            self.pending.discard(path)
            self.ready.emit(path, image)
