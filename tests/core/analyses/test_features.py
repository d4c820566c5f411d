"""Token features (core.features): capture against timm's intermediate layers, feature PCA against a plain NumPy
SVD of the same recipe, patch similarity against a direct cosine, high-norm token diagnostics."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import vitviz
from parity_refs import perturb
from vitviz.core.analyses.features import (FeatureError, PatchSimilarity, attention_share, capture_features, feature_pca,
                                  high_norm_mask, norm_histogram, pca_colors, prefix_norms, token_norms, top_eigh)

timm = pytest.importorskip("timm")
from timm.models.vision_transformer import VisionTransformer  # noqa: E402

TINY = dict(img_size=32, patch_size=8, embed_dim=32, depth=3, num_heads=2, mlp_ratio=2.0, num_classes=5)


@pytest.fixture(scope="module")
def pair() -> tuple[VisionTransformer, object]:
    torch.manual_seed(0)
    model = perturb(VisionTransformer(**TINY, reg_tokens=2), std=0.2)
    return model, vitviz.load(model, device="cpu", mean=(0.5,) * 3, std=(0.5,) * 3)


def x_for(seed: int = 1, size: tuple[int, int] = (32, 32)) -> torch.Tensor:
    return torch.randn(1, 3, *size, generator=torch.Generator().manual_seed(seed))


# ------------------------------------------------------------------------------------------------- capture
def test_capture_matches_timm_intermediate_layers(pair) -> None:
    model, vm = pair
    x = x_for()
    feats = capture_features(vm, x)
    assert feats.layers == (0, 1, 2) and feats.raw.shape == (3, 3 + 16, 32) and feats.normed.shape == feats.raw.shape
    with torch.no_grad():
        normed = model.get_intermediate_layers(x, n=[0, 1, 2], return_prefix_tokens=True, norm=True)
        raw = model.get_intermediate_layers(x, n=[0, 1, 2], return_prefix_tokens=True, norm=False)
        logits = model(x)
    for i in range(3):
        np.testing.assert_allclose(feats.normed[i], torch.cat([normed[i][1], normed[i][0]], 1)[0].numpy(), atol=1e-5)
        np.testing.assert_allclose(feats.raw[i], torch.cat([raw[i][1], raw[i][0]], 1)[0].numpy(), atol=1e-5)
    np.testing.assert_allclose(feats.logits, logits[0].numpy(), atol=1e-5)
    np.testing.assert_array_equal(feats.patches(-1), feats.normed[2, 3:].reshape(4, 4, 32))
    np.testing.assert_array_equal(feats.patches(1, normed=False), feats.raw[1, 3:].reshape(4, 4, 32))


def test_capture_chosen_layers_and_errors(pair) -> None:
    _, vm = pair
    feats = capture_features(vm, x_for(size=(40, 24)), layers=[-1, 0], normed=False)
    assert feats.layers == (0, 2) and feats.grid == (5, 3) and feats.normed is None
    assert feats.patches(-1, normed=False).shape == (5, 3, 32)
    with pytest.raises(FeatureError, match=r"layer 1 was not captured; captured layers: \[0, 2\]"):
        feats.patches(1, normed=False)
    with pytest.raises(FeatureError, match="normed features were not captured"):
        feats.patches(0)
    with pytest.raises(FeatureError, match="layer 3 out of range for a model with 3 layers"):
        capture_features(vm, x_for(), layers=[3])
    before = vm.run(x_for())
    np.testing.assert_array_equal(vm.run(x_for()).attentions, before.attentions)  # hooks gone


# ------------------------------------------------------------------------------------------------------ PCA
def planted(seed: int, grid: tuple[int, int], d: int) -> np.ndarray:
    """(gh, gw, D) features: a background cluster on the border and a structured object in the middle."""
    rng = np.random.default_rng(seed)
    gh, gw = grid
    x = rng.standard_normal((gh, gw, d)) * 0.3
    obj = np.zeros((gh, gw), bool)
    obj[1:-1, 1:-1] = rng.random((gh - 2, gw - 2)) < 0.8
    x[obj, 0] += 4.0  # the object stands apart along one direction
    x[obj, 1:4] += rng.standard_normal((obj.sum(), 3)) * np.array([2.0, 1.5, 1.0])
    return x


def reference_pca(patches: list[np.ndarray], threshold: float = 0.0, whiten: bool = True) -> tuple[list, list]:
    """The recipe written with np.linalg.svd: first component (standardised, border side negative) > threshold is
    the foreground; 3 components on it (largest loading positive); sigmoid(2 x) of the (whitened) projections."""
    flat = np.concatenate([p.reshape(-1, p.shape[-1]) for p in patches]).astype(np.float64)
    xc = flat - flat.mean(axis=0)
    _, s, vt = np.linalg.svd(xc, full_matrices=False)
    z = xc @ vt[0] / (s[0] / np.sqrt(len(flat) - 1))
    border = np.concatenate([np.pad(np.zeros((p.shape[0] - 2, p.shape[1] - 2), bool), 1, constant_values=True).ravel()
                             for p in patches])
    if z[border].mean() > 0:
        z = -z
    fg = z > threshold
    f = flat[fg]
    mean = f.mean(axis=0)
    _, s, vt = np.linalg.svd(f - mean, full_matrices=False)
    vt = vt[:3] * np.sign(vt[:3][np.arange(3), np.abs(vt[:3]).argmax(axis=1)])[:, None]
    proj = (flat - mean) @ vt.T
    if whiten:
        proj /= s[:3] / np.sqrt(len(f) - 1)
    rgb = 1 / (1 + np.exp(-2 * proj))
    rgb[~fg] = 0
    colors, masks, start = [], [], 0
    for p in patches:
        n = p.shape[0] * p.shape[1]
        colors.append(rgb[start:start + n].reshape(*p.shape[:2], 3))
        masks.append(fg[start:start + n].reshape(p.shape[:2]))
        start += n
    return colors, masks


@pytest.mark.parametrize("d", [24, 100], ids=["covariance", "gram"])
@pytest.mark.parametrize("whiten", [True, False])
def test_pca_matches_plain_svd(d: int, whiten: bool) -> None:
    patches = [planted(0, (6, 6), d), planted(1, (5, 7), d)]
    ours = pca_colors(patches, whiten=whiten)
    ref_colors, ref_masks = reference_pca(patches, whiten=whiten)
    for c, m, rc, rm in zip(ours.colors, ours.foreground, ref_colors, ref_masks):
        np.testing.assert_array_equal(m, rm)
        np.testing.assert_allclose(c, rc, atol=1e-6)
        assert c.shape == (*m.shape, 3) and c.dtype == np.float32
    fg = ours.foreground[0]
    assert fg[1:-1, 1:-1].mean() > 0.6 and not fg[0].any() and not fg[-1].any()  # the object, not the border
    assert np.allclose(np.linalg.norm(ours.components, axis=1), 1)


def test_pca_of_a_large_grid_by_subspace_iteration() -> None:
    """Above 400 x 400 the top eigenvectors come from subspace iteration: the same colours as the full SVD."""
    patches = [planted(2, (21, 21), 420)]  # a 441 x 441 Gram matrix
    ours = pca_colors(patches)
    ref_colors, ref_masks = reference_pca(patches)
    np.testing.assert_array_equal(ours.foreground[0], ref_masks[0])
    np.testing.assert_allclose(ours.colors[0], ref_colors[0], atol=1e-6)


def test_top_eigh_iterates_or_falls_back() -> None:
    rng = np.random.default_rng(0)
    q = np.linalg.qr(rng.standard_normal((500, 500)))[0]
    for spectrum in (0.9 ** np.arange(500), np.ones(500) + rng.random(500) * 1e-3):  # decaying; flat (fallback)
        m = (q * spectrum) @ q.T
        vals, vecs = top_eigh(m, 3)
        ref_vals, ref_vecs = np.linalg.eigh(m)
        np.testing.assert_allclose(vals, ref_vals[::-1][:3], rtol=1e-9)
        if spectrum[0] == 1.0:  # distinct eigenvalues: the vectors are defined up to sign
            np.testing.assert_allclose(np.abs(vecs), np.abs(ref_vecs[:, ::-1][:, :3]), atol=1e-6)


def test_pca_joint_fit_colours_agree_and_single_image() -> None:
    a = planted(0, (6, 6), 24)
    joint = pca_colors([a, a.copy()])
    np.testing.assert_array_equal(joint.colors[0], joint.colors[1])
    single, doubled = pca_colors([a], whiten=False), pca_colors([a, a.copy()], whiten=False)
    np.testing.assert_allclose(single.colors[0], doubled.colors[0], atol=1e-6)  # the same patches, the same axes
    everything = pca_colors([a], foreground="all")
    assert everything.foreground[0].all() and (everything.colors[0] > 0).all()


def test_pca_errors() -> None:
    a = planted(0, (6, 6), 24)
    with pytest.raises(FeatureError, match="too few for a 3-component PCA"):
        pca_colors([a], threshold=50.0)
    with pytest.raises(FeatureError, match="do not match the grids"):
        pca_colors([a], foreground=[np.ones((5, 5), bool)])
    with pytest.raises(FeatureError, match="one D"):
        pca_colors([a, planted(1, (6, 6), 10)])


def test_feature_pca_on_captured_stacks(pair) -> None:
    _, vm = pair
    feats = [capture_features(vm, x_for(1)), capture_features(vm, x_for(2, (40, 32)))]
    result = feature_pca(feats, layer=-1, foreground="all")
    ref, _ = reference_pca([f.patches(-1) for f in feats], threshold=-np.inf)
    assert [c.shape for c in result.colors] == [(4, 4, 3), (5, 4, 3)]
    for c, r in zip(result.colors, ref):
        np.testing.assert_allclose(c, r, atol=1e-6)


# ------------------------------------------------------------------------------------------------ similarity
def test_similarity_matches_direct_cosine() -> None:
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((5, 6, 40)).astype(np.float32), rng.standard_normal((4, 7, 40)).astype(np.float32)
    sim = PatchSimilarity(a, b)

    def cos(u: np.ndarray, grid: np.ndarray) -> np.ndarray:
        g = grid.astype(np.float64)
        return (g @ u) / (np.linalg.norm(g, axis=-1) * np.linalg.norm(u))

    for r, c in [(0, 0), (2, 3), (4, 5)]:
        here, there = sim.maps(r, c)
        np.testing.assert_allclose(here, cos(a[r, c].astype(np.float64), a), atol=1e-6)
        np.testing.assert_allclose(there, cos(a[r, c].astype(np.float64), b), atol=1e-6)
        assert here[r, c] == pytest.approx(1.0, abs=1e-6)
    here, there = sim.maps(3, 6, image="b")
    np.testing.assert_allclose(here, cos(b[3, 6].astype(np.float64), a), atol=1e-6)
    np.testing.assert_allclose(there, cos(b[3, 6].astype(np.float64), b), atol=1e-6)
    with pytest.raises(FeatureError, match=r"patch \(5, 0\) is off the 5x6 grid"):
        sim.maps(5, 0)
    alone = PatchSimilarity(a)
    assert alone.maps(1, 1)[1] is None
    with pytest.raises(FeatureError, match="second image"):
        alone.maps(0, 0, image="b")


def test_similarity_from_captured_stacks(pair) -> None:
    _, vm = pair
    fa, fb = capture_features(vm, x_for(1)), capture_features(vm, x_for(2, (24, 40)))
    sim = PatchSimilarity.from_stacks(fa, fb, layer=1, normed=False)
    here, there = sim.maps(2, 1)
    q = fa.patches(1, normed=False)[2, 1].astype(np.float64)
    ref = fb.patches(1, normed=False).astype(np.float64)
    np.testing.assert_allclose(there, ref @ q / (np.linalg.norm(ref, axis=-1) * np.linalg.norm(q)), atol=1e-6)
    assert here.shape == (4, 4) and there.shape == (3, 5)


# ------------------------------------------------------------------------------------------ high-norm tokens
def test_token_norms_histogram_and_mask(pair) -> None:
    _, vm = pair
    feats = capture_features(vm, x_for(), normed=False)
    norms = token_norms(feats)
    assert norms.shape == (3, 4, 4)
    np.testing.assert_allclose(norms, np.linalg.norm(feats.raw[:, 3:], axis=-1).reshape(3, 4, 4), rtol=1e-6)
    np.testing.assert_allclose(prefix_norms(feats), np.linalg.norm(feats.raw[:, :3], axis=-1), rtol=1e-6)
    counts, edges = norm_histogram(norms, bins=10)
    assert counts.shape == (3, 10) and edges.shape == (11,) and (counts.sum(axis=1) == 16).all()
    assert edges[0] == pytest.approx(norms.min()) and edges[-1] == pytest.approx(norms.max())
    threshold = float(np.median(norms))
    mask = high_norm_mask(norms, threshold)
    assert mask.shape == norms.shape and mask.sum() == (norms > threshold).sum() > 0


def test_attention_share(pair) -> None:
    _, vm = pair
    result = vm.run(x_for())
    attn = result.attentions  # (3, 2, 19, 19), 3 prefix tokens
    mask = np.zeros((4, 4), bool)
    mask[1, 2] = mask[3, 0] = True
    keys = [3 + 1 * 4 + 2, 3 + 3 * 4 + 0]
    np.testing.assert_allclose(attention_share(result, mask), attn[:, :, :, keys].sum(-1).mean(-1), atol=1e-6)
    np.testing.assert_allclose(attention_share(result, mask, query="cls"), attn[:, :, 0, keys].sum(-1), atol=1e-6)
    np.testing.assert_allclose(attention_share(attn, mask, num_prefix=3, query="patches"),
                               attn[:, :, 3:, keys].sum(-1).mean(-1), atol=1e-6)
    every = attention_share(result, np.ones((4, 4), bool))
    np.testing.assert_allclose(every, 1 - attn[:, :, :, :3].sum(-1).mean(-1), atol=1e-5)
    per_layer = np.zeros((3, 4, 4), bool)
    per_layer[1, 1, 2] = True
    share = attention_share(result, per_layer)
    assert share[0].sum() == 0 and share[2].sum() == 0
    np.testing.assert_allclose(share[1], attn[1, :, :, keys[0]].mean(-1), atol=1e-6)
    with pytest.raises(FeatureError, match=r"mask of shape \(2, 4, 4\); expected \(gh, gw\) or \(3, gh, gw\)"):
        attention_share(result, np.zeros((2, 4, 4), bool))
    with pytest.raises(FeatureError, match="mask of 9 patches; the attention has 16 patch tokens"):
        attention_share(result, np.zeros((3, 3), bool))
