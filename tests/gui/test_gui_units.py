"""Qt-free parts of the GUI: view state, map stacks, mosaic layout, drop sorting, arguments, import contract."""
from __future__ import annotations

import html

import argparse
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from _gui import random_result

from vitviz.core.analyses import analysis
from vitviz.cli.window import add_window_arguments
from vitviz.gui.dropping import classify
from vitviz.core.analyses.maps import ResultMaps, mosaic
from vitviz.gui.state import ViewState, current_map, levels_for, parse_map_arg, resolve_index


def test_state_validates_and_notifies() -> None:
    state = ViewState()
    seen: list[set[str]] = []
    state.subscribe(seen.append)
    assert state.update(layer=2, head="max") == {"layer", "head"}
    assert state.update(layer=2) == set()
    assert seen == [{"layer", "head"}]
    with pytest.raises(ValueError):
        state.update(head="median")
    with pytest.raises(AttributeError):
        state.update(nonsense=1)


def test_parse_map_and_resolve() -> None:
    assert parse_map_arg("mean") == {"source": "mean"} and parse_map_arg("max") == {"source": "max"}
    assert parse_map_arg("token:7") == {"source": "token", "query": 7}
    assert parse_map_arg("rollout") == {"source": "rollout"}
    with pytest.raises(ValueError):
        parse_map_arg("token:x")
    assert resolve_index(-1, 12) == 11 and resolve_index(40, 12) == 11 and resolve_index("mean", 12) == "mean"


def test_window_arguments_parse() -> None:
    parser = argparse.ArgumentParser()
    add_window_arguments(parser)
    args = parser.parse_args(["a.png", "--model", "m.pth", "--layer", "-1", "--head", "max", "--map", "token:3",
                              "--size", "224x320", "--heads", "12", "--screenshot", "s.png"])
    assert (args.images, args.layer, args.head, args.map, args.size) == (["a.png"], -1, "max", "token:3", (224, 320))
    with pytest.raises(SystemExit):
        parser.parse_args(["--map", "bogus"])


@pytest.mark.parametrize("reg", [0, 2])
def test_stacks_match_core_analysis(reg: int) -> None:
    result = random_result(reg=reg)
    maps = ResultMaps(result)
    cls = maps.stack("cls")
    for layer in range(3):
        for head in [0, 3, "mean", "max"]:
            np.testing.assert_allclose(cls.select(layer, head), analysis.cls_attention(result, layer, head),
                                       rtol=1e-6)
    q = result.spec.num_prefix + 4
    np.testing.assert_allclose(maps.stack(f"token:{q}").select(1, 2), analysis.token_map(result, 1, 2, q), rtol=1e-6)
    roll = maps.stack("rollout")
    np.testing.assert_allclose(roll.select(2, "mean"), analysis.rollout(result), rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(roll.select(0, 0), analysis.rollout(result.attentions[:1], num_prefix=1 + reg,
                                                                   grid=(3, 5)), rtol=1e-4, atol=1e-7)
    assert cls.select("mean", "mean").shape == (3, 5)
    np.testing.assert_allclose(cls.select("mean", 1), cls.maps[:, 1].mean(0))


def test_no_cls_falls_back_to_mean_query() -> None:
    result = random_result(cls=False)
    stack = ResultMaps(result).stack("cls")
    np.testing.assert_allclose(stack.select(1, 0), analysis.token_map(result, 1, 0, "mean"), rtol=1e-5)


def test_levels_shared_or_per_map() -> None:
    maps = ResultMaps(random_result())
    state = ViewState(layer=0, head=0)
    values, stack = current_map(maps, state)
    assert levels_for(state, values, stack) == (0.0, float(stack.maps[:, :4].max()))
    state.update(head="mean")
    values, stack = current_map(maps, state)
    assert levels_for(state, values, stack) == (0.0, float(stack.maps[:, 4].max()))
    state.update(normalize=True)
    assert levels_for(state, values, stack) == (float(values.min()), float(values.max()))


def test_mosaic_layout_and_per_tile_scaling() -> None:
    maps = np.arange(2 * 3 * 2 * 2, dtype=np.float32).reshape(2, 3, 2, 2)
    image = mosaic(maps, per_tile=False, gap=1)
    assert image.shape == (2 * 3 - 1, 3 * 3 - 1)
    np.testing.assert_array_equal(image[3:5, 6:8], maps[1, 2])
    assert np.isnan(image[2]).all() and np.isnan(image[:, 2]).all()
    scaled = mosaic(maps, per_tile=True, gap=1)
    np.testing.assert_allclose(scaled[3:5, 6:8], [[0, 1 / 3], [2 / 3, 1]])


def test_classify_paths(tmp_path: Path) -> None:
    (tmp_path / "imgs").mkdir()
    (tmp_path / "imgs" / "a.jpg").write_bytes(b"x")
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text("{}")
    (tmp_path / "m.safetensors").write_bytes(b"x")
    (tmp_path / "notes.txt").write_text("x")
    out = classify([str(tmp_path / n) for n in ("imgs", "hf", "m.safetensors", "notes.txt")])
    assert out.images == [str(tmp_path / "imgs" / "a.jpg")]
    assert out.models == [str(tmp_path / "hf"), str(tmp_path / "m.safetensors")]
    assert out.ignored == [str(tmp_path / "notes.txt")]


def test_window_module_does_not_import_torch() -> None:
    code = ("import sys; import vitviz.gui.app, vitviz.cli.window, vitviz.gui.window; "
            "bad = [m for m in ('torch', 'torchvision') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[2])


def test_args_module_does_not_import_qt() -> None:
    code = ("import sys; import vitviz.cli.window; "
            "bad = [m for m in sys.modules if m.startswith(('PySide6', 'pyqtgraph', 'torch'))]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[2])


def test_model_summary_follows_the_input_size() -> None:
    from vitviz.core.spec import ModelSpec
    from vitviz.gui.panels.controls import model_summary

    spec = ModelSpec(family="timm", source="m.pth", image_size=(224, 224), patch_size=16, embed_dim=768, depth=12,
                     num_heads=12)

    def plain(text: str) -> str:
        return html.unescape(text).replace("\xa0", " ")

    assert "224×224 px, patch 16, grid 14×14" in plain(model_summary(spec))
    assert "224×320 px, patch 16, grid 14×20" in plain(model_summary(spec, (224, 320)))


def test_whole_patches_rounds_down() -> None:
    from vitviz.core.spec import whole_patches

    assert whole_patches((36, 43), 8) == (32, 40) and whole_patches((32, 48), 8) == (32, 48)
    assert whole_patches((5, 16), 8) == (0, 16)                          # callers that need a patch reject it
    assert whole_patches((5, 16), 8, at_least_one=True) == (8, 16)       # the window runs one patch instead


def test_a_note_stands_in_for_the_idle_message_until_it_expires(qtbot) -> None:  # noqa: ANN001
    from PySide6.QtWidgets import QStatusBar

    from vitviz.gui.status import StatusArea

    bar = QStatusBar()
    qtbot.addWidget(bar)
    status = StatusArea(bar)
    status.set_ready_message("Ready")
    status.note("first", timeout_ms=100)
    status.note("second", timeout_ms=300)                               # restarts the one timer
    assert status.idle_message() == "second" and bar.currentMessage() == "second"
    qtbot.wait(200)
    assert status.idle_message() == "second" and bar.currentMessage() == "second"   # the first note's time is over
    qtbot.waitUntil(lambda: bar.currentMessage() == "Ready", timeout=2000)
    assert status.idle_message() == "Ready"


def test_pool_maps_by_name_and_their_state() -> None:
    from vitviz.core.analyses.maps import MapKind
    from vitviz.gui.state import map_kind

    assert parse_map_arg("pool") == {"source": "pool"}
    assert parse_map_arg("rollout:pool") == {"source": "rollout", "rollout_pool": True}
    state = ViewState(source="rollout", rollout_pool=True, rollout_fusion="max", query=5)
    assert map_kind(state) == MapKind.parse("rollout:pool", map_kind(ViewState(source="rollout",
                                                                            rollout_fusion="max")).rollout)
    assert map_kind(state).label == "rollout-pool-max" and map_kind(ViewState(source="pool")).label == "pool"
    result = random_result()                              # no MAP head: a placeholder that says so, never drawn
    from vitviz.gui.state import stack_for

    stack = stack_for(ResultMaps(result), ViewState(source="pool"))
    assert stack.pending and stack.title.startswith("no pooling attention")


def test_rope_kernels_are_sliced_as_the_library_slices_them() -> None:
    from vitviz.core.posembed import kernel_at
    from vitviz.gui.protocol import RopeKernels

    rng = np.random.default_rng(0)
    grid = (3, 5)
    kernels = rng.random((2, 4, 5, 9)).astype(np.float32)                # per layer and head (RoPE-Mixed)
    rope = RopeKernels(grid, kernels, "mixed")
    assert rope.per_head and not RopeKernels(grid, kernels[:1, :1], "axial").per_head
    for patch in [(0, 0), (2, 4), (1, 2)]:
        np.testing.assert_array_equal(rope.at(patch, 1, 3), kernel_at(kernels[1, 3], grid, patch))
        np.testing.assert_allclose(rope.at(patch, 0, "mean"), kernel_at(kernels[0].mean(0), grid, patch))
        np.testing.assert_allclose(rope.at(patch, "mean", "mean"), kernel_at(kernels.mean((0, 1)), grid, patch),
                                   rtol=1e-6)


def test_a_sentence_in_a_title_wraps_between_words() -> None:
    """Round five: Swin's rollout reason wrapped inside words ('tok' / 'en-to-' / 'token', 'mo' / 'del'): a phrase of
    eight words or more is a sentence and keeps its spaces breakable; short phrases stay whole."""
    from vitviz.gui.panels.base import unbreakable_phrases

    text = unbreakable_phrases("rollout multiplies the token-to-token attention of one grid; CLS attention · "
                               "head mean")
    assert "rollout multiplies the token-to-token attention of one grid" in text
    assert "CLS&nbsp;attention" in text and "head&nbsp;mean" in text


def test_displayed_numbers_use_one_notation() -> None:
    """Issue 35: a hover said '3.979e-05' beside a title's '0.009855' (Python's 'g' switches to an exponent below
    1e-4). Attention-sized numbers are plain decimals with four significant digits; a range's ends share their
    decimals."""
    from vitviz.gui.numbers import number, number_range

    assert number(3.979e-05) == "0.00003979" and number(0.009855) == "0.009855" and number(12.345) == "12.35"
    assert number(0) == "0" and number(-0.5) == "-0.5" and number(48213.2) == "48213"
    assert number(3.979e-07) == "3.979e-07" and number(2.5e7) == "2.500e+07"
    assert "e" not in number(1e-6) and number(float("nan")) == "nan"
    assert number_range(0, 0.009855) == "0–0.00985" and number_range(0.00123, 0.00991) == "0.00123–0.00991"
    assert number_range(1e-8, 3e-7) == "1.00e-08–3.00e-07" and number_range(0, 25000) == "0–25000"
    for lo, hi in ((3.2e-5, 0.0071), (0.0, 0.5), (-1.0, 1.0), (2e-6, 9e-5)):
        a, b = number_range(lo, hi).split("–")
        assert ("e" in a) == ("e" in b), (a, b)
