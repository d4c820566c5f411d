"""Menu bar and toolbar of the main window: every action once, with its shortcut shown in the menu."""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import QMenu, QStyle, QToolBar

if TYPE_CHECKING:
    from vitviz.gui.window import MainWindow


def _action(window: "MainWindow", text: str, slot: Callable[[], object], shortcut: str | QKeySequence = "",
            tip: str = "", name: str = "") -> QAction:
    action = QAction(text, window)
    if shortcut:
        action.setShortcut(QKeySequence(shortcut))
    if tip:
        action.setStatusTip(tip)
        action.setToolTip(tip + (f" ({action.shortcut().toString()})" if shortcut else ""))
    action.setObjectName(name or text.strip(".…").replace(" ", "_").lower())
    action.triggered.connect(lambda _checked=False: slot())
    return action


def build(window: "MainWindow") -> dict[str, QAction]:
    """Create the menus and toolbar; return the actions by name (tests and the window use them)."""
    w = window
    acts = {
        "open_model": _action(w, "Open &model…", w.open_model_dialog, QKeySequence.StandardKey.Open,
                              "Open a ViT checkpoint file or folder"),
        "open_images": _action(w, "Open &images…", w.open_images_dialog, "Ctrl+I",
                               "Add image files to the image list"),
        "export_png": _action(w, "Current view as &PNG…", w.export_png_dialog, "Ctrl+E",
                              "Save the overlay or heatmap at the resolution of the model's input"),
        "export_all": _action(w, "&All layer × head maps…", w.export_all_dialog, "Ctrl+Shift+E",
                              "Save one PNG per layer and head into a folder"),
        "export_npz": _action(w, "Raw &arrays (.npz)…", w.export_npz_dialog, "",
                              "Save attentions, logits, input and spec"),
        "quit": _action(w, "&Quit", w.close, QKeySequence.StandardKey.Quit, "Quit vitviz"),
        "next_image": _action(w, "&Next image", lambda: w.images.step(1), "PgDown"),
        "prev_image": _action(w, "&Previous image", lambda: w.images.step(-1), "PgUp"),
        "next_layer": _action(w, "Next &layer", lambda: w.step_layer(1), "Ctrl+Down"),
        "prev_layer": _action(w, "Previous l&ayer", lambda: w.step_layer(-1), "Ctrl+Up"),
        "next_head": _action(w, "Next &head", lambda: w.step_head(1), "Ctrl+Right"),
        "prev_head": _action(w, "Previous h&ead", lambda: w.step_head(-1), "Ctrl+Left"),
        "reset_layout": _action(w, "&Reset layout", w.reset_layout, "", "Restore the default dock arrangement"),
    }
    _add_menus(w, acts)
    return acts


def _add_menus(w: "MainWindow", acts: dict[str, QAction]) -> None:
    style = w.style()
    acts["open_model"].setIcon(style.standardIcon(QStyle.StandardPixmap.SP_DirOpenIcon))
    acts["open_images"].setIcon(style.standardIcon(QStyle.StandardPixmap.SP_FileDialogContentsView))
    acts["export_png"].setIcon(style.standardIcon(QStyle.StandardPixmap.SP_DialogSaveButton))
    bar = w.menuBar()
    file_menu = bar.addMenu("&File")
    file_menu.addActions([acts["open_model"], acts["open_images"]])
    w.recent_menu = file_menu.addMenu("&Recent models")
    w.recent_menu.setObjectName("recentModelsMenu")
    export_menu = file_menu.addMenu("&Export")
    export_menu.addActions([acts["export_png"], acts["export_all"], acts["export_npz"]])
    file_menu.addSeparator()
    file_menu.addAction(acts["quit"])
    w.models_menu = bar.addMenu("&Models")
    w.models_menu.setObjectName("modelsMenu")
    nav = bar.addMenu("&Navigate")
    nav.addActions([acts["next_image"], acts["prev_image"]])
    nav.addSeparator()
    nav.addActions([acts["next_layer"], acts["prev_layer"], acts["next_head"], acts["prev_head"]])
    w.view_menu = bar.addMenu("&View")
    toolbar = QToolBar("Main toolbar")
    toolbar.setObjectName("mainToolbar")
    toolbar.setToolButtonStyle(toolbar.toolButtonStyle().ToolButtonTextBesideIcon)
    toolbar.addActions([acts["open_model"], acts["open_images"], acts["export_png"]])
    w.addToolBar(toolbar)


def fill_view_menu(window: "MainWindow", menu: QMenu, reset: QAction) -> None:
    """One checkable entry per dock (closing a dock unchecks it), then the toolbar and Reset layout."""
    menu.clear()
    for dock in window.docks:
        menu.addAction(dock.toggleViewAction())
    for toolbar in window.findChildren(QToolBar):
        menu.addAction(toolbar.toggleViewAction())
    menu.addSeparator()
    menu.addAction(reset)


def fill_recent_menu(window: "MainWindow", menu: QMenu, paths: list[str]) -> None:
    menu.clear()
    for i, path in enumerate(paths):
        action = menu.addAction(f"&{i + 1} {path}")
        action.triggered.connect(lambda _checked=False, p=path: window.choose_model(p))
    menu.setEnabled(bool(paths))
