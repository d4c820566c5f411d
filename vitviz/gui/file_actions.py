"""The File menu's actions, composed into the window: the open dialogs and the exports of the current view.

Each `*_dialog` method only asks the user; the `export_*_to` methods do the work and are what tests call. Failures
go to the error callback the window gives; a chosen checkpoint and a finished export are signals.
"""
from __future__ import annotations

import traceback
from pathlib import Path
from typing import Callable, TypeVar

from PySide6.QtCore import QObject, QSettings, Signal
from PySide6.QtWidgets import QFileDialog, QInputDialog, QWidget

from vitviz.core.formats import dialog_filter
from vitviz.core.maps import ResultMaps
from vitviz.gui import dialogs, exporting, settings as st
from vitviz.gui.session import Session
from vitviz.gui.state import ViewState

T = TypeVar("T")
ErrorCallback = Callable[[str, str, str], None]     # title, summary, details

PNG_STYLES = {
    "Overlay with colorbar (*.png)": (False, True),
    "Overlay (*.png)": (False, False),
    "Heatmap with colorbar (*.png)": (True, True),
    "Heatmap (*.png)": (True, False),
}
IMAGE_FILTER = "Images (*.png *.jpg *.jpeg *.bmp *.gif *.tif *.tiff *.webp *.ppm *.pgm);;All files (*)"
MODEL_FILTER = dialog_filter()


class FileActions(QObject):
    """Open dialogs and exports over `parent`, reading the session's current result and the view state.

    Signals:
        model_chosen(path): a checkpoint was picked in the open dialog (the window loads it).
        exported(message): an export finished; the message says where it went.
    """

    model_chosen = Signal(str)
    exported = Signal(str)

    def __init__(self, session: Session, state: ViewState, settings: QSettings, parent: QWidget,
                 report_error: ErrorCallback) -> None:
        super().__init__(parent)
        self.session, self.state, self.settings = session, state, settings
        self.parent_widget, self.report_error = parent, report_error

    def open_model_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self.parent_widget, "Open model",
                                              st.last_folder(self.settings, "model"), MODEL_FILTER)
        if path:
            st.set_last_folder(self.settings, "model", str(Path(path).parent))
            self.model_chosen.emit(path)

    def open_images_dialog(self) -> None:
        paths, _ = QFileDialog.getOpenFileNames(self.parent_widget, "Open images",
                                                st.last_folder(self.settings, "images"), IMAGE_FILTER)
        if paths:
            st.set_last_folder(self.settings, "images", str(Path(paths[0]).parent))
            self.session.add_images(paths)

    def _current_maps(self) -> ResultMaps | None:
        maps = self.session.result(self.session.current)
        if maps is None:
            self.report_error("Nothing to export", "Load a model and select an image that has run first.", "")
        return maps

    def _export_name(self, maps: ResultMaps, suffix: str) -> str:
        folder = st.last_folder(self.settings, "export")
        name = f"{exporting.image_stem(maps.result.source)}_{exporting.map_label(self.state)}{suffix}"
        return str(Path(folder) / name) if folder else name

    def export_png_dialog(self) -> None:
        maps = self._current_maps()
        if maps is None:
            return
        path, chosen = QFileDialog.getSaveFileName(self.parent_widget, "Export current view",
                                                   self._export_name(maps, ".png"), ";;".join(PNG_STYLES))
        if path:   # the file dialog has already asked before replacing a file
            heatmap_only, colorbar = PNG_STYLES.get(chosen, (False, True))
            self.export_png_to(Path(path), heatmap_only, colorbar, overwrite=True)

    def export_png_to(self, path: Path, heatmap_only: bool = False, colorbar: bool = True,
                      overwrite: bool = False) -> Path | None:
        """Write the current view as a PNG at the resolution of the image the model saw."""
        maps = self._current_maps()
        if maps is None:
            return None
        path = path if path.suffix.lower() == ".png" else path.with_suffix(".png")
        return self._guarded("Could not export PNG", lambda: exporting.export_png(
            maps, self.state, path, heatmap_only, colorbar, overwrite), path)

    def export_all_dialog(self) -> None:
        maps = self._current_maps()
        if maps is None:
            return
        folder = QFileDialog.getExistingDirectory(self.parent_widget, "Export every layer × head map into",
                                                  st.last_folder(self.settings, "export"))
        if not folder:
            return
        style, ok = QInputDialog.getItem(self.parent_widget, "Export all maps", "Style",
                                         [s[:-8] for s in PNG_STYLES], 1, False)
        if ok:
            heatmap_only, colorbar = PNG_STYLES[style + " (*.png)"]
            self.export_all_to(Path(folder), heatmap_only, colorbar)

    def export_all_to(self, folder: Path, heatmap_only: bool = False, colorbar: bool = False,
                      overwrite: bool | None = None) -> list[Path]:
        """Write every layer × head map; asks before replacing files unless `overwrite` is given."""
        maps = self._current_maps()
        if maps is None:
            return []
        if overwrite is None:
            targets = [p for p, _l, _h in exporting.all_map_paths(maps, self.state, folder)]
            if not dialogs.confirm_overwrite(self.parent_widget, targets):
                return []
            overwrite = True
        written = self._guarded("Could not export maps", lambda: exporting.export_all(
            maps, self.state, folder, heatmap_only, colorbar, overwrite), folder / "x")
        return written or []

    def export_npz_dialog(self) -> None:
        maps = self._current_maps()
        if maps is None:
            return
        path, _ = QFileDialog.getSaveFileName(self.parent_widget, "Export raw arrays", self._export_name(maps, ".npz"),
                                              "NumPy arrays (*.npz)")
        if path:
            self.export_npz_to(Path(path), overwrite=True)

    def export_npz_to(self, path: Path, overwrite: bool = False) -> Path | None:
        """Write attentions, logits, input, image and spec (JSON) of the current image."""
        maps = self._current_maps()
        if maps is None:
            return None
        path = path if path.suffix.lower() == ".npz" else path.with_suffix(".npz")
        return self._guarded("Could not export arrays", lambda: exporting.export_npz(maps, path, overwrite), path)

    def _guarded(self, title: str, work: Callable[[], T], where: Path) -> T | None:
        """Run an export, turning any failure into the error dialog; remember the folder on success."""
        try:
            out = work()
        except Exception as exc:  # noqa: BLE001 - the GUI boundary
            self.report_error(title, f"{type(exc).__name__}: {exc}", traceback.format_exc())
            return None
        st.set_last_folder(self.settings, "export", str(where.parent))
        self.exported.emit(f"Exported to {where.parent if isinstance(out, list) else out}")
        return out
