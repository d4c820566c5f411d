"""The window's export and `vitviz export` are one engine: the same file names and byte-identical PNGs for every
map kind and rollout setting, and the same colormaps.

The window side is `vitviz.gui.exporting` driven by a `ViewState` (what "Export all" runs); the CLI side is
`vitviz export` in this process on the tiny checkpoint, one image, every layer and every head.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _tiny import write_tiny_checkpoint
from PIL import Image

from vitviz.cli import main
from vitviz.core.drawing.colormaps import available_colormaps
from vitviz.core.analyses.maps import MapKind, ResultMaps
from vitviz.core.analyses.rollout import RolloutParams
from vitviz.gui import exporting
from vitviz.gui.state import COLORMAPS, ViewState, map_kind

HEADS = 2

# (name, view state fields, `vitviz export` arguments): one case per map kind and rollout setting
MAPS = [
    ("cls", {"source": "cls"}, ["--maps", "cls"]),
    ("mean", {"source": "mean"}, ["--maps", "mean"]),
    ("max", {"source": "max"}, ["--maps", "max"]),
    ("token", {"source": "token", "query": 3}, ["--maps", "token:3"]),
    ("rollout", {"source": "rollout"}, ["--maps", "rollout"]),
    ("rollout-max-d0.9", {"source": "rollout", "rollout_fusion": "max", "rollout_discard": 0.9},
     ["--maps", "rollout", "--fusion", "max", "--discard-ratio", "0.9"]),
    ("rollout-min-r0.2", {"source": "rollout", "rollout_fusion": "min", "rollout_residual": 0.2},
     ["--maps", "rollout", "--fusion", "min", "--residual", "0.2"]),
    ("rollout-d0.5-r0-from1", {"source": "rollout", "rollout_discard": 0.5, "rollout_residual": 0.0,
                               "rollout_start": 1},
     ["--maps", "rollout", "--discard-ratio", "0.5", "--residual", "0", "--start-layer", "1"]),
    ("rollout-token5-max", {"source": "rollout", "query": 5, "rollout_fusion": "max"},
     ["--maps", "rollout:5", "--fusion", "max"]),
]

# (name, view state fields, heatmap only, colorbar, `vitviz export` arguments): how the maps are drawn
PICTURES = [
    ("overlay", {}, False, False, []),
    ("heatmap-plasma-own-blocky-colorbar", {"colormap": "plasma", "normalize": True, "smooth": False}, True, True,
     ["--cmap", "plasma", "--scale", "own", "--blocky", "--style", "heatmap", "--colorbar"]),
    ("overlay-turbo-0.3-colorbar", {"colormap": "turbo", "opacity": 0.3}, False, True,
     ["--cmap", "turbo", "--opacity", "0.3", "--colorbar"]),
]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_checkpoint(tmp_path_factory.mktemp("model") / "tiny.pth")


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """40 x 52 pixels, not square: both sides draw over the region the model saw, at the original's resolution."""
    path = tmp_path_factory.mktemp("images") / "cat photo.png"   # a stem that needs making file-name safe
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 256, (40, 52, 3), dtype=np.uint8)).save(path)
    return path


@pytest.fixture(scope="module")
def maps(tiny: Path, image: Path) -> ResultMaps:
    import vitviz

    return ResultMaps(vitviz.load(tiny, heads=HEADS, device="cpu").run(image))


def _window(maps: ResultMaps, folder: Path, fields: dict[str, Any], heatmap_only: bool, colorbar: bool) -> Path:
    folder.mkdir()
    state = ViewState()
    state.update(**fields)
    exporting.export_all(maps, state, folder, heatmap_only=heatmap_only, colorbar=colorbar)
    return folder


def _cli(tiny: Path, image: Path, folder: Path, args: list[str]) -> Path:
    code = main(["export", "--model", str(tiny), "--heads", str(HEADS), str(image), "--out", str(folder),
                 "--layers", "all", "--which-heads", "all,mean,max", "--quiet", *args])
    assert code == 0
    return folder


def _pngs(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.glob("*.png"))}


def _assert_same(window: Path, cli: Path) -> None:
    ours, theirs = _pngs(window), _pngs(cli)
    assert sorted(ours) == sorted(theirs)
    for name in ours:
        assert ours[name] == theirs[name], name


@pytest.mark.parametrize("name, fields, args", MAPS, ids=[m[0] for m in MAPS])
def test_window_and_cli_write_the_same_maps(maps: ResultMaps, tiny: Path, image: Path, tmp_path: Path, name: str,
                                            fields: dict[str, Any], args: list[str]) -> None:
    window = _window(maps, tmp_path / "window", fields, heatmap_only=False, colorbar=False)
    cli = _cli(tiny, image, tmp_path / "cli", args)
    _assert_same(window, cli)
    label = name if name not in ("token",) else "token3"
    rollout = fields.get("source") == "rollout"
    expected = {f"cat_photo_{label}_L{layer}_H{head}.png" for layer in range(2)
                for head in (["mean"] if rollout else ["0", "1", "mean", "max"])}
    assert set(_pngs(window)) == expected


@pytest.mark.parametrize("name, fields, heatmap_only, colorbar, args", PICTURES, ids=[p[0] for p in PICTURES])
def test_window_and_cli_draw_the_same_pictures(maps: ResultMaps, tiny: Path, image: Path, tmp_path: Path, name: str,
                                               fields: dict[str, Any], heatmap_only: bool, colorbar: bool,
                                               args: list[str]) -> None:
    for source, extra in (({"source": "cls"}, ["--maps", "cls"]),
                          ({"source": "rollout", "rollout_fusion": "max", "rollout_discard": 0.9},
                           ["--maps", "rollout", "--fusion", "max", "--discard-ratio", "0.9"])):
        label = source["source"]
        window = _window(maps, tmp_path / f"window-{label}", {**source, **fields}, heatmap_only, colorbar)
        cli = _cli(tiny, image, tmp_path / f"cli-{label}", [*extra, *args])
        _assert_same(window, cli)


def test_rollout_settings_name_the_files() -> None:
    """The label is the CLI's (defaults say nothing), and the window's state maps onto it, query and start too."""
    assert MapKind("rollout").label == "rollout"
    assert MapKind("rollout", rollout=RolloutParams("max", 0.9)).label == "rollout-max-d0.9"
    settings = RolloutParams("min", 0.5, 2, 0.3, 17)
    assert MapKind("rollout", rollout=settings).label == "rollout-token17-min-d0.5-r0.3-from2"
    state = ViewState(source="rollout", rollout_fusion="max", rollout_discard=0.9)
    assert map_kind(state).label == "rollout-max-d0.9"      # the window used to name this plain 'rollout'
    assert map_kind(ViewState(source="token")).label == "cls"     # no query token: the CLS map, named so
    assert MapKind.parse("rollout:4", RolloutParams("max")) == MapKind("rollout", rollout=RolloutParams("max", query=4))


def test_window_offers_the_colormaps_export_accepts() -> None:
    assert COLORMAPS == available_colormaps()
    state = ViewState()
    for name in available_colormaps():
        state.update(colormap=name)
    for name in ("jet", "viridis_r"):
        with pytest.raises(ValueError):
            state.update(colormap=name)
    from vitviz.cli import build_parser

    export = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices["export"]
    cmap = next(a for a in export._actions if a.dest == "cmap")
    assert cmap.help.startswith(", ".join(available_colormaps()))
    for name in available_colormaps():
        assert cmap.type(name) == name
    with pytest.raises(argparse.ArgumentTypeError):
        cmap.type("jet")


def test_no_cls_model_names_its_fallback_map_mean(tmp_path: Path, image: Path) -> None:
    """Without a CLS token the window's 'cls' map is the mean over the patch queries: exported under that name,
    the files `vitviz export --maps mean` writes."""
    import vitviz

    ckpt = write_tiny_checkpoint(tmp_path / "no_cls.pth", class_token=False)
    maps = ResultMaps(vitviz.load(ckpt, heads=HEADS, device="cpu").run(image))
    window = _window(maps, tmp_path / "window", {"source": "cls"}, heatmap_only=False, colorbar=False)
    cli = _cli(ckpt, image, tmp_path / "cli", ["--maps", "mean"])
    _assert_same(window, cli)
    assert "cat_photo_mean_L0_H0.png" in _pngs(window)


# ---------------------------------------------------------------------------------------------- maps of a class,
# and of the token features: the window keeps them with the result (as its worker makes them), the CLI makes them
# per image; both write the same names and the same bytes

GRADIENT_MAPS = [
    ("relevance-top", {"source": "relevance"}, ["--maps", "relevance"], {"cat_photo_relevance_Lall.png"}),
    ("relevance-c3", {"source": "relevance", "relevance_class": 3}, ["--maps", "relevance:3"],
     {"cat_photo_relevance-c3_Lall.png"}),
    ("gradrollout-c1", {"source": "relevance", "relevance_method": "gradrollout", "relevance_class": 1},
     ["--maps", "gradrollout:1"], {"cat_photo_gradrollout-c1_Lall.png"}),
    ("attngrad-c2", {"source": "relevance", "relevance_method": "attngrad", "relevance_class": 2},
     ["--maps", "attngrad:2"], {f"cat_photo_attngrad-c2_L{layer}_H{head}.png" for layer in range(2)
                                for head in ("0", "1", "mean", "max")}),
]


@pytest.fixture(scope="module")
def full_maps(tiny: Path, image: Path) -> ResultMaps:
    """A result with every class's gradient maps and the token features added, as the window's worker adds them."""
    import vitviz
    from vitviz.core.analyses.features import capture_features, prefix_norms, token_norms
    from vitviz.core.analyses.relevance import class_relevance

    model = vitviz.load(tiny, heads=HEADS, device="cpu")
    maps = ResultMaps(model.run(image))
    for target in (None, 1, 2, 3):
        maps.add_relevance(class_relevance(model, str(image), target), target)
    feats = capture_features(model, str(image))
    maps.add_features(feats, token_norms(feats), prefix_norms(feats))
    return maps


@pytest.mark.parametrize("name, fields, args, expected", GRADIENT_MAPS, ids=[m[0] for m in GRADIENT_MAPS])
@pytest.mark.parametrize("picture", [PICTURES[0], PICTURES[1]], ids=[PICTURES[0][0], PICTURES[1][0]])
def test_window_and_cli_write_the_same_gradient_maps(full_maps: ResultMaps, tiny: Path, image: Path, tmp_path: Path,
                                                     name: str, fields: dict[str, Any], args: list[str],
                                                     expected: set[str], picture: tuple) -> None:
    _label, style, heatmap_only, colorbar, style_args = picture
    window = _window(full_maps, tmp_path / "window", {**fields, **style}, heatmap_only, colorbar)
    cli = _cli(tiny, image, tmp_path / "cli", [*args, *style_args])
    _assert_same(window, cli)
    assert set(_pngs(window)) == expected


@pytest.mark.parametrize("picture", [PICTURES[0], PICTURES[1]], ids=[PICTURES[0][0], PICTURES[1][0]])
def test_the_features_dock_and_cli_write_the_same_pca_and_norms(full_maps: ResultMaps, tiny: Path, image: Path,
                                                                tmp_path: Path, picture: tuple) -> None:
    """The Features dock's export of a PCA fitted on this image and of the norms is `--maps pca,norms`."""
    from vitviz.core.analyses.features import feature_pca
    from vitviz.gui import features_export

    _label, style, heatmap_only, colorbar, style_args = picture
    state = ViewState()
    state.update(**style)
    folder = tmp_path / "window"
    folder.mkdir()
    for layer in range(2):
        colors = feature_pca(full_maps.features, layer).colors[0]
        features_export.export_pca(full_maps, colors, layer, state, folder, heatmap_only=heatmap_only,
                                   colorbar=colorbar)
    features_export.export_norms(full_maps, [0, 1], state, folder, heatmap_only=heatmap_only, colorbar=colorbar)
    cli = _cli(tiny, image, tmp_path / "cli", ["--maps", "pca,norms", *style_args])
    _assert_same(folder, cli)
    assert set(_pngs(folder)) == {f"cat_photo_{kind}_L{layer}.png" for kind in ("pca", "norms") for layer in (0, 1)}


# ---------------------------------------------------------------------------------------------- a MAP head's maps
# (SigLIP, PE have no CLS token; the pooling query's attention is their "CLS attention"): the window's 'pool' source
# and its rollout target are `vitviz export --maps pool` and `--maps rollout:pool`, same names, same bytes

SIGLIP = dict(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4, mlp_ratio=2.0)


@pytest.fixture(scope="module")
def siglip(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random timm SigLIP tower (MAP head) saved as a timm hub folder."""
    timm = pytest.importorskip("timm")
    folder = tmp_path_factory.mktemp("siglip")
    model = timm.create_model("vit_base_patch16_siglip_224", pretrained=False, num_classes=0, **SIGLIP)
    timm.models._hub.save_for_hf(model, str(folder), model_args=SIGLIP, safe_serialization=True)
    return folder


@pytest.fixture(scope="module")
def siglip_maps(siglip: Path, image: Path) -> ResultMaps:
    import warnings

    import vitviz

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ResultMaps(vitviz.load(siglip, device="cpu").run(image))


POOL_MAPS = [
    ("pool", {"source": "pool"}, ["--maps", "pool"],
     {f"cat_photo_pool_Lall_H{head}.png" for head in ("0", "1", "2", "3", "mean", "max")}),
    ("rollout-pool", {"source": "rollout", "rollout_pool": True}, ["--maps", "rollout:pool"],
     {f"cat_photo_rollout-pool_L{layer}_Hmean.png" for layer in range(2)}),
    ("rollout-pool-max-d0.5", {"source": "rollout", "rollout_pool": True, "rollout_fusion": "max",
                               "rollout_discard": 0.5}, ["--maps", "rollout:pool", "--fusion", "max",
                                                         "--discard-ratio", "0.5"],
     {f"cat_photo_rollout-pool-max-d0.5_L{layer}_Hmean.png" for layer in range(2)}),
]


@pytest.mark.parametrize("name, fields, args, expected", POOL_MAPS, ids=[m[0] for m in POOL_MAPS])
@pytest.mark.parametrize("picture", [PICTURES[0], PICTURES[1]], ids=[PICTURES[0][0], PICTURES[1][0]])
def test_window_and_cli_write_the_same_pool_maps(siglip_maps: ResultMaps, siglip: Path, image: Path, tmp_path: Path,
                                                 name: str, fields: dict[str, Any], args: list[str],
                                                 expected: set[str], picture: tuple) -> None:
    _label, style, heatmap_only, colorbar, style_args = picture
    window = _window(siglip_maps, tmp_path / "window", {**fields, **style}, heatmap_only, colorbar)
    code = main(["export", "--model", str(siglip), str(image), "--out", str(tmp_path / "cli"), "--layers", "all",
                 "--which-heads", "all,mean,max", "--quiet", *args, *style_args])
    assert code == 0
    _assert_same(window, tmp_path / "cli")
    assert set(_pngs(window)) == expected


def test_pool_maps_are_the_map_heads_attention(siglip_maps: ResultMaps) -> None:
    """'pool' is `AttentionResult.pool_map` per head; its rollout pulls the fused pooling row back through the
    layers exactly as the full rollout matrix does."""
    from vitviz.core.analyses.maps import pool_vector

    result = siglip_maps.result
    stack = siglip_maps.stack("pool")
    assert stack.maps.shape == (1, 4 + 2, *result.grid) and stack.title.startswith("pooling attention")
    for head in (0, 3, "mean", "max"):
        np.testing.assert_allclose(stack.select("all", head), result.pool_map(head), rtol=1e-6)
    params = RolloutParams("max", 0.5, 0, 0.3)
    rolled = siglip_maps.stack(MapKind("poolrollout", rollout=params))
    engine = siglip_maps.rollout
    full = pool_vector(result.pool_attention, "max") @ engine.matrix(params)        # (T,) through every layer
    np.testing.assert_allclose(rolled.select(-1, "mean"), full.reshape(result.grid), rtol=1e-5, atol=1e-7)
    assert MapKind.parse("rollout:pool", params) == MapKind("poolrollout", rollout=params)
    assert MapKind.parse("pool").label == "pool" and rolled.title.startswith("rollout of the pooling query")


def test_pool_map_of_a_model_without_a_map_head_is_refused(tiny: Path, image: Path, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["export", "--model", str(tiny), "--heads", str(HEADS), str(image), "--out", str(tmp_path / "o"),
                 "--maps", "pool", "--quiet"])
    assert code == 2 and "needs a MAP pooling head" in capsys.readouterr().err
