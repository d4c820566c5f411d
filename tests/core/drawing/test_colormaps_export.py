"""Tests for vitviz.core.drawing.colormaps, vitviz.core.drawing.render and vitviz.core.files."""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vitviz.core.drawing import colormaps as cm
from vitviz.core import files
from vitviz.core.drawing import render
from vitviz.core.spec import AttentionResult, ModelSpec
from vitviz.errors import VitvizError

# Published 8-bit values (the hex codes every viridis/turbo reference quotes), index -> RGB.
PUBLISHED = {
    "viridis": {0: (68, 1, 84), 128: (33, 145, 140), 255: (253, 231, 37)},
    "inferno": {0: (0, 0, 4), 128: (188, 55, 84), 255: (252, 255, 164)},
    "magma": {0: (0, 0, 4), 128: (183, 55, 121), 255: (252, 253, 191)},
    "plasma": {0: (13, 8, 135), 128: (203, 71, 120), 255: (240, 249, 33)},
    "turbo": {0: (48, 18, 59), 128: (164, 252, 60), 255: (122, 4, 3)},
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_colormap_matches_published_values(name: str) -> None:
    table = cm.colormap(name)
    assert table.shape == (256, 3) and table.dtype == np.uint8
    for index, rgb in PUBLISHED[name].items():
        assert np.abs(table[index].astype(int) - rgb).max() <= 2, (name, index, table[index])


def _published_csv(name: str) -> np.ndarray | None:
    """The full published table as shipped by pyqtgraph (found without importing it, so no Qt)."""
    spec = importlib.util.find_spec("pyqtgraph")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "colors" / "maps" / f"{name}.csv"
    if not path.exists():
        return None
    rows = [line for line in path.read_text().splitlines() if line.strip() and not line.startswith(";")]
    return np.round(np.array([[float(v) for v in r.split(",")] for r in rows]) * 255)


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_colormap_whole_table_within_one_unit(name: str) -> None:
    reference = _published_csv(name)
    if reference is None:
        pytest.skip("pyqtgraph's colormap tables are not installed")
    assert np.abs(cm.colormap(name).astype(int) - reference).max() <= 1


def test_gray_reversed_and_unknown() -> None:
    np.testing.assert_array_equal(cm.colormap("gray")[:, 0], np.arange(256))
    np.testing.assert_array_equal(cm.colormap("viridis_r"), cm.colormap("viridis")[::-1])
    assert set(PUBLISHED) | {"gray"} <= set(cm.available_colormaps())
    with pytest.raises(cm.ColormapError, match="unknown colormap 'jet'"):
        cm.colormap("jet")
    assert issubclass(cm.ColormapError, VitvizError) and issubclass(cm.ColormapError, ValueError)


def test_viridis_luminance_increases() -> None:
    rgb = cm.colormap("viridis").astype(float)
    luma = rgb @ [0.2126, 0.7152, 0.0722]
    assert (np.diff(luma) > -0.5).all() and luma[-1] - luma[0] > 150


def test_apply_colormap_scaling() -> None:
    values = np.array([[0.0, 0.5, 1.0], [np.nan, -3.0, 9.0]])
    out = cm.apply_colormap(values, "gray", vmin=0.0, vmax=1.0)
    assert out.shape == (2, 3, 3) and out.dtype == np.uint8
    np.testing.assert_array_equal(out[..., 0], [[0, 128, 255], [0, 0, 255]])  # NaN low, clipped both ends
    auto = cm.apply_colormap(np.array([[2.0, 4.0]]), "gray")  # range from the data
    np.testing.assert_array_equal(auto[..., 0], [[0, 255]])
    np.testing.assert_array_equal(cm.apply_colormap(np.ones((2, 2)), "gray")[..., 0], 0)  # constant
    with pytest.raises(ValueError):
        cm.apply_colormap(np.zeros((2, 2, 2)), "gray")


def test_heatmap_blocky_and_smooth_on_non_square_grid() -> None:
    grid = np.arange(6, dtype=np.float32).reshape(2, 3)
    blocky = render.heatmap_image(grid, (20, 30), "gray", smooth=False)
    assert blocky.shape == (20, 30, 3)
    expected = np.repeat(np.repeat(cm.apply_colormap(grid, "gray"), 10, axis=0), 10, axis=1)
    np.testing.assert_array_equal(blocky, expected)
    smooth = render.heatmap_image(grid, (20, 30), "gray", smooth=True)
    np.testing.assert_array_equal(smooth[[0, -1]][:, [0, -1]], blocky[[0, -1]][:, [0, -1]])  # corners agree
    assert len(np.unique(smooth[..., 0])) > len(np.unique(blocky[..., 0]))


def test_overlay_blends() -> None:
    image = np.full((4, 5, 3), 100, np.uint8)
    heat = np.full((4, 5, 3), 200, np.uint8)
    np.testing.assert_array_equal(render.overlay(image, heat, 0.0), image)
    np.testing.assert_array_equal(render.overlay(image, heat, 1.0), heat)
    np.testing.assert_array_equal(render.overlay(image, heat, 0.25), 125)
    with pytest.raises(ValueError):
        render.overlay(image, heat[:3], 0.5)


def test_add_colorbar_draws_bar_and_labels() -> None:
    img = np.full((80, 50, 3), 7, np.uint8)
    out = render.add_colorbar(img, "viridis", 0.0, 0.125, bar_width=10, pad=4)
    assert out.shape[0] == 80 and out.shape[1] > 50 + 4 + 10
    np.testing.assert_array_equal(out[:, :50], img)
    table = cm.colormap("viridis")
    np.testing.assert_array_equal(out[0, 55], table[255])   # vmax at the top
    np.testing.assert_array_equal(out[-1, 55], table[0])    # vmin at the bottom
    labels = out[:, 50 + 4 + 10 + 4:]
    assert (labels < 128).any() and (labels == 255).any()   # dark text on a white margin


def test_write_png_atomic(tmp_path: Path) -> None:
    rgb = np.random.default_rng(0).integers(0, 256, (6, 9, 3), dtype=np.uint8)
    target = tmp_path / "map.png"
    assert files.write_png_atomic(target, rgb) == target
    np.testing.assert_array_equal(np.asarray(Image.open(target)), rgb)
    with pytest.raises(files.OutputExistsError) as info:
        files.write_png_atomic(target, np.zeros_like(rgb))
    assert isinstance(info.value, FileExistsError) and isinstance(info.value, VitvizError)
    np.testing.assert_array_equal(np.asarray(Image.open(target)), rgb)  # untouched
    files.write_png_atomic(target, np.zeros_like(rgb), overwrite=True)
    np.testing.assert_array_equal(np.asarray(Image.open(target)), 0)
    assert os.listdir(tmp_path) == ["map.png"]  # no temporary files left


def test_failed_write_leaves_nothing(tmp_path: Path) -> None:
    def explode(handle: object) -> None:
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        files._atomic_write(tmp_path / "x.png", explode, overwrite=False)
    assert os.listdir(tmp_path) == []


def test_npz_round_trip(tmp_path: Path) -> None:
    spec = ModelSpec(family="test", source="m.pth", image_size=(32, 48), patch_size=16, embed_dim=8, depth=1,
                     num_heads=2, reg_tokens=1)
    attn = np.random.default_rng(1).random((1, 2, 8, 8)).astype(np.float16)
    result = AttentionResult(attentions=attn, logits=np.arange(3, dtype=np.float32),
                             input=np.zeros((3, 32, 48), np.float32), image=np.ones((32, 48, 3), np.uint8),
                             spec=spec, source="cat.jpg", features=np.ones((8, 8), np.float32))
    path = files.write_npz_atomic(tmp_path / "run.npz", result)
    data = files.read_npz(path)
    np.testing.assert_array_equal(data["attentions"], attn)
    assert data["attentions"].dtype == np.float16
    np.testing.assert_array_equal(data["logits"], [0, 1, 2])
    assert data["image"].shape == (32, 48, 3) and data["features"].shape == (8, 8)
    assert data["spec"]["grid"] == [2, 3] and data["spec"]["prefix_names"] == ["cls", "reg0"]
    assert data["source"] == "cat.jpg"
    with pytest.raises(files.OutputExistsError):
        files.write_npz_atomic(path, result)


def test_write_json_atomic_replaces_and_leaves_nothing_else(tmp_path: Path) -> None:
    import json

    target = tmp_path / "manifest.json"
    assert files.write_json_atomic(target, {"a": (1, 2), "b": {3}}) == target
    assert json.loads(target.read_text()) == {"a": [1, 2], "b": [3]}
    assert target.read_text().endswith("}\n")
    files.write_json_atomic(target, {"a": 1})                   # an existing file is replaced
    assert json.loads(target.read_text()) == {"a": 1}
    assert os.listdir(tmp_path) == ["manifest.json"] and (target.stat().st_mode & 0o777) == 0o644


def test_cover_pads_a_partial_patch_with_the_minimum() -> None:
    values = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
    assert render.cover(values, (16, 16), 8) is values          # whole patches: unchanged
    out = render.cover(values, (20, 17), 8)                     # 3 x 3 patches cover 20 x 17 pixels
    np.testing.assert_array_equal(out, [[1, 2, 1], [3, 4, 1], [1, 1, 1]])
