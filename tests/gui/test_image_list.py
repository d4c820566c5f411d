"""The image list: opened images are selected and shown, images can be removed (Delete, the context menu, the
failed ones, all), the Open dialogs take folders and model folders, many images show n/N and the time left, and
thumbnails of huge images are decoded off the GUI thread without Qt warnings."""
from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
from _gui import HEADS, make_image, wait_idle
from PIL import Image
from PySide6.QtCore import QRect, Qt
from PySide6.QtGui import QImageReader
from PySide6.QtWidgets import QFileDialog

from vitviz.gui import file_actions
from vitviz.gui.status import time_left
from vitviz.gui.thumbnails import THUMB, read_thumbnail


@pytest.fixture
def many(tmp_path: Path) -> list[Path]:
    folder = tmp_path / "many"
    folder.mkdir()
    return [make_image(folder / f"img_{i:03d}.png", i, size=(24, 24)) for i in range(25)]


def _visible(panel, path: str) -> bool:  # noqa: ANN001
    item = panel._item(path)
    return item is not None and panel.list.viewport().rect().intersects(panel.list.visualItemRect(item))


def test_opened_images_are_selected_and_scrolled_into_view(qtbot, window, many) -> None:  # noqa: ANN001
    w = window
    w.session.add_images([str(p) for p in many[:20]])
    assert w.session.image_list.current == str(many[0])
    w.open_paths([str(p) for p in many[20:]])                               # dropped: the first new one is shown
    assert w.session.image_list.current == str(many[20]) == w.images.current_path()
    assert _visible(w.images, str(many[20]))
    w.open_paths([str(many[3])])                                            # already listed: shown again
    assert w.session.image_list.current == str(many[3]) and _visible(w.images, str(many[3]))


def test_delete_removes_the_selected_images(qtbot, loaded, images) -> None:  # noqa: ANN001
    w = loaded
    panel = w.images
    panel.list.setFocus()
    assert w.session.image_list.current == str(images[0])
    qtbot.keyClick(panel.list, Qt.Key.Key_Delete)
    assert panel.paths() == [str(p) for p in images[1:]] == w.session.image_list.paths
    assert w.session.image_list.current == str(images[1]) and w.session.result(str(images[0])) is None
    assert str(images[0]) not in w.session.head_stats
    menu = panel.context_menu()
    assert [a.objectName() for a in menu.actions() if a.objectName()] == ["remove_images", "remove_failed_images",
                                                                        "clear_images"]
    menu.deleteLater()
    panel.clear_action.trigger()
    assert panel.paths() == [] == w.session.image_list.paths and w.session.image_list.current == ""
    assert w.panel.title.text.startswith("Drop images")


def test_a_list_built_from_the_image_list_alone_asks_what_the_user_wants(qtbot) -> None:  # noqa: ANN001
    """The image list dock is built from the part it shows (an `ImageList`, no session, window or worker) and a
    result look-up: it lists and selects what the part says, and what the user does (pick an image, Delete, remove
    the failed ones, clear) it asks as `current_requested` / `remove_requested`, changing nothing itself."""
    from vitviz.gui.images import ImageList
    from vitviz.gui.panels.image_list import ImageListPanel

    a, b, c = (str(Path(f"/imgs/{n}.png")) for n in "abc")
    images, looked_up, asked = ImageList(), [], []
    panel = ImageListPanel(images, lambda path: looked_up.append(path))
    qtbot.addWidget(panel)
    panel.current_requested.connect(lambda path: asked.append(("current", path)))
    panel.remove_requested.connect(lambda paths: asked.append(("remove", paths)))
    images.current = images.add([a, b, c])[1]
    images.current_changed.emit(None)                        # as the session says it
    assert panel.paths() == [a, b, c] and panel.current_path() == a
    images.current = c
    images.current_changed.emit(None)                        # the list follows the part's current image
    assert panel.current_path() == c
    asked.clear()
    panel.list.setCurrentRow(1)                              # the user picks b: asked, not done
    assert asked == [("current", b)] and images.current == c
    panel.remove_selected()
    images.fail(a, "broken")
    panel.update_actions()
    panel.remove_failed_action.trigger()
    panel.clear_action.trigger()
    assert asked[1:] == [("remove", [b]), ("remove", [a]), ("remove", [a, b, c])] and images.paths == [a, b, c]
    images.result_ready.emit(b)                              # a result: looked up through the look-up it was given
    assert looked_up == [b]


def test_remove_failed_images(qtbot, loaded, tmp_path, images) -> None:  # noqa: ANN001
    w = loaded
    bad = tmp_path / "broken.png"
    bad.write_bytes(b"not a png")
    with qtbot.waitSignal(w.session.image_list.run_failed, timeout=20000):
        w.session.add_images([str(bad)])
    wait_idle(qtbot, w)
    w.reporter.box.close()
    w.images.update_actions()
    assert w.images.remove_failed_action.isEnabled() and "(1)" in w.images.remove_failed_action.text()
    w.images.remove_failed_action.trigger()
    assert w.session.image_list.paths == [str(p) for p in images] and not w.session.image_list.failed
    assert not w.images.remove_failed_action.isEnabled()
    assert "imageListMenu" in [m.objectName() for m in w.menus.file.findChildren(type(w.menus.file))]


def test_removing_an_image_drops_its_queued_run(qtbot, window, tiny_ckpt, images) -> None:  # noqa: ANN001
    w = window
    with qtbot.waitSignal(w.session.model.model_loaded, timeout=30000):
        w.load_model(str(tiny_ckpt), heads=HEADS)
    w.session.add_images([str(p) for p in images])
    w.session.remove_images([str(images[2])])                             # queued behind the others
    wait_idle(qtbot, w)
    assert w.session.result(str(images[2])) is None and str(images[2]) not in w.session.image_list.failed
    assert w.session.cached_paths() == [str(images[0]), str(images[1])]


def test_the_model_dialog_shows_model_folders(tmp_path) -> None:  # noqa: ANN001
    assert "config.json" in file_actions.MODEL_FILTER and "*.safetensors" in file_actions.MODEL_FILTER
    folder = tmp_path / "dinov2-small"
    folder.mkdir()
    assert file_actions.model_target(str(folder / "config.json")) == str(folder)
    assert file_actions.model_target(str(folder / "model.safetensors")) == str(folder / "model.safetensors")
    assert "*.webp" in file_actions.IMAGE_FILTER


def test_open_folder_dialogs(qtbot, window, many, tmp_path, monkeypatch) -> None:  # noqa: ANN001
    w = window
    monkeypatch.setattr(QFileDialog, "getExistingDirectory", lambda *_a, **_k: str(many[0].parent))
    w.menus.actions["open_image_folder"].trigger()
    assert w.session.image_list.paths == [str(p) for p in many] and w.session.image_list.current == str(many[0])
    chosen: list[str] = []
    w.file_actions.model_chosen.disconnect()
    w.file_actions.model_chosen.connect(chosen.append)
    model_folder = tmp_path / "model"
    model_folder.mkdir()
    monkeypatch.setattr(QFileDialog, "getExistingDirectory", lambda *_a, **_k: str(model_folder))
    w.menus.actions["open_model_folder"].trigger()
    monkeypatch.setattr(QFileDialog, "getOpenFileName", lambda *_a, **_k: (str(model_folder / "config.json"), ""))
    w.menus.actions["open_model"].trigger()
    assert chosen == [str(model_folder), str(model_folder)]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert w.file_actions.open_image_folder(str(empty)) == []
    assert w.reporter.errors[-1][0] == "No images in the folder"
    w.reporter.box.close()


def test_a_run_of_many_images_counts_and_estimates(qtbot, window, tiny_ckpt, many) -> None:  # noqa: ANN001
    w = window
    with qtbot.waitSignal(w.session.model.model_loaded, timeout=30000):
        w.load_model(str(tiny_ckpt), heads=HEADS)
    reports: list[tuple[int, int, float]] = []
    w.session.image_list.run_progress.connect(lambda done, total, left: reports.append((done, total, left)))
    lines: list[str] = []
    w.statusBar().messageChanged.connect(lines.append)
    w.session.add_images([str(p) for p in many[:6]])
    wait_idle(qtbot, w)
    assert [(d, t) for d, t, _l in reports] == [(i, 6) for i in range(1, 7)]
    assert all(math.isfinite(left) and left >= 0 for _d, _t, left in reports)
    running = [line for line in lines if line.startswith("Running img_")]
    assert any(" — 2/6" in line and "left" in line for line in running), running
    assert not w.busy_bar.isVisible()


def test_time_left_and_the_run_suffix(window) -> None:  # noqa: ANN001
    assert time_left(float("nan")) == "" and time_left(12.4) == "about 12 s left"
    assert time_left(150) == "about 2 min left" and time_left(3900) == "about 1 h 5 min left"
    status = window.status
    status.set_busy(True)
    status.set_runs(17, 200, 95.0)
    status.show("Running img_018.jpg…")
    assert window.statusBar().currentMessage() == "Running img_018.jpg… — 18/200, about 2 min left"
    assert (window.busy_bar.minimum(), window.busy_bar.maximum(), window.busy_bar.value()) == (0, 200, 17)
    status.show("Reading the position embedding…")
    assert window.statusBar().currentMessage() == "Reading the position embedding…"
    status.set_busy(False)


def test_huge_images_get_a_thumbnail_off_the_gui_thread(qtbot, window, tmp_path) -> None:  # noqa: ANN001
    """A PNG too large for Qt's image allocation limit (here lowered to 1 MB for a 1200 × 900 image; the real case
    is 12000 × 9000 against 256 MB) gets its thumbnail, without the Qt warning that fails this test."""
    huge = tmp_path / "huge.png"
    Image.new("RGB", (1200, 900), (200, 40, 40)).save(huge)
    limit = QImageReader.allocationLimit()
    QImageReader.setAllocationLimit(1)
    try:
        panel = window.images
        with qtbot.waitSignal(panel.thumbnails.ready, timeout=20000) as ready:
            window.session.add_images([str(huge)])
            assert panel.icon_size(str(huge)) == panel._placeholder.availableSizes()[0]   # placeholder first
        image = ready.args[1]
        assert not image.isNull() and (image.width(), image.height()) == (THUMB, 54)
        assert image.pixelColor(10, 10).red() > 150
    finally:
        QImageReader.setAllocationLimit(limit)


def test_unreadable_files_get_a_blank_thumbnail(tmp_path) -> None:  # noqa: ANN001
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"nope")
    assert read_thumbnail(str(bad)).isNull()
    ok = make_image(tmp_path / "ok.jpg", 1, size=(40, 80))
    thumb = read_thumbnail(str(ok))
    assert thumb.width() == THUMB and thumb.height() == THUMB // 2
    assert QRect(0, 0, THUMB, THUMB).contains(thumb.rect())


def test_fifo_in_the_image_list_is_refused_without_blocking(qtbot, loaded, tmp_path: Path) -> None:  # noqa: ANN001
    """A FIFO named x.png: no thumbnail decoder or run ever opens it; it is marked failed as 'not a regular
    file' and the window goes on."""
    w = loaded
    fifo = tmp_path / "x.png"
    os.mkfifo(fifo)
    w.session.add_images([str(fifo)])
    qtbot.waitUntil(lambda: "failed" in w.images.top_text(str(fifo)), timeout=10000)
    assert "named pipe" in w.session.image_list.failed[str(fifo)]
    if w.reporter.box is not None:
        w.reporter.box.close()
    good = tmp_path / "after.png"
    Image.new("RGB", (40, 40), "green").save(good)
    w.session.add_images([str(good)])
    wait_idle(qtbot, w)
    assert w.session.result(str(good)) is not None
