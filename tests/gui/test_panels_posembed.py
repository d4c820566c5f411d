"""The position-embedding dock: hover (here or in the image) updates the similarity map; CLS row; mosaic; input
size; models without CLS row, without CLS and without a learned position embedding."""
from __future__ import annotations

import numpy as np
import pytest
from _gui import HEADS, SCREENS, hover, load_model, open_at, settle, show_dock, viewport_pos
from _plot_text import plot_text_problems

from vitviz.core.analyses import analysis
from vitviz.core.analyses.maps import MOSAIC_MAX_POSITIONS, pos_embed_data
from vitviz.gui.panels.posembed import NO_POS_TEXT


def _model_pos(path, grid=None):  # noqa: ANN001, ANN202
    import vitviz

    model = vitviz.load(str(path), heads=HEADS)
    return model.pos_embed(grid), model.spec.pos_prefix


def _ready(qtbot, window, grid):  # noqa: ANN001, ANN202
    panel = show_dock(qtbot, window, "posEmbedDock")
    qtbot.waitUntil(lambda: panel.data is not None and panel.data.grid == grid, timeout=20000)
    return panel


def test_image_hover_drives_similarity(qtbot, loaded, tiny_ckpt) -> None:  # noqa: ANN001
    w = loaded
    panel = _ready(qtbot, w, (4, 4))
    pos, prefix = _model_pos(tiny_ckpt)
    sim = analysis.pos_embed_similarity(pos, (4, 4), prefix)
    p = w.session.model.spec.patch_size
    scene = w.panel.view.mapViewToScene(__import__("PySide6.QtCore", fromlist=["QPointF"]).QPointF(3.5 * p, 1.5 * p))
    hover(w.panel.view_widget.viewport(), w.panel.view_widget.mapFromScene(scene))    # patch (1, 3) in the image
    assert panel.position == (1, 3)
    np.testing.assert_allclose(panel.hover_item.image, sim[1, 3], rtol=1e-5, atol=1e-6)
    assert panel.hover_frame.rect().topLeft().toTuple() == (3.0, 1.0)
    assert "(1, 3)" in panel.hover_label.text
    np.testing.assert_allclose(panel.cls_item.image, analysis.prefix_pos_similarity(pos, (4, 4), prefix), rtol=1e-5,
                               atol=1e-6)
    assert panel.mosaic_item.image.shape == (4 * 5 - 1, 4 * 5 - 1)          # 4x4 tiles of 4x4, 1-px gaps


def test_hover_in_panel_and_mosaic(qtbot, loaded) -> None:  # noqa: ANN001
    w = loaded
    panel = _ready(qtbot, w, (4, 4))
    sim = panel.data.similarity
    hover(panel.widget.viewport(), viewport_pos(panel.widget, panel.hover_view, 0.5, 2.5))
    assert panel.position == (2, 0)
    np.testing.assert_allclose(panel.hover_item.image, sim[2, 0])
    hover(panel.widget.viewport(), viewport_pos(panel.widget, panel.mosaic_view, 3 * 5 + 1.5, 1 * 5 + 2.5))
    assert panel.position == (1, 3)                                          # the tile of position (1, 3)
    np.testing.assert_allclose(panel.hover_item.image, sim[1, 3])
    assert panel.last_hover_ms < 1000


def test_follows_input_size(qtbot, loaded, tiny_ckpt) -> None:  # noqa: ANN001
    w = loaded
    w.session.set_image_size((32, 48))
    panel = _ready(qtbot, w, (4, 6))
    pos, prefix = _model_pos(tiny_ckpt, (4, 6))
    np.testing.assert_allclose(panel.data.pos, pos, rtol=1e-6)             # the interpolated embedding
    np.testing.assert_allclose(panel.data.similarity, analysis.pos_embed_similarity(pos, (4, 6), prefix),
                               rtol=1e-5, atol=1e-6)
    assert "4×6 · interpolated from the trained 4×4" in panel.title.text()
    w.panel.hovered.emit(3, 5)
    assert panel.position == (3, 5)


@pytest.mark.parametrize("variant", ["no_embed_class", "no_cls"])
def test_position_embedding_without_prefix_rows(qtbot, window, variant_ckpts, images, variant) -> None:  # noqa: ANN001
    load_model(qtbot, window, variant_ckpts[variant], images[:1])
    panel = _ready(qtbot, window, (4, 4))
    pos, prefix = _model_pos(variant_ckpts[variant])
    assert prefix == 0 and panel.data.cls_similarity is None
    np.testing.assert_allclose(panel.data.similarity, analysis.pos_embed_similarity(pos, (4, 4), 0), rtol=1e-5,
                               atol=1e-6)
    assert panel.cls_item.image is None
    assert "no prefix rows" in panel.cls_label.text
    assert ("no_embed_class" in panel.cls_label.text) == (variant == "no_embed_class")


def test_model_without_position_embedding(qtbot, window, variant_ckpts, images) -> None:  # noqa: ANN001
    panel = show_dock(qtbot, window, "posEmbedDock")
    # no table: say it has no positions at all
    with qtbot.waitSignal(window.session.model.model_loaded, timeout=20000):
        window.load_model(str(variant_ckpts["no_pos"]), heads=HEADS, rope="none")
    window.session.add_images([str(images[0])])
    qtbot.waitUntil(lambda: panel.message.text() == NO_POS_TEXT, timeout=20000)
    assert panel._stack.currentWidget() is panel.message
    window.panel.hovered.emit(1, 1)                                        # hovering the image does nothing
    assert panel.position is None
    assert window.reporter.errors == []


def test_pos_embed_of_a_huge_grid_computes_only_what_is_shown() -> None:
    rng = np.random.default_rng(0)
    grid = (60, 70)                                       # 4200 positions > MOSAIC_MAX_POSITIONS
    assert grid[0] * grid[1] > MOSAIC_MAX_POSITIONS
    pos = rng.normal(size=(1 + grid[0] * grid[1], 16)).astype(np.float32)
    data = pos_embed_data(pos, grid, 1)
    assert data.similarity is None and data.mosaic is None
    full = analysis.pos_embed_similarity(pos, grid, 1)
    np.testing.assert_allclose(data.similarity_to(7, 9), full[7, 9], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(data.cls_similarity, analysis.prefix_pos_similarity(pos, grid, 1), rtol=1e-4,
                               atol=1e-5)
    assert full.min() - 1e-6 <= data.low < 1.0
    small = pos_embed_data(pos[: 1 + 12], (3, 4), 1)
    assert small.similarity is not None and small.mosaic is not None
    assert small.low == pytest.approx(float(analysis.pos_embed_similarity(pos[: 1 + 12], (3, 4), 1).min()))


def test_pos_embed_panel_says_the_grid_is_too_large(qtbot, window) -> None:  # noqa: ANN001
    pos = np.random.default_rng(1).normal(size=(1 + 60 * 70, 8)).astype(np.float32)
    panel = show_dock(qtbot, window, "posEmbedDock")
    panel.set_data(pos_embed_data(pos, (60, 70), 1), None)
    assert panel.mosaic_label.text == "no mosaic" and "grid too large for the mosaic" in panel.title.text()
    panel.hover(10, 20)
    assert panel.hover_item.image.shape == (60, 70) and not panel.mosaic_frame.isVisible()


def test_a_new_colormap_redraws_the_maps_and_both_colour_bars(qtbot, loaded) -> None:
    """The position dock's colour bar and maps, and its RoPE section's bar, follow the view's colormap."""
    from vitviz.gui import colors

    panel = _ready(qtbot, loaded, (4, 4))
    assert loaded.state.colormap != "magma"
    loaded.state.update(colormap="magma")
    assert panel.colorbar.colorMap() is colors.colormap("magma")
    assert panel.rope_section.colorbar.colorMap() is colors.colormap("magma")
    np.testing.assert_array_equal(panel.cls_item.lut, colors.lut("magma"))


@pytest.mark.parametrize("screen", SCREENS)
def test_each_small_position_map_sits_right_under_its_caption(qtbot, window, tiny_ckpt, images,
                                                               screen) -> None:  # noqa: ANN001
    """Positions: 'CLS vs all' floated ~40-100 px above its map (an aspect-locked map centred in a tall cell); the
    maps are now drawn at the top of their cells, each within 20 px under its caption, and still whole."""
    from _gui import HEADS

    open_at(qtbot, window, SCREENS[screen], tiny_ckpt, images[0], heads=HEADS)
    panel = show_dock(qtbot, window, "posEmbedDock")
    qtbot.waitUntil(lambda: panel.data is not None, timeout=20000)
    panel.hover(1, 2)
    settle()
    for label, item in ((panel.hover_label, panel.hover_item), (panel.cls_label, panel.cls_item)):
        text = label.item.mapRectToScene(label.item.boundingRect())
        shown = item.sceneBoundingRect().intersected(item.getViewBox().sceneBoundingRect())
        gap = shown.top() - text.bottom()
        assert -1 <= gap <= 20, (label.text, gap)
        assert shown.height() >= item.sceneBoundingRect().height() - 1      # not cut by its view
    assert not plot_text_problems(panel.widget), plot_text_problems(panel.widget)


def test_the_panel_is_built_from_the_model_part_alone(qtbot) -> None:  # noqa: ANN001
    """No session, no worker, no window: the dock follows the model part it shows -- the load on its way, the new
    model, and its embedding once the part says it is ready."""
    from vitviz.core.spec import ModelSpec
    from vitviz.gui.model_slot import ModelSlot
    from vitviz.gui.panels.posembed import NO_MODEL_TEXT, PosEmbedPanel
    from vitviz.gui.protocol import Load, Loaded, PosEmbedded
    from vitviz.gui.state import ViewState

    model = ModelSlot()
    panel = PosEmbedPanel(ViewState(), model)
    qtbot.addWidget(panel)
    assert panel.message.text() == NO_MODEL_TEXT
    model.set_loading("/m/tiny.pth")
    assert panel.message.text().startswith("Loading model tiny")
    spec = ModelSpec(family="vit", source="x", image_size=(32, 32), patch_size=8, embed_dim=16, depth=2, num_heads=2)
    model.loaded(Load.make("/m/tiny.pth"), Loaded(spec, "cpu", {}))
    model.set_loading("")
    model.model_loaded.emit(spec, "cpu")
    assert panel.message.text() == "Reading the position embedding…" and panel.data is None
    pos = np.random.default_rng(2).normal(size=(1 + 16, 16)).astype(np.float32)
    model.position(PosEmbedded((4, 4), pos_embed_data(pos, (4, 4), 1)))
    assert panel.data is model.pos_embed and panel._stack.currentWidget() is panel.body
    np.testing.assert_allclose(panel.cls_item.image, analysis.prefix_pos_similarity(pos, (4, 4), 1), rtol=1e-5,
                               atol=1e-6)
