"""The real window, driven offscreen: load, run, select, click, drop, keyboard, stale answers."""
from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
from _gui import HEADS, answer_heads, wait_idle
from PySide6.QtCore import QEvent, QMimeData, QPoint, QPointF, Qt, QUrl
from PySide6.QtGui import QDragEnterEvent, QDropEvent, QMouseEvent
from PySide6.QtWidgets import QApplication

from vitviz.core.analyses import analysis
from vitviz.gui.protocol import Run


def overlay_image(window) -> np.ndarray:  # noqa: ANN001
    return np.asarray(window.panel.overlay_item.image)


def test_load_and_show_cls_map(loaded, images) -> None:  # noqa: ANN001
    w = loaded
    spec = w.session.model.spec
    assert (spec.depth, spec.num_heads, spec.grid) == (2, HEADS, (4, 4))
    assert w.state.layer == 1 and w.state.head == "mean"
    result = w.session.result(str(images[0])).result
    expected = analysis.cls_attention(result, 1, "mean")
    np.testing.assert_allclose(w.panel.values, expected, rtol=1e-6)
    assert overlay_image(w).shape == (32, 32)                 # smooth: upsampled over the 32x32 input
    assert "CLS attention" in w.panel.title.text
    assert w.controls.layer_spin.maximum() == 1 and w.controls.head_spin.maximum() == HEADS - 1
    assert "%" in w.images.top_text(str(images[1]))           # top-5 shown for every image


def test_controls_drive_the_map(qtbot, loaded, images) -> None:  # noqa: ANN001
    w = loaded
    result = w.session.result(str(images[0])).result
    w.controls.layer_spin.setValue(0)
    w.controls.head_spin.setValue(1)
    assert (w.state.layer, w.state.head) == (0, 1)
    np.testing.assert_allclose(w.panel.values, analysis.cls_attention(result, 0, 1), rtol=1e-6)
    w.controls.head_spin.lineEdit().setText("max")
    w.controls.head_spin.interpretText()
    assert w.state.head == "max"
    w.controls.smooth_check.setChecked(False)
    assert overlay_image(w).shape == (4, 4)                   # blocky: one value per patch
    w.controls.cmap_combo.setCurrentText("inferno")
    w.controls.cmap_combo.activated.emit(w.controls.cmap_combo.currentIndex())
    assert w.state.colormap == "inferno"
    np.testing.assert_array_equal(w.panel.overlay_item.lut, __import__("vitviz.core.drawing.colormaps", fromlist=["x"])
                                  .colormap("inferno"))
    w.controls.opacity_slider.setValue(25)
    assert w.panel.overlay_item.opacity() == 0.25
    w.controls.source_combo.setCurrentIndex(w.controls.source_combo.findData("rollout"))
    w.controls.source_combo.activated.emit(w.controls.source_combo.currentIndex())
    assert not w.controls.head_spin.isEnabled()               # rollout fuses the heads
    w.controls.layer_spin.setValue(1)
    np.testing.assert_allclose(w.panel.values, analysis.rollout(result), rtol=1e-4)
    w.controls.normalize_check.setChecked(True)
    levels = w.panel.overlay_item.getLevels()
    assert np.isclose(levels[1], w.panel.values.max())


def _patch_viewport_pos(window, row: int, col: int) -> QPoint:  # noqa: ANN001
    p = window.session.model.spec.patch_size
    scene = window.panel.view.mapViewToScene(QPointF((col + 0.5) * p, (row + 0.5) * p))
    return window.panel.view_widget.mapFromScene(scene)


def _hover(viewport, pos: QPoint) -> None:  # noqa: ANN001
    """A plain mouse move (no button), sent straight to the viewport: QTest's move needs a real cursor."""
    event = QMouseEvent(QEvent.Type.MouseMove, QPointF(pos), viewport.mapToGlobal(QPointF(pos)),
                        Qt.MouseButton.NoButton, Qt.MouseButton.NoButton, Qt.KeyboardModifier.NoModifier)
    QApplication.sendEvent(viewport, event)


def test_click_patch_selects_query_and_again_clears(qtbot, loaded, images) -> None:  # noqa: ANN001
    w = loaded
    result = w.session.result(str(images[0])).result
    viewport = w.panel.view_widget.viewport()
    pos = _patch_viewport_pos(w, 2, 3)
    _hover(viewport, pos)
    assert "row 2, col 3" in w.hover_label.text()
    assert "token 12" in w.hover_label.text()                  # 1 prefix + 2 * 4 + 3
    qtbot.mouseClick(viewport, Qt.MouseButton.LeftButton, pos=pos)
    assert (w.state.source, w.state.query) == ("token", 12)
    np.testing.assert_allclose(w.panel.values, analysis.token_map(result, 1, "mean", 12), rtol=1e-6)
    assert w.panel.highlight_item.isVisible()
    assert w.controls.query_combo.currentData() == 12
    qtbot.mouseClick(viewport, Qt.MouseButton.LeftButton, pos=pos)
    assert (w.state.source, w.state.query) == ("cls", None)
    assert not w.panel.highlight_item.isVisible()


def test_prefix_token_as_query(loaded, images) -> None:  # noqa: ANN001
    w = loaded
    combo = w.controls.query_combo
    combo.setCurrentIndex(combo.findData(0))
    combo.activated.emit(combo.currentIndex())
    assert (w.state.source, w.state.query) == ("token", 0)


def test_overview_click_selects_layer_and_head(qtbot, loaded) -> None:  # noqa: ANN001
    w = loaded
    ov = w.overview
    nl, nc, gh, gw = ov._shape
    assert (nl, nc) == (2, HEADS + 2)
    point = QPointF((1 + 0.5) * (gw + ov._gap), (0 + 0.5) * (gh + ov._gap))   # layer 0, head 1
    scene = ov.plot.vb.mapViewToScene(point)
    qtbot.mouseClick(ov.widget.viewport(), Qt.MouseButton.LeftButton, pos=ov.widget.mapFromScene(scene))
    assert (w.state.layer, w.state.head) == (0, 1)
    w.overview.tile_clicked.emit(1, "max")
    assert (w.state.layer, w.state.head) == (1, "max")


def test_keyboard_actions(loaded, images) -> None:  # noqa: ANN001
    w = loaded
    acts = w.menus.actions
    assert acts["next_layer"].shortcut().toString() == "Ctrl+Down"
    acts["next_layer"].trigger()
    assert w.state.layer == 0
    acts["next_head"].trigger()
    assert w.state.head == 0
    acts["prev_head"].trigger()
    assert w.state.head == 1
    acts["next_image"].trigger()
    assert w.session.image_list.current == str(images[1])
    assert w.panel.title.text.startswith("img1.png")


def _drop(window, paths: list[Path]) -> None:  # noqa: ANN001
    """Synthesize a drag entering the window and the drop, as the platform would send them."""
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(p)) for p in paths])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        enter = QDragEnterEvent(QPoint(50, 50), Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton,
                                Qt.KeyboardModifier.NoModifier)
    QApplication.sendEvent(window, enter)
    assert enter.isAccepted()
    event = QDropEvent(QPointF(50, 50), Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton,
                       Qt.KeyboardModifier.NoModifier)
    QApplication.sendEvent(window, event)


def test_drop_checkpoint_then_images_and_folder(qtbot, window, tiny_ckpt, images) -> None:  # noqa: ANN001
    with qtbot.waitSignal(window.session.model.model_loaded, timeout=20000):
        _drop(window, [tiny_ckpt])
    answer_heads(qtbot, window, HEADS)                           # the file does not say: the window asks
    assert window.session.model.spec.depth == 2 and window.session.model.spec.num_heads == HEADS
    _drop(window, [images[0], images[0].parent])               # a file and its folder: no duplicates
    wait_idle(qtbot, window)
    assert window.images.paths() == [str(p) for p in images]
    assert all(window.session.result(str(p)) is not None for p in images)
    assert window.panel.image_item.image is not None


def test_input_size_non_square(qtbot, loaded, images) -> None:  # noqa: ANN001
    w = loaded
    with qtbot.waitSignal(w.session.image_list.result_ready, timeout=20000):
        w.session.set_image_size((32, 48))
    result = w.session.result(w.session.image_list.current).result
    assert result.grid == (4, 6) and result.image.shape[:2] == (32, 48)
    assert w.panel.values.shape == (4, 6)
    assert (w.controls.height_spin.value(), w.controls.width_spin.value()) == (32, 48)
    assert w.overview._shape[2:] == (4, 6)


def test_input_size_in_whole_patches_is_noted(qtbot, loaded, images) -> None:  # noqa: ANN001
    """A size that is not whole 8-px patches runs rounded down, and the status bar says so (also once idle)."""
    w = loaded
    with qtbot.waitSignal(w.session.image_list.result_ready, timeout=20000):
        w.session.set_image_size((36, 43))
    note = "Input size 36×43 is not a multiple of the 8 px patch; using 32×40"
    assert w.session.model.image_size == (32, 40) and w.notes == [note]
    assert (w.controls.height_spin.value(), w.controls.width_spin.value()) == (32, 40)
    wait_idle(qtbot, w)
    assert w.session.result(w.session.image_list.current).result.image.shape[:2] == (32, 40)
    assert w.statusBar().currentMessage() == note and w.reporter.errors == []
    w.session.set_image_size((5, 16))
    assert w.session.model.image_size == (8, 16)
    assert w.notes[-1] == "Input size 5×16 is smaller than one 8 px patch; using 8×16"
    wait_idle(qtbot, w)
    assert w.reporter.errors == []
    w.session.set_image_size((32, 48))                          # whole patches: no note
    assert len(w.notes) == 2


def test_stale_run_is_dropped(qtbot, loaded, images) -> None:  # noqa: ANN001
    w = loaded
    dropped: list = []
    w.session.client.dropped.connect(dropped.append)
    w.session.set_image_size((40, 40))      # the run at 40x40 is sent at once ...
    w.session.set_image_size((32, 24))      # ... and is stale before its answer can arrive
    wait_idle(qtbot, w)
    assert any(r.kind is Run and r.args["image_size"] == (40, 40) for r in dropped)
    result = w.session.result(w.session.image_list.current).result
    assert result.image.shape[:2] == (32, 24) and w.panel.values.shape == (4, 3)


def test_result_of_replaced_model_is_dropped(qtbot, loaded, tiny_ckpt_b, images) -> None:  # noqa: ANN001
    w = loaded
    dropped: list = []
    w.session.client.dropped.connect(dropped.append)
    w.session.set_image_size((40, 40))
    w.session.ensure_all()        # runs for the old model are in flight ...
    w.load_model(str(tiny_ckpt_b), heads=HEADS)   # ... when a new model is asked for
    wait_idle(qtbot, w)
    assert w.reporter.errors == []
    assert any(r.kind is Run for r in dropped)
    assert w.session.model.spec.reg_tokens == 2
    result = w.session.result(w.session.image_list.current).result
    assert result.spec.grid == (3, 3) and w.panel.values.shape == (3, 3)


def test_device_list(qtbot, window) -> None:  # noqa: ANN001
    with qtbot.waitSignal(window.session.devices_found, timeout=20000) as blocker:
        pass
    assert "cpu" in blocker.args[0]
    items = [window.controls.device_combo.itemText(i) for i in range(window.controls.device_combo.count())]
    assert items[0] == "cpu"


def test_move_to_cuda_gives_the_same_maps(qtbot, loaded, images) -> None:  # noqa: ANN001
    import pytest
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    w = loaded
    cpu = w.session.result(w.session.image_list.current).result.attentions
    combo = w.controls.device_combo
    qtbot.waitUntil(lambda: "cuda" in [combo.itemText(i) for i in range(combo.count())], timeout=20000)
    with qtbot.waitSignal(w.session.model.device_changed, timeout=60000):
        w.controls.device_requested.emit("cuda")
    assert w.session.model.device.startswith("cuda") and w.controls.device_combo.currentText().startswith("cuda")
    w.set_image_size(32, 32 + 8)      # forces new runs, now on the GPU
    w.session.set_image_size((32, 32))
    wait_idle(qtbot, w)
    np.testing.assert_allclose(w.session.result(w.session.image_list.current).result.attentions, cpu, atol=1e-5)


def test_overview_names_the_mean_and_max_columns_as_space_allows(qtbot, session) -> None:  # noqa: ANN001
    from vitviz.core.analyses.maps import MapStack
    from vitviz.gui.panels.overview import MEAN_MAX, OverviewPanel
    from vitviz.gui.state import ViewState

    def bottom_labels(panel: OverviewPanel) -> list[str]:
        return [text for _pos, text in panel.plot.getAxis("bottom")._tickLevels[0]]

    panel = OverviewPanel(ViewState(), session.model, session.image_list)
    qtbot.addWidget(panel)
    panel.resize(700, 500)
    panel.show()
    qtbot.waitExposed(panel)
    rng = np.random.default_rng(0)
    panel.show_stack(MapStack(rng.random((2, 6, 7, 7), dtype=np.float32), np.ones(3, np.float32), "CLS"), False,
                     "viridis")                                     # 4 heads: wide columns
    assert bottom_labels(panel)[-2:] == ["mean", "max"]
    assert panel.plot.getAxis("bottom").labelText == "head"
    panel.show_stack(MapStack(rng.random((24, 18, 7, 7), dtype=np.float32), np.ones(3, np.float32), "CLS"), False,
                     "viridis")                                     # ViT-L: 16 heads and 24 layers in 500 px
    assert bottom_labels(panel)[-2:] != ["mean", "max"]
    assert panel.plot.getAxis("bottom").labelText in [label for *_names, label in MEAN_MAX[1:]]
    panel.resize(700, 1400)                                         # taller: the columns widen again
    qtbot.waitUntil(lambda: bottom_labels(panel)[-2:] == ["mean", "max"], timeout=5000)
