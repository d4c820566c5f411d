"""Menu bar and toolbar of the main window, built from a table: every action once, with its shortcut shown in the
menu. `build` takes what each action does as callbacks by name and returns what it built; it knows no window."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import QDockWidget, QMainWindow, QMenu, QStyle, QToolBar

from vitviz.core.drawing.render import LARGE_PICTURE_PIXELS, MIN_PICTURE_PX


@dataclass(frozen=True)
class ActionSpec:
    """One action: its name (the key of its callback), text, shortcut and status tip."""

    name: str
    text: str
    shortcut: str | QKeySequence.StandardKey = ""
    tip: str = ""


ACTIONS = (
    ActionSpec("open_model", "Open &model…", QKeySequence.StandardKey.Open,
               "Open a ViT checkpoint file (or a model folder's config.json)"),
    ActionSpec("open_model_folder", "Open model &folder…", "Ctrl+Shift+O",
               "Open a model folder (Hugging Face, timm hub or open_clip layout)"),
    ActionSpec("open_images", "Open &images…", "Ctrl+I", "Add image files to the image list"),
    ActionSpec("open_image_folder", "Open image f&older…", "Ctrl+Shift+I",
               "Add every image in a folder (and its subfolders) to the image list"),
    ActionSpec("export_png", "Current view as &PNG…", "Ctrl+E",
               "Save the overlay or heatmap over the image at its original resolution (the model's input size "
               f"is offered for originals over {LARGE_PICTURE_PIXELS // 1_000_000} megapixels); with a colorbar, "
               f"an image under {MIN_PICTURE_PX} px is drawn enlarged by a whole factor"),
    ActionSpec("export_all", "&All layer × head maps…", "Ctrl+Shift+E",
               "Save one PNG per layer and head into a folder"),
    ActionSpec("export_npz", "Raw &arrays (.npz)…", "", "Save attentions, logits, input and spec"),
    ActionSpec("quit", "&Quit", QKeySequence.StandardKey.Quit, "Quit vitviz"),
    ActionSpec("next_image", "&Next image", "PgDown"),
    ActionSpec("prev_image", "&Previous image", "PgUp"),
    ActionSpec("next_layer", "Next &layer", "Ctrl+Down"),
    ActionSpec("prev_layer", "Previous l&ayer", "Ctrl+Up"),
    ActionSpec("next_head", "Next &head", "Ctrl+Right"),
    ActionSpec("prev_head", "Previous h&ead", "Ctrl+Left"),
    ActionSpec("reset_layout", "&Reset layout", "", "Restore the default dock arrangement"),
    ActionSpec("shortcuts", "&Keyboard and mouse shortcuts", QKeySequence.StandardKey.HelpContents,
               "What every key and click does"),
    ActionSpec("about", "&About vitviz", "", "vitviz's version and what it runs on"),
)
ICONS = {"open_model": QStyle.StandardPixmap.SP_DirOpenIcon,
         "open_images": QStyle.StandardPixmap.SP_FileDialogContentsView,
         "export_png": QStyle.StandardPixmap.SP_DialogSaveButton}
TOOLBAR = ("open_model", "open_images", "export_png")


@dataclass(frozen=True)
class Menus:
    """What `build` made: the actions by name (tests and the window use them), the menus the window fills later,
    and the toolbar."""

    actions: dict[str, QAction]
    file: QMenu
    recent: QMenu
    models: QMenu
    view: QMenu
    toolbar: QToolBar


def _action(parent: QMainWindow, spec: ActionSpec, slot: Callable[[], object]) -> QAction:
    action = QAction(spec.text, parent)
    if spec.shortcut:
        action.setShortcut(QKeySequence(spec.shortcut))
    if spec.tip:
        action.setStatusTip(spec.tip)
        action.setToolTip(spec.tip + (f" ({action.shortcut().toString()})" if spec.shortcut else ""))
    action.setObjectName(spec.name)
    action.triggered.connect(lambda _checked=False: slot())
    return action


def build(window: QMainWindow, callbacks: Mapping[str, Callable[[], object]]) -> Menus:
    """Create the actions of `ACTIONS` (each calling `callbacks[name]`), the menus and the toolbar of `window`."""
    acts = {spec.name: _action(window, spec, callbacks[spec.name]) for spec in ACTIONS}
    style = window.style()
    for name, icon in ICONS.items():
        acts[name].setIcon(style.standardIcon(icon))
    bar = window.menuBar()
    file_menu = bar.addMenu("&File")
    file_menu.addActions([acts["open_model"], acts["open_model_folder"]])
    recent = file_menu.addMenu("&Recent models")
    recent.setObjectName("recentModelsMenu")
    file_menu.addSeparator()
    file_menu.addActions([acts["open_images"], acts["open_image_folder"]])
    file_menu.addSeparator()
    export_menu = file_menu.addMenu("&Export")
    export_menu.addActions([acts["export_png"], acts["export_all"], acts["export_npz"]])
    file_menu.addSeparator()
    file_menu.addAction(acts["quit"])
    models = bar.addMenu("&Models")
    models.setObjectName("modelsMenu")
    nav = bar.addMenu("&Navigate")
    nav.addActions([acts["next_image"], acts["prev_image"]])
    nav.addSeparator()
    nav.addActions([acts["next_layer"], acts["prev_layer"], acts["next_head"], acts["prev_head"]])
    view = bar.addMenu("&View")
    help_menu = bar.addMenu("&Help")
    help_menu.addActions([acts["shortcuts"], acts["about"]])
    toolbar = QToolBar("Main toolbar")
    toolbar.setObjectName("mainToolbar")
    toolbar.setToolButtonStyle(toolbar.toolButtonStyle().ToolButtonTextBesideIcon)
    toolbar.addActions([acts[name] for name in TOOLBAR])
    window.addToolBar(toolbar)
    return Menus(acts, file_menu, recent, models, view, toolbar)


def fill_view_menu(menu: QMenu, docks: list[QDockWidget], toolbars: list[QToolBar], reset: QAction) -> None:
    """One checkable entry per dock (closing a dock unchecks it), then the toolbars and Reset layout."""
    menu.clear()
    for dock in docks:
        menu.addAction(dock.toggleViewAction())
    for toolbar in toolbars:
        menu.addAction(toolbar.toggleViewAction())
    menu.addSeparator()
    menu.addAction(reset)


def fill_recent_menu(menu: QMenu, paths: list[str], choose: Callable[[str], object]) -> None:
    """One entry per recent model, newest first; choosing one calls `choose(path)`."""
    menu.clear()
    for i, path in enumerate(paths):
        action = menu.addAction(f"&{i + 1} {path}")
        action.triggered.connect(lambda _checked=False, p=path: choose(p))
    menu.setEnabled(bool(paths))
