"""Problems a new-user trial found: --device that is not here, huge input sizes (position embedding, repeated
errors), the window's --map names against `vitviz export --maps`, a --head the map ignores, colorbar ticks and the
layer/head sliders on 'mean'."""
from __future__ import annotations

import numpy as np
import pytest
from _gui import HEADS, parse, random_result, show_dock, wait_idle

from vitviz.core.analyses import analysis
from vitviz.gui import colors
from vitviz.gui.app import EXIT_2_TITLES, apply_args
from vitviz.core.analyses.maps import MOSAIC_MAX_POSITIONS, MapKind, ResultMaps, map_stack, pos_embed_data
from vitviz.gui.session import DEVICE_FAILED
from vitviz.gui.state import MAP_CHOICES, ViewState, current_map, parse_map_arg
from vitviz.gui.protocol import Kind


# ---------------------------------------------------------------------------------------------- --device


@pytest.mark.parametrize("device", ["tpu", "cuda:7"])
def test_unavailable_device_is_reported_and_the_model_runs_on_cpu(qtbot, window, tiny_ckpt, images,  # noqa: ANN001
                                                                   device) -> None:
    import torch

    if device.startswith("cuda") and torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    with qtbot.waitSignal(window.session.model_loaded, timeout=20000):
        apply_args(window, parse(str(images[0]), "--model", str(tiny_ckpt), "--heads", str(HEADS),
                                 "--device", device))
    wait_idle(qtbot, window)
    assert [t for t, _ in window.reporter.errors] == [DEVICE_FAILED], window.reporter.errors
    assert device in window.reporter.errors[0][1] and "CPU" in window.reporter.errors[0][1]
    assert DEVICE_FAILED in EXIT_2_TITLES                                  # --screenshot exits 2, as `vitviz info`
    assert window.session.device == "cpu" and window.session.result(str(images[0])) is not None
    assert window.session.device_preference is None                                # later loads do not repeat the error


def test_device_reaches_the_demo_load(qtbot, window, monkeypatch, tiny_ckpt, images) -> None:  # noqa: ANN001
    """`vitviz --device X` (no model) loads the demo there; it used to ignore --device."""
    from vitviz.gui import bundled

    monkeypatch.setattr(bundled, "demo_checkpoint", lambda: tiny_ckpt)
    monkeypatch.setattr(bundled, "demo_images", lambda: list(images))
    asked = []
    monkeypatch.setattr(window.session.client, "submit",
                        lambda kind, first=False, **kw: asked.append(kw["device"]) if kind is Kind.LOAD else None)
    apply_args(window, parse("--device", "cpu"))
    assert asked == ["cpu"]


# ---------------------------------------------------------------------------------------------- huge grids


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


def test_the_same_run_error_is_shown_once(qtbot, window) -> None:  # noqa: ANN001
    for i, free in enumerate(("21.4", "21.0", "20.9")):
        window.reporter.show_run_error(f"/x/img{i}.png", f"the attention maps of input (1, 3, 4000, 4000) need 2794.0 GiB "
                              f"(float32) but only {free} GiB of memory is available", "")
    window.reporter.show_run_error("/x/bad.png", "/x/bad.png: not a recognised image format", "")
    assert len(window.reporter.errors) == 2, window.reporter.errors
    assert window.reporter.errors[0][1].startswith("/x/img0.png: the attention maps")
    assert window.reporter.errors[0][1].endswith("(and the same for 2 more images)")
    assert window.reporter.errors[1][1] == "/x/bad.png: not a recognised image format"      # its path once


def test_a_repeated_run_error_leaves_an_unrelated_error_box_alone(qtbot, window) -> None:  # noqa: ANN001
    """A failure like one whose box was closed is a new error, not a rewrite of the box open now."""
    reason = "the attention maps need 2794.0 GiB (float32) but only 21.4 GiB of memory is available"
    window.reporter.show_run_error("/x/a.png", reason, "")
    qtbot.waitUntil(lambda: window.reporter.box is not None and window.reporter.box.isVisible())
    window.reporter.box.close()
    qtbot.waitUntil(lambda: window.reporter.box is None or not window.reporter.box.isVisible())
    window.reporter.show("Could not load model", "/x/broken.pth: not a checkpoint", "Traceback")
    box = window.reporter.box
    qtbot.waitUntil(lambda: box.isVisible())
    window.reporter.show_run_error("/x/b.png", reason, "")
    assert box.text() != "/x/a.png: " + reason + " (and the same for 1 more image)"
    assert box.text() == "2 errors; the latest: /x/b.png: " + reason
    assert box.detailedText().startswith("Traceback") and "the same for /x/b.png" not in box.detailedText()
    assert window.reporter.errors == [("Could not run image", "/x/a.png: " + reason),
                             ("Could not load model", "/x/broken.pth: not a checkpoint"),
                             ("Could not run image", "/x/b.png: " + reason)]
    window.reporter.show_run_error("/x/c.png", reason, "")                # joins the error of b.png, which the box holds
    assert window.reporter.errors[2][1] == "/x/b.png: " + reason + " (and the same for 1 more image)"
    assert box.text() == "2 errors; the latest: /x/b.png: " + reason and box.detailedText().endswith(
        "=== the same for /x/c.png")


# ---------------------------------------------------------------------------------------------- --map / --head


@pytest.mark.parametrize("name", ["mean", "max"])
def test_map_mean_max_are_exports_maps(name: str) -> None:
    """--map mean/max is the attention received over the patch queries, as `vitviz export --maps mean,max`
    (it used to be the CLS map with --head mean/max)."""
    result = random_result()
    stack = ResultMaps(result).stack(parse_map_arg(name)["source"])
    expected = map_stack(result.attentions, MapKind(name), result.spec).maps
    np.testing.assert_allclose(stack.maps, expected, rtol=1e-5, atol=1e-7)
    cls = ResultMaps(result).stack("cls").maps
    assert not np.allclose(stack.maps, cls)
    state = ViewState(source=name, head=1)
    assert current_map(ResultMaps(result), state)[0].shape == result.grid


def test_map_choices_are_listed() -> None:
    with pytest.raises(ValueError, match=r"cls, mean, max, rollout\[:N\], token:N, entropy"):
        parse_map_arg("pca")
    # the window lists every map of the table it can show (with export's syntax), and not the ones it cannot
    assert list(MAP_CHOICES)[:6] == ["cls", "mean", "max", "rollout[:N]", "token:N", "entropy"]
    assert {"relevance[:CLASS]", "attngrad[:CLASS]", "pool", "rollout:pool", "text:PROMPT"} <= set(MAP_CHOICES)
    assert {"received", "query:N"} <= set(MAP_CHOICES)                  # a windowed model's, shown since
    assert not {"pca", "norms"} & set(MAP_CHOICES)


def test_head_ignored_by_rollout_is_noted(window) -> None:  # noqa: ANN001
    apply_args(window, parse("--map", "rollout", "--head", "max"))
    assert any(n.startswith("--head max is ignored") for n in window.notes), window.notes
    assert window.status.idle_message().startswith("--head max is ignored")    # the status bar once idle
    window.notes.clear()
    apply_args(window, parse("--map", "mean", "--head", "1"))
    assert not any("ignored" in n for n in window.notes)


# ---------------------------------------------------------------------------------------------- looks


@pytest.mark.parametrize("levels,labels", [((0.0, 0.000728), ["0", "2e-4", "4e-4", "6e-4"]),
                                           ((0.0, 0.0941), ["0", "0.02", "0.04", "0.06", "0.08"]),
                                           ((-1.0, 1.0), ["-1.0", "-0.5", "0", "0.5", "1.0"])])
def test_colorbar_ticks_span_the_bar(window, levels, labels) -> None:  # noqa: ANN001
    ticks = colors.nice_ticks(*levels)
    assert colors.tick_labels(ticks) == labels
    assert ticks[-1] >= levels[0] + 0.7 * (levels[1] - levels[0])          # up the whole bar, not just its foot
    colors.set_colorbar_levels(window.panel.colorbar, levels)
    assert [t[1] for t in window.panel.colorbar.axis._tickLevels[0]] == labels


def test_sliders_are_greyed_out_on_mean(qtbot, loaded) -> None:  # noqa: ANN001
    from PySide6.QtCore import QPoint, Qt

    c = loaded.controls
    loaded.state.update(layer="mean", head=1)
    assert not c.layer_slider.isEnabled() and c.layer_spin.text() == "mean"
    assert c.head_slider.isEnabled() and c.head_slider.value() == 1
    loaded.state.update(layer=0, head="max")
    assert c.layer_slider.isEnabled() and c.layer_slider.value() == 0 and not c.head_slider.isEnabled()
    loaded.state.update(layer="mean")
    qtbot.mouseClick(c.layer_slider, Qt.MouseButton.LeftButton, pos=QPoint(5, c.layer_slider.height() // 2))
    assert loaded.state.layer == 0 and c.layer_slider.isEnabled()            # a click picks a layer again
    loaded.state.update(source="rollout", head="mean")
    qtbot.mouseClick(c.head_slider, Qt.MouseButton.LeftButton, pos=QPoint(5, c.head_slider.height() // 2))
    assert loaded.state.head == "mean" and not c.head_slider.isEnabled()    # rollout: heads stay off
