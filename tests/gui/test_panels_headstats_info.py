"""The head-statistics dock (values, hover, click selects, averaging, attention by token kind) and the model-info
dock."""
from __future__ import annotations

import numpy as np
from _gui import HEADS, hover, load_model, settle, show_dock, viewport_pos
from _plot_text import plot_text_problems
from PySide6.QtCore import Qt

from vitviz.core.analyses import analysis
from vitviz.core.analyses.analysis import attention_by_token_kind
from vitviz.gui.panels.info import ModelInfo, info_html


def _point_pos(panel, plot, layer: int, head: int):  # noqa: ANN001, ANN202
    index = int(np.flatnonzero((plot.layers == layer) & (plot.heads == head))[0])
    return panel.widget.mapFromScene(plot.scene_pos_of(index))


def test_statistics_of_the_current_image(qtbot, loaded, images) -> None:  # noqa: ANN001
    w = loaded
    panel = show_dock(qtbot, w, "headStatsDock")
    result = w.session.result(str(images[0])).result
    dist, ent = panel.shown
    np.testing.assert_allclose(dist, analysis.mean_attention_distance(result))
    np.testing.assert_allclose(ent, analysis.attention_entropy(result.attentions, num_prefix=1))
    assert len(panel.distance.x) == 2 * HEADS
    np.testing.assert_allclose(np.sort(panel.distance.y), np.sort(dist.ravel()))
    w.menus.actions["next_image"].trigger()
    np.testing.assert_allclose(panel.shown[0], analysis.mean_attention_distance(
        w.session.result(str(images[1])).result))


def test_hover_names_and_click_selects(qtbot, loaded) -> None:  # noqa: ANN001
    w = loaded
    panel = show_dock(qtbot, w, "headStatsDock")
    hover(panel.widget.viewport(), _point_pos(panel, panel.entropy, 0, 1))
    assert panel.readout.text().startswith("layer 0, head 1:")
    assert "nats" in panel.readout.text()
    qtbot.mouseClick(panel.widget.viewport(), Qt.MouseButton.LeftButton, pos=_point_pos(panel, panel.distance, 0, 1))
    assert (w.state.layer, w.state.head) == (0, 1)
    assert w.overview.frame.isVisible()                                  # the overview follows
    ring = panel.distance.ring.getData()
    assert len(ring[0]) == 1
    w.state.update(head="mean")                                          # every head of the layer is ringed
    assert len(panel.entropy.ring.getData()[0]) == HEADS


def test_average_over_images(qtbot, loaded, images) -> None:  # noqa: ANN001
    w = loaded
    panel = show_dock(qtbot, w, "headStatsDock")
    panel.average_check.setChecked(True)
    assert w.state.stats_average
    each = [analysis.mean_attention_distance(w.session.result(str(p)).result) for p in images]
    np.testing.assert_allclose(panel.shown[0], np.mean(each, axis=0), rtol=1e-6)
    assert "all 3 images" in panel.average_check.text()
    with qtbot.waitSignal(w.session.image_list.result_ready, timeout=20000):
        w.session.set_image_size((32, 48))                                         # another size: statistics start over
    wait = [p for p in images]
    qtbot.waitUntil(lambda: all(w.session.result(str(p)) is not None for p in wait), timeout=20000)
    assert "all 3 images" in panel.average_check.text()


def legend_names(panel) -> list[str]:  # noqa: ANN001
    return panel.kinds.legend_names


def plotted_means(panel) -> np.ndarray:  # noqa: ANN001
    """(L, kinds) the y values of the solid (head mean) lines."""
    return np.stack([curve.getData()[1] for curve in panel.kinds.mean_curves], axis=1)


def test_token_kinds_of_the_current_image_and_the_average(qtbot, loaded, images) -> None:  # noqa: ANN001
    w = loaded
    panel = show_dock(qtbot, w, "headStatsDock")
    expected = attention_by_token_kind(w.session.result(str(images[0])).result)     # (L, H, 2): cls, patches
    assert expected.shape == (2, HEADS, 2)
    np.testing.assert_allclose(panel.kinds.values, expected, rtol=1e-6)
    np.testing.assert_allclose(plotted_means(panel), expected.mean(axis=1), rtol=1e-6)
    assert legend_names(panel) == ["cls", "patches"]
    w.menus.actions["next_image"].trigger()
    np.testing.assert_allclose(panel.kinds.values, attention_by_token_kind(
        w.session.result(str(images[1])).result), rtol=1e-6)
    panel.average_check.setChecked(True)
    each = [attention_by_token_kind(w.session.result(str(p)).result) for p in images]
    np.testing.assert_allclose(panel.kinds.values, np.mean(each, axis=0), rtol=1e-6)
    np.testing.assert_allclose(plotted_means(panel).sum(axis=1), 1.0, rtol=1e-5)


def test_token_kinds_of_register_tokens_follow_layer_and_head(qtbot, window, tiny_ckpt_b,  # noqa: ANN001
                                                               images) -> None:
    w = window
    load_model(qtbot, w, tiny_ckpt_b, images[:2])
    panel = show_dock(qtbot, w, "headStatsDock")
    expected = attention_by_token_kind(w.session.result(w.session.image_list.current).result)    # cls, reg0, reg1, patches
    assert legend_names(panel) == ["cls", "reg0", "reg1", "patches"]
    np.testing.assert_allclose(plotted_means(panel), expected.mean(axis=1), rtol=1e-6)
    w.state.update(layer=1, head=1)                     # the selected head's shares, dashed; a line at the layer
    heads = np.stack([curve.getData()[1] for curve in panel.kinds.head_curves], axis=1)
    np.testing.assert_allclose(heads, expected[:, 1], rtol=1e-6)
    assert panel.kinds.layer_line.isVisible() and panel.kinds.layer_line.value() == 1
    assert legend_names(panel)[-1] == "head 1"
    w.state.update(head="mean")
    assert all(curve.getData()[1] is None or len(curve.getData()[1]) == 0 for curve in panel.kinds.head_curves)
    assert legend_names(panel) == ["cls", "reg0", "reg1", "patches"]
    hover(panel.widget.viewport(), viewport_pos(panel.widget, panel.kinds.plot.vb, 0.1, 0.5))
    text = panel.readout.text()
    assert text.startswith(f"layer 0: cls {expected[0, :, 0].mean():.3f}, reg0 ")
    assert f"reg1 {expected[0, :, 2].mean():.3f}, patches {expected[0, :, 3].mean():.3f} (head mean)" in text
    qtbot.mouseClick(panel.widget.viewport(), Qt.MouseButton.LeftButton,
                     pos=viewport_pos(panel.widget, panel.kinds.plot.vb, 0.1, 0.5))
    assert w.state.layer == 0 and w.state.head == "mean"                 # a click selects the layer


def test_token_kinds_without_prefix_tokens(qtbot, window, variant_ckpts, images) -> None:  # noqa: ANN001
    load_model(qtbot, window, variant_ckpts["no_cls"], images[:1])
    """Without prefix tokens all of the patches' attention goes to patches (1.0 in every layer, a flat line that
    said nothing, issue 35): the plot is folded and its title says why; the statistics are still there."""
    from vitviz.gui.panels.headstats import NO_KINDS_TITLE

    panel = show_dock(qtbot, window, "headStatsDock")
    qtbot.waitUntil(lambda: panel.kinds.folded, timeout=20000)
    np.testing.assert_allclose(window.session.head_stats[str(images[0])][2], 1.0, rtol=1e-6)   # what it would show
    assert panel.kinds.title.text == NO_KINDS_TITLE and not panel.kinds.plot.isVisible()
    window.state.update(layer=0, head=0)
    assert panel.kinds.key.text() == "" and panel.kinds.values is None


def test_model_info(qtbot, loaded, images, tiny_ckpt) -> None:  # noqa: ANN001
    w = loaded
    panel = show_dock(qtbot, w, "infoDock")
    text = panel.text()
    spec = w.session.model.spec
    assert spec.family in text and str(tiny_ckpt) in text and "device: cpu" in text
    assert "prefix tokens\n1 (cls)" in text
    assert "patch embedding" in text and "blocks" in text and "head" in text
    assert sum(w.session.model.param_counts.values()) == spec.num_params
    assert f"num_heads\n{HEADS}\ngiven\noverride" in text                # value, its kind, where it came from
    assert "pos_prefix\n1\nderived\nshape: pos_embed length" in text
    assert "block_norm\npre\nassumed\n" in text and f"num_params\n{spec.num_params}\n\n" in text   # no kind
    n = len(spec.assumptions)
    assert f"Exactness\nNot verified — {n} assumptions\n" in text                       # the verdict line
    assert "cached results: 3 image(s)" in text
    top = w.session.result(str(images[0])).result.top_k(5)
    assert top[0][1] in text and "Top-5" in text
    assert "interpolation" in text and "bicubic" in text


def test_model_info_register_tokens_and_no_model(qtbot, window, tiny_ckpt_b, images) -> None:  # noqa: ANN001
    assert "No model loaded" in window.info.text()
    load_model(qtbot, window, tiny_ckpt_b, images[:1])
    assert "3 (cls, reg0, reg1)" in window.info.text()
    assert "No model loaded" in info_html(ModelInfo())


def test_the_token_kind_plot_of_a_model_without_prefix_tokens_says_why_it_is_empty(qtbot, swin24, loaded,
                                                                                   images) -> None:  # noqa: ANN001
    """Swin has no CLS or register tokens: 'by token kind' was a flat line at 1.0 for every block. The plot is
    folded (its room goes to the distance and entropy plots) and its title says why; a ViT with a CLS token
    still gets the plot and its key."""
    from vitviz.gui.panels.headstats import KINDS_TITLE, NO_KINDS_TITLE

    panel = show_dock(qtbot, loaded, "headStatsDock")
    qtbot.waitUntil(lambda: panel.kinds.values is not None, timeout=20000)
    assert panel.kinds.plot.isVisible() and panel.kinds.title.text == KINDS_TITLE and "cls" in panel.kinds.key.text()
    with qtbot.waitSignal(loaded.session.model.model_loaded, timeout=60000):
        loaded.load_model(str(swin24))
    qtbot.waitUntil(loaded.is_idle, timeout=60000)
    panel.request_redraw()
    qtbot.waitUntil(lambda: panel.kinds.folded and panel.shown is not None, timeout=20000)
    settle()
    assert not panel.kinds.plot.isVisible() and panel.kinds.title.text == NO_KINDS_TITLE
    assert panel.kinds.key.text() == ""
    loaded.state.update(head=3)
    assert panel.kinds.key.text() == ""
    assert panel.distance.plot.height() > 100
    assert not plot_text_problems(panel.widget), plot_text_problems(panel.widget)
    # Features: no token features for a windowed model (said), and its settings disabled, not left to do nothing
    features = show_dock(qtbot, loaded, "featuresDock")
    qtbot.waitUntil(lambda: "No token features" in features.status.text(), timeout=20000)
    assert not features.tabs.isEnabled() and not features.layer_spin.isEnabled()
