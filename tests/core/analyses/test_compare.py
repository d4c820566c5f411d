"""Two models compared (vitviz.core.analyses.compare), a training run as a timeline (vitviz.core.analyses.timeline), and `vitviz export
--compare` / `--timeline`, on tiny random models of other depths, head counts and grids."""
from __future__ import annotations

import json
import os
import warnings
from itertools import permutations
from pathlib import Path

import numpy as np
import pytest

import vitviz
from _hostile import DEMO, random_png, run_folder
from _tiny import HEADS, write_permuted_heads, write_tiny_checkpoint
from vitviz.core.analyses import compare as cmp
from vitviz.core.analyses.maps import MapKind, map_stack
from vitviz.core.analyses.timeline import TimelineError, find_checkpoints, name_number, open_run, run_metrics


def load(path: Path, heads: int = HEADS):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return vitviz.load(path, heads=heads)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory):
    d = tmp_path_factory.mktemp("cmp")
    a = load(write_tiny_checkpoint(d / "a.pth"))
    b = load(write_tiny_checkpoint(d / "b.pth", seed=5))                                  # same layout
    c = load(write_tiny_checkpoint(d / "c.pth", depth=3, grid=(8, 8), patch=4, seed=3), heads=4)  # all differ
    return a, b, c


@pytest.fixture(scope="module")
def images() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.integers(0, 256, (40, 52, 3), dtype=np.uint8) for _ in range(2)]


def test_a_model_against_itself_is_exactly_zero(models, images) -> None:
    a = models[0]
    c = cmp.compare(a, a, images)
    for im in c.images:
        assert np.array_equal(im.diff.maps, np.zeros_like(im.diff.maps))
        assert np.array_equal(im.a.maps, im.b.maps)
    assert np.all(c.jsd == 0) and np.allclose(c.cka, 1.0, atol=1e-9)
    assert [m.pairs[0][:2] for m in c.heads] == [(0, 0), (0, 0)]
    assert c.notes[1] == "layers by index (2 each)"


def test_difference_is_a_minus_b_exactly(models, images) -> None:
    a, b, _ = models
    c = cmp.compare(a, b, images, heads="index", cka=False)
    for img, im in zip(images, c.images):
        sa = map_stack(a.run(img, logits=False).attentions, MapKind("cls"), a.spec)
        sb = map_stack(b.run(img, logits=False).attentions, MapKind("cls"), b.spec)
        assert np.array_equal(im.a.maps, sa.maps) and np.array_equal(im.b.maps, sb.maps)
        assert np.array_equal(im.diff.maps, sa.maps - sb.maps)
        assert np.allclose(im.diff.vmin, -im.diff.vmax)                       # centred on 0
        assert im.diff.vmax[0] == np.abs(im.diff.maps[:, :2]).max()
    assert c.cka is None


def test_other_depth_heads_and_grid(models, images) -> None:
    a, _, c3 = models
    c = cmp.compare(a, c3, images)
    assert list(c.layers_b) == [0, 2] and list(c.relative_depth) == [0.0, 1.0]
    assert "relative depth" in c.notes[1] and "patches by place" in c.notes[3]
    im = c.images[0]
    assert im.a.maps.shape == im.b.maps.shape == im.diff.maps.shape == (2, 4, 4, 4)
    assert im.b_own.maps.shape == (3, 6, 8, 8)
    for i, match in enumerate(c.heads):             # B's columns are its matched heads, by place, scaled 64/16
        for ha, hb, _ in match.pairs:
            want = cmp.to_grid(im.b_own.maps[c.layers_b[i], hb], (8, 8), (4, 4))
            assert np.array_equal(im.b.maps[i, ha], want)
            assert np.array_equal(im.diff.maps[i, ha], im.a.maps[i, ha] - want)
        sim = match.similarity
        assert sum(s for *_, s in match.pairs) == pytest.approx(
            max(sum(sim[i2, j] for i2, j in enumerate(cols)) for cols in permutations(range(4), 2)))
    assert c.cka.shape == (2,) and np.all((c.cka > 0) & (c.cka <= 1))


def test_layers_by_relative_depth() -> None:
    assert list(cmp.match_layers(4, 4)) == [0, 1, 2, 3]
    assert list(cmp.match_layers(2, 3)) == [0, 2]
    assert list(cmp.match_layers(3, 2)) == [0, 1, 1]
    assert list(cmp.match_layers(12, 6)) == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5]
    assert list(cmp.match_layers(1, 5)) == [4]


def test_by_place_keeps_an_even_map_and_uses_the_windows_rule() -> None:
    even = np.full((8, 8), 1 / 64)
    assert np.allclose(cmp.to_grid(even, (8, 8), (4, 4)), 1 / 16)
    idx = cmp.place_index((8, 8), (4, 4))
    assert idx[0] == 1 * 8 + 1 and idx[-1] == 7 * 8 + 7      # centre (0.125, 0.125) -> patch (1, 1)
    assert list(cmp.place_index((2, 2), (4, 4))) == [0, 0, 1, 1, 0, 0, 1, 1, 2, 2, 3, 3, 2, 2, 3, 3]


@pytest.mark.parametrize("shape", [(1, 1), (3, 3), (5, 5), (6, 6), (2, 5), (5, 3), (7, 7)])
def test_hungarian_against_brute_force(shape) -> None:
    rng = np.random.default_rng(sum(shape))
    for _ in range(5):
        s = rng.normal(size=shape)
        if rng.random() < 0.5:
            s = np.round(s, 1)                          # ties
        got, want = cmp.assign(s), cmp.brute_force_assign(s)
        total = lambda pairs: sum(s[i, j] for i, j in pairs)  # noqa: E731
        assert total(got) == pytest.approx(total(want), abs=1e-12)
        assert len(got) == min(shape) and len({j for _, j in got}) == len(got)


def test_head_matching_recovers_a_permutation(tmp_path: Path, images) -> None:
    """B is A with its heads permuted in every layer (q, k, v rows and proj columns): the matching finds it."""
    perm = [2, 0, 3, 1]
    heads = len(perm)
    a_path, b_path = write_permuted_heads(tmp_path, perm)
    a, b = load(a_path, heads), load(b_path, heads)
    c = cmp.compare(a, b, images)
    for match in c.heads:                       # B's head h is A's head perm[h]
        assert [(x, y) for x, y, _ in match.pairs] == sorted((perm[h], h) for h in range(heads))
        assert all(s == pytest.approx(1.0) for *_, s in match.pairs)
    assert np.allclose([np.abs(im.diff.maps).max() for im in c.images], 0, atol=1e-6)
    assert "A head 0 ↔ B head 1, similarity 1.00" in c.heads[0].describe()


def test_jsd_and_cka_against_direct_formulas() -> None:
    rng = np.random.default_rng(1)
    p, q = rng.random(16), rng.random(16)
    pn, qn = p / p.sum(), q / q.sum()
    m = (pn + qn) / 2
    direct = 0.5 * np.sum(pn * np.log2(pn / m)) + 0.5 * np.sum(qn * np.log2(qn / m))
    assert cmp.js_divergence(p, q) == pytest.approx(direct, rel=1e-12)
    assert cmp.js_divergence(np.array([1.0, 0]), np.array([0, 1.0])) == pytest.approx(1.0)
    x, y = rng.normal(size=(50, 6)), rng.normal(size=(50, 9))
    h = np.eye(50) - 1 / 50
    k, l_ = h @ x @ x.T @ h, h @ y @ y.T @ h                    # HSIC form with centred Gram matrices
    want = np.sum(k * l_) / np.sqrt(np.sum(k * k) * np.sum(l_ * l_))
    assert cmp.linear_cka(x, y) == pytest.approx(want, rel=1e-10)
    q_, _ = np.linalg.qr(rng.normal(size=(6, 6)))
    assert cmp.linear_cka(x, 3 * x @ q_) == pytest.approx(1.0)


def test_compare_refuses_maps_of_one_model() -> None:
    with pytest.raises(cmp.CompareError, match="token:N"):
        cmp.compare_results([object()], [object()], "token:3")


# ---------------------------------------------------------------------------------------------- view model
@pytest.fixture(scope="module")
def runs(models, images):
    return {name: [m.run(img, logits=False) for img in images] for name, m in zip("abc", models)}


def test_view_frames_are_the_comparisons_maps_on_one_scale(runs) -> None:
    ra, rc = runs["a"], runs["c"]
    view = cmp.CompareView(ra, rc)
    want = cmp.compare_results(ra, rc)
    assert [m.pairs for m in view.matches] == [m.pairs for m in want.heads]
    for n in range(2):
        a, b, d = view.stacks(n)
        im = want.images[n]
        assert np.array_equal(a.maps, im.a.maps) and np.array_equal(b.maps, im.b.maps, equal_nan=True)
        for layer in (0, 1, -1, "mean"):
            for head in (0, 1, "mean", "max"):                     # A has 2 heads, C 4
                f = view.frame(n, layer, head)
                assert np.array_equal(f.a, im.a.select(layer, head))
                assert np.array_equal(f.b, im.b.select(layer, head), equal_nan=True)
                assert np.array_equal(f.diff, f.a - f.b, equal_nan=True)
                group = 0 if isinstance(head, int) else 1 if head == "mean" else 2
                top = max(np.nanmax(im.a.maps[:, :2] if group == 0 else im.a.maps[:, 2 + group - 1]),
                          np.nanmax(im.b.maps[:, :2] if group == 0 else im.b.maps[:, 2 + group - 1]))
                assert f.vmax == pytest.approx(top) and f.vmin == 0       # A and B: one scale, all layers
                assert f.dmax == pytest.approx(im.diff.scale_max(im.diff.column(head)))
    f = view.frame(0, 1, 1)
    lb, hb = int(want.layers_b[1]), want.heads[1].partner(1)
    assert (f.layer_b, f.head_b) == (2, hb) == (2, f.head_b)
    assert np.array_equal(f.b_own, want.images[0].b_own.select(lb, hb))
    assert "A layer 1 ↔ B layer 2 (relative depth 1.00)" in f.label and f"A head 1 ↔ B head {hb}" in f.label
    assert f.similarity == pytest.approx(want.heads[1].similarity[1, hb])
    with pytest.raises(cmp.CompareError, match="A has 2"):
        view.frame(0, 5, 0)


def test_view_of_a_model_with_itself_is_zero_for_every_kind(runs) -> None:
    from vitviz.core.analyses.maps import ResultMaps

    ra = runs["a"]
    view = cmp.CompareView(ra, [ResultMaps(r) for r in ra])          # results or ResultMaps alike
    for kind, query in (("cls", None), ("mean", None), ("max", None), ("rollout", None), ("cls", 7), ("token:0", None)):
        for layer in (0, 1, "mean"):
            for head in (0, 1, "mean", "max"):
                f = view.frame(1, layer, head, kind, query)
                assert np.array_equal(f.diff, np.zeros_like(f.diff)), (kind, query, layer, head)
    assert view.frame(0, 0, 0, query=7).query_b == 7


def test_view_queries_by_place_and_other_grids(runs) -> None:
    ra, rc = runs["a"], runs["c"]                # A: 4x4 grid, 2 heads; C: 8x8, 4 heads, 3 layers
    view = cmp.CompareView(ra, rc, heads="index")
    q = 1 + 2 * 4 + 3                            # A's patch (2, 3): centre (0.625, 0.875) -> C's patch (5, 7)
    assert view.query_place(q) == (0.625, 0.875) and view.query_b(q) == 1 + 5 * 8 + 7
    assert view.query_b(0) == 0
    f = view.frame(0, -1, 1, query=q)
    own = map_stack(rc[0].attentions, MapKind("token", 1 + 5 * 8 + 7), rc[0].spec)
    assert np.array_equal(f.b_own, own.maps[2, 1])
    assert np.array_equal(f.b, cmp.to_grid(own.maps[2, 1], (8, 8), (4, 4)))
    assert np.array_equal(f.a, map_stack(ra[0].attentions, MapKind("token", q), ra[0].spec).maps[1, 1])
    assert "query at (0.62, 0.88): A token 12 ↔ B token 48" in f.label and f.head_b == 1
    given = cmp.CompareView(ra, rc, heads=view.matches)                 # matches given are used as given
    assert np.array_equal(given.frame(0, 0, 1).b, view.frame(0, 0, 1).b)
    with pytest.raises(cmp.CompareError, match="one head match per layer"):
        cmp.CompareView(ra, rc, heads=view.matches[:1])


def test_view_summary_against_depth(models, runs, images) -> None:
    from vitviz.core.analyses.features import capture_features

    a, _, c3 = models
    view = cmp.CompareView(runs["a"], runs["c"])
    s = view.summary()
    want = cmp.compare(a, c3, images)
    assert np.allclose(s.jsd, want.jsd) and np.allclose(s.jsd_heads, want.jsd_heads, equal_nan=True)
    assert s.cka is None and "CKA needs" in s.notes[-1] and s.images == 2
    assert list(s.relative_depth) == [0.0, 1.0] and list(s.depth_b) == [0.0, 1.0] and list(s.layers_b) == [0, 2]
    feats = ([capture_features(a, img, normed=False) for img in images],
             [capture_features(c3, img, normed=False) for img in images])
    assert np.allclose(view.summary(feats).cka, want.cka)


# ----------------------------------------------------------------------------------------------------- timeline
def test_names_give_numbers() -> None:
    assert name_number("epoch=3-step=1200") == (1200, 3)
    assert name_number("step-3000") == (3000, None)
    assert name_number("epoch_12") == (12, None)
    assert name_number("checkpoint-500") == (500, None)
    assert name_number("vit_b16_run7_iter40") == (40, None)
    assert name_number("best") == (None, None)


def test_timeline_orders_by_number_lightning_and_file_time(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    for n in (10, 2, 300):
        (run / f"epoch_{n}.pth").write_bytes(b"x")
    (run / "notes.txt").write_text("not a checkpoint")
    found, note = find_checkpoints(run)
    assert [c.path.name for c in found] == ["epoch_2.pth", "epoch_10.pth", "epoch_300.pth"]
    assert note == "ordered by the number in the names"
    light = tmp_path / "light"
    light.mkdir()
    for e, s in ((0, 500), (1, 1000), (0, 250)):
        (light / f"epoch={e}-step={s}.ckpt").write_bytes(b"x")
    found, note = find_checkpoints(light)
    assert [c.number for c in found] == [250, 500, 1000] and "Lightning" in note
    hf = tmp_path / "hf"
    for n in (1500, 500):
        (hf / f"checkpoint-{n}").mkdir(parents=True)
        (hf / f"checkpoint-{n}" / "model.safetensors").write_bytes(b"x")
    assert [c.label for c in find_checkpoints(hf)[0]] == ["checkpoint-500", "checkpoint-1500"]
    plain = tmp_path / "plain"
    plain.mkdir()
    for i, name in enumerate(["last.pth", "best.pth", "first.pth"]):
        (plain / name).write_bytes(b"x")
        os.utime(plain / name, (1000 + 10 * (2 - i), 1000 + 10 * (2 - i)))
    found, note = find_checkpoints(plain)
    assert [c.path.name for c in found] == ["first.pth", "best.pth", "last.pth"]
    assert note.startswith("ordered by file time:") and "has no number" in note
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "log.txt").write_text("")
    with pytest.raises(TimelineError, match="no checkpoints"):
        find_checkpoints(tmp_path / "empty")


def test_timeline_loads_lazily_names_another_layout_and_measures(tmp_path: Path, images) -> None:
    for i, step in enumerate((100, 200)):
        write_tiny_checkpoint(tmp_path / f"step-{step}.safetensors", seed=i)
    write_tiny_checkpoint(tmp_path / "step-300.safetensors", depth=3, seed=9)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = open_run(tmp_path, budget_bytes=1, heads=HEADS)
        assert run.loaded == []
        run.model(0)
        run.model(1)
        assert run.loaded == [1]                    # the budget keeps one
        with pytest.raises(TimelineError, match=r"step-300.safetensors: another layout.*depth 3 \(the run: 2\)"):
            run.model(2)
        run.checkpoints = run.checkpoints[:2]
        metrics = run_metrics(run, images[0], box=(0, 0, 0.5, 0.5))
    assert metrics.distance.shape == metrics.entropy.shape == metrics.box_share.shape == (2, 2)
    assert metrics.labels == ("step-100", "step-200") and metrics.numbers == (100, 200)
    r = run.model(1).run(images[0])
    from vitviz.core.analyses import analysis
    assert np.allclose(metrics.distance[1], analysis.mean_attention_distance(r).mean(axis=1))
    want = r.attentions[:, :, 0, 1:].reshape(2, HEADS, 4, 4)[:, :, :2, :2].sum(axis=(2, 3)).mean(axis=1)
    assert np.allclose(metrics.box_share[1], want, atol=1e-6)
    assert metrics.predictions[1][0] == r.top_k(1)[0][0]
    assert len(metrics.rows()) == 4 and json.dumps(metrics.to_dict())


# ---------------------------------------------------------------------------------------------------------- CLI
def _cli(*argv: str) -> int:
    """`vitviz ARGV...`'s exit code, whether argparse exits or the command returns it."""
    from vitviz.cli import main

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return main(list(argv))
        except SystemExit as e:
            return int(e.code)


def test_cli_compare_writes_a_b_and_differences(tmp_path: Path, photo: Path) -> None:
    a = write_tiny_checkpoint(tmp_path / "a.pth")
    b = write_tiny_checkpoint(tmp_path / "b.pth", depth=3, seed=2)
    out = tmp_path / "out"
    assert _cli("export", "--model", str(a), "--heads", "2", "--compare", str(b), str(photo), "--out", str(out),
                "--layers", "all", "--which-heads", "0,mean", "--npz", "--no-verify", "--quiet") == 0
    names = sorted(p.name for p in out.iterdir())
    manifest = json.loads((out / "manifest.json").read_text())
    record = manifest["compare"]["maps"]["cls"]
    assert record["layers_b"] == [0, 2]
    p0 = record["heads"][0]["pairs"][0]["b"]
    p1 = record["heads"][1]["pairs"][0]["b"]
    want = {"photo_A_cls_L0_H0.png", "photo_A_cls_L1_H0.png", "photo_A_cls_L0_Hmean.png", "photo_A_cls_L1_Hmean.png",
            f"photo_B_cls_L0_H{p0}.png", f"photo_B_cls_L2_H{p1}.png", "photo_B_cls_L0_Hmean.png",
            "photo_B_cls_L2_Hmean.png", "photo_diff_cls_L0_H0.png", "photo_diff_cls_L1_H0.png",
            "photo_diff_cls_L0_Hmean.png", "photo_diff_cls_L1_Hmean.png", "photo_compare.npz", "manifest.json"}
    assert set(names) == want
    assert sorted(manifest["images"][0]["outputs"]) == sorted(want - {"manifest.json"})
    arrays = np.load(out / "photo_compare.npz")
    assert np.array_equal(arrays["cls_diff"], arrays["cls_a"] - arrays["cls_b"])
    from PIL import Image

    from vitviz.core.drawing.colormaps import colormap

    a_pic = np.asarray(Image.open(out / "photo_A_cls_L0_Hmean.png"))
    diff = np.asarray(Image.open(out / "photo_diff_cls_L0_Hmean.png"))
    assert diff.shape == a_pic.shape                  # drawn over the region A saw
    assert _cli("export", "--model", str(a), "--heads", "2", "--compare", str(a), str(photo), "--out",
                str(tmp_path / "self"), "--style", "heatmap", "--no-verify", "--quiet") == 0
    same = np.asarray(Image.open(tmp_path / "self" / "photo_diff_cls_L1_Hmean.png"))
    assert {tuple(c) for c in same.reshape(-1, 3)} == {tuple(colormap("rdbu")[128])}   # exactly 0: the centre


def test_cli_timeline_writes_maps_sheet_and_figures(tmp_path: Path, photo: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    for e, s in ((1, 20), (0, 10)):
        write_tiny_checkpoint(run / f"epoch={e}-step={s}.ckpt", seed=e)
    out = tmp_path / "out"
    assert _cli("export", "--timeline", str(run), "--heads", "2", str(photo), "--out", str(out), "--box",
                "0,0,0.5,0.5", "--no-verify", "--quiet") == 0
    names = sorted(p.name for p in out.iterdir())
    assert names == ["manifest.json", "photo_animation_cls_L1_Hmean.gif", "photo_animation_cls_L1_Hmean.png",
                     "photo_epoch_0-step_10_cls_L1_Hmean.png", "photo_epoch_1-step_20_cls_L1_Hmean.png",
                     "photo_timeline_cls_L1_Hmean.png", "timeline.csv"]
    manifest = json.loads((out / "manifest.json").read_text())
    tl = manifest["timeline"]
    assert [c["number"] for c in tl["checkpoints"]] == [10, 20] and "Lightning" in tl["order"]
    assert len(tl["images"][0]["box_share"]) == 2
    lines = (out / "timeline.csv").read_text().splitlines()
    assert lines[0].startswith("image,checkpoint,number,layer,distance_px") and len(lines) == 1 + 2 * 2
    from PIL import Image

    one = Image.open(out / "photo_epoch_0-step_10_cls_L1_Hmean.png")
    sheet = Image.open(out / "photo_timeline_cls_L1_Hmean.png")
    assert sheet.size[0] > 2 * one.size[0] and sheet.size[1] > one.size[1]
    assert _cli("export", "--timeline", str(run), "--model", "x.pth", str(photo), "--out", str(out)) == 2


def test_view_keeps_only_the_last_queries(runs) -> None:
    view = cmp.CompareView(runs["a"], runs["c"])
    first = view.frame(0, 0, 0, query=1).a.copy()
    for q in range(2, 2 + cmp.MAX_QUERY_KINDS):
        view.frame(0, 0, 0, query=q)
    held = [k.token for k in view._pairs if k.kind == "token"]
    assert held == list(range(2, 2 + cmp.MAX_QUERY_KINDS)) and MapKind("cls") in view._pairs
    assert np.array_equal(view.frame(0, 0, 0, query=1).a, first)         # made again, the same
    assert all(MapKind("token", q) not in view.maps_a[0]._stacks for q in range(1, 10))


def test_view_of_a_key_map_takes_bs_token_by_place(runs) -> None:
    """key:N (the attention paid to token N) is compared as token:N is: A's token, B's by place; the maps are each
    model's own key column, B's aligned to A's grid."""
    ra, rc = runs["a"], runs["c"]
    view = cmp.CompareView(ra, rc, heads="index")
    q = 1 + 2 * 4 + 3                                             # A's patch (2, 3) -> C's patch (5, 7)
    f = view.frame(0, -1, 1, "key:%d" % q)
    own = map_stack(rc[0].attentions, MapKind("key", view.query_b(q)), rc[0].spec)
    assert np.array_equal(f.b_own, own.maps[2, 1])
    assert np.array_equal(f.a, map_stack(ra[0].attentions, MapKind("key", q), ra[0].spec).maps[1, 1])
    assert (f.query_a, f.query_b) == (q, 1 + 5 * 8 + 7) and "A token 12 ↔ B token 48" in f.label
    assert not np.array_equal(f.a, view.frame(0, -1, 1, f"token:{q}").a)      # the column, not the row
    same = cmp.CompareView(ra, ra)
    assert np.array_equal(same.frame(1, 0, 0, MapKind("key", 0)).diff, np.zeros((4, 4), np.float32))
    with pytest.raises(cmp.CompareError, match="token of one model only"):
        cmp.compare_results(ra, rc, "key:3")                      # a whole-run comparison names no token


# ----------------------------------------------------------------------------- head matching, hostile inputs (issue 34)

@pytest.mark.parametrize("shape", [(1, 1), (4, 4), (6, 6), (2, 6), (6, 3)])
def test_head_matching_without_scipy_is_exact(shape) -> None:
    from vitviz.core.analyses import compare as cmp

    rng = np.random.default_rng(sum(shape))
    for _ in range(6):
        s = rng.normal(size=shape)
        s = np.round(s, 1) if rng.random() < 0.5 else s   # ties
        got, want = cmp.assign_numpy(s), cmp.brute_force_assign(s)
        assert sum(s[i, j] for i, j in got) == pytest.approx(sum(s[i, j] for i, j in want), abs=1e-12)
        assert len(got) == min(shape) and len({j for _, j in got}) == len(got)


def test_head_matching_uses_scipy_when_there_and_numpy_otherwise(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    from vitviz.core.analyses import compare as cmp

    pytest.importorskip("scipy")
    s = np.random.default_rng(3).normal(size=(96, 130))
    with_scipy = cmp.assign(s)
    real_import = builtins.__import__

    def no_scipy(name, *a, **k):  # noqa: ANN001, ANN002, ANN003, ANN202
        if name.startswith("scipy"):
            raise ImportError("no scipy here")
        return real_import(name, *a, **k)

    calls = []
    monkeypatch.setattr(builtins, "__import__", no_scipy)
    monkeypatch.setattr(cmp, "assign_numpy", lambda x, real=cmp.assign_numpy: calls.append(1) or real(x))
    without = cmp.assign(s)
    assert calls and sum(s[i, j] for i, j in without) == pytest.approx(sum(s[i, j] for i, j in with_scipy))


def test_compare_refuses_what_is_not_a_loaded_global_attention_model(demo, tiny_swin_folder: Path,
                                                                     tmp_path: Path) -> None:
    from vitviz.core.analyses.compare import CompareError

    image = random_png(tmp_path / "a.png", size=64)
    for b, match in ((None, "model B is NoneType"), ("b.pth", "load it first"), (str(DEMO), "load it first")):
        with pytest.raises(CompareError, match=match):
            vitviz.compare(demo, b, [image])
    with pytest.raises(CompareError, match="model A is NoneType"):
        vitviz.compare(None, demo, [image])
    swin = vitviz.load(tiny_swin_folder)
    for a, b, side in ((demo, swin, "model B"), (swin, demo, "model A")):
        with pytest.raises(CompareError, match=f"{side} .*attends inside windows"):
            vitviz.compare(a, b, [image])
    with pytest.raises(CompareError, match="kind=None"):
        vitviz.compare(demo, demo, [image], kind=None)
    with pytest.raises(CompareError, match="heads=None"):
        vitviz.compare(demo, demo, [image], heads=None)
    with pytest.raises(CompareError, match="list of images"):
        vitviz.compare(demo, demo, image)


@pytest.mark.parametrize("order", ["AB", "BA"])
def test_export_compare_with_a_windowed_model_is_refused(order: str, tiny_swin_folder: Path, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture) -> None:
    image = random_png(tmp_path / "a.png", size=64)
    a, b = (DEMO, tiny_swin_folder) if order == "AB" else (tiny_swin_folder, DEMO)
    code = _cli("export", "--model", str(a), "--compare", str(b), str(image), "--out", str(tmp_path / "out"),
                "--quiet", "--no-verify")
    err = capsys.readouterr().err
    assert code == 2 and "attends inside windows" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("option", ["--compare", "--timeline"])
def test_an_empty_compare_or_timeline_is_refused(option: str, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture) -> None:
    image = random_png(tmp_path / "a.png")
    code = _cli("export", "--model", str(DEMO), option, "", str(image), "--out", str(tmp_path / "out"))
    assert code == 2 and "empty" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("side, at", [("compare", 4), ("compare", 5), ("timeline", 4)])
@pytest.mark.parametrize("how", ["SIGINT", "SIGTERM"])
def test_an_interrupted_compare_or_timeline_leaves_a_manifest_equal_to_the_disk(
        side: str, at: int, how: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The signal arrives as the `at`-th picture is written (for a comparison: A's, B's and the difference's
    pictures in turn; B's and the difference's names are known only once the heads are matched): exit 130, and
    manifest.json records exactly the files on disk (as the plain export's does), the interrupted image's
    finished files included."""
    import signal

    from vitviz.batch import compare as side_export

    images = [random_png(tmp_path / "in" / f"{n}.png", seed=n, size=64) for n in range(3)]
    out = tmp_path / "out"
    real = side_export.files.write_png_atomic
    count = [0]

    def write(*a, **k):  # noqa: ANN002, ANN003, ANN202
        path = real(*a, **k)
        count[0] += 1
        if count[0] == at:
            os.kill(os.getpid(), getattr(signal, how))
        return path

    monkeypatch.setattr(side_export.files, "write_png_atomic", write)
    given = ["--compare", str(DEMO), "--model", str(DEMO)] if side == "compare" else \
        ["--timeline", str(run_folder(tmp_path, DEMO, 3)), "--no-animation"]
    code = _cli("export", *given, *map(str, images), "--out", str(out), "--quiet", "--no-verify",
                "--layers", "all")
    assert code == 130
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["summary"]["interrupted"] is True
    recorded = {o for e in manifest["images"] for o in e["outputs"]}
    on_disk = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()} - {"manifest.json"}
    assert recorded == on_disk and len(on_disk) >= 4
    assert manifest["summary"]["files"] == len(on_disk)
