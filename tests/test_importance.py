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
