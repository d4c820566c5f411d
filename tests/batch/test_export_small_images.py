"""Exports of small images (issue 25): with a colorbar, an image under `MIN_PICTURE_PX` is drawn enlarged by a whole
factor, so the demo's 64-px shapes give 256-px pictures instead of 140 × 64 ones; the colorbar's label goes onto more
lines instead of being cut to 'CLSattentio…'; the bar's two end labels share one number format; the window's
export and `vitviz export` stay byte-identical."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from _tiny import write_tiny_checkpoint
from PIL import Image, ImageFont

import vitviz
from vitviz.cli import main
from vitviz.core.drawing import render
from vitviz.core.analyses.maps import ResultMaps

LABEL = "CLS attention · head mean · shared scale: all layers (head means)"


@pytest.mark.parametrize("size, factor", [((64, 64), 4), ((32, 32), 7), ((28, 40), 8), ((44, 45), 5),
                                          ((200, 120), 2), ((200, 300), 1), ((1080, 1920), 1)])
def test_the_enlargement_is_the_least_whole_factor_reaching_the_minimum(size: tuple[int, int], factor: int) -> None:
    assert render.enlargement(size) == factor
    assert factor == 1 or min(size) * factor >= render.MIN_PICTURE_PX > min(size) * (factor - 1)
    image = np.arange(size[0] * size[1] * 3, dtype=np.uint8).reshape(*size, 3)
    big = render.enlarge(image)
    assert big.shape == (size[0] * factor, size[1] * factor, 3)
    np.testing.assert_array_equal(big[::factor, ::factor], image)          # every pixel a factor × factor block


def test_a_long_label_is_wrapped_between_its_phrases_not_cut() -> None:
    font = ImageFont.load_default()
    lines = render._label_lines(LABEL, font, 256)
    assert lines == ["CLS attention · head mean", "shared scale: all layers (head means)"]
    assert " · ".join(lines) == LABEL and not any("…" in line for line in lines)
    assert render._label_lines(LABEL, font, 1000) == [LABEL]
    assert render._label_lines("a phrase far too long for a tiny picture", font, 40)[0].endswith("…")
    assert render._words_width("CLS attention", font) >= render._words_width("CLSattention", font) + 3


@pytest.mark.parametrize("lo, hi, want", [(0.0, 0.193, ("0.193", "0")), (1.2e-5, 0.00454, ("0.00454", "0.00001")),
                                          (0.00012, 0.00454, ("0.00454", "0.00012")), (-1.0, 1.0, ("1.00", "-1.00")),
                                          (3e-7, 4.5e-5, ("4.50e-5", "0.03e-5")), (0.0, 25000.0, ("2.50e4", "0"))])
def test_both_ends_of_a_bar_in_one_format(lo: float, hi: float, want: tuple[str, str]) -> None:
    assert render.bar_labels(lo, hi) == want


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("small")
    image = folder / "shape.png"
    Image.fromarray(np.random.default_rng(3).integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(image)
    return write_tiny_checkpoint(folder / "tiny.pth"), image


def test_small_exports_are_enlarged_and_the_window_and_cli_agree(small: tuple[Path, Path], tmp_path: Path) -> None:
    from vitviz.gui import exporting
    from vitviz.gui.state import ViewState

    ckpt, image = small
    maps = ResultMaps(vitviz.load(ckpt, heads=2, device="cpu").run(image))
    state = ViewState(source="cls", layer=1, head="mean")
    h, w = render.native_view(maps.result).shape[:2]          # the centre crop of the 64-px image the model saw
    assert h < 64 and render.enlargement((h, w)) == 4
    labelled = exporting.render_view(maps, state, heatmap_only=False, colorbar=True, label=True)
    assert labelled.shape[0] == 4 * h >= render.MIN_PICTURE_PX and labelled.shape[1] > 4 * w   # the bar beside
    bare = exporting.render_view(maps, state, heatmap_only=False, colorbar=False)
    assert bare.shape == (h, w, 3)                                               # no bar: pixel for pixel
    window = exporting.export_png(maps, state, tmp_path / "window.png", colorbar=True, label=True)
    assert main(["export", "--model", str(ckpt), "--heads", "2", str(image), "--out", str(tmp_path / "cli"),
                 "--layers", "1", "--which-heads", "mean", "--colorbar", "--colorbar-label", "--device", "cpu",
                 "--quiet", "--no-verify"]) == 0
    assert (tmp_path / "cli" / "shape_cls_L1_Hmean.png").read_bytes() == window.read_bytes()
