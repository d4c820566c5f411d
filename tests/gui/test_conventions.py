"""Conventions of a desktop program: a Help menu (shortcuts; About with versions and the device), a clear exit 2
without a display, the window title once, a prompt Ctrl+Q, a warning before a huge export, a labelled colorbar
in exports, legends for the head-statistics colours, and models by name (Models › Open by name…, dropped text)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from _gui import HEADS, show_dock
from PIL import Image
from PySide6.QtCore import QMimeData, QPointF, Qt, QTimer
from PySide6.QtGui import QDragEnterEvent, QDropEvent
from PySide6.QtWidgets import QApplication, QInputDialog, QMessageBox, QTextBrowser

from vitviz.gui import app as gui_app, file_actions
from vitviz.gui.help import shortcuts_html, versions
from vitviz.gui.window import dropped_name

ROOT = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------------------------------------- help


def test_help_menu_shortcuts_and_about(qtbot, loaded) -> None:  # noqa: ANN001
    w = loaded
    help_menu = next(a.menu() for a in w.menuBar().actions() if a.text() == "&Help")
    assert [a.objectName() for a in help_menu.actions()] == ["shortcuts", "about"]
    dialog = w.show_shortcuts()
    text = dialog.findChild(QTextBrowser).toPlainText()
    assert "Ctrl+O" in text and "Ctrl+Down" in text and "Del" in text and "Click a patch" in text
    # as tall as its text (a fixed 480 px needed scrolling), within 85 % of the screen
    from vitviz.gui.help import text_dialog_size

    browser = dialog.findChild(QTextBrowser)
    assert dialog.height() == text_dialog_size(browser, w)[1]
    screen_h = w.screen().availableGeometry().height()
    doc_h = browser.document().size().height()
    assert dialog.height() >= min(doc_h, 0.85 * screen_h - 90) and dialog.height() <= 0.85 * screen_h
    dialog.close()
    about = dict(versions(w.session))
    import pyqtgraph
    from importlib import metadata

    from PySide6.QtCore import qVersion

    import vitviz

    assert about["vitviz"] == vitviz.__version__ and about["Qt"] == qVersion()
    assert about["pyqtgraph"] == pyqtgraph.__version__
    assert about["torch"].split("+")[0] == metadata.version("torch").split("+")[0]
    assert about["device"].startswith("cpu")
    w.show_about().close()


def test_shortcuts_list_every_action_with_a_key(window) -> None:  # noqa: ANN001
    html = shortcuts_html(window.menus.actions.values())
    for name in ("next_image", "next_layer", "open_images", "quit"):
        assert window.menus.actions[name].shortcut().toString() in html


def test_help_texts_import_no_torch() -> None:
    code = ("import sys; import vitviz.gui.help, vitviz.gui.window; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, env=dict(os.environ, QT_QPA_PLATFORM="offscreen"))


def test_the_window_is_built_and_shown_without_torch() -> None:
    """Building and showing the window imports no torch (the worker imports it off the GUI thread): a part asking
    its vocabulary at build time (the interventions' refusal) once made the first window wait 2 s for torch."""
    code = ("import sys, tempfile; from PySide6.QtCore import QSettings; from vitviz.gui.app import ensure_app; "
            "from vitviz.gui.window import MainWindow; app = ensure_app(); "
            "w = MainWindow(QSettings(tempfile.mktemp(suffix='.ini'), QSettings.Format.IniFormat)); w.show(); "
            "app.processEvents(); loaded = 'torch' in sys.modules; w.persist_settings = False; w.close(); "
            "assert not loaded, 'torch imported before the window was shown'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, env=dict(os.environ, QT_QPA_PLATFORM="offscreen"),
                   timeout=300)


# ---------------------------------------------------------------------------------------------- no display


@pytest.mark.parametrize("platform", ["", "xcb"])
def test_without_a_display_the_window_exits_2_with_a_message(platform: str) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM")}
    if platform:
        env["QT_QPA_PLATFORM"] = platform
    proc = subprocess.run([sys.executable, "-m", "vitviz"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "cannot open the window: no display" in proc.stderr and "xvfb-run" in proc.stderr
    assert "Aborted" not in proc.stderr and "qt.qpa" not in proc.stderr


def test_display_problem() -> None:
    problem = gui_app.display_problem
    assert problem({"QT_QPA_PLATFORM": "offscreen"}) == ""
    assert problem({"WAYLAND_DISPLAY": "wayland-0"}) == ""
    assert "DISPLAY or WAYLAND_DISPLAY" in problem({})
    assert "DISPLAY is not set" in problem({"QT_QPA_PLATFORM": "xcb", "WAYLAND_DISPLAY": "wayland-0"})
    assert "nothing listens" in problem({"DISPLAY": ":7391"})
    assert problem({"DISPLAY": "otherhost:0"}) == ""                     # remote: Qt tries
    assert problem({}, platform="win32") == "" and problem({}, platform="darwin") == ""


# ---------------------------------------------------------------------------------------------- title, quit


def test_the_title_names_vitviz_once(qtbot, window, fake_demo) -> None:  # noqa: ANN001
    with qtbot.waitSignal(window.session.model.model_loaded, timeout=30000):
        window.load_demo()
    assert window.windowTitle() == "vitviz — demo"
    code = ("from vitviz.gui.app import ensure_app; app = ensure_app(); app.setApplicationName('other'); "
            "assert app.applicationDisplayName() == 'other', app.applicationDisplayName()")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, env=dict(os.environ, QT_QPA_PLATFORM="offscreen"))


def test_quit_on_an_idle_window_stops_everything_and_exits(tmp_path: Path, tiny_ckpt: Path) -> None:
    """Ctrl+Q's action in a real `vitviz` process: the window closes, the worker stops and the process exits 0
    (bench/gui.py measures how long it takes, with and without the exit-time `gc.freeze`)."""
    code = """
import sys
from PySide6.QtCore import QTimer
import vitviz.gui.app as app_module
def quit_when_idle(win):
    if win.session.model.spec is None or not win.is_idle():
        QTimer.singleShot(50, lambda: quit_when_idle(win))
        return
    win.menus.actions["quit"].trigger()
apply_args = app_module.apply_args
def apply_then_quit(win, args):
    apply_args(win, args)
    QTimer.singleShot(200, lambda: quit_when_idle(win))
app_module.apply_args = apply_then_quit
import atexit
atexit.register(lambda: print("registered", getattr(app_module._freeze_at_exit, "registered", False), flush=True))
from vitviz.cli import main
sys.exit(main())     # `vitviz` ends the process itself once its window has closed (os._exit: atexit handlers run)
"""
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", VITVIZ_SETTINGS=str(tmp_path / "s.ini"))
    proc = subprocess.run([sys.executable, "-c", code, "--model", str(tiny_ckpt), "--heads", str(HEADS)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "registered True" in proc.stdout
    assert "Destroyed while thread" not in proc.stderr


# ---------------------------------------------------------------------------------------------- exports


def _big_original(tmp_path: Path) -> Path:
    path = tmp_path / "big.png"
    Image.new("RGB", (6400, 4800), (90, 120, 150)).save(path)          # the region seen: over LARGE_EXPORT_PIXELS
    return path


def _answer_box(button_text: str) -> None:
    def click() -> None:
        box = QApplication.activeModalWidget()
        if not isinstance(box, QMessageBox):
            QTimer.singleShot(20, click)
            return
        button = next(b for b in box.buttons() if b.text().startswith(button_text))
        button.click()
    QTimer.singleShot(0, click)


def test_a_huge_export_is_announced_with_its_size(qtbot, loaded, tmp_path) -> None:  # noqa: ANN001
    w = loaded
    big = _big_original(tmp_path)
    with qtbot.waitSignal(w.session.image_list.result_ready, timeout=30000):
        w.session.add_images([str(big)], show=True)
    maps = w.session.result(str(big))
    h, w_ = file_actions.exporting.native_size(maps)                     # the centre crop the model saw
    assert 4000 < h <= 4800 and 4000 < w_ <= 4800 and h * w_ > file_actions.LARGE_PICTURE_PIXELS
    _answer_box("Input size")
    assert w.file_actions.choose_size(maps, 1) == file_actions.INPUT
    _answer_box("Cancel")
    assert w.file_actions.choose_size(maps, 1) is None
    _answer_box("Original size")
    assert w.file_actions.choose_size(maps, 1) == file_actions.ORIGINAL
    assert "13 MP" in file_actions.export_cost((3600, 3600), 1) and "s of drawing" in file_actions.export_cost(
        (3600, 3600), 1)
    out = w.file_actions.export_png_to(tmp_path / "small.png", colorbar=False, size=file_actions.INPUT)
    assert Image.open(out).size == (32, 32)
    small = next(p for p in w.session.image_list.paths if p != str(big))
    w.session.set_current(small)
    assert w.file_actions.choose_size(w.session.image_list.current_maps, 1) == file_actions.ORIGINAL   # no question


def test_exported_colorbars_say_what_they_show(qtbot, loaded, tmp_path) -> None:  # noqa: ANN001
    w = loaded
    plain = w.file_actions.export_png_to(tmp_path / "plain.png", colorbar=True)
    named = w.file_actions.export_png_to(tmp_path / "named.png", colorbar=True, label=True)
    a, b = np.asarray(Image.open(plain)), np.asarray(Image.open(named))
    assert a.shape[0] == b.shape[0] and b.shape[1] > a.shape[1]
    np.testing.assert_array_equal(b[:, :a.shape[1] - 6], a[:, :a.shape[1] - 6])   # the same picture and bar
    assert (b[:, a.shape[1]:] < 128).any()                                           # ... and text beside it
    from vitviz.core.drawing import render
    stack = w.session.image_list.current_maps.stack("cls")
    assert render.colorbar_label(stack, "mean", "shared") == "CLS attention · head mean · shared scale: all layers (head means)"
    assert render.colorbar_label(stack, 1, "own") == "CLS attention · head 1 · own scale: this map"
    assert render.colorbar_label(stack, 1, "own", 2) == "CLS attention · layer 2 · head 1 · own scale: this map"


def test_the_save_dialog_proposes_the_name_export_gives(qtbot, loaded) -> None:  # noqa: ANN001
    """Round five: the window proposed `shapes_1_cross_cls.png` (no layer, no head) where `vitviz export` writes
    `shapes_1_cross_cls_L2_Hmean.png` for the same view."""
    w = loaded
    w.state.update(layer=1, head=0)
    stem = Path(w.session.image_list.current).stem
    assert Path(w.file_actions._export_name(w.session.image_list.current_maps, ".png")).name == f"{stem}_cls_L1_H0.png"
    assert Path(w.file_actions._export_name(w.session.image_list.current_maps, ".npz")).name == f"{stem}_cls.npz"


# ---------------------------------------------------------------------------------------------- legends


def test_head_statistics_say_what_the_colours_mean(qtbot, loaded) -> None:  # noqa: ANN001
    w = loaded
    panel = show_dock(qtbot, w, "headStatsDock")
    key = panel.head_key.text()
    assert key.startswith("Head colours:") and all(f"&nbsp;{h}" in key for h in range(HEADS))
    assert panel.kinds.key.text().startswith("Token kinds:") and "patches" in panel.kinds.key.text()
    assert "1 image" not in panel.average_check.text() and "3 images" in panel.average_check.text()


# ---------------------------------------------------------------------------------------------- models by name


def test_open_by_name_from_the_models_menu(qtbot, window, monkeypatch) -> None:  # noqa: ANN001
    w = window
    asked: list[str] = []
    monkeypatch.setattr(w.session, "load_model", lambda path, device=None, **kw: asked.append(path))
    assert w.models.by_name_action in w.menus.models.actions()
    monkeypatch.setattr(QInputDialog, "getText", lambda *_a, **_k: ("  hf:facebook/dinov2-small ", True))
    w.models.by_name_action.trigger()
    assert asked == ["hf:facebook/dinov2-small"]
    assert w.statusBar().currentMessage().startswith("Loading hf:facebook/dinov2-small")
    monkeypatch.setattr(QInputDialog, "getText", lambda *_a, **_k: ("facebook/dinov2-small", True))
    w.models.by_name_action.trigger()
    assert asked == ["hf:facebook/dinov2-small"] and w.reporter.errors[-1][0] == "Not a model name"
    w.reporter.box.close()


def _drop(window, data: QMimeData) -> bool:  # noqa: ANN001
    """Drag `data` over the window and drop it; whether the drag was accepted."""
    pos = QPointF(window.width() / 2, window.height() / 2)
    actions = Qt.DropAction.CopyAction
    enter = QDragEnterEvent(pos.toPoint(), actions, data, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier)
    window.dragEnterEvent(enter)
    if not enter.isAccepted():
        return False
    window.dropEvent(QDropEvent(pos, actions, data, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier))
    return True


def test_dropping_a_model_name_loads_it(qtbot, window, monkeypatch) -> None:  # noqa: ANN001
    asked: list[str] = []
    monkeypatch.setattr(window.session, "load_model", lambda path, device=None, **kw: asked.append(path))
    data = QMimeData()
    data.setText("timm:vit_small_patch14_reg4_dinov2.lvd142m\n")
    assert dropped_name(data) == "timm:vit_small_patch14_reg4_dinov2.lvd142m"
    assert _drop(window, data)
    assert asked == ["timm:vit_small_patch14_reg4_dinov2.lvd142m"]
    page = QMimeData()
    page.setText("https://huggingface.co/facebook/dinov2-small/tree/main")
    assert dropped_name(page) == "hf:facebook/dinov2-small@main"
    other = QMimeData()
    other.setText("just some words")
    assert dropped_name(other) == "" and not _drop(window, other)
    assert asked == ["timm:vit_small_patch14_reg4_dinov2.lvd142m"]
