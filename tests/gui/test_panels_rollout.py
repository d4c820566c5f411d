"""The rollout dock: live controls change the map (same numbers as core), any query token, and the image panel's
'rollout' source and its export use the same parameters."""
from __future__ import annotations

import numpy as np
from _gui import load_model, show_dock, viewport_pos
from PySide6.QtCore import Qt

from vitviz.core.analyses import analysis
from vitviz.gui import exporting
from vitviz.gui.state import stack_for


def _result(w, images):  # noqa: ANN001, ANN202
    return w.session.result(str(images[0])).result


def test_defaults_match_core_and_raw_cls(qtbot, loaded, images) -> None:  # noqa: ANN001
    w = loaded
    panel = show_dock(qtbot, w, "rolloutDock")
    result = _result(w, images)
    np.testing.assert_allclose(panel.rollout_map, analysis.rollout(result), rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(panel.raw_map, analysis.cls_attention(result, -1, "mean"), rtol=1e-6)
    assert "rollout of cls" in panel.rollout_view.title.text


def test_controls_change_the_map(qtbot, loaded, images) -> None:  # noqa: ANN001
    w = loaded
    panel = show_dock(qtbot, w, "rolloutDock")
    result = _result(w, images)
    before = panel.rollout_map.copy()
    panel.fusion_combo.setCurrentText("max")
    panel.fusion_combo.activated.emit(panel.fusion_combo.currentIndex())
    panel.discard_spin.setValue(0.5)
    panel.residual_spin.setValue(0.2)
    panel.start_spin.setValue(1)
    with qtbot.waitSignal(w.refreshed, timeout=5000):
        pass                                                  # the coalesced update lands on the next turn
    assert (w.state.rollout_fusion, w.state.rollout_discard, w.state.rollout_residual, w.state.rollout_start) == \
        ("max", 0.5, 0.2, 1)
    expected = analysis.rollout(result, "max", 0.5, 1, "cls", 0.2)
    np.testing.assert_allclose(panel.rollout_map, expected, rtol=1e-4, atol=1e-7)
    assert not np.allclose(panel.rollout_map, before)
    assert "discard 0.50" in panel.rollout_view.title.text and "from layer 1" in panel.rollout_view.title.text
    assert "ms" in panel.timing.text()


def test_rollout_source_and_export_use_the_parameters(qtbot, loaded, images, tmp_path) -> None:  # noqa: ANN001
    w = loaded
    result = _result(w, images)
    w.state.update(source="rollout", rollout_fusion="min", rollout_discard=0.25, rollout_residual=0.7)
    expected = analysis.rollout(result, "min", 0.25, 0, "cls", 0.7)
    np.testing.assert_allclose(w._values, expected, rtol=1e-4, atol=1e-7)          # the image panel's map
    assert "rollout of cls (min, discard 0.25" in w.panel.title.text
    maps = w.session.result(str(images[0]))
    np.testing.assert_allclose(stack_for(maps, w.state).select(-1, "mean"), expected, rtol=1e-4, atol=1e-7)
    heat = exporting.render_view(maps, w.state, heatmap_only=True, colorbar=False)
    w.state.update(rollout_fusion="mean", rollout_discard=0.0, rollout_residual=0.5)
    assert not np.array_equal(heat, exporting.render_view(maps, w.state, heatmap_only=True, colorbar=False))


def test_click_patch_rolls_out_from_it(qtbot, loaded, images) -> None:  # noqa: ANN001
    w = loaded
    panel = show_dock(qtbot, w, "rolloutDock")
    result = _result(w, images)
    w.state.update(source="rollout")
    p = result.spec.patch_size
    pos = viewport_pos(panel.widget, panel.rollout_view.view, 2.5 * p, 1.5 * p)   # patch (1, 2) = token 7
    qtbot.mouseClick(panel.widget.viewport(), Qt.MouseButton.LeftButton, pos=pos)
    assert (w.state.source, w.state.query) == ("rollout", 7)                    # rollout stays the map source
    np.testing.assert_allclose(panel.rollout_map, analysis.rollout(result, query=7), rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(w._values, analysis.rollout(result, query=7), rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(panel.raw_map, analysis.token_map(result, -1, "mean", 7), rtol=1e-6)
    assert panel.rollout_view.box.isVisible() and w.panel.highlight_item.isVisible()
    assert panel.query_combo.currentData() == 7
    qtbot.mouseClick(panel.widget.viewport(), Qt.MouseButton.LeftButton, pos=pos)   # again: back to CLS
    assert w.state.query is None
    np.testing.assert_allclose(panel.rollout_map, analysis.rollout(result), rtol=1e-4, atol=1e-7)


def test_prefix_query_from_combo(qtbot, window, tiny_ckpt_b, images) -> None:  # noqa: ANN001
    load_model(qtbot, window, tiny_ckpt_b, images[:1])
    panel = show_dock(qtbot, window, "rolloutDock")
    result = window.session.result(str(images[0])).result
    combo = panel.query_combo
    combo.setCurrentIndex(combo.findData(2))                                     # reg1
    combo.activated.emit(combo.currentIndex())
    assert window.state.query == 2
    np.testing.assert_allclose(panel.rollout_map, analysis.rollout(result, query=2), rtol=1e-4, atol=1e-7)
    assert "rollout of reg1" in panel.rollout_view.title.text


def test_no_cls_model_rolls_out_the_patch_mean(qtbot, window, variant_ckpts, images) -> None:  # noqa: ANN001
    load_model(qtbot, window, variant_ckpts["no_cls"], images[:1])
    panel = show_dock(qtbot, window, "rolloutDock")
    result = window.session.result(str(images[0])).result
    np.testing.assert_allclose(panel.rollout_map, analysis.rollout(result, query="mean"), rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(panel.raw_map, analysis.token_map(result, -1, "mean", "mean"), rtol=1e-5)
    assert "mean patch" in panel.rollout_view.title.text
    assert panel.query_combo.itemText(0).startswith("mean of the patches")


def test_engine_matches_the_reference_for_every_setting() -> None:
    """The window's engine (`ResultMaps.rollout`) against the test-side reference, and `analysis.rollout_vector`
    is that same engine: equal to the last bit."""
    from _gui import random_result
    from _rollout_ref import reference_rollout_rows

    from vitviz.core.analyses.maps import ResultMaps
    from vitviz.core.analyses.rollout import RolloutParams

    for reg, cls in ((0, True), (2, True), (0, False)):
        result = random_result(depth=4, reg=reg, cls=cls)
        engine = ResultMaps(result).rollout
        p = result.spec.num_prefix
        for fusion in ("mean", "max", "min"):
            for discard, start, query in ((0.0, 0, None), (0.4, 1, p + 2), (0.9, 3, 0)):
                params = RolloutParams(fusion, discard, start, 0.3, query)
                ref = reference_rollout_rows(result.attentions, p, fusion, discard, 0.3, start, query, cls)
                np.testing.assert_allclose(engine.vector(params), ref[-1], rtol=1e-4, atol=1e-6)
                layers = engine.through_each_layer(params)
                np.testing.assert_allclose(layers, ref, rtol=1e-4, atol=1e-6)
                assert not layers[:start].any()
                core_query = query if query is not None else ("cls" if cls else "mean")
                core = analysis.rollout_vector(result, fusion, discard, start, core_query, 0.3)
                np.testing.assert_array_equal(engine.vector(params), core)


def test_colormap_combo_lists_what_export_accepts(window) -> None:  # noqa: ANN001
    """The controls' colormap combo (the rollout views draw with its choice too) offers exactly the colormaps
    `vitviz export --cmap` accepts, `plasma` included."""
    from vitviz.core.drawing.colormaps import available_colormaps

    combo = window.controls.cmap_combo
    assert tuple(combo.itemText(i) for i in range(combo.count())) == available_colormaps()


def _lines(label) -> list[str]:  # noqa: ANN001
    doc = label.item.document()
    out = []
    block = doc.begin()
    while block.isValid():
        layout = block.layout()
        for i in range(layout.lineCount()):
            line = layout.lineAt(i)
            out.append(block.text()[line.textStart():line.textStart() + line.textLength()])
        block = block.next()
    return out


def test_a_long_rollout_title_wraps_between_its_settings_not_inside_a_number(qtbot) -> None:  # noqa: ANN001
    """The Rollout dock's title 'rollout of cls (mean, residual 0.50) · max 0.0941' is one phrase wider than the
    half-dock it has at 1400 px: Qt broke it anywhere, into 'residual 0.5' / '0) · max ...'. It breaks after a
    setting's comma instead."""
    import pyqtgraph as pg

    from vitviz.gui.panels.base import TitleLabel

    widget = pg.GraphicsLayoutWidget()
    qtbot.addWidget(widget)
    label = TitleLabel("", size="10pt")
    widget.addItem(label)
    label.setText("rollout of cls (max, discard 0.90, from layer 2, residual 0.50) · max 0.0941")
    label.item.setTextWidth(180)
    lines = _lines(label)
    assert len(lines) > 1
    for before, after in zip(lines, lines[1:]):
        assert before[-1:].isspace() or after[:1].isspace(), lines     # a break at a space, never inside a word
    assert all(not line.strip()[:1].isdigit() and not line.strip().startswith(")") for line in lines), lines
