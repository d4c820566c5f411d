"""`vitviz export --maps` with the maps that need passes of their own: relevance / gradrollout / attngrad of a class
(a forward and backward pass per image), pca and norms (the blocks' output tokens).

The PNGs are the library's maps (`core.relevance`, `core.features`) drawn through `core.render`, byte for byte
after decoding; the .npz holds the same arrays; a class the model does not have exits 2 with the reason; and the
plain export never runs those passes.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from _tiny import write_tiny_checkpoint
from PIL import Image

from vitviz.batch.plan import Plan, check_classes, class_index, combos, output_name, parse_maps
from vitviz.cli import main
from vitviz.core.analyses.maps import MapKind, MapNotReady, ResultMaps, SelectionError, norm_stack, relevance_stack
from vitviz.core.drawing.render import RenderOptions, draw_colors, draw_map, native_view
from vitviz.core.spec import ModelSpec

HEADS = 2


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("images") / "cat.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (40, 52, 3), dtype=np.uint8)).save(path)
    return path


@pytest.fixture(scope="module")
def model(tiny_ckpt: Path):  # noqa: ANN201
    import vitviz

    return vitviz.load(tiny_ckpt, heads=HEADS, device="cpu")


def _export(tiny_ckpt: Path, image: Path, out: Path, *args: str) -> int:
    return main(["export", "--model", str(tiny_ckpt), "--heads", str(HEADS), str(image), "--out", str(out), "--quiet",
                 *args])


def _png(path: Path) -> np.ndarray:
    return np.asarray(Image.open(path).convert("RGB"))


# ---------------------------------------------------------------------------------------------- names


def test_the_new_maps_parse_and_name_their_files() -> None:
    maps = parse_maps("relevance,relevance:3,gradrollout:Tabby Cat,attngrad:0,pca,norms")
    assert [m.label for m in maps] == ["relevance", "relevance-c3", "gradrollout-tabby_cat", "attngrad-c0", "pca",
                                       "norms"]
    assert maps[2].target == "tabby cat"
    todo = combos(maps, [0, 1], [0, "mean"])
    names = [output_name("cat", m, layer, head) for m, layer, head in todo]
    assert names == ["cat_relevance_Lall.png", "cat_relevance-c3_Lall.png", "cat_gradrollout-tabby_cat_Lall.png",
                     "cat_attngrad-c0_L0_H0.png", "cat_attngrad-c0_L0_Hmean.png", "cat_attngrad-c0_L1_H0.png",
                     "cat_attngrad-c0_L1_Hmean.png", "cat_pca_L0.png", "cat_pca_L1.png", "cat_norms_L0.png",
                     "cat_norms_L1.png"]
    # the attention maps keep their names
    assert output_name("cat", MapKind("cls"), 3, "mean") == "cat_cls_L3_Hmean.png"
    assert output_name("cat", MapKind("rollout"), 3, "mean") == "cat_rollout_L3_Hmean.png"
    for bad in ("relevance:", "pca:3", "norms:1", "relevancee"):
        with pytest.raises(SelectionError):
            MapKind.parse(bad)


def test_classes_resolve_by_index_or_label() -> None:
    spec = ModelSpec(family="test", source="x", image_size=(32, 32), patch_size=8, embed_dim=32, depth=2,
                     num_heads=2, num_classes=4, labels=("tench", "tabby, tabby cat", "tiger cat", "Egyptian cat"))
    assert class_index(None, spec) is None and class_index(2, spec) == 2
    assert class_index("TABBY", spec) == 1 and class_index("tabby, tabby cat", spec) == 1
    assert class_index("egyptian  cat", spec) == 3
    with pytest.raises(SelectionError, match="out of range: the model has 4 classes"):
        class_index(4, spec)
    with pytest.raises(SelectionError, match="did you mean 'tiger cat'"):
        class_index("tigr cat", spec)
    resolved = check_classes(parse_maps("relevance:tabby,relevance:1,cls,gradrollout:tench"), spec)
    assert [m.label for m in resolved] == ["relevance-c1", "cls", "gradrollout-c0"]   # one map per class
    headless = ModelSpec(family="test", source="x", image_size=(32, 32), patch_size=8, embed_dim=32, depth=2,
                         num_heads=2)
    with pytest.raises(SelectionError, match="no classifier"):
        check_classes(parse_maps("relevance"), headless)


def test_the_plan_asks_for_each_pass_only_when_a_map_needs_it() -> None:
    def plan(maps: str, npz: bool = False) -> Plan:
        return Plan(parse_maps(maps), [0], ["mean"], RenderOptions(), npz=npz)

    plain = plan("cls,rollout")
    assert plain.needs_attention and not plain.classes and not plain.needs_features
    assert plan("cls,token:3").rows == [0, 3]
    only = plan("relevance:2,attngrad:2,gradrollout")
    assert not only.needs_attention and only.classes == [2, None] and not only.needs_features
    assert only.rows == []
    assert plan("pca", npz=True).needs_attention and plan("norms").needs_features


# ---------------------------------------------------------------------------------------------- the files


def test_gradient_and_feature_maps_equal_the_library(model, tiny_ckpt: Path, image: Path, tmp_path: Path) -> None:  # noqa: ANN001
    from vitviz.core.analyses.features import capture_features, feature_pca, prefix_norms, token_norms
    from vitviz.core.analyses.relevance import class_relevance

    out = tmp_path / "out"
    assert _export(tiny_ckpt, image, out, "--maps", "relevance:3,gradrollout,attngrad:3,pca,norms", "--layers", "all",
                   "--which-heads", "all,mean", "--npz", "--colorbar") == 0
    names = sorted(p.name for p in out.glob("*.png"))
    assert names == sorted(["cat_relevance-c3_Lall.png", "cat_gradrollout_Lall.png", "cat_pca_L0.png",
                            "cat_pca_L1.png", "cat_norms_L0.png", "cat_norms_L1.png",
                            *[f"cat_attngrad-c3_L{layer}_H{head}.png" for layer in (0, 1) for head in (0, 1, "mean")]])
    result = model.run(image)
    base, hw, patch = native_view(result), result.image.shape[:2], result.spec.patch_size
    opts = RenderOptions(colorbar=True)
    rel3, top = class_relevance(model, str(image), 3), class_relevance(model, str(image))
    assert np.array_equal(_png(out / "cat_relevance-c3_Lall.png"),
                          draw_map(relevance_stack(rel3, "relevance"), "all", "mean", base, hw, patch, opts))
    assert np.array_equal(_png(out / "cat_gradrollout_Lall.png"),
                          draw_map(relevance_stack(top, "gradrollout"), "all", "mean", base, hw, patch, opts))
    grads = relevance_stack(rel3, "attngrad")
    assert grads.vmin is not None and float(grads.vmin[0]) == -float(grads.vmax[0]) < 0   # signed: -m..m
    for layer in (0, 1):
        for head in (0, 1, "mean"):
            assert np.array_equal(_png(out / f"cat_attngrad-c3_L{layer}_H{head}.png"),
                                  draw_map(grads, layer, head, base, hw, patch, opts))
    feats = capture_features(model, str(image))
    norms = token_norms(feats)
    for layer in (0, 1):
        pca = feature_pca(feats, layer)
        assert np.array_equal(_png(out / f"cat_pca_L{layer}.png"), draw_colors(pca.colors[0], base, hw, patch, opts))
        assert np.array_equal(_png(out / f"cat_norms_L{layer}.png"),
                              draw_map(norm_stack(norms), layer, "mean", base, hw, patch, opts))
    data = np.load(out / "cat.npz")
    np.testing.assert_array_equal(data["relevance_c3"], rel3.chefer)
    assert int(data["relevance_c3_class"]) == 3 and int(data["gradrollout_class"]) == top.target
    np.testing.assert_array_equal(data["gradrollout"], top.grad_rollout)
    np.testing.assert_array_equal(data["attngrad_c3"], rel3.attn_grad)
    for layer in (0, 1):
        pca = feature_pca(feats, layer)
        np.testing.assert_array_equal(data[f"pca_L{layer}"], pca.colors[0])
        np.testing.assert_array_equal(data[f"pca_foreground_L{layer}"], pca.foreground[0])
    np.testing.assert_array_equal(data["norms"], norms)
    np.testing.assert_array_equal(data["prefix_norms"], prefix_norms(feats))
    assert data["attentions"].shape == (2, HEADS, 17, 17)           # the attention arrays are still there


def test_a_pca_colour_image_is_not_a_heatmap(model, image: Path) -> None:  # noqa: ANN001
    """Background patches are black, the legend names the components, the heatmap style is the bare colours."""
    from vitviz.core.analyses.features import capture_features, feature_pca

    pca = feature_pca(capture_features(model, str(image)))
    colors, fg = pca.colors[0], pca.foreground[0]
    bare = draw_colors(colors, np.zeros((32, 32, 3), np.uint8), (32, 32), 8, RenderOptions(style="heatmap",
                                                                                        smooth=False))
    blocks = bare[4::8, 4::8]                                        # one pixel per patch, (4, 4, 3)
    np.testing.assert_array_equal(blocks, np.rint(colors * 255).astype(np.uint8))
    assert (blocks[~fg] == 0).all()
    legend = draw_colors(colors, np.zeros((32, 32, 3), np.uint8), (32, 32), 8, RenderOptions(colorbar=True))
    assert legend.shape[1] > 32 and legend.shape[0] >= 32


@pytest.mark.parametrize("maps, args, message", [
    ("relevance:7", [], "class 7 out of range: the model has 5 classes (0-4)"),
    ("gradrollout:cat", [], "class 'cat': this model has no class labels; give an index 0-4"),
    ("pca", ["--layers", "mean"], "the pca map has no mean over layers"),
])
def test_a_bad_class_or_layer_exits_2_with_the_reason(tiny_ckpt: Path, image: Path, tmp_path: Path, maps: str,
                                                       args: list[str], message: str,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    assert _export(tiny_ckpt, image, tmp_path / "out", "--maps", maps, *args) == 2
    err = capsys.readouterr().err
    assert f"vitviz: error: {message}" in err
    assert not (tmp_path / "out").exists()


def test_a_model_without_classifier_has_no_relevance(tmp_path: Path, image: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    headless = write_tiny_checkpoint(tmp_path / "headless.pth", num_classes=0)
    assert _export(headless, image, tmp_path / "out", "--maps", "relevance") == 2
    assert "no classifier" in capsys.readouterr().err
    assert _export(headless, image, tmp_path / "out", "--maps", "pca,norms") == 0    # features need no classes


def test_the_plain_export_runs_no_extra_pass_and_relevance_alone_no_attention_pass(
        tiny_ckpt: Path, image: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from vitviz.core.running import capture
    from vitviz.core.analyses import features, relevance
    def refuse(*_a: object, **_k: object) -> None:
        raise AssertionError("this pass must not run")

    with monkeypatch.context() as m:
        m.setattr(relevance, "class_relevance", refuse)
        m.setattr(features, "capture_features", refuse)
        assert _export(tiny_ckpt, image, tmp_path / "plain", "--maps", "cls,rollout", "--npz") == 0
    with monkeypatch.context() as m:
        m.setattr(capture.VitModel, "forward_captured", refuse)
        assert _export(tiny_ckpt, image, tmp_path / "grad", "--maps", "relevance,norms") == 0
    assert sorted(p.name for p in (tmp_path / "grad").glob("*.png")) == ["cat_norms_L1.png", "cat_relevance_Lall.png"]


def test_result_maps_keep_relevance_and_features(model, image: Path) -> None:  # noqa: ANN001
    """The window's cache: a gradient map is not ready until its relevance is added, then it is the library's."""
    from vitviz.core.analyses.features import capture_features, prefix_norms, token_norms
    from vitviz.core.analyses.relevance import class_relevance

    maps = ResultMaps(model.run(image))
    kind = MapKind("relevance")
    assert not maps.has(kind)
    with pytest.raises(MapNotReady):
        maps.stack(kind)
    before = maps.nbytes
    rel = class_relevance(model, str(image))
    maps.add_relevance(rel, None)
    assert maps.has(kind) and maps.has(MapKind("gradrollout", target=rel.target))
    np.testing.assert_array_equal(maps.stack(kind).select("all", "mean"), rel.chefer)
    np.testing.assert_array_equal(maps.stack(MapKind("attngrad", target=rel.target)).select(1, 0), rel.attn_grad[1, 0])
    feats = capture_features(model, str(image))
    maps.add_features(feats, token_norms(feats), prefix_norms(feats))
    np.testing.assert_array_equal(maps.stack("norms").select(0, "mean"), token_norms(feats)[0])
    assert maps.nbytes > before


def test_the_windows_npz_holds_the_relevance_and_norms_computed_under_the_clis_keys(model, tiny_ckpt: Path, image: Path,  # noqa: ANN001
                                                                                    tmp_path: Path) -> None:
    from vitviz.core.analyses.features import capture_features, prefix_norms, token_norms
    from vitviz.core.analyses.relevance import class_relevance
    from vitviz.gui.exporting import export_npz

    maps = ResultMaps(model.run(image))
    maps.add_relevance(class_relevance(model, str(image), 3), 3)
    feats = capture_features(model, str(image))
    maps.add_features(feats, token_norms(feats), prefix_norms(feats))
    export_npz(maps, tmp_path / "window.npz")
    assert _export(tiny_ckpt, image, tmp_path / "cli", "--maps", "relevance:3,gradrollout:3,attngrad:3,norms",
                   "--npz") == 0
    ours, theirs = np.load(tmp_path / "window.npz"), np.load(tmp_path / "cli" / "cat.npz")
    keys = {"relevance_c3", "relevance_c3_class", "gradrollout_c3", "gradrollout_c3_class", "attngrad_c3",
            "attngrad_c3_class", "norms", "prefix_norms"}
    assert keys <= set(ours.files) and keys <= set(theirs.files)
    for key in keys:
        np.testing.assert_array_equal(ours[key], theirs[key])
