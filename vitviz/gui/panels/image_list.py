"""The image list dock: thumbnails, file names and the model's top-5 predictions of the session's images.

It lists what the session adds, shows each image's progress (running, top-5, failed) and makes the selected one the
session's current image.
"""
from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QColor, QIcon, QImageReader, QPixmap
from PySide6.QtWidgets import QAbstractItemView, QListWidget, QListWidgetItem, QVBoxLayout, QWidget

from vitviz.gui.session import Session

THUMB = 72
PATH_ROLE = Qt.ItemDataRole.UserRole


class ImageListPanel(QWidget):
    """A list of the session's images; selecting one makes it the current image."""

    def __init__(self, session: Session, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("imageListPanel")
        self.session = session
        self.list = QListWidget()
        self.list.setObjectName("imageList")
        self.list.setIconSize(QSize(THUMB, THUMB))
        self.list.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.list.setWordWrap(True)
        self.list.setUniformItemSizes(False)
        self.list.setToolTip("Drop images or folders on the window to add them")
        self.list.currentItemChanged.connect(self._on_current_item)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.list)
        session.images_added.connect(self.add_paths)
        session.current_changed.connect(self._on_current_changed)
        session.run_started.connect(self.set_pending)
        session.result_ready.connect(self._on_result_ready)
        session.run_failed.connect(self._on_run_failed)
        self.add_paths(session.images)

    def paths(self) -> list[str]:
        return [self.list.item(i).data(PATH_ROLE) for i in range(self.list.count())]

    def add_paths(self, paths: list[str]) -> None:
        """Append items for images not already listed."""
        known = set(self.paths())
        for path in dict.fromkeys(paths):
            if path in known:
                continue
            item = QListWidgetItem(_thumbnail(path), Path(path).name)
            item.setData(PATH_ROLE, path)
            item.setToolTip(path)
            self.list.addItem(item)
        self._on_current_changed(None)

    def current_path(self) -> str:
        item = self.list.currentItem()
        return item.data(PATH_ROLE) if item is not None else ""

    def select(self, path: str) -> None:
        item = self._item(path)
        if item is not None:
            self.list.setCurrentItem(item)

    def step(self, delta: int) -> None:
        """Select the next (delta=1) or previous (delta=-1) image, wrapping around."""
        n = self.list.count()
        if n:
            self.list.setCurrentRow((max(0, self.list.currentRow()) + delta) % n)

    def set_predictions(self, path: str, top: list[tuple[int, str, float]]) -> None:
        """Show top-k (index, label, probability) under the file name; nothing for a headless model."""
        item = self._item(path)
        if item is None:
            return
        lines = [Path(path).name] + [f"{p * 100:5.1f}%  {label}" for _i, label, p in top]
        item.setText("\n".join(lines))
        item.setToolTip(path + ("\n\n" + "\n".join(lines[1:]) if top else "\n\n(no classifier head)"))
        item.setForeground(QColor())

    def set_pending(self, path: str) -> None:
        item = self._item(path)
        if item is not None:
            item.setText(Path(path).name + "\nrunning…")

    def set_failed(self, path: str, summary: str) -> None:
        item = self._item(path)
        if item is not None:
            item.setText(Path(path).name + "\nfailed: " + summary[:60])
            item.setToolTip(path + "\n\n" + summary)
            item.setForeground(QColor("#d93025"))

    def top_text(self, path: str) -> str:
        item = self._item(path)
        return item.text() if item is not None else ""

    def _item(self, path: str) -> QListWidgetItem | None:
        for i in range(self.list.count()):
            if self.list.item(i).data(PATH_ROLE) == path:
                return self.list.item(i)
        return None

    def _on_current_item(self, current: QListWidgetItem | None, _previous: object) -> None:
        self.session.set_current(current.data(PATH_ROLE) if current is not None else "")

    def _on_current_changed(self, _maps: object) -> None:
        """Select the session's current image (the user's own selection comes back here unchanged)."""
        if self.current_path() != self.session.current:
            self.select(self.session.current)

    def _on_result_ready(self, path: str) -> None:
        maps = self.session.result(path)
        if maps is not None:
            self.set_predictions(path, maps.result.top_k(5))

    def _on_run_failed(self, path: str, summary: str, _details: str) -> None:
        self.set_failed(path, summary)


def _thumbnail(path: str) -> QIcon:
    """A small icon read straight at thumbnail size (cheap even for large photos); blank when unreadable."""
    reader = QImageReader(path)
    reader.setAutoTransform(True)
    size = reader.size()
    if size.isValid() and size.width() > 0 and size.height() > 0:
        reader.setScaledSize(size.scaled(THUMB, THUMB, Qt.AspectRatioMode.KeepAspectRatio))
    image = reader.read()
    if image.isNull():
        blank = QPixmap(THUMB, THUMB)
        blank.fill(QColor("#5f6368"))
        return QIcon(blank)
    return QIcon(QPixmap.fromImage(image))
