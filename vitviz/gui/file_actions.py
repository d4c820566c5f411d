"""File and Models menu actions of the main window: open dialogs, the demo, models picked from a menu, exports.

Each `*_dialog` method only asks the user; the `export_*_to` methods do the work and are what tests call.
"""
from __future__ import annotations

import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any

from PySide6.QtWidgets import QFileDialog, QInputDialog

from vitviz.core.formats import dialog_filter
from vitviz.gui import bundled, dialogs, exporting, settings as st
from vitviz.core.maps import ResultMaps

if TYPE_CHECKING:
    from vitviz.gui.window import MainWindow

PNG_STYLES = {
    "Overlay with colorbar (*.png)": (False, True),
    "Overlay (*.png)": (False, False),
    "Heatmap with colorbar (*.png)": (True, True),
    "Heatmap (*.png)": (True, False),
}
IMAGE_FILTER = "Images (*.png *.jpg *.jpeg *.bmp *.gif *.tif *.tiff *.webp *.ppm *.pgm);;All files (*)"
MODEL_FILTER = dialog_filter()


class FileActionsMixin:
    """Mixed into `MainWindow`; uses its session, state, settings and `show_error`."""

    def open_model_dialog(self: "MainWindow") -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Open model", st.last_folder(self.settings, "model"),
                                              MODEL_FILTER)
        if path:
            st.set_last_folder(self.settings, "model", str(Path(path).parent))
            self.load_model(path)

    def load_demo(self: "MainWindow", images: bool = True, instead_of_model: bool = False) -> bool:
        """Load the bundled demo model, on the demo images (added to the list) with `images`; False, with a
        status-bar hint, when this install has no demo model. `instead_of_model`: images were named without a
        model, and the status bar says that the demo runs them and how to open one's own."""
        demo = bundled.demo_model()
        if demo is None:
            self.status.set_ready_message(bundled.missing_demo_hint())
            return False
        self.demo_instead_of_model = instead_of_model
        self.load_model(demo)
        if images:
            self.add_images(bundled.images_for(demo))
        return True

    def choose_model(self: "MainWindow", path: str) -> None:
        """Load a model picked from a menu; into an empty image list, add the bundled images that suit it."""
        self.load_model(path)
        if not self.images.paths():
            self.add_images(bundled.images_for(path))

    def open_images_dialog(self: "MainWindow") -> None:
        paths, _ = QFileDialog.getOpenFileNames(self, "Open images", st.last_folder(self.settings, "images"),
                                                IMAGE_FILTER)
        if paths:
            st.set_last_folder(self.settings, "images", str(Path(paths[0]).parent))
            self.add_images(paths)

    def _current_maps(self: "MainWindow") -> ResultMaps | None:
        maps = self.session.result(self.session.current)
        if maps is None:
            self.show_error("Nothing to export", "Load a model and select an image that has run first.", "")
        return maps

    def _export_name(self: "MainWindow", maps: ResultMaps, suffix: str) -> str:
        folder = st.last_folder(self.settings, "export")
        name = f"{exporting.image_stem(maps.result.source)}_{exporting.map_label(self.state)}{suffix}"
        return str(Path(folder) / name) if folder else name

    def export_png_dialog(self: "MainWindow") -> None:
        maps = self._current_maps()
        if maps is None:
            return
        path, chosen = QFileDialog.getSaveFileName(self, "Export current view", self._export_name(maps, ".png"),
                                                   ";;".join(PNG_STYLES))
        if path:   # the file dialog has already asked before replacing a file
            heatmap_only, colorbar = PNG_STYLES.get(chosen, (False, True))
            self.export_png_to(Path(path), heatmap_only, colorbar, overwrite=True)

    def export_png_to(self: "MainWindow", path: Path, heatmap_only: bool = False, colorbar: bool = True,
                      overwrite: bool = False) -> Path | None:
        """Write the current view as a PNG at the resolution of the image the model saw."""
        maps = self._current_maps()
        if maps is None:
            return None
        path = path if path.suffix.lower() == ".png" else path.with_suffix(".png")
        return self._guarded("Could not export PNG", lambda: exporting.export_png(
            maps, self.state, path, heatmap_only, colorbar, overwrite), path)

    def export_all_dialog(self: "MainWindow") -> None:
        maps = self._current_maps()
        if maps is None:
            return
        folder = QFileDialog.getExistingDirectory(self, "Export every layer × head map into",
                                                  st.last_folder(self.settings, "export"))
        if not folder:
            return
        style, ok = QInputDialog.getItem(self, "Export all maps", "Style", [s[:-8] for s in PNG_STYLES], 1, False)
        if ok:
            heatmap_only, colorbar = PNG_STYLES[style + " (*.png)"]
            self.export_all_to(Path(folder), heatmap_only, colorbar)

    def export_all_to(self: "MainWindow", folder: Path, heatmap_only: bool = False, colorbar: bool = False,
                      overwrite: bool | None = None) -> list[Path]:
        """Write every layer × head map; asks before replacing files unless `overwrite` is given."""
        maps = self._current_maps()
        if maps is None:
            return []
        if overwrite is None:
            targets = [p for p, _l, _h in exporting.all_map_paths(maps, self.state, folder)]
            if not dialogs.confirm_overwrite(self, targets):
                return []
            overwrite = True
        written = self._guarded("Could not export maps", lambda: exporting.export_all(
            maps, self.state, folder, heatmap_only, colorbar, overwrite), folder / "x")
        return written or []

    def export_npz_dialog(self: "MainWindow") -> None:
        maps = self._current_maps()
        if maps is None:
            return
        path, _ = QFileDialog.getSaveFileName(self, "Export raw arrays", self._export_name(maps, ".npz"),
                                              "NumPy arrays (*.npz)")
        if path:
            self.export_npz_to(Path(path), overwrite=True)

    def export_npz_to(self: "MainWindow", path: Path, overwrite: bool = False) -> Path | None:
        """Write attentions, logits, input, image and spec (JSON) of the current image."""
        maps = self._current_maps()
        if maps is None:
            return None
        path = path if path.suffix.lower() == ".npz" else path.with_suffix(".npz")
        return self._guarded("Could not export arrays", lambda: exporting.export_npz(maps, path, overwrite), path)

    def _guarded(self: "MainWindow", title: str, work: Any, where: Path) -> Any:
        """Run an export, turning any failure into the error dialog; remember the folder on success."""
        try:
            out = work()
        except Exception as exc:  # noqa: BLE001 - the GUI boundary
            self.show_error(title, f"{type(exc).__name__}: {exc}", traceback.format_exc())
            return None
        st.set_last_folder(self.settings, "export", str(where.parent))
        self.statusBar().showMessage(f"Exported to {where.parent if isinstance(out, list) else out}", 8000)
        return out
