"""The ViTs of 2026 in the window (issue 15): the Positions dock of a RoPE model shows the q·k rotation kernel from
the hovered patch (computed in the worker) and says it has no learned table -- both when a model has both; a model
with a MAP pooling head (SigLIP, PE) gets a *pooling attention* map source, its rollout as a target, and neither is
offered to other models. Small random timm models saved as timm hub folders, as their users save them."""
from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
from _gui import hover, show_dock, wait_idle

from vitviz.core.analyses.maps import pool_vector
from vitviz.core.analyses.rollout import RolloutParams
from vitviz.gui.panels.rope import ROPE_ONLY
from vitviz.gui.protocol import RopeKernels

timm = pytest.importorskip("timm")

ARCHS = {   # name -> (timm architecture, its arguments): tiny, 4 heads, grids of a few patches
    "dinov3": ("vit_small_patch16_dinov3", dict(img_size=64)),                  # RoPE only, 4 registers
    "eva02": ("eva02_tiny_patch14_224", dict(img_size=56)),                     # a learned table and RoPE
    "mixed": ("vit_small_patch16_rope_mixed_ape_224", dict(img_size=64)),       # learned frequencies per head
    "pe": ("vit_pe_core_base_patch16_224", dict(img_size=64, attn_pool_num_heads=2)),   # RoPE and a MAP head
    "siglip": ("vit_base_patch16_siglip_224", dict(img_size=32, patch_size=8)),  # a MAP head, no CLS
}


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folders = {}
    for name, (arch, extra) in ARCHS.items():
        args = dict(embed_dim=64, num_heads=4, depth=2, **extra)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = timm.create_model(arch, pretrained=False, num_classes=0, dynamic_img_size=True, **args)
        folder = tmp_path_factory.mktemp(name)
        timm.models._hub.save_for_hf(model, str(folder), model_args=args, safe_serialization=True)
        folders[name] = folder
    return folders


def _open(qtbot, window, folder: Path, images) -> None:  # noqa: ANN001
    with qtbot.waitSignal(window.session.model.model_loaded, timeout=30000):
        window.load_model(str(folder))
    window.session.add_images([str(p) for p in images])
    wait_idle(qtbot, window, timeout=30000)
    assert window.reporter.errors == [], window.reporter.errors


def _kernel(folder: Path, grid, head=None, layer: int = 0) -> np.ndarray:  # noqa: ANN001
    import vitviz
    from vitviz.core.posembed import rope_kernel

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return rope_kernel(vitviz.load(folder, device="cpu"), grid, head=head, layer=layer)


def test_rope_only_model_says_so_and_shows_the_kernel_from_the_hovered_patch(qtbot, window, hub,  # noqa: ANN001
                                                                             images) -> None:
    _open(qtbot, window, hub["dinov3"], images[:1])
    panel = show_dock(qtbot, window, "posEmbedDock")
    qtbot.waitUntil(lambda: panel.rope is not None, timeout=20000)
    s = window.session
    assert isinstance(s.model.rope, RopeKernels) and s.model.pos_embed is None and s.model.rope.grid == (4, 4)
    assert panel._stack.currentWidget() is panel.body
    assert panel.rope_section.isVisible() and not panel.widget.isVisible()          # no learned table drawn
    assert panel.rope_section.title.text().startswith(ROPE_ONLY)
    kernel = _kernel(hub["dinov3"], (4, 4))
    np.testing.assert_allclose(s.model.rope.kernels[0, 0], kernel, rtol=1e-6)             # computed in the worker
    p = s.model.spec.patch_size
    scene = window.panel.view.mapViewToScene(__import__("PySide6.QtCore", fromlist=["QPointF"]).QPointF(3.5 * p,
                                                                                                     1.5 * p))
    hover(window.panel.view_widget.viewport(), window.panel.view_widget.mapFromScene(scene))   # patch (1, 3)
    from vitviz.core.posembed import kernel_at

    assert panel.position == (1, 3)
    np.testing.assert_allclose(panel.rope_section.values, kernel_at(kernel, (4, 4), (1, 3)))
    assert panel.rope_section.values[1, 3] == pytest.approx(1.0)                    # offset 0: no turn
    assert "RoPE kernel from (1, 3)" in panel.rope_section.at_label.text
    assert panel.rope_section.window_frame.rect().topLeft().toTuple() == (0.0, 2.0)  # the window `at` slices
    w = window.session.model.spec.patch_size
    window.session.set_image_size((6 * w, 5 * w))                                   # the kernel follows the grid
    qtbot.waitUntil(lambda: panel.rope is not None and panel.rope.grid == (6, 5), timeout=20000)
    np.testing.assert_allclose(panel.rope.kernels[0, 0], _kernel(hub["dinov3"], (6, 5)), rtol=1e-6)
    assert "rotary (RoPE, dinov3" in window.info.text()


def test_a_model_with_both_shows_both(qtbot, window, hub, images) -> None:  # noqa: ANN001
    _open(qtbot, window, hub["eva02"], images[:1])
    panel = show_dock(qtbot, window, "posEmbedDock")
    qtbot.waitUntil(lambda: panel.rope is not None and panel.data is not None, timeout=20000)
    assert panel.widget.isVisible() and panel.rope_section.isVisible()
    assert panel.title.text().startswith("Position embedding at 4×4")
    assert panel.rope_section.title.text().startswith("Rotary position embedding (RoPE) as well")
    panel.hover(2, 0)
    assert panel.position == (2, 0) and panel.rope_section.position == (2, 0)
    np.testing.assert_allclose(panel.hover_item.image, panel.data.similarity_to(2, 0))
    np.testing.assert_allclose(panel.rope_section.values, panel.rope.at((2, 0)))
    hover(panel.rope_section.widget.viewport(), panel.rope_section.widget.mapFromScene(
        panel.rope_section.at_view.mapViewToScene(__import__("PySide6.QtCore", fromlist=["QPointF"]).QPointF(
            3.5, 1.5))))                                                            # hover in the kernel map itself
    assert panel.position == (1, 3) and panel.rope_section.position == (1, 3)


def test_learned_frequencies_follow_the_layer_and_head(qtbot, window, hub, images) -> None:  # noqa: ANN001
    _open(qtbot, window, hub["mixed"], images[:1])
    panel = show_dock(qtbot, window, "posEmbedDock")
    qtbot.waitUntil(lambda: panel.rope is not None, timeout=20000)
    assert panel.rope.per_head and panel.rope.kernels.shape == (2, 4, 7, 7)
    window.state.update(layer=1, head=2)
    panel.hover(0, 0)
    np.testing.assert_allclose(panel.rope_section.values, _kernel(hub["mixed"], (4, 4), head=2, layer=1)[3:, 3:],
                               rtol=1e-5)
    assert "layer 1, head 2" in panel.rope_section.title.text()
    window.state.update(head="mean", layer=0)
    np.testing.assert_allclose(panel.rope_section.values, _kernel(hub["mixed"], (4, 4), layer=0)[3:, 3:], rtol=1e-5)
    assert "layer 0, mean over heads" in panel.rope_section.title.text()


def test_pooling_attention_source_and_rollout_target(qtbot, window, hub, images) -> None:  # noqa: ANN001
    _open(qtbot, window, hub["siglip"], images[:1])
    s, state = window.session, window.state
    result = s.result(str(images[0])).result
    combo = window.controls.source_combo
    assert combo.findData("pool") >= 0 and s.model.spec.num_prefix == 0
    state.update(source="pool", head="mean", layer=0)
    np.testing.assert_allclose(window.panel.values, result.pool_map("mean"), rtol=1e-6)
    assert "pooling attention (MAP head)" in window.panel.title.text and "all layers" in window.panel.title.text
    assert not window.controls.layer_spin.isEnabled() and window.controls.head_spin.isEnabled()
    state.update(head=3)
    np.testing.assert_allclose(window.panel.values, result.pool_map(3), rtol=1e-6)
    overview = show_dock(qtbot, window, "overviewDock")
    assert overview._shape[:2] == (1, 4 + 2)                       # one map of the whole model per pooling head
    state.update(layer=1)                                          # no second row: the frame stays on the first
    assert overview.frame.isVisible() and overview.frame.rect().top() < overview._shape[2]
    rollout = show_dock(qtbot, window, "rolloutDock")
    entry = rollout.query_combo.findText("pooling query (MAP head)")
    assert entry >= 0
    rollout.query_combo.setCurrentIndex(entry)
    rollout.query_combo.activated.emit(entry)
    assert state.rollout_pool
    engine = s.result(str(images[0])).rollout
    params = RolloutParams(state.rollout_fusion, state.rollout_discard, 0, state.rollout_residual)
    expected = engine.pull(pool_vector(result.pool_attention, params.fusion), params)
    np.testing.assert_allclose(rollout.rollout_map, expected.reshape(result.grid), rtol=1e-5, atol=1e-8)
    assert rollout.rollout_view.title.text.startswith("rollout of the pooling query")
    state.update(source="rollout")
    assert window.panel.title.text.split(" — ")[1].startswith("rollout of the pooling query")


def test_pool_is_only_offered_with_a_map_head(qtbot, window, hub, tiny_ckpt, images) -> None:  # noqa: ANN001
    _open(qtbot, window, hub["pe"], images[:1])                     # PE: RoPE, a learned table and a MAP head
    assert window.controls.source_combo.findData("pool") >= 0
    window.state.update(source="pool", rollout_pool=True)
    assert window.session.result(str(images[0])).result.pool_attention.shape[0] == 2   # its own 2 pooling heads
    with qtbot.waitSignal(window.session.model.model_loaded, timeout=20000):
        window.load_model(str(tiny_ckpt), heads=2)
    assert window.controls.source_combo.findData("pool") < 0
    assert window.state.source == "cls" and not window.state.rollout_pool           # not left on a missing map
