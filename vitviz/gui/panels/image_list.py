"""The image list dock: thumbnails, file names and the model's top-5 predictions of the listed images.

Built from the part it shows (the image list) and a look-up of the cached results, it lists what the image list
adds, shows each image's progress (running, top-5, failed) and keeps the current image selected and in view. What
the user asks of it, it asks as signals the window connects to the session: the selected image made current
(`current_requested`), images removed (`remove_requested`: Delete, the context menu's remove, remove the failed
ones, clear). Thumbnails are decoded off the GUI thread at thumbnail size (`thumbnails.ThumbnailLoader`),
so a folder of large photos or one 12000 × 9000 scan never stalls the window.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

from PySide6.QtCore import QPoint, QSize, Qt, Signal
from PySide6.QtGui import QAction, QColor, QIcon, QImage, QKeySequence, QPixmap
from PySide6.QtWidgets import QAbstractItemView, QListWidget, QListWidgetItem, QMenu, QVBoxLayout, QWidget

from vitviz.core.analyses.maps import ResultMaps
from vitviz.gui.images import ImageList
from vitviz.gui.panels.base import failure_reason, shortened
from vitviz.gui.signals import wire
from vitviz.gui.thumbnails import THUMB, ThumbnailLoader

PATH_ROLE = Qt.ItemDataRole.UserRole
PLACEHOLDER = "#5f6368"


def _blank(color: str = PLACEHOLDER) -> QIcon:
    pixmap = QPixmap(THUMB, THUMB)
    pixmap.fill(QColor(color))
    return QIcon(pixmap)


class ImageListPanel(QWidget):
    """A list of the image list's images (`images`); `result` looks up an image's cached result (None: none yet).

    Signals:
        current_requested(path): the user selected that image (the window makes it current).
        remove_requested(paths): the user asked to remove those images (the window removes them).

    Attributes:
        remove_action, remove_failed_action, clear_action: what the context menu (and the File menu) offer;
            Delete removes the selected images while the list has the focus.
    """

    current_requested = Signal(str)
    remove_requested = Signal(list)

    def __init__(self, images: ImageList, result: Callable[[str], ResultMaps | None],
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("imageListPanel")
        self.images, self.result = images, result
        self.list = QListWidget()
        self.list.setObjectName("imageList")
        self.list.setIconSize(QSize(THUMB, THUMB))
        self.list.setSelectionMode(QAbstractItemView.SelectionMode.ExtendedSelection)
        self.list.setWordWrap(True)
        self.list.setUniformItemSizes(False)
        self.list.setToolTip("Drop images or folders on the window to add them; Delete removes the selected ones "
                             "(right-click for more)")
        self.list.currentItemChanged.connect(self._on_current_item)
        self.list.itemSelectionChanged.connect(self.update_actions)
        self.list.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.list.customContextMenuRequested.connect(self._context_menu)
        self._placeholder = _blank()
        self._items: dict[str, QListWidgetItem] = {}     # path -> its item (a click looks items up, never scans)
        self._shown: dict[str, tuple[Any, ...]] = {}     # path -> (clean result, intervened probabilities, what) shown
        self.runs: Any = None                            # the interventions whose runs it shows (`show_intervened`)
        self._make_actions()
        self.thumbnails = ThumbnailLoader(self)
        self.thumbnails.ready.connect(self._on_thumbnail)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.list)
        wire(images, images_added=self.add_paths, images_removed=self.remove_paths,
             current_changed=self._on_current_changed, run_started=self.set_pending,
             result_ready=self._on_result_ready, run_failed=self._on_run_failed)
        self.add_paths(images.paths)

    def _make_actions(self) -> None:
        self.remove_action = QAction("&Remove from the list", self)
        self.remove_action.setObjectName("remove_images")
        self.remove_action.setShortcut(QKeySequence(QKeySequence.StandardKey.Delete))
        self.remove_action.setShortcutContext(Qt.ShortcutContext.WidgetWithChildrenShortcut)
        self.remove_action.setStatusTip("Remove the selected images from the list (the files stay)")
        self.remove_action.triggered.connect(lambda _checked=False: self.remove_selected())
        self.remove_failed_action = QAction("Remove &failed images", self)
        self.remove_failed_action.setObjectName("remove_failed_images")
        self.remove_failed_action.setStatusTip("Remove every image that could not be run")
        self.remove_failed_action.triggered.connect(
            lambda _checked=False: self.remove_requested.emit(self.images.failed_paths()))
        self.clear_action = QAction("&Clear the list", self)
        self.clear_action.setObjectName("clear_images")
        self.clear_action.setStatusTip("Remove every image from the list (the files stay)")
        self.clear_action.triggered.connect(lambda _checked=False: self.remove_requested.emit(list(self.images.paths)))
        self.list.addAction(self.remove_action)        # Delete works while the list has the focus
        self.update_actions()

    def update_actions(self) -> None:
        """Enable what applies now (and count the failed images)."""
        failed = sum(1 for p in self.images.paths if p in self.images.failed)
        self.remove_action.setEnabled(bool(self.list.selectedItems()))
        self.remove_failed_action.setEnabled(failed > 0)
        self.remove_failed_action.setText(f"Remove &failed images ({failed})" if failed else "Remove &failed images")
        self.clear_action.setEnabled(self.list.count() > 0)

    def paths(self) -> list[str]:
        return [self.list.item(i).data(PATH_ROLE) for i in range(self.list.count())]

    def add_paths(self, paths: list[str]) -> None:
        """Append items for images not already listed; their thumbnails follow from the loader."""
        known = set(self.paths())
        for path in dict.fromkeys(paths):
            if path in known:
                continue
            item = QListWidgetItem(self._placeholder, Path(path).name)
            item.setData(PATH_ROLE, path)
            item.setToolTip(path)
            self.list.addItem(item)
            self._items[path] = item
            if os.path.isfile(path):  # regular files only: a FIFO or device would block a decoder for good
                self.thumbnails.request(path)
        self._on_current_changed(None)
        self.update_actions()

    def remove_paths(self, paths: list[str]) -> None:
        """Take the items of removed images out of the list (the image list has removed them)."""
        gone = set(paths)
        for i in reversed(range(self.list.count())):
            if self.list.item(i).data(PATH_ROLE) in gone:
                self.list.takeItem(i)
        for path in gone:
            self._items.pop(path, None)
            self._shown.pop(path, None)
        self._on_current_changed(None)
        self.update_actions()

    def remove_selected(self) -> None:
        """Ask to remove the selected images (the list follows the image list's `images_removed`)."""
        self.remove_requested.emit([item.data(PATH_ROLE) for item in self.list.selectedItems()])

    def current_path(self) -> str:
        item = self.list.currentItem()
        return item.data(PATH_ROLE) if item is not None else ""

    def select(self, path: str) -> None:
        """Make `path` the selected item and scroll it into view."""
        item = self._item(path)
        if item is not None:
            self.list.setCurrentItem(item)
            self.list.scrollToItem(item, QAbstractItemView.ScrollHint.EnsureVisible)

    def step(self, delta: int) -> None:
        """Select the next (delta=1) or previous (delta=-1) image, wrapping around."""
        n = self.list.count()
        if n:
            self.list.setCurrentRow((max(0, self.list.currentRow()) + delta) % n)
            self.list.scrollToItem(self.list.currentItem())

    def set_predictions(self, path: str, top: list[tuple[int, str, float]], after: Any = None, what: str = "") -> None:
        """Show top-k (index, label, probability) under the file name; nothing for a headless model. With `after`
        (every class's probability in the intervened run, `vitviz.gui.interventions`) each line is the clean
        probability -> the intervened one (Δ in points), in amber, and the tooltip says what was done."""
        item = self._item(path)
        if item is None:
            return
        if after is None:
            lines = [f"{p * 100:5.1f}%  {label}" for _i, label, p in top]
        else:
            lines = [f"{p * 100:4.1f}→{after[i] * 100:4.1f}% ({(after[i] - p) * 100:+.1f})  {label}"
                     for i, label, p in top]
        text = "\n".join([Path(path).name] + lines)
        if item.text() != text:       # a new text lays the list out again
            item.setText(text)
        head = f"clean → {what} (Δ in points)\n" if after is not None else ""
        item.setToolTip(path + ("\n\n" + head + "\n".join(lines) if top else "\n\n(no classifier head)"))
        item.setForeground(QColor("#ffb000") if after is not None and top else QColor())

    def set_pending(self, path: str) -> None:
        self._shown.pop(path, None)
        item = self._item(path)
        if item is not None:
            item.setText(Path(path).name + "\nrunning…")

    def set_failed(self, path: str, summary: str) -> None:
        self._shown.pop(path, None)
        item = self._item(path)
        if item is not None:
            item.setText(Path(path).name + "\nfailed: " + shortened(failure_reason(path, summary), 70))
            item.setToolTip(path + "\n\n" + summary)
            item.setForeground(QColor("#d93025"))
        self.update_actions()

    def top_text(self, path: str) -> str:
        item = self._item(path)
        return item.text() if item is not None else ""

    def icon_size(self, path: str) -> QSize:
        """The size of an item's thumbnail as shown now (the placeholder's until the loader has answered)."""
        item = self._item(path)
        return item.icon().availableSizes()[0] if item is not None and item.icon().availableSizes() else QSize()

    def _item(self, path: str) -> QListWidgetItem | None:
        return self._items.get(path)

    def _on_thumbnail(self, path: str, image: QImage) -> None:
        item = self._item(path)
        if item is not None:
            item.setIcon(QIcon(QPixmap.fromImage(image)) if not image.isNull() else _blank())

    def _on_current_item(self, current: QListWidgetItem | None, _previous: object) -> None:
        self.current_requested.emit(current.data(PATH_ROLE) if current is not None else "")
        self.update_actions()

    def _on_current_changed(self, _maps: object) -> None:
        """Select the current image and show it (the user's own selection comes back here unchanged)."""
        if self.current_path() != self.images.current:
            self.select(self.images.current)

    def _on_result_ready(self, path: str) -> None:
        maps = self.result(path)
        if maps is not None:
            self._shown.pop(path, None)
            self.set_predictions(path, maps.result.top_k(5))

    def show_intervened(self, runs: Any = None) -> None:
        """Every listed image's top-5 beside its intervened run where that has answered (`runs.probabilities`,
        `runs.describe()`: `vitviz.gui.interventions.InterventionSession`; `self.runs` when not given), the clean
        top-5 alone elsewhere. An image whose clean result, intervened run and steps are those shown is not
        touched: a click re-makes the text of the images whose runs changed only."""
        runs = runs if runs is not None else self.runs
        what = runs.describe()
        for path in self._items:
            maps = self.result(path)
            if maps is None:
                continue
            after = runs.probabilities(path)
            key = (maps.result, after, what if after is not None else "")
            shown = self._shown.get(path)
            if shown is None or shown[0] is not key[0] or shown[1] is not key[1] or shown[2] != key[2]:
                self._shown[path] = key
                self.set_predictions(path, maps.result.top_k(5), after, what)

    def _on_run_failed(self, path: str, summary: str, _details: str) -> None:
        self.set_failed(path, summary)

    def context_menu(self) -> QMenu:
        """The list's context menu (built fresh, so its entries say what applies now)."""
        self.update_actions()
        menu = QMenu(self)
        menu.addActions([self.remove_action, self.remove_failed_action])
        menu.addSeparator()
        menu.addAction(self.clear_action)
        return menu

    def _context_menu(self, pos: QPoint) -> None:
        menu = self.context_menu()
        menu.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose, True)
        menu.popup(self.list.viewport().mapToGlobal(pos))
