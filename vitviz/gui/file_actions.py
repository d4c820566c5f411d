"""The File menu's actions, composed into the window: the open dialogs and the exports of the current view.

Each `*_dialog` method only asks the user; the `export_*_to` methods do the work and are what tests call. Failures
go to the error callback the window gives; a chosen checkpoint and a finished export are signals.
"""
from __future__ import annotations

import traceback
from pathlib import Path
from typing import Callable, TypeVar

from PySide6.QtCore import QObject, QSettings, Qt, Signal
from PySide6.QtWidgets import QApplication, QFileDialog, QInputDialog, QMessageBox, QWidget

from vitviz.batch.plan import output_name
from vitviz.core.formats import MODEL_FILE_SUFFIXES, MODEL_FOLDER_MARKERS
from vitviz.core.drawing.render import LARGE_PICTURE_PIXELS
from vitviz.core.running.images import IMAGE_EXTENSIONS, find_images
from vitviz.core.analyses.maps import ResultMaps
from vitviz.gui import dialogs, exporting, settings as st
from vitviz.gui.session import Session
from vitviz.gui.state import ViewState, map_kind

T = TypeVar("T")
ErrorCallback = Callable[[str, str, str], None]     # title, summary, details

PNG_STYLES = {
    "Overlay with colorbar (*.png)": (False, True),
    "Overlay (*.png)": (False, False),
    "Heatmap with colorbar (*.png)": (True, True),
    "Heatmap (*.png)": (True, False),
}
IMAGE_FILTER = f"Images ({' '.join('*' + e for e in sorted(IMAGE_EXTENSIONS))});;All files (*)"
# checkpoint files, and the files that mark a model folder (config.json: choosing it opens its folder)
MODEL_MARKER_FILES = tuple(m for m in MODEL_FOLDER_MARKERS if m.endswith(".json"))
MODEL_FILTER = (f"Checkpoints and model folders ({' '.join('*' + s for s in MODEL_FILE_SUFFIXES)} "
                f"{' '.join(MODEL_MARKER_FILES)});;All files (*)")
SECONDS_PER_MEGAPIXEL = 0.25          # drawing and writing one overlay, measured on a laptop-class CPU
PNG_BYTES_PER_PIXEL = 1.5             # a photo's overlay as PNG, roughly
ORIGINAL, INPUT = "original", "input"


def model_target(path: str) -> str:
    """What to load for a file chosen in the Open model dialog: a model folder's marker file (config.json)
    stands for its folder."""
    return str(Path(path).parent) if Path(path).name in MODEL_MARKER_FILES else path


def export_cost(size: tuple[int, int], pictures: int) -> str:
    """'12000 × 9000 px (108 MP) per picture: about 160 MB of PNG and 30 s' for a warning before an export."""
    h, w = size
    pixels = h * w * pictures
    megabytes = pixels * PNG_BYTES_PER_PIXEL / 1e6
    seconds = pixels / 1e6 * SECONDS_PER_MEGAPIXEL
    amount = f"{megabytes / 1000:.1f} GB" if megabytes >= 1000 else f"{megabytes:.0f} MB"
    duration = f"{seconds / 60:.0f} min" if seconds >= 90 else f"{max(1, round(seconds))} s"
    each = f"{pictures} pictures of " if pictures > 1 else ""
    return f"{each}{w} × {h} px ({h * w / 1e6:.0f} MP): roughly {amount} of PNG and {duration} of drawing"


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
        """A checkpoint file, or a model folder's config.json (which opens the folder)."""
        path, _ = QFileDialog.getOpenFileName(self.parent_widget, "Open model",
                                              st.last_folder(self.settings, "model"), MODEL_FILTER)
        if path:
            st.set_last_folder(self.settings, "model", str(Path(path).parent))
            self.model_chosen.emit(model_target(path))

    def open_model_folder_dialog(self) -> None:
        """A model folder (Hugging Face, timm hub or open_clip layout)."""
        folder = QFileDialog.getExistingDirectory(self.parent_widget, "Open model folder",
                                                  st.last_folder(self.settings, "model"))
        if folder:
            st.set_last_folder(self.settings, "model", str(Path(folder).parent))
            self.model_chosen.emit(folder)

    def open_images_dialog(self) -> None:
        paths, _ = QFileDialog.getOpenFileNames(self.parent_widget, "Open images",
                                                st.last_folder(self.settings, "images"), IMAGE_FILTER)
        if paths:
            st.set_last_folder(self.settings, "images", str(Path(paths[0]).parent))
            self.session.add_images(paths, show=True)

    def open_image_folder_dialog(self) -> None:
        folder = QFileDialog.getExistingDirectory(self.parent_widget, "Open a folder of images",
                                                  st.last_folder(self.settings, "images"))
        if folder:
            self.open_image_folder(folder)

    def open_image_folder(self, folder: str) -> list[str]:
        """Add every image in `folder` and its subfolders (natural order); says so when there is none."""
        st.set_last_folder(self.settings, "images", folder)
        found = [str(p) for p in find_images(folder)]
        if not found:
            self.report_error("No images in the folder", f"{folder} holds no PNG, JPEG, BMP, GIF, TIFF, WebP or "
                              "PPM/PGM images (subfolders included)", "")
            return []
        self.session.add_images(found, show=True)
        return found

    def choose_size(self, maps: ResultMaps, pictures: int) -> str | None:
        """Where a large export is drawn: announced up front with its size and cost, the user picks the original
        size, the model's input size or nothing (None). Small exports go ahead at the original size."""
        size = exporting.native_size(maps)
        if size[0] * size[1] <= LARGE_PICTURE_PIXELS:
            return ORIGINAL
        h, w = maps.result.image.shape[:2]
        box = QMessageBox(QMessageBox.Icon.Question, "Large export",
                          f"The export is drawn over the image at its original resolution: "
                          f"{export_cost(size, pictures)}.", QMessageBox.StandardButton.Cancel, self.parent_widget)
        box.setObjectName("largeExportBox")
        box.setInformativeText(f"Export at the model's input size ({w} × {h} px) instead?")
        original = box.addButton("Original size", QMessageBox.ButtonRole.AcceptRole)
        small = box.addButton(f"Input size ({w} × {h})", QMessageBox.ButtonRole.AcceptRole)
        box.setDefaultButton(small)
        box.exec()
        clicked = box.clickedButton()
        return ORIGINAL if clicked is original else INPUT if clicked is small else None

    def _current_maps(self) -> ResultMaps | None:
        """The run on show: the intervened one while there is one (its titles and the .npz's 'interventions' say
        what was done, as `vitviz export --ablate` does), else the cached clean result."""
        maps = self.session.image_list.current_maps
        if maps is None:
            self.report_error("Nothing to export", "Load a model and select an image that has run first.", "")
        return maps

    def _export_name(self, maps: ResultMaps, suffix: str) -> str:
        """The Save dialog's proposal: a PNG named as `vitviz export` names that map, layer and head
        (`shapes_1_cross_cls_L2_Hmean.png`); the arrays (every layer) by image and map."""
        folder = st.last_folder(self.settings, "export")
        stem = exporting.image_stem(maps.result.source)
        name = (output_name(stem, map_kind(self.state), self.state.layer, self.state.head) if suffix == ".png"
                else f"{stem}_{exporting.map_label(self.state)}{suffix}")
        return str(Path(folder) / name) if folder else name

    def export_png_dialog(self) -> None:
        maps = self._current_maps()
        if maps is None:
            return
        size = self.choose_size(maps, 1)
        if size is None:
            return
        path, chosen = QFileDialog.getSaveFileName(self.parent_widget, "Export current view",
                                                   self._export_name(maps, ".png"), ";;".join(PNG_STYLES))
        if path:   # the file dialog has already asked before replacing a file
            heatmap_only, colorbar = PNG_STYLES.get(chosen, (False, True))
            self.export_png_to(Path(path), heatmap_only, colorbar, overwrite=True, label=True, size=size)

    def export_png_to(self, path: Path, heatmap_only: bool = False, colorbar: bool = True,
                      overwrite: bool = False, label: bool = False, size: str = ORIGINAL) -> Path | None:
        """Write the current view as a PNG at the resolution of the image the model saw (`size` 'original'), or
        over the model's input image ('input'); `label` names the colorbar (the window's dialogs do)."""
        maps = self._current_maps()
        if maps is None:
            return None
        path = path if path.suffix.lower() == ".png" else path.with_suffix(".png")
        return self._guarded("Could not export PNG", lambda: exporting.export_png(
            maps, self.state, path, heatmap_only, colorbar, overwrite, label, size == ORIGINAL), path)

    def export_all_dialog(self) -> None:
        maps = self._current_maps()
        if maps is None:
            return
        size = self.choose_size(maps, len(exporting.all_map_paths(maps, self.state, Path("."))))
        if size is None:
            return
        folder = QFileDialog.getExistingDirectory(self.parent_widget, "Export every layer × head map into",
                                                  st.last_folder(self.settings, "export"))
        if not folder:
            return
        style, ok = QInputDialog.getItem(self.parent_widget, "Export all maps", "Style",
                                         [s[:-8] for s in PNG_STYLES], 1, False)
        if ok:
            heatmap_only, colorbar = PNG_STYLES[style + " (*.png)"]
            self.export_all_to(Path(folder), heatmap_only, colorbar, label=True, size=size)

    def export_all_to(self, folder: Path, heatmap_only: bool = False, colorbar: bool = False,
                      overwrite: bool | None = None, label: bool = False, size: str = ORIGINAL) -> list[Path]:
        """Write every layer × head map; asks before replacing files unless `overwrite` is given. `label` and
        `size` as for `export_png_to`."""
        maps = self._current_maps()
        if maps is None:
            return []
        if overwrite is None:
            targets = [p for p, _l, _h in exporting.all_map_paths(maps, self.state, folder)]
            if not dialogs.confirm_overwrite(self.parent_widget, targets):
                return []
            overwrite = True
        written = self._guarded("Could not export maps", lambda: exporting.export_all(
            maps, self.state, folder, heatmap_only, colorbar, overwrite, label, size == ORIGINAL), folder / "x")
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
        """Run an export (with a busy cursor), turning any failure into the error dialog; remember the folder on
        success."""
        QApplication.setOverrideCursor(Qt.CursorShape.WaitCursor)
        try:
            out = work()
        except Exception as exc:  # noqa: BLE001 - the GUI boundary
            self.report_error(title, f"{type(exc).__name__}: {exc}", traceback.format_exc())
            return None
        finally:
            QApplication.restoreOverrideCursor()
        st.set_last_folder(self.settings, "export", str(where.parent))
        self.exported.emit(f"Exported to {where.parent if isinstance(out, list) else out}")
        return out
