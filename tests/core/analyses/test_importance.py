"""Head importance (`vitviz.core.analyses.importance`): the batched scan equals one ablation per head done through
`model.run(intervene=...)`; attribution patching equals the directional derivative it estimates; progress, cancel
and bad input."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import vitviz
from _tiny import write_tiny_checkpoint
from vitviz.core.analyses.importance import ScanCancelled, head_importance
from vitviz.core.running.interventions import Ablate, InterventionError

HEADS = 4


def _image(seed: int) -> torch.Tensor:
    return torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


A, B, C = _image(1), _image(2), _image(3)


def _load(path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return vitviz.load(path, heads=HEADS, device="cpu")


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    return _load(write_tiny_checkpoint(tmp_path_factory.mktemp("imp") / "c.pth", depth=3, embed_dim=32, seed=4))


@pytest.fixture(scope="module")
def backbone(tmp_path_factory):
    return _load(write_tiny_checkpoint(tmp_path_factory.mktemp("imp") / "e.pth", depth=2, num_classes=0, seed=5))


def _probability(result, cls: int) -> float:
    z = result.logits.astype(np.float64)
    p = np.exp(z - z.max())
    return float(p[cls] / p.sum())


def test_scan_equals_one_ablation_per_head(classifier) -> None:
    vm = classifier
    imp = head_importance(vm, A, batch_size=5)   # 12 heads: passes of 5, 5 and 2 copies
    clean = vm.run(A)
    cls = clean.top_k(1)[0][0]
    assert imp.targets == (cls,) and imp.forwards == 3 and imp.drop.shape == (3, HEADS)
    for layer in range(3):
        for head in range(HEADS):
            ablated = vm.run(A, intervene=Ablate([(layer, head)]))
            want = _probability(clean, cls) - _probability(ablated, cls)
            assert imp.drop[layer, head] == pytest.approx(want, abs=1e-6), (layer, head)
    assert np.abs(imp.drop).max() > 1e-3
    assert imp.top(1)[0][:2] == np.unravel_index(np.argmax(imp.drop), imp.drop.shape)


def test_mean_ablation_logit_over_images(classifier) -> None:
    vm = classifier
    imp = head_importance(vm, [A, B], target=2, metric="logit", mode="mean", reference=[B, C], batch_size=7)
    for n, x in enumerate((A, B)):
        clean = vm.run(x).logits[2]
        for layer, head in ((0, 1), (2, 3)):
            r = vm.run(x, intervene=Ablate([(layer, head)], "mean", reference=[B, C]))
            assert imp.per_image[n, layer, head] == pytest.approx(clean - r.logits[2], abs=1e-5)
    np.testing.assert_allclose(imp.drop, imp.per_image.mean(0))
    assert imp.targets == (2, 2) and "logit('class 2')" in imp.title and "2 images" in imp.title


def test_embedding_model_cosine_change(backbone) -> None:
    vm = backbone
    imp = head_importance(vm, A)
    assert imp.metric == "cosine" and imp.targets == (None,)
    clean = vm.run(A).features
    ablated = vm.run(A, intervene=Ablate([(1, 2)])).features
    cos = float(np.dot(clean, ablated) / np.linalg.norm(clean) / np.linalg.norm(ablated))
    assert imp.drop[1, 2] == pytest.approx(1 - cos, abs=1e-6)
    assert "cosine change" in repr(imp)


def test_attribution_is_the_directional_derivative(classifier) -> None:
    """The estimate for head (l, h) is -d/de metric(a + e (v - a)) at e = 0: checked against a finite difference
    of a hook that scales the head's output by (1 - e) (zero ablation's direction)."""
    vm = classifier
    imp = head_importance(vm, A, metric="logit", attribution=True)
    cls = imp.targets[0]
    base = vm.run(A).logits[cls].astype(np.float64)
    eps = 1e-2
    for layer, head in ((0, 0), (1, 3), (2, 1)):
        probe = vm.net.blocks[layer].attn.head_probe

        def shrink(_m, _i, out, head=head):
            out = out.clone()
            out[:, head] *= 1 - eps
            return out
        handle = probe.register_forward_hook(shrink)
        try:
            moved = vm.run(A).logits[cls].astype(np.float64)
        finally:
            handle.remove()
        slope = (base - moved) / eps
        assert imp.estimate[layer, head] == pytest.approx(slope, abs=2e-3 + 0.05 * abs(slope)), (layer, head)
    assert imp.correlation == pytest.approx(np.corrcoef(imp.drop.ravel(), imp.estimate.ravel())[0, 1])
    assert [m for m in vm.net.modules() if m._forward_hooks] == []
    assert all(p.requires_grad for p in vm.net.parameters())


def test_progress_and_cancel(classifier) -> None:
    seen: list[tuple[int, int]] = []
    head_importance(classifier, [A, B], batch_size=8, progress=lambda d, t: seen.append((d, t)))
    assert seen == [(8, 24), (12, 24), (20, 24), (24, 24)]
    calls = []

    def cancel() -> bool:
        calls.append(1)
        return len(calls) > 1

    with pytest.raises(ScanCancelled, match="after 8 of 12"):
        head_importance(classifier, A, batch_size=8, cancel=cancel)
    assert [m for m in classifier.net.modules() if m._forward_hooks] == []


@pytest.mark.parametrize("kwargs, words", [
    (dict(metric="entropy"), ["'entropy'", "probability, logit, cosine"]),
    (dict(mode="noise"), ["'noise'", "zero, mean, resample"]),
    (dict(mode="mean", reference=[B]), ["at least 2", "got 1"]),
    (dict(target=5), ["class 5", "5 classes (0-4)"]),
    (dict(batch_size=0), ["batch size 0"]),
])
def test_bad_input(classifier, kwargs, words) -> None:
    with pytest.raises(InterventionError) as err:
        head_importance(classifier, A, **kwargs)
    for w in words:
        assert w in str(err.value)


def test_embedding_model_bad_input(backbone) -> None:
    with pytest.raises(InterventionError, match="needs a classifier"):
        head_importance(backbone, A, metric="probability")
    with pytest.raises(InterventionError, match="gradient is zero at the clean run"):
        head_importance(backbone, A, attribution=True)


def test_show_draws_the_grid(classifier) -> None:
    """`vitviz.show(importance)`: the grid on the diverging colormap, red where the head helps, blue where it hurts;
    the attribution estimate adds a second panel."""
    from vitviz.core.drawing.importance import _cell, _panel

    imp = head_importance(classifier, A)
    picture = np.asarray(vitviz.show(imp))
    assert picture.ndim == 3 and picture.shape[2] == 3
    assert imp._repr_png_()[:4] == b"\x89PNG"
    from PIL import ImageFont

    cell = _cell(imp.drop.shape)
    bound = float(np.abs(imp.drop).max())
    panel = np.asarray(_panel(imp.drop, cell, bound, "rdbu", ImageFont.load_default(), "", set()))
    for layer, head in (np.unravel_index(np.argmax(imp.drop), imp.drop.shape),
                        np.unravel_index(np.argmin(imp.drop), imp.drop.shape)):
        r, _g, b = panel[34 + layer * cell + 2, 30 + head * cell + 2].astype(int)   # a corner, off the number
        assert (r > b) == (imp.drop[layer, head] > 0), (layer, head, imp.drop[layer, head])
    both = np.asarray(vitviz.show(head_importance(classifier, A, attribution=True)))
    assert both.shape[1] > picture.shape[1]


def test_grid_without_legend_and_its_cells(classifier) -> None:
    """The window's picture (`legend=False`): no title lines and no colorbar, so smaller in both directions; the
    legend's lines are `legend_lines`; `cell_rect` and `cell_at` agree on where each cell is drawn, with or without
    the legend, and a cell drawn is coloured as its value."""
    from vitviz.core.drawing.importance import cell_at, cell_rect, draw_importance, legend_lines

    imp = head_importance(classifier, A)
    full, bare = draw_importance(imp), draw_importance(imp, legend=False)
    assert bare.shape[0] < full.shape[0] and bare.shape[1] < full.shape[1]
    title, drops, label = legend_lines(imp)
    assert title == imp.title and drops.startswith("largest drops: L") and "drop" in label
    layers, heads = imp.drop.shape
    for legend, picture in ((True, full), (False, bare)):
        for layer in range(layers):
            for head in range(heads):
                x, y, size = cell_rect(imp, layer, head, legend=legend)
                assert cell_at(imp, x + 2, y + 2, legend=legend) == (layer, head)
                assert cell_at(imp, x + size - 2, y + size - 2, legend=legend) == (layer, head)
        layer, head = np.unravel_index(np.argmax(imp.drop), imp.drop.shape)
        x, y, _size = cell_rect(imp, int(layer), int(head), legend=legend)
        r, _g, b = picture[y + 2, x + 2].astype(int)
        assert (r > b) == (imp.drop[layer, head] > 0)
    assert cell_at(imp, 1, 1, legend=False) is None


def test_export_ablate_and_importance(tmp_path) -> None:
    """`vitviz export --ablate 1.0,2.1:mean --importance --attribution --npz` on the demo model: the maps are those
    of the ablated model, the .npz and the manifest say what was done, the grid is written as PNG + CSV + npz and
    equals the library's scan of the ablated model."""
    import csv
    import json

    from vitviz.cli import main
    from vitviz.core.files import read_npz
    from vitviz.demo import demo_checkpoint, demo_images

    images = [str(p) for p in demo_images()[:3]]
    out = tmp_path / "out"
    assert main(["export", "--model", str(demo_checkpoint()), *images, "--out", str(out), "--ablate", "1.0,2.1:mean",
                 "--importance", "--attribution", "--npz", "--no-verify", "-q"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    what = "ablate L1.H0+L2.H1 (mean over 3 images)"
    assert manifest["interventions"] == [what]
    assert manifest["importance"]["files"] == ["importance.png", "importance.csv", "importance.npz"]
    saved = read_npz(out / "shapes_1_cross.npz")
    assert saved["interventions"] == [what]
    model = vitviz.load(demo_checkpoint())
    ablation = Ablate([(1, 0), (2, 1)], "mean", reference=demo_images()[:3])
    np.testing.assert_allclose(saved["logits"], model.run(images[0], intervene=ablation).logits, atol=1e-5)
    assert np.abs(saved["logits"] - model.run(images[0]).logits).max() > 1e-3
    grid = read_npz(out / "importance.npz")
    with model.intervening(ablation):
        want = head_importance(model, images)
    np.testing.assert_allclose(grid["drop"], want.drop, atol=1e-6)
    assert [str(t) for t in grid["interventions"]] == [what] and "estimate" in grid
    rows = list(csv.DictReader((out / "importance.csv").open()))
    assert len(rows) == 12 and float(rows[5]["drop"]) == pytest.approx(want.drop[1, 1], abs=1e-6)
    assert rows[0].keys() == {"layer", "head", "drop", "estimate"}


@pytest.mark.parametrize("argv, words", [
    (["--ablate", "3.0"], ["layer 3", "3 layers (0-2)"]),
    (["--ablate", "0.4"], ["head 4", "(0-3)"]),
    (["--ablate", "0-1"], ["'0-1'", "LAYER.HEAD"]),
    (["--ablate", "0.1:noise"], ["'noise'", "zero, mean, resample"]),
    (["--ablate", "0.1:resample"], ["--reference IMAGE"]),
    (["--ablate", "0.1:mean"], ["at least 2", "got 1"]),
    (["--reference", "x.png"], ["--reference is for"]),
    (["--attribution"], ["--attribution is for --importance"]),
    (["--importance", "--importance-class", "hexagon"], ["'hexagon'", "5 classes"]),
])
def test_export_bad_options(tmp_path, capsys, argv, words) -> None:
    from vitviz.cli import main
    from vitviz.demo import demo_checkpoint, demo_images

    try:
        status = main(["export", "--model", str(demo_checkpoint()), str(demo_images()[0]), "--out", str(tmp_path),
                       "--no-verify", "-q", *argv])
    except SystemExit as e:   # argparse refuses a malformed option itself
        status = e.code
    err = capsys.readouterr().err
    assert status == 2, err
    for w in words:
        assert w in err
