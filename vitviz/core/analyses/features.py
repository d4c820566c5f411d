"""Token features: each layer's output tokens captured on request, DINOv2/DINOv3-style feature PCA, patch feature
similarity within and across images, and high-norm ("artifact") token diagnostics.

    from vitviz.core.analyses.features import capture_features, feature_pca, PatchSimilarity, token_norms
    feats = capture_features(model, "cat.jpg")             # FeatureStack: (L, T, D) raw and normed
    pca = feature_pca([feats, other])                      # one fit for both images, so colours agree
    sim = PatchSimilarity(feats, other, layer=-1)          # unit features made once
    here, there = sim.maps(3, 5)                           # (gh, gw) and (gh', gw') cosine similarity
    norms = token_norms(feats)                             # (L, gh, gw) output-token norms

Features are the blocks' outputs (the residual stream, (T, D) per layer), read by forward hooks on the blocks in a
pass of their own, so the plain attention capture stays as it is. `normed` applies the model's final norm to every
layer (`norm`, then `norm_extra` when present), as DINOv2's `get_intermediate_layers(..., norm=True)` does; norms
for the high-norm diagnostics are those of the raw tokens, as in Darcet et al. 2024 (registers).

Token order is the reference ViT's: `num_prefix` prefix tokens, then the patches row-major on `spec.grid`.

Feature PCA (the DINOv2/DINOv3 recipe; `pca_colors` on plain arrays, `feature_pca` on captured stacks):
1. foreground: a 1-component PCA over every patch of every image; its projection, divided by its standard
   deviation, is oriented so that the patches on the grid border lie on the negative side on average (backgrounds
   touch the image border, objects mostly do not), and the foreground is where it exceeds `threshold` (default 0,
   the mean). Or `foreground='all'`, or one boolean (gh, gw) mask per image.
2. a 3-component PCA fitted on the foreground patches of all images together; each component's sign makes its
   largest-magnitude loading positive (as scikit-learn's `svd_flip` on the components).
3. colours: sigmoid(2 x) of the projections, whitened (divided by each component's standard deviation over the
   fitted patches, ddof=1, as `PCA(whiten=True)`) unless `whiten=False`; background patches are black (0) and
   flagged in `foreground`.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Union

import numpy as np
import torch

from vitviz.core.running.capture import VitModel
from vitviz.core.protocol import FEATURES, capabilities_of
from vitviz.core.spec import AttentionResult, ModelSpec
from vitviz.errors import VitvizError

Foreground = Union[Literal["auto", "all"], Sequence[np.ndarray]]


class FeatureError(VitvizError, ValueError):
    """Features were asked for something they cannot give (a layer not captured, a patch off the grid, too few
    foreground patches for the PCA, mismatched shapes)."""


@dataclass(frozen=True, eq=False)
class FeatureStack:
    """Per-layer token features of one image.

    Attributes:
        raw: (L', T, D) float32, the captured blocks' output tokens.
        normed: (L', T, D) float32, the same after the model's final norm; None when not asked for.
        layers: the block index (0-based) of each entry.
        spec: the model spec at this run's resolution (grid, prefix tokens).
        logits: (C,) float32, the model's output for the image.
        image: (H, W, 3) uint8, the image as the model saw it.
        source: the path or a description of the image.
    """

    raw: np.ndarray
    normed: np.ndarray | None
    layers: tuple[int, ...]
    spec: ModelSpec
    logits: np.ndarray
    image: np.ndarray
    source: str = ""

    @property
    def grid(self) -> tuple[int, int]:
        return self.spec.grid

    def entry(self, layer: int) -> int:
        """The position in `layers` of block `layer` (negative counts from the model's last block)."""
        depth = self.spec.depth
        block = layer + depth if layer < 0 else layer
        if block not in self.layers:
            raise FeatureError(f"layer {layer} was not captured; captured layers: {list(self.layers)}")
        return self.layers.index(block)

    def tokens(self, layer: int = -1, normed: bool = True) -> np.ndarray:
        """(T, D) features of every token at block `layer`."""
        if normed and self.normed is None:
            raise FeatureError("normed features were not captured; capture with normed=True or ask for normed=False")
        return (self.normed if normed else self.raw)[self.entry(layer)]

    def patches(self, layer: int = -1, normed: bool = True) -> np.ndarray:
        """(gh, gw, D) features of the patch tokens at block `layer`."""
        t = self.tokens(layer, normed)
        gh, gw = self.grid
        return t[self.spec.num_prefix:].reshape(gh, gw, -1)  # (N, D) -> (gh, gw, D)


def capture_features(model: VitModel, image: Any, layers: Sequence[int] | None = None, *, normed: bool = True,
                     image_size: tuple[int, int] | None = None) -> FeatureStack:
    """Run one image and keep the output tokens of the chosen blocks (a forward pass of its own, no gradients).

    Args:
        model: a loaded `VitModel` with vitviz's reference ViT.
        image: a path, PIL image, (H, W[, C]) array or a ready (1, C, H, W) tensor, as for `VitModel.run`.
        layers: block indices (negative counts from the end); None: every block.
        normed: also keep each layer's tokens after the model's final norm.
        image_size: run at another (h, w), as `VitModel.run`.
    """
    if FEATURES not in capabilities_of(model):
        raise FeatureError(f"feature capture needs vitviz's reference ViT; this model runs as "
                           f"{type(getattr(model, 'net', model)).__name__}")
    net = model.net
    depth = len(net.blocks)
    wanted = range(depth) if layers is None else layers
    blocks = []
    for layer in wanted:
        block = int(layer) + depth if int(layer) < 0 else int(layer)
        if not 0 <= block < depth:
            raise FeatureError(f"layer {layer} out of range for a model with {depth} layers")
        blocks.append(block)
    blocks = sorted(set(blocks))
    x, disp, spec, src, _seen = model.prepare(image, image_size)
    kept: dict[int, torch.Tensor] = {}

    def keep(index: int):  # noqa: ANN202 - a forward hook
        def hook(_m: torch.nn.Module, _inp: Any, out: torch.Tensor) -> None:
            kept[index] = out[0]
        return hook

    with model._lock, torch.inference_mode():  # hooks on the shared net: one pass at a time, as forward_captured
        handles = [net.blocks[i].register_forward_hook(keep(i)) for i in blocks]
        try:
            out = net(x.to(next(net.parameters()).device))
        finally:
            for h in handles:
                h.remove()
        raw = torch.stack([kept[i] for i in blocks])  # (L', T, D)
        norm = net.norm_extra(net.norm(raw)) if normed else None
        raw_np = raw.float().cpu().numpy()
        norm_np = None if norm is None else norm.float().cpu().numpy()
    return FeatureStack(raw=raw_np, normed=norm_np, layers=tuple(blocks), spec=spec,
                        logits=out[0].float().cpu().numpy(), image=disp, source=src)


# ----------------------------------------------------------------------------------------------------------- PCA
@dataclass(frozen=True, eq=False)
class PcaResult:
    """Feature PCA colours of one or more images fitted together.

    Attributes:
        colors: per image, (gh, gw, 3) float32 in [0, 1]; background patches are 0.
        foreground: per image, (gh, gw) bool, the patches the PCA was fitted on and coloured.
        projections: per image, (gh, gw, 3) float32, each patch on the components (whitened when asked), also for
            background patches.
        components: (3, D) float64 unit principal axes (rows), largest variance first.
        mean: (D,) float64, the mean of the fitted patches.
        scale: (3,) float64, each component's standard deviation over the fitted patches (ddof=1).
        whiten: whether projections are divided by `scale`.
    """

    colors: list[np.ndarray]
    foreground: list[np.ndarray]
    projections: list[np.ndarray]
    components: np.ndarray
    mean: np.ndarray
    scale: np.ndarray
    whiten: bool


_DIRECT_EIGH = 400  # symmetric matrices up to this size get a full eigh; larger ones subspace iteration


def top_eigh(m: np.ndarray, k: int, tol: float = 1e-10, max_iter: int = 300) -> tuple[np.ndarray, np.ndarray]:
    """The k largest eigenpairs of a symmetric positive semi-definite (s, s) matrix, largest first.

    Up to `_DIRECT_EIGH` a full `np.linalg.eigh`; above, subspace iteration on a block of k + 8 vectors with a
    Rayleigh-Ritz step each round (one s x s x b product per round), until every residual ||m v - θ v|| is at most
    tol · θ_1 -- falling back to the full eigh when the residual stalls (less than 10x smaller in 20 rounds: a
    flat spectrum, as of random features) or after `max_iter` rounds.

    Returns:
        values (k,) and vectors (s, k) as columns, float64.
    """
    s = m.shape[0]
    if s > _DIRECT_EIGH:
        b = min(s, k + 8)
        v = np.linalg.qr(np.random.default_rng(0).standard_normal((s, b)))[0]  # (s, b) orthonormal start
        mv = m @ v
        checkpoint = np.inf
        for i in range(max_iter):
            theta, y = np.linalg.eigh(v.T @ mv)  # Rayleigh-Ritz on the (b, b) projection
            theta, y = theta[::-1], y[:, ::-1]
            v, mv = v @ y, mv @ y
            residual = np.linalg.norm(mv[:, :k] - v[:, :k] * theta[:k], axis=0).max() / max(theta[0], 1e-300)
            if residual <= tol:
                return theta[:k], v[:, :k]
            if i % 20 == 19:  # stalled (less than 10x better in 20 rounds): the full eigh is faster
                if residual > 0.1 * checkpoint:
                    break
                checkpoint = residual
            v = np.linalg.qr(mv)[0]
            mv = m @ v
    vals, vecs = np.linalg.eigh(m)
    return vals[::-1][:k], vecs[:, ::-1][:, :k]


def principal_axes(x: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The top-k principal axes of the rows of x (n, D), from the top eigenvectors (`top_eigh`) of the smaller of
    the Gram (n, n) and scatter (D, D) matrices, in float64.

    Returns:
        mean (D,), axes (k, D) unit rows (sign: largest-magnitude entry positive), and the standard deviation of the
        data along each axis (k,) (ddof=1).
    """
    x = np.asarray(x, dtype=np.float64)
    n, d = x.shape
    if n < 2 or k > min(n - 1, d):
        raise FeatureError(f"a {k}-component PCA needs at least {k + 1} samples of at least {k} dimensions; "
                           f"found {n} of {d}")
    mean = x.mean(axis=0)
    xc = x - mean
    if n <= d:
        vals, u = top_eigh(xc @ xc.T, k)  # (n, n) Gram: xc = U S V^T, Gram = U S^2 U^T
        axes = (xc.T @ u / np.sqrt(np.maximum(vals, np.finfo(np.float64).tiny))).T  # V = xc^T U / S -> (k, D)
    else:
        vals, vecs = top_eigh(xc.T @ xc, k)  # (D, D) scatter matrix
        axes = vecs.T  # (k, D)
    axes /= np.linalg.norm(axes, axis=1, keepdims=True)
    flip = np.sign(axes[np.arange(k), np.abs(axes).argmax(axis=1)])
    axes *= flip[:, None]
    return mean, axes, np.sqrt(np.maximum(vals, 0.0) / (n - 1))


def _border(grid: tuple[int, int]) -> np.ndarray:
    """(gh, gw) bool: the outermost ring of patches."""
    b = np.zeros(grid, dtype=bool)
    b[0, :] = b[-1, :] = b[:, 0] = b[:, -1] = True
    return b


def foreground_masks(patches: Sequence[np.ndarray], threshold: float = 0.0) -> list[np.ndarray]:
    """The first-component foreground of each image (step 1 of the module docstring): per image (gh, gw) bool.

    Args:
        patches: per image, (gh, gw, D) patch features.
        threshold: in standard deviations of the first component, on the side away from the border.
    """
    flat = np.concatenate([p.reshape(-1, p.shape[-1]) for p in patches])  # (sum N, D)
    mean, axis, std = principal_axes(flat, 1)
    z = (flat - mean) @ axis[0] / max(float(std[0]), np.finfo(np.float64).tiny)  # (sum N,) standardised
    border = np.concatenate([_border(p.shape[:2]).ravel() for p in patches])
    if z[border].mean() > 0:  # orient: the border (background) on the negative side
        z = -z
    masks, start = [], 0
    for p in patches:
        n = p.shape[0] * p.shape[1]
        masks.append((z[start:start + n] > threshold).reshape(p.shape[:2]))  # (N,) -> (gh, gw)
        start += n
    return masks


def pca_colors(patches: Sequence[np.ndarray], foreground: Foreground = "auto", threshold: float = 0.0,
               whiten: bool = True, n_components: int = 3) -> PcaResult:
    """Feature PCA of patch features, one fit over all images (the module docstring's recipe).

    Args:
        patches: per image, (gh, gw, D) patch features (grids may differ; D must agree).
        foreground: 'auto' (first-component threshold), 'all', or per image a (gh, gw) bool mask.
        threshold: the 'auto' foreground threshold, in standard deviations of the first component.
        whiten: divide each projection by its standard deviation before the colours (DINOv3's `whiten=True`).
        n_components: components (3 for RGB).

    Raises:
        FeatureError: no images, mismatched feature sizes or masks, or fewer foreground patches than the fit needs.
    """
    patches = [np.asarray(p) for p in patches]
    if not patches:
        raise FeatureError("feature PCA needs at least one image")
    if any(p.ndim != 3 for p in patches) or len({p.shape[-1] for p in patches}) != 1:
        raise FeatureError(f"expected (gh, gw, D) features with one D; found shapes {[p.shape for p in patches]}")
    if isinstance(foreground, str):
        if foreground == "auto":
            masks = foreground_masks(patches, threshold)
        elif foreground == "all":
            masks = [np.ones(p.shape[:2], dtype=bool) for p in patches]
        else:
            raise FeatureError(f"foreground={foreground!r}; expected 'auto', 'all' or one (gh, gw) mask per image")
    else:
        masks = [np.asarray(m, dtype=bool) for m in foreground]
        if len(masks) != len(patches) or any(m.shape != p.shape[:2] for m, p in zip(masks, patches)):
            raise FeatureError(f"foreground masks {[m.shape for m in masks]} do not match the grids "
                               f"{[p.shape[:2] for p in patches]}")
    fg = np.concatenate([p[m] for p, m in zip(patches, masks)])  # (n_fg, D)
    if fg.shape[0] <= n_components:
        raise FeatureError(f"only {fg.shape[0]} foreground patches, too few for a {n_components}-component PCA; "
                           "lower the threshold or use foreground='all'")
    mean, axes, scale = principal_axes(fg, n_components)
    colors, projections = [], []
    for p, m in zip(patches, masks):
        proj = (p.reshape(-1, p.shape[-1]) - mean) @ axes.T  # (N, D) -> (N, k)
        if whiten:
            proj = proj / np.maximum(scale, np.finfo(np.float64).tiny)
        proj = proj.reshape(*p.shape[:2], n_components)  # (N, k) -> (gh, gw, k)
        rgb = 1.0 / (1.0 + np.exp(-2.0 * proj))
        rgb[~m] = 0.0
        colors.append(rgb.astype(np.float32))
        projections.append(proj.astype(np.float32))
    return PcaResult(colors=colors, foreground=masks, projections=projections, components=axes, mean=mean,
                     scale=scale, whiten=whiten)


def feature_pca(features: FeatureStack | Sequence[FeatureStack], layer: int = -1, *, normed: bool = True,
                foreground: Foreground = "auto", threshold: float = 0.0, whiten: bool = True) -> PcaResult:
    """DINOv2/DINOv3-style PCA colours of one image, or of several fitted together so their colours agree.

    Args:
        features: one `FeatureStack` or several (each image's own grid).
        layer: the block whose features are used (default the last).
        normed: use the features after the model's final norm (the recipe) or the raw ones.
        foreground, threshold, whiten: as `pca_colors`.
    """
    stacks = [features] if isinstance(features, FeatureStack) else list(features)
    return pca_colors([s.patches(layer, normed) for s in stacks], foreground, threshold, whiten)


# ---------------------------------------------------------------------------------------------------- similarity
def unit_rows(x: np.ndarray) -> np.ndarray:
    """(n, D) rows scaled to unit length, float32 C-contiguous (all-zero rows stay zero)."""
    x = np.asarray(x, dtype=np.float32)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return np.ascontiguousarray(x / np.maximum(norms, np.finfo(np.float32).tiny))


class PatchSimilarity:
    """Cosine similarity of one patch's features to every patch of its image and of a second image.

    The unit-length features of both images are made once, so each query is two matrix-vector products (fast
    enough to follow the mouse).

    Args:
        a, b: (gh, gw, D) patch features of the first and (optional) second image; `from_stacks` takes
            `FeatureStack`s.
    """

    def __init__(self, a: np.ndarray, b: np.ndarray | None = None) -> None:
        a = np.asarray(a)
        if a.ndim != 3 or (b is not None and (np.ndim(b) != 3 or np.shape(b)[-1] != a.shape[-1])):
            raise FeatureError(f"expected (gh, gw, D) features with one D; found {a.shape} and "
                               f"{None if b is None else np.shape(b)}")
        self.grid_a: tuple[int, int] = (a.shape[0], a.shape[1])
        self.unit_a = unit_rows(a.reshape(-1, a.shape[-1]))  # (gh, gw, D) -> (N, D)
        self.grid_b: tuple[int, int] | None = None if b is None else (int(np.shape(b)[0]), int(np.shape(b)[1]))
        self.unit_b = None if b is None else unit_rows(np.asarray(b).reshape(-1, np.shape(b)[-1]))

    @classmethod
    def from_stacks(cls, a: FeatureStack, b: FeatureStack | None = None, layer: int = -1,
                    normed: bool = True) -> "PatchSimilarity":
        """From captured features at block `layer` (normed: after the model's final norm)."""
        return cls(a.patches(layer, normed), None if b is None else b.patches(layer, normed))

    def maps(self, row: int, col: int, image: Literal["a", "b"] = "a") -> tuple[np.ndarray, np.ndarray | None]:
        """The similarity of patch (row, col) of image `image` to every patch of image a and of image b.

        Returns:
            (gh_a, gw_a) and (gh_b, gw_b) float32 cosine similarities (None without a second image).
        """
        if image not in ("a", "b") or (image == "b" and self.unit_b is None):
            raise FeatureError(f"image={image!r}; expected 'a' or, with a second image, 'b'")
        unit, grid = (self.unit_a, self.grid_a) if image == "a" else (self.unit_b, self.grid_b)
        assert unit is not None and grid is not None
        if not (0 <= row < grid[0] and 0 <= col < grid[1]):
            raise FeatureError(f"patch ({row}, {col}) is off the {grid[0]}x{grid[1]} grid")
        q = unit[row * grid[1] + col]  # (D,)
        here = (self.unit_a @ q).reshape(self.grid_a)  # (N_a,) -> (gh_a, gw_a)
        there = None if self.unit_b is None else (self.unit_b @ q).reshape(self.grid_b)
        return here, there


# ---------------------------------------------------------------------------------------------- high-norm tokens
def token_norms(features: FeatureStack) -> np.ndarray:
    """(L', gh, gw) float32: the L2 norm of every patch's raw output token at each captured layer."""
    gh, gw = features.grid
    norms = np.linalg.norm(features.raw[:, features.spec.num_prefix:], axis=-1)  # (L', N)
    return norms.reshape(len(features.layers), gh, gw).astype(np.float32)  # (L', N) -> (L', gh, gw)


def prefix_norms(features: FeatureStack) -> np.ndarray:
    """(L', P) float32: the L2 norm of each prefix token's raw output (CLS, dist, registers) at each layer."""
    return np.linalg.norm(features.raw[:, : features.spec.num_prefix], axis=-1).astype(np.float32)


def norm_histogram(norms: np.ndarray, bins: int = 50,
                   value_range: tuple[float, float] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per-layer histograms of token norms on shared bins (the registers paper's diagnostic).

    Args:
        norms: (L, ...) norms, e.g. `token_norms` (L, gh, gw).
        value_range: (low, high) of the bins; default the range over all layers.

    Returns:
        counts (L, bins) int64 and edges (bins + 1,) float64.
    """
    norms = np.asarray(norms, dtype=np.float64)
    if norms.ndim < 1 or norms.size == 0:
        raise FeatureError(f"expected (L, ...) norms; found shape {norms.shape}")
    flat = norms.reshape(norms.shape[0], -1)  # (L, ...) -> (L, n)
    lo, hi = value_range if value_range is not None else (float(flat.min()), float(flat.max()))
    edges = np.histogram_bin_edges(flat, bins=bins, range=(lo, hi if hi > lo else lo + 1.0))
    counts = np.stack([np.histogram(row, bins=edges)[0] for row in flat])
    return counts, edges


def high_norm_mask(norms: np.ndarray, threshold: float) -> np.ndarray:
    """Boolean mask of the tokens whose norm exceeds `threshold`, the shape of `norms` (e.g. (L, gh, gw))."""
    return np.asarray(norms) > threshold


def attention_share(attn: AttentionResult | np.ndarray, mask: np.ndarray, num_prefix: int | None = None,
                    query: Literal["all", "patches", "cls"] = "all") -> np.ndarray:
    """The share of attention the masked patches receive, per layer and head.

    Args:
        attn: an `AttentionResult`, or (L, H, T, T) attention with `num_prefix` given.
        mask: (gh, gw) bool patches for every layer, or (L, gh, gw) with mask[l] the keys of layer l (the tokens
            as they enter block l, i.e. block l-1's output).
        query: average over every query row ('all'), the patch rows ('patches') or the CLS row ('cls').

    Returns:
        (L, H) float32: per layer and head, the mean over the queries of the attention summed over the masked keys.
    """
    if isinstance(attn, AttentionResult):
        num_prefix = attn.spec.num_prefix if num_prefix is None else num_prefix
        has_cls = attn.spec.cls_token
        attn = attn.attentions
    else:
        has_cls = bool(num_prefix)
    if num_prefix is None:
        raise FeatureError("num_prefix is required with a raw (L, H, T, T) array")
    a = np.asarray(attn)
    if a.ndim != 4 or a.shape[2] != a.shape[3]:
        raise FeatureError(f"expected attention of shape (L, H, T, T); found {a.shape}")
    depth, t = a.shape[0], a.shape[-1]
    m = np.asarray(mask, dtype=bool)
    if m.ndim == 2:
        m = np.broadcast_to(m.reshape(1, -1), (depth, m.size))  # (gh, gw) -> (L, N)
    elif m.ndim == 3 and m.shape[0] == depth:
        m = m.reshape(depth, -1)  # (L, gh, gw) -> (L, N)
    else:
        raise FeatureError(f"mask of shape {m.shape}; expected (gh, gw) or ({depth}, gh, gw)")
    if m.shape[1] != t - num_prefix:
        raise FeatureError(f"mask of {m.shape[1]} patches; the attention has {t - num_prefix} patch tokens")
    if query == "all":
        rows = slice(None)
    elif query == "patches":
        rows = slice(num_prefix, None)
    elif query == "cls":
        if not has_cls:
            raise FeatureError("query='cls' needs a model with a CLS token")
        rows = slice(0, 1)
    else:
        raise FeatureError(f"query={query!r}; expected 'all', 'patches' or 'cls'")
    out = np.zeros(a.shape[:2], dtype=np.float64)
    for layer in range(depth):
        keys = np.flatnonzero(m[layer]) + num_prefix
        if keys.size:
            out[layer] = a[layer][:, rows][..., keys].sum(axis=-1, dtype=np.float64).mean(axis=-1)  # (H, q, k) -> (H,)
    return out.astype(np.float32)
