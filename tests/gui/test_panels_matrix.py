"""The attention-matrix dock: drawing, hover readout, log scale, linked query selection, prefix labels."""
from __future__ import annotations

import numpy as np
from _gui import hover, load_model, show_dock, viewport_pos
from PySide6.QtCore import Qt

from vitviz.core.analyses import analysis
from vitviz.gui.numbers import number
def _cell_pos(panel, row: int, col: int):  # noqa: ANN001, ANN202
    return viewport_pos(panel.widget, panel.plot.vb, col + 0.5, row + 0.5)


def test_matrix_follows_layer_and_head(qtbot, loaded, images) -> None:  # noqa: ANN001
    w = loaded
    panel = show_dock(qtbot, w, "matrixDock")
    attn = w.session.result(str(images[0])).result.attentions
    np.testing.assert_allclose(panel.image_item.image, attn[1].mean(0), rtol=1e-6)
    assert panel.image_item.image.shape == (17, 17)
    w.state.update(layer=0, head=1)
    np.testing.assert_allclose(panel.image_item.image, attn[0, 1], rtol=1e-6)
    w.state.update(head="max")                        # made in a pool thread (test_matrix_reductions.py)
    qtbot.waitUntil(lambda: panel.matrix is not None, timeout=10000)
    np.testing.assert_allclose(panel.image_item.image, attn[0].max(0), rtol=1e-6)
    assert "layer 0 · head max" in panel.title.text


def test_hover_readout_and_log_scale(qtbot, loaded, images) -> None:  # noqa: ANN001
    w = loaded
    panel = show_dock(qtbot, w, "matrixDock")
    attn = w.session.result(str(images[0])).result.attentions
    hover(panel.widget.viewport(), _cell_pos(panel, 5, 0))
    text = panel.readout.text()
    assert "query patch (1, 0) · token 5" in text and "key cls · token 0" in text
    assert number(attn[1, :, 5, 0].mean()) in text
    panel.log_check.setChecked(True)
    assert w.state.matrix_log
    np.testing.assert_allclose(panel.image_item.image, np.log10(attn[1].mean(0)), rtol=1e-5)


def test_click_row_selects_query_everywhere(qtbot, loaded, images) -> None:  # noqa: ANN001
    w = loaded
    panel = show_dock(qtbot, w, "matrixDock")
    result = w.session.result(str(images[0])).result
    qtbot.mouseClick(panel.widget.viewport(), Qt.MouseButton.LeftButton, pos=_cell_pos(panel, 7, 2))
    assert (w.state.source, w.state.query) == ("token", 7)
    np.testing.assert_allclose(w.panel.values, analysis.token_map(result, 1, "mean", 7), rtol=1e-6)   # image panel
    assert w.panel.highlight_item.isVisible()
    assert w.controls.query_combo.currentData() == 7
    assert panel.row_box.isVisible() and panel.row_box.rect().top() == 7
    assert panel.col_box.rect().left() == 7
    qtbot.mouseClick(panel.widget.viewport(), Qt.MouseButton.LeftButton, Qt.KeyboardModifier.ShiftModifier,
                     pos=_cell_pos(panel, 7, 11))
    assert w.state.query == 11                                            # Shift: the column's token


def test_image_click_moves_matrix_selection(qtbot, loaded) -> None:  # noqa: ANN001
    w = loaded
    panel = show_dock(qtbot, w, "matrixDock")
    w.panel.clicked.emit(0, 1)                                             # patch (0, 1) = token 2
    assert w.state.query == 2 and panel.row_box.rect().top() == 2


def test_register_tokens_labelled(qtbot, window, tiny_ckpt_b, images) -> None:  # noqa: ANN001
    load_model(qtbot, window, tiny_ckpt_b, images[:1])
    panel = show_dock(qtbot, window, "matrixDock")
    assert panel.image_item.image.shape == (12, 12)                       # cls, reg0, reg1 + 3x3 patches
    major = [label for _, label in panel.plot.getAxis("left")._tickLevels[0]]
    assert major[:3] == ["cls", "reg0", "reg1"] and "row 1" in major
    assert panel.prefix_lines[0].value() == 3 and panel.prefix_lines[0].isVisible()
    hover(panel.widget.viewport(), _cell_pos(panel, 2, 4))
    assert "query reg1 · token 2" in panel.readout.text() and "key patch (0, 1)" in panel.readout.text()


def test_no_cls_model_matrix(qtbot, window, variant_ckpts, images) -> None:  # noqa: ANN001
    load_model(qtbot, window, variant_ckpts["no_cls"], images[:1])
    panel = show_dock(qtbot, window, "matrixDock")
    assert panel.image_item.image.shape == (16, 16)
    assert not panel.prefix_lines[0].isVisible()
    hover(panel.widget.viewport(), _cell_pos(panel, 0, 0))
    assert "query patch (0, 0) · token 0" in panel.readout.text()


def test_hidden_tab_skips_redraws_and_catches_up(qtbot, loaded, images) -> None:  # noqa: ANN001
    """A dock behind another tab is 'visible' to Qt but not on screen: it must not redraw until raised."""
    w = loaded
    panel = show_dock(qtbot, w, "matrixDock")
    attn = w.session.result(str(images[0])).result.attentions
    overview = show_dock(qtbot, w, "overviewDock")
    assert not panel.is_shown() and overview.isVisible()
    before = panel.image_item.image.copy()
    w.state.update(layer=0, head=1)
    np.testing.assert_array_equal(panel.image_item.image, before)  # no work behind the tab
    show_dock(qtbot, w, "matrixDock")
    qtbot.waitUntil(lambda: np.allclose(panel.image_item.image, attn[0, 1]), timeout=5000)


def test_a_matrix_built_from_the_image_list_alone_follows_it(qtbot, loaded, images) -> None:  # noqa: ANN001
    """The matrix is built from the part it follows (the image list) and the result shown now, not the session or
    the window: it starts on that result and follows the current image from there."""
    from vitviz.gui.panels.matrix import MatrixPanel
    from vitviz.gui.state import ViewState

    session = loaded.session
    qtbot.waitUntil(lambda: session.result(str(images[1])) is not None, timeout=20000)
    first = session.image_list.current_maps
    panel = MatrixPanel(ViewState(), session.image_list, first)
    qtbot.addWidget(panel)
    panel.show()
    qtbot.waitExposed(panel)
    assert first is not None and panel._maps is first
    session.set_current(str(images[1]))
    second = session.result(str(images[1]))
    assert panel._maps is second and second is not first
    np.testing.assert_allclose(panel.image_item.image, second.result.attentions[-1].mean(0), rtol=1e-6)
