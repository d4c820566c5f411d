"""Two models on the same images: their maps side by side and A − B, layers and heads matched, per-layer summaries.

    from vitviz.core.analyses.compare import compare
    cmp = compare(model_a, model_b, ["cat.jpg", "dog.jpg"])      # `vitviz.compare` is this function
    cmp.images[0].a, cmp.images[0].b, cmp.images[0].diff          # MapStacks on A's grid; diff = a - b exactly
    cmp.relative_depth, cmp.jsd, cmp.cka                          # (La,) each: the per-layer figures
    cmp.heads[-1].pairs                                           # ((a_head, b_head, similarity), ...)

The mapping between the two models is explicit, and said in `Comparison.notes`:

- **layers** by relative depth: A's layer i (of La) is compared with B's layer round(i·(Lb − 1)/(La − 1)), so the
  first and the last layers meet; equal depths pair layer i with layer i. `relative_depth` is i / (La − 1).
- **patches** by place in the image, the rule the window uses for a query when the grid changes
  (`vitviz.core.analyses.tokens.patch_at`): A's patch (r, c) takes B's
  patch under its centre ((r + ½)/gh, (c + ½)/gw). When B's grid differs, its sampled values are multiplied by
  N_B / N_A (its patch count over A's), so a map spread evenly over the image has the same value on both sides;
  with equal grids nothing is resampled or scaled. The two models see the image through their own preprocessing
  (resize, crop); places are places in what each model saw.
- **heads** by an assignment on attention similarity ('match', the default) or by index ('index'). The similarity
  of A head i and B head j in a layer pair is the cosine similarity of their maps (CLS attention, on A's grid),
  averaged over the images; the assignment maximises the summed similarity of the pairs with the Hungarian
  algorithm (`assign`, exact for any size, shortest augmenting paths, O(n³); tested against brute force). With
  other head counts, min(Ha, Hb) pairs are made and A's other heads have no partner (NaN columns in `b` and
  `diff`). By index pairs head i with head i.

Per layer, over all the images: `jsd` is the mean Jensen–Shannon divergence (bits, 0..1) between A's and B's
head-mean CLS attention over the patches (each renormalised to sum 1 on A's grid), `jsd_heads` the same per matched
head pair; `cka` the linear centred kernel alignment (Kornblith et al. 2019) of the two models' patch-token features
at the paired blocks (`vitviz.core.analyses.features.capture_features`, raw block outputs; B's patches taken by place as
above), every image's patches pooled as the samples. CKA of a model with itself is 1.
"""
from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from vitviz.core.analyses.maps import MapKind, MapStack, ResultMaps, map_stack
from vitviz.core.analyses.tokens import patch_at
from vitviz.core.protocol import ATTENTION, capabilities_of
from vitviz.errors import VitvizError

HeadMode = Literal["match", "index"]
JSD_EPS = 1e-12
MAX_QUERY_KINDS = 8     # query token maps a CompareView keeps (each: A, B, aligned B and A - B stacks per image)


class CompareError(VitvizError, ValueError):
    """Two models or maps that cannot be compared as asked (a map kind without per-layer maps, no images)."""


# ----------------------------------------------------------------------------------------------------- mapping
def match_layers(depth_a: int, depth_b: int) -> np.ndarray:
    """(La,) int: the layer of B compared with each layer of A, by relative depth (first and last meet)."""
    if depth_a < 1 or depth_b < 1:
        raise CompareError(f"depths must be positive, found {depth_a} and {depth_b}")
    if depth_a == 1:
        return np.array([depth_b - 1])
    i = np.arange(depth_a, dtype=np.float64)
    return np.floor(i * (depth_b - 1) / (depth_a - 1) + 0.5).astype(np.int64)


def relative_depth(depth: int) -> np.ndarray:
    """(L,) float64: each layer's depth as a fraction, 0 for the first and 1 for the last."""
    return np.arange(depth) / max(1, depth - 1) if depth > 1 else np.ones(1)


def place_index(grid_from: tuple[int, int], grid_to: tuple[int, int]) -> np.ndarray:
    """(N_to,) int: for every patch of `grid_to` (row-major), the patch of `grid_from` under its centre."""
    gh, gw = grid_to
    return np.array([patch_at(((r + 0.5) / gh, (c + 0.5) / gw), grid_from) for r in range(gh) for c in range(gw)],
                    dtype=np.int64)


def to_grid(maps: np.ndarray, grid_from: tuple[int, int], grid_to: tuple[int, int], mass: bool = True) -> np.ndarray:
    """(..., gh, gw) maps on `grid_from` taken by place onto `grid_to`: (..., gh', gw'); unchanged for equal grids.

    With `mass` the values are scaled by N_from / N_to (attention mass per patch keeps its density)."""
    grid_from, grid_to = tuple(grid_from), tuple(grid_to)
    if grid_from == grid_to:
        return maps
    flat = maps.reshape(*maps.shape[:-2], -1)[..., place_index(grid_from, grid_to)]   # (..., N_to)
    if mass:
        flat = flat * ((grid_from[0] * grid_from[1]) / (grid_to[0] * grid_to[1]))
    return flat.reshape(*maps.shape[:-2], *grid_to).astype(maps.dtype, copy=False)


# --------------------------------------------------------------------------------------------------- assignment
def assign(score: np.ndarray) -> list[tuple[int, int]]:
    """The pairs (i, j), one per row or column of the smaller side, maximising the summed `score[i, j]`.

    SciPy's `linear_sum_assignment` (compiled, milliseconds for 768 heads) when SciPy is installed -- it is not a
    dependency of vitviz, so without it `assign_numpy` (the same algorithm with its inner loop in NumPy) solves it.

    Returns:
        pairs sorted by row.
    """
    s = np.asarray(score, dtype=np.float64)
    if s.ndim != 2 or not np.isfinite(s).all():
        raise CompareError(f"expected a finite 2-D score matrix, found shape {s.shape}")
    try:
        from scipy.optimize import linear_sum_assignment
    except ImportError:
        return assign_numpy(s)
    rows, cols = linear_sum_assignment(s, maximize=True)
    return sorted((int(i), int(j)) for i, j in zip(rows, cols))


def assign_numpy(score: np.ndarray) -> list[tuple[int, int]]:
    """`assign` without SciPy: the Hungarian algorithm in its shortest-augmenting-path form (Kuhn–Munkres with
    potentials, as in Jonker and Volgenant), exact for any (n, m) matrix in O(min·max²), each step over the columns
    one NumPy operation (768 × 768 heads: about a second). Rows and columns are swapped when there are more rows."""
    s = np.asarray(score, dtype=np.float64)
    if s.shape[0] > s.shape[1]:
        return sorted((i, j) for j, i in assign_numpy(s.T))
    n, m = s.shape
    if n == 0:
        return []
    cost = s.max() - s                                  # minimise cost == maximise score
    u, v = np.zeros(n + 1), np.zeros(m + 1)             # potentials; index 0 is the virtual start
    owner = np.zeros(m + 1, dtype=np.int64)             # owner[j]: the row (1-based) holding column j, 0: free
    way = np.zeros(m + 1, dtype=np.int64)
    for i in range(1, n + 1):
        owner[0] = i
        j0 = 0
        minv = np.full(m + 1, np.inf)
        used = np.zeros(m + 1, dtype=bool)
        while True:                                     # grow the alternating tree until a free column is reached
            used[j0] = True
            i0 = owner[j0]
            cur = np.full(m + 1, np.inf)
            cur[1:] = cost[i0 - 1] - u[i0] - v[1:]
            better = ~used & (cur < minv)
            minv[better], way[better] = cur[better], j0
            j1 = int(np.argmin(np.where(used, np.inf, minv)))   # the first smallest, as a scan would find it
            delta = minv[j1]
            u[owner[used]] += delta                     # the rows of used columns are distinct
            v[used] -= delta
            minv[~used] -= delta
            j0 = j1
            if owner[j0] == 0:
                break
        while j0:                                       # flip the augmenting path
            j1 = way[j0]
            owner[j0] = owner[j1]
            j0 = j1
    return sorted((int(owner[j]) - 1, j - 1) for j in range(1, m + 1) if owner[j])


def brute_force_assign(score: np.ndarray) -> list[tuple[int, int]]:
    """`assign` by trying every injection of the smaller side into the larger (for tests; small sizes only)."""
    from itertools import permutations

    s = np.asarray(score, dtype=np.float64)
    if s.shape[0] > s.shape[1]:
        return sorted((i, j) for j, i in brute_force_assign(s.T))
    n, m = s.shape
    best, pick = -np.inf, ()
    for cols in permutations(range(m), n):
        total = s[np.arange(n), list(cols)].sum()
        if total > best:
            best, pick = total, cols
    return [(i, int(j)) for i, j in enumerate(pick)]


def head_similarity(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(Ha, Hb) cosine similarity of every head pair's maps, averaged over the images.

    Args:
        a: (n, Ha, N) and b: (n, Hb, N) maps of n images on one grid (flattened)."""
    def unit(x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        norm = np.linalg.norm(x, axis=-1, keepdims=True)
        return x / np.where(norm > 0, norm, 1.0)

    return np.einsum("nid,njd->ij", unit(a), unit(b)) / max(1, a.shape[0])   # (Ha, Hb)


@dataclass(frozen=True)
class HeadMatch:
    """How the heads of one layer pair are matched.

    Attributes:
        layer_a, layer_b: the layers compared.
        pairs: ((A head, B head, similarity), ...) sorted by A head; similarity is `head_similarity`'s.
        method: 'match' (Hungarian assignment on the similarity) or 'index'.
        similarity: (Ha, Hb) the whole similarity matrix.
    """

    layer_a: int
    layer_b: int
    pairs: tuple[tuple[int, int, float], ...]
    method: str
    similarity: np.ndarray

    def partner(self, head: int) -> int | None:
        """B's head matched with A's `head`, or None."""
        return next((b for a, b, _ in self.pairs if a == head), None)

    def describe(self) -> list[str]:
        """['A head 3 ↔ B head 7, similarity 0.91', ...]."""
        return [f"A head {a} ↔ B head {b}, similarity {s:.2f}" for a, b, s in self.pairs]

    def to_dict(self) -> dict[str, Any]:
        return {"layer_a": self.layer_a, "layer_b": self.layer_b, "method": self.method,
                "pairs": [{"a": a, "b": b, "similarity": round(s, 6)} for a, b, s in self.pairs]}


def match_heads(sim: np.ndarray, method: HeadMode = "match", layer_a: int = 0, layer_b: int = 0) -> HeadMatch:
    """The head pairs of one layer pair from their (Ha, Hb) similarity."""
    if method == "index":
        idx = [(i, i) for i in range(min(sim.shape))]
    elif method == "match":
        idx = assign(sim)
    else:
        raise CompareError(f"heads={method!r}; expected 'match' (by similarity) or 'index'")
    return HeadMatch(layer_a, layer_b, tuple((i, j, float(sim[i, j])) for i, j in idx), method, sim)


# ------------------------------------------------------------------------------------------------------ figures
def js_divergence(p: np.ndarray, q: np.ndarray, axis: int = -1) -> np.ndarray:
    """Jensen–Shannon divergence in bits (0..1) between distributions along `axis`, each renormalised to sum 1;
    0·log 0 counts as 0."""
    p = np.asarray(p, dtype=np.float64)
    q = np.asarray(q, dtype=np.float64)
    p = p / np.maximum(p.sum(axis=axis, keepdims=True), JSD_EPS)
    q = q / np.maximum(q.sum(axis=axis, keepdims=True), JSD_EPS)
    m = 0.5 * (p + q)

    def kl(x: np.ndarray) -> np.ndarray:
        return np.where(x > 0, x * (np.log2(np.maximum(x, JSD_EPS)) - np.log2(np.maximum(m, JSD_EPS))), 0.0)

    return np.clip(0.5 * (kl(p).sum(axis=axis) + kl(q).sum(axis=axis)), 0.0, 1.0)


def linear_cka(x: np.ndarray, y: np.ndarray) -> float:
    """Linear CKA of two representations of the same n samples: ‖Yᶜᵀ Xᶜ‖²_F / (‖Xᶜᵀ Xᶜ‖_F ‖Yᶜᵀ Yᶜ‖_F), columns
    centred (Kornblith et al. 2019, eq. 5); 1 for identical (or rotated, or scaled) features, NaN for a constant one.

    Args:
        x: (n, Dx) and y: (n, Dy)."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if x.shape[0] != y.shape[0]:
        raise CompareError(f"CKA needs the same samples on both sides: {x.shape[0]} and {y.shape[0]} rows")
    x = x - x.mean(axis=0)
    y = y - y.mean(axis=0)
    den = np.linalg.norm(x.T @ x) * np.linalg.norm(y.T @ y)
    return float(np.linalg.norm(y.T @ x) ** 2 / den) if den > 0 else float("nan")


def _stack(maps: np.ndarray, title: str, signed: bool) -> MapStack:
    """A stack from (L, H + 2, gh, gw) maps whose columns H, H + 1 are already the head mean and max (NaN columns
    allowed), with the shared scales of each group (symmetric about 0 when `signed`)."""
    h = maps.shape[1] - 2
    groups = (maps[:, :h], maps[:, h], maps[:, h + 1])

    def top(g: np.ndarray) -> float:
        g = np.abs(g) if signed else g
        return float(np.nanmax(g)) if np.isfinite(g).any() else 0.0

    vmax = np.array([top(g) for g in groups], dtype=np.float64)
    if signed:  # an all-zero difference is drawn on -1..1, so 0 stays the centre colour
        vmax = np.where(vmax > 0, vmax, 1.0)
    return MapStack(maps=maps, vmax=vmax, title=title, vmin=-vmax if signed else None)


def align_stack(b: MapStack, layers_b: np.ndarray, matches: Sequence[HeadMatch], heads_a: int,
                grid_b: tuple[int, int], grid_a: tuple[int, int]) -> MapStack:
    """B's stack laid out as A's: layer i of the result is B's layer `layers_b[i]`, column h is B's head matched
    with A's head h (NaN when none), then B's own head mean and max; on A's grid by place (`to_grid`)."""
    src = to_grid(b.maps[layers_b], grid_b, grid_a)                    # (La, Hb + 2, gh, gw)
    hb = b.num_heads
    out = np.full((len(layers_b), heads_a + 2, *grid_a), np.nan, dtype=np.float32)
    for i, match in enumerate(matches):
        for a, j, _ in match.pairs:
            out[i, a] = src[i, j]
    out[:, heads_a:] = src[:, hb:]
    return _stack(out, f"{b.title} (B, on A's layers, heads and grid)", signed=False)


def diff_stack(a: MapStack, b_aligned: MapStack) -> MapStack:
    """A − B column by column (heads, head mean, head max), on a scale symmetric about 0."""
    if a.maps.shape != b_aligned.maps.shape:
        raise CompareError(f"stacks of shapes {a.maps.shape} and {b_aligned.maps.shape}; align B first")
    return _stack(a.maps - b_aligned.maps, f"{a.title}: A − B", signed=True)


# ---------------------------------------------------------------------------------------------------- compare
@dataclass(frozen=True)
class ImageComparison:
    """One image's maps: A's stack, B's own, B's aligned to A (`align_stack`) and A − B (`diff` = a − b)."""

    source: str
    a: MapStack
    b_own: MapStack
    b: MapStack
    diff: MapStack
    a_result: Any = field(repr=False, default=None)
    b_result: Any = field(repr=False, default=None)


@dataclass(frozen=True)
class Comparison:
    """Two models compared over images (see the module docstring for every rule).

    Attributes:
        layers_b: (La,) B's layer compared with each layer of A.
        relative_depth: (La,) A's layers' relative depths, the x axis of the figures.
        heads: one `HeadMatch` per layer of A.
        images: one `ImageComparison` per image.
        jsd: (La,) mean JSD (bits) of the head-mean CLS attention; jsd_heads: (La, Ha) per matched pair (NaN
            without a partner).
        cka: (La,) linear CKA of the patch-token features; None when not asked for.
        notes: the mapping, said in words.
    """

    kind: MapKind
    spec_a: Any
    spec_b: Any
    layers_b: np.ndarray
    relative_depth: np.ndarray
    heads: tuple[HeadMatch, ...]
    images: tuple[ImageComparison, ...]
    jsd: np.ndarray
    jsd_heads: np.ndarray
    cka: np.ndarray | None
    notes: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        """The figures and the matching, for a manifest (JSON-safe)."""
        def clean(values: np.ndarray | None) -> list[Any] | None:
            return None if values is None else [None if not np.isfinite(v) else round(float(v), 6)
                                                 for v in np.ravel(values)]

        return {"map": self.kind.label, "layers_b": [int(x) for x in self.layers_b],
                "relative_depth": clean(self.relative_depth), "jsd_bits": clean(self.jsd),
                "jsd_heads_bits": [clean(row) for row in self.jsd_heads], "cka": clean(self.cka),
                "heads": [m.to_dict() for m in self.heads], "notes": list(self.notes)}


def _kind_of(kind: MapKind | str) -> MapKind:
    if not isinstance(kind, (str, MapKind)):
        raise CompareError(f"kind={kind!r}: expected a map name, 'cls' (the default), 'mean', 'max' or 'rollout'")
    kind = MapKind.parse(kind) if isinstance(kind, str) else kind
    if kind.source != "attention" or kind.token is not None or not kind.per_layer:
        raise CompareError(f"compare draws per-layer attention maps (cls, mean, max, rollout); {kind.label!r} is "
                           "not one (token:N and key:N name a token of one model only)")
    return kind


def _resolved(kind: MapKind, spec: Any) -> MapKind:
    """'cls' of a model without CLS is its 'mean' map, as everywhere."""
    return MapKind("mean") if kind.kind == "cls" and not (spec.cls_token and spec.num_prefix) else kind


def resolved_kind(kind: MapKind, spec: Any) -> MapKind:
    """`kind` as this model draws it: 'cls' of a model without a CLS token is its 'mean' map."""
    return _resolved(kind, spec)


def compare_results(results_a: Sequence[Any], results_b: Sequence[Any], kind: MapKind | str = "cls",
                    heads: HeadMode = "match", features: tuple[Sequence[Any], Sequence[Any]] | None = None
                    ) -> Comparison:
    """`compare` from runs already made: `AttentionResult`s of the same images by A and by B (in order), and
    optionally their `FeatureStack`s (A's, B's) for CKA."""
    kind = _kind_of(kind)
    if not results_a or len(results_a) != len(results_b):
        raise CompareError(f"expected the same images run by both models; found {len(results_a)} and "
                           f"{len(results_b)} results")
    spec_a, spec_b = results_a[0].spec, results_b[0].spec
    stacks_a = [map_stack(r.attentions, _resolved(kind, spec_a), r.spec) for r in results_a]
    stacks_b = [map_stack(r.attentions, _resolved(kind, spec_b), r.spec) for r in results_b]
    return compare_stacks(stacks_a, stacks_b, spec_a, spec_b, kind, heads, [str(r.source) for r in results_a],
                          features, (results_a, results_b))


def compare_stacks(stacks_a: Sequence[MapStack], stacks_b: Sequence[MapStack], spec_a: Any, spec_b: Any,
                   kind: MapKind | str = "cls", heads: HeadMode | Sequence[HeadMatch] = "match",
                   sources: Sequence[str] | None = None,
                   features: tuple[Sequence[Any], Sequence[Any]] | None = None,
                   results: tuple[Sequence[Any], Sequence[Any]] | None = None) -> Comparison:
    """The comparison from both models' map stacks of the same images (`map_stack` of A's and B's runs, at the
    specs' grids): what `vitviz export --compare` uses, holding only maps, not attention. `heads` may also be the
    `HeadMatch`es to use (one per layer of A, e.g. another map kind's), instead of matching on these maps."""
    kind = _kind_of(kind)
    la, lb = spec_a.depth, spec_b.depth
    layers_b = match_layers(la, lb)
    grid_a, grid_b = tuple(spec_a.grid), tuple(spec_b.grid)
    ha, hb = stacks_a[0].num_heads, stacks_b[0].num_heads
    if isinstance(heads, str):
        matches = []
        for i, j in enumerate(layers_b):
            a_maps = np.stack([s.maps[i, :ha].reshape(ha, -1) for s in stacks_a])             # (n, Ha, N)
            b_maps = np.stack([to_grid(s.maps[j, :hb], grid_b, grid_a).reshape(hb, -1) for s in stacks_b])
            matches.append(match_heads(head_similarity(a_maps, b_maps), heads, i, int(j)))
    else:
        matches = _checked_matches(heads, layers_b, ha, hb)
    images = []
    sources = sources or [""] * len(stacks_a)
    for n, (sa, sb) in enumerate(zip(stacks_a, stacks_b)):
        aligned = align_stack(sb, layers_b, matches, ha, grid_b, grid_a)
        ra, rb = (results[0][n], results[1][n]) if results is not None else (None, None)
        images.append(ImageComparison(sources[n], sa, sb, aligned, diff_stack(sa, aligned), ra, rb))
    jsd = np.mean([js_divergence(im.a.maps[:, ha].reshape(la, -1), im.b.maps[:, ha].reshape(la, -1))
                   for im in images], axis=0)                                               # (La,)
    jsd_heads = np.full((la, ha), np.nan)
    for i, match in enumerate(matches):
        for a, _, _ in match.pairs:
            jsd_heads[i, a] = np.mean([js_divergence(im.a.maps[i, a].ravel(), im.b.maps[i, a].ravel())
                                       for im in images])
    cka = None if features is None else feature_cka(features[0], features[1], layers_b)
    notes = [f"map: {stacks_a[0].title}" + ("" if kind.kind != "cls" or _resolved(kind, spec_b) == kind
                                             else " (B has no CLS token: its mean patch attention)")]
    notes.append(f"layers by relative depth: A has {la}, B {lb}; A layer i ↔ B layer round(i·{lb - 1}/{max(1, la - 1)})"
                 if la != lb else f"layers by index ({la} each)")
    how = ("by index" if matches and matches[0].method == "index" else
           "matched by similarity (Hungarian assignment)" if not matches or matches[0].method == "match" else
           f"matched as given ({matches[0].method})")
    notes.append(f"heads {how}: "
                 f"A has {ha}, B {hb}" + (f"; {ha - hb} of A's heads have no partner" if ha > hb else ""))
    if grid_a != grid_b:
        notes.append(f"patches by place: B's {grid_b[0]}×{grid_b[1]} grid sampled at A's {grid_a[0]}×{grid_a[1]} "
                     f"patch centres, scaled by {grid_b[0] * grid_b[1]}/{grid_a[0] * grid_a[1]}")
    return Comparison(kind, spec_a, spec_b, layers_b, relative_depth(la), tuple(matches), tuple(images), jsd,
                      jsd_heads, cka, tuple(notes))


def _checked_matches(matches: Sequence[HeadMatch], layers_b: np.ndarray, ha: int, hb: int) -> list[HeadMatch]:
    """Given head matches, checked against the layer pairs and head counts."""
    matches = list(matches)
    if len(matches) != len(layers_b):
        raise CompareError(f"expected one head match per layer of A ({len(layers_b)}); found {len(matches)}")
    for i, m in enumerate(matches):
        if (m.layer_a, m.layer_b) != (i, int(layers_b[i])):
            raise CompareError(f"head match {i} pairs A layer {m.layer_a} with B layer {m.layer_b}; the layers are "
                               f"paired A {i} ↔ B {int(layers_b[i])} by relative depth")
        if any(not (0 <= a < ha and 0 <= b < hb) for a, b, _ in m.pairs):
            raise CompareError(f"head match of layer {i} names a head outside A's {ha} or B's {hb}")
    return matches


def feature_cka(feats_a: Sequence[Any], feats_b: Sequence[Any], layers_b: np.ndarray) -> np.ndarray:
    """(La,) linear CKA of the raw patch-token features at each layer pair, the images' patches pooled as samples;
    B's patches taken by place on A's grid."""
    out = np.empty(len(layers_b))
    for i, j in enumerate(layers_b):
        xs, ys = [], []
        for fa, fb in zip(feats_a, feats_b):
            xs.append(fa.patches(i, normed=False).reshape(-1, fa.raw.shape[-1]))                 # (Na, Da)
            pb = fb.patches(int(j), normed=False)                                                # (gh', gw', Db)
            idx = place_index(tuple(fb.grid), tuple(fa.grid))
            ys.append(pb.reshape(-1, pb.shape[-1])[idx])                                         # (Na, Db)
        out[i] = linear_cka(np.concatenate(xs), np.concatenate(ys))
    return out


def compare(a: Any, b: Any, images: Sequence[Any], kind: MapKind | str = "cls", heads: HeadMode = "match",
            cka: bool = True) -> Comparison:
    """Run every image through models A and B (`VitModel`s, any family or size) and compare them per layer.

    Args:
        images: paths, PIL images or arrays, as `VitModel.run` takes them.
        kind: the map compared: 'cls' (the default), 'mean', 'max' or 'rollout'.
        heads: 'match' (Hungarian assignment on similarity) or 'index'.
        cka: also capture both models' token features (a pass of their own per image) for the CKA figure.
    """
    for side, model in (("A", a), ("B", b)):
        check_comparable(model, side)
    _kind_of(kind)
    if heads not in ("match", "index"):
        raise CompareError(f"heads={heads!r}; expected 'match' (by similarity) or 'index'")
    if isinstance(images, (str, bytes, os.PathLike)) or not hasattr(images, "__len__") or not len(images):
        raise CompareError("expected a list of images to compare the models on")
    ra = [a.run(img, logits=False) for img in images]
    rb = [b.run(img, logits=False) for img in images]
    feats = None
    if cka:
        from vitviz.core.analyses.features import capture_features

        feats = ([capture_features(a, img, normed=False) for img in images],
                 [capture_features(b, img, normed=False) for img in images])
    return compare_results(ra, rb, kind, heads, feats)


def check_comparable(model: Any, side: str) -> None:
    """Refuse what `compare` cannot take as model A or B: anything but a loaded model (None, a path: load it
    first), and a windowed model (Swin, SAM / ViTDet: attention inside windows, no image-wide map per head to
    match; compare maps the same model family's global-attention ViTs of any size)."""
    if not (hasattr(model, "run") and hasattr(model, "spec")):
        hint = " (load it first: vitviz.load(path))" if isinstance(model, (str, os.PathLike)) else ""
        raise CompareError(f"model {side} is {type(model).__name__}{hint}; expected a model from vitviz.load")
    if ATTENTION not in capabilities_of(model):    # a windowed model: attention inside windows only
        raise CompareError(f"model {side} ({model.spec.family}) attends inside windows, so it has no image-wide "
                           "attention map per head to compare; compare takes ViTs with global attention")


# ------------------------------------------------------------------------------------------------- view model
@dataclass(frozen=True)
class CompareFrame:
    """What the Compare view shows for one image and one linked selection.

    Attributes:
        a, b, diff: (gh, gw) on A's grid: A's map, B's partner map taken by place (NaN where B's head has no partner)
            and a − b.
        b_own: B's map on its own grid (its own layer and head), None without a partner; draw it over B's view.
        vmin, vmax: the one colour scale of `a` and `b` (and `b_own`): 0..the largest of both stacks' groups
            (all single heads of all layers, or the head means, or the maxima), so switching layers keeps it.
        dmax: `diff` is drawn on -dmax..dmax, centred on 0 (the difference stack's group, all layers).
        layer_a, layer_b, head_a, head_b, query_a, query_b: the selection on each side (None: B has no partner
            head / the map has no query).
        similarity: the matched heads' similarity, None for the head mean or max.
        label: the mapping in words, e.g. 'A layer 11 ↔ B layer 5 (relative depth 1.00) · A head 3 ↔ B head 7,
            similarity 0.91 · query at (0.40, 0.61): A token 57 ↔ B token 23'.
    """

    a: np.ndarray
    b: np.ndarray
    diff: np.ndarray
    b_own: np.ndarray | None
    vmin: float
    vmax: float
    dmax: float
    layer_a: Any
    layer_b: Any
    head_a: Any
    head_b: Any
    query_a: int | None
    query_b: int | None
    similarity: float | None
    label: str


@dataclass(frozen=True)
class CompareSummary:
    """The per-layer figures of two models over the open images, as arrays against depth (the summary panel's
    plot; a click on layer i goes to `frame(..., layer=i)`).

    Attributes:
        relative_depth: (La,) x axis: A's layers' relative depths; depth_b: (La,) the paired B layers' own.
        layers_b: (La,) B's layer paired with each of A's.
        jsd: (La,) mean JSD (bits) of the head-mean CLS attention over the images; jsd_heads: (La, Ha) per matched
            head pair (NaN without a partner).
        cka: (La,) linear CKA of the patch-token features, None when the results carry no features (`note` says).
        images: how many images the figures are over.
        notes: the mapping in words (`Comparison.notes`), and why CKA is missing if it is.
    """

    relative_depth: np.ndarray
    depth_b: np.ndarray
    layers_b: np.ndarray
    jsd: np.ndarray
    jsd_heads: np.ndarray
    cka: np.ndarray | None
    images: int
    notes: tuple[str, ...]


def shared_scale(a: MapStack, b_aligned: MapStack) -> np.ndarray:
    """(3,) the one colour scale of A's and B's maps, per column group (single heads, head mean, head max): the
    larger of A's and aligned B's maxima (1 where both are 0). The window's views and `vitviz export --compare` draw
    A and B on it; A − B has its own scale, symmetric about 0 (`diff_stack`)."""
    top = np.fmax(a.vmax, b_aligned.vmax)
    return np.where(top > 0, top, 1.0)


SHARED_NOTE = " (scale shared by A and B)"


def on_scale(stack: MapStack, vmax: np.ndarray) -> MapStack:
    """`stack` drawn on the shared scale `vmax` (`shared_scale`), its title saying so (the colorbar label)."""
    return MapStack(maps=stack.maps, vmax=np.asarray(vmax, dtype=np.float64), title=stack.title + SHARED_NOTE,
                    vmin=stack.vmin)


@dataclass
class _Pair:
    """One image's stacks of one map kind: A's, B's own, B's aligned to A, A − B and the shared A/B scale."""

    a: MapStack
    b_own: MapStack
    b: MapStack
    diff: MapStack
    vmax: np.ndarray        # (3,) per group: max of A's and aligned B's (`shared_scale`)


def _as_maps(result: Any) -> Any:
    return result if isinstance(result, ResultMaps) else ResultMaps(result)


class CompareView:
    """The Compare mode's view model (Qt-free): two models' results on the same images, linked.

        view = CompareView(results_a, results_b)            # AttentionResults or ResultMaps, one per image, in order
        f = view.frame(0, layer=11, head=3)                  # A, B, A − B maps of image 0, one scale, mapped
        f = view.frame(0, layer=5, head="mean", kind="token", query=57)   # a query token of A, B's by place
        view.summary()                                       # per-layer JSD and CKA against depth

    Made in the worker (it builds the CLS stacks of every image, matches the heads over all of them and aligns B's
    maps to A's layers, heads and grid); `frame` then only indexes those arrays, so a switch of the linked layer or
    head costs microseconds (`bench/compare.py`). Another map kind or query is built on its first `frame` (or ahead
    of time with `prepare`, in the worker) and kept (the last `MAX_QUERY_KINDS` queries). The head matching is made once, on CLS attention (or given),
    and used for every kind, so a head's partner does not change with the map. Rules: the module docstring.

    Args:
        heads: 'match' (Hungarian assignment on CLS-attention similarity over these images), 'index', or the
            `HeadMatch`es to use (one per layer of A).
    """

    def __init__(self, results_a: Sequence[Any], results_b: Sequence[Any],
                 heads: HeadMode | Sequence[HeadMatch] = "match") -> None:
        if not len(results_a) or len(results_a) != len(results_b):
            raise CompareError(f"expected the same images' results from both models; found {len(results_a)} and "
                               f"{len(results_b)}")
        self.maps_a = [_as_maps(r) for r in results_a]
        self.maps_b = [_as_maps(r) for r in results_b]
        self.spec_a, self.spec_b = self.maps_a[0].result.spec, self.maps_b[0].result.spec
        for side, maps in (("A", self.maps_a), ("B", self.maps_b)):
            grids = {tuple(m.grid) for m in maps}
            if len(grids) > 1:
                raise CompareError(f"{side}'s results are on grids {sorted(grids)}; compare runs of one size per model")
        self.grid_a, self.grid_b = tuple(self.maps_a[0].grid), tuple(self.maps_b[0].grid)
        cls = MapKind("cls")
        self.comparison = compare_stacks(
            [m.stack(_resolved(cls, self.spec_a)) for m in self.maps_a],
            [m.stack(_resolved(cls, self.spec_b)) for m in self.maps_b], self.spec_a, self.spec_b, cls, heads,
            [str(m.result.source) for m in self.maps_a])
        self.layers_b = self.comparison.layers_b
        self.matches = self.comparison.heads
        self.heads_a = self.comparison.images[0].a.num_heads
        self._pairs: dict[MapKind, list[_Pair]] = {cls: [self._pair(im) for im in self.comparison.images]}
        self._lock = threading.Lock()   # `_pairs` is filled by the worker (`prepare`) and read by the GUI (`frame`)
        self._layer_words = self._layer_labels()
        self._head_words = [{a: (b, sim, f"A head {a} ↔ B head {b}, similarity {sim:.2f}") for a, b, sim in m.pairs}
                            for m in self.matches]
        self._summary: CompareSummary | None = None

    @staticmethod
    def _pair(im: ImageComparison) -> _Pair:
        return _Pair(im.a, im.b_own, im.b, im.diff, shared_scale(im.a, im.b))

    def _layer_labels(self) -> list[str]:
        la, lb = self.spec_a.depth, self.spec_b.depth
        rel = relative_depth(la)
        if la == lb:
            return [f"A layer {i} ↔ B layer {i}" for i in range(la)]
        return [f"A layer {i} ↔ B layer {int(j)} (relative depth {rel[i]:.2f})" for i, j in enumerate(self.layers_b)]

    @property
    def notes(self) -> tuple[str, ...]:
        return self.comparison.notes

    @property
    def images(self) -> int:
        return len(self.maps_a)

    @property
    def sources(self) -> list[str]:
        """The images compared, in order (A's results' sources)."""
        return [str(m.result.source) for m in self.maps_a]

    def has(self, kind: MapKind | str = "cls", query: int | None = None) -> bool:
        """Whether this map kind's stacks are built already (`frame` then only indexes arrays)."""
        key = self._key(kind, query)
        with self._lock:
            return key in self._pairs

    def pair(self, image: int, kind: MapKind | str = "cls", query: int | None = None) -> _Pair:
        """One image's stacks of a map kind: A's (`a`), B's own (`b_own`), B's aligned to A (`b`), A − B (`diff`)
        and the shared A/B scale (`vmax`, `shared_scale`): what an export of the view draws."""
        return self._pair_of(image, self._key(kind, query))

    # queries --------------------------------------------------------------------------------------------------
    def query_place(self, query_a: int) -> tuple[float, float] | None:
        """The place (y, x), fractions of the image, of A's token `query_a` (its patch centre); None for a prefix
        token."""
        p = self.spec_a.num_prefix
        if query_a < p:
            return None
        gh, gw = self.grid_a
        r, c = divmod(query_a - p, gw)
        if r >= gh:
            raise CompareError(f"query token {query_a}: A has {p + gh * gw} tokens")
        return ((r + 0.5) / gh, (c + 0.5) / gw)

    def query_b(self, query_a: int) -> int:
        """B's token for A's `query_a`: a patch by place (the patch of B's grid under A's patch centre), CLS for CLS,
        another prefix token by its name (reg0, dist) when B has one of that name.

        Raises:
            CompareError: A's prefix token has no counterpart in B (e.g. a register token, B without registers)."""
        place = self.query_place(query_a)
        if place is not None:
            return self.spec_b.num_prefix + patch_at(place, self.grid_b)
        name = self.spec_a.prefix_names[query_a]
        if name in self.spec_b.prefix_names[: self.spec_b.num_prefix]:
            return self.spec_b.prefix_names.index(name)
        raise CompareError(f"A's token {query_a} ({name}) has no counterpart in B (its prefix tokens: "
                           f"{', '.join(self.spec_b.prefix_names[: self.spec_b.num_prefix]) or 'none'})")

    def _kinds(self, kind: MapKind | str, query: int | None) -> tuple[MapKind, MapKind, MapKind]:
        """(the key, A's kind, B's kind) of a map selection."""
        kind = MapKind.parse(kind) if isinstance(kind, str) else kind
        if kind.token is not None or query is not None:      # a map of one token (token:N, key:N): B's by place
            q = kind.token if query is None else int(query)
            word = kind.kind if kind.token is not None else "token"
            key = MapKind(word, q)
            return key, key, MapKind(word, self.query_b(q))
        if kind.source != "attention" or not kind.per_layer:
            raise CompareError(f"compare draws per-layer attention maps (cls, mean, max, rollout, token:N, key:N); "
                               f"{kind.label!r} is not one")
        return kind, _resolved(kind, self.spec_a), _resolved(kind, self.spec_b)

    # maps -----------------------------------------------------------------------------------------------------
    def prepare(self, kind: MapKind | str = "cls", query: int | None = None) -> list[_Pair]:
        """Build one map kind's stacks for every image (the worker's call, ahead of `frame`); returns them."""
        key, ka, kb = self._kinds(kind, query)
        with self._lock:
            if key in self._pairs:
                return self._pairs[key]
        pairs = []      # made outside the lock: a frame of a kind made already never waits for this one
        for ma, mb in zip(self.maps_a, self.maps_b):
            if key.token is not None:   # made here, not cached in the ResultMaps: one per query hovered
                sa = map_stack(ma.result.attentions, ka, ma.result.spec)
                sb = map_stack(mb.result.attentions, kb, mb.result.spec)
            else:
                sa, sb = ma.stack(ka), mb.stack(kb)
            aligned = align_stack(sb, self.layers_b, self.matches, self.heads_a, self.grid_b, self.grid_a)
            if aligned.maps.shape[1] != sa.maps.shape[1]:       # rollout: one fused 'head' on each side
                aligned = _stack(to_grid(sb.maps[self.layers_b], self.grid_b, self.grid_a), aligned.title, False)
            pairs.append(self._pair(ImageComparison(str(ma.result.source), sa, sb, aligned, diff_stack(sa, aligned))))
        with self._lock:
            pairs = self._pairs.setdefault(key, pairs)
            queries = [k for k in self._pairs if k.token is not None]
            for old in queries[: max(0, len(queries) - MAX_QUERY_KINDS)]:     # the oldest queries go
                if old != key:
                    del self._pairs[old]
        return pairs

    def stacks(self, image: int, kind: MapKind | str = "cls", query: int | None = None
               ) -> tuple[MapStack, MapStack, MapStack]:
        """(A's, B's aligned to A, A − B) stacks of one image: what an export of the view writes."""
        pair = self._pair_of(image, self._key(kind, query))
        return pair.a, pair.b, pair.diff

    _CLS = MapKind("cls")

    def _key(self, kind: MapKind | str, query: int | None) -> MapKind:
        if query is None and (kind == "cls" or kind == self._CLS):
            return self._CLS
        return self._kinds(kind, query)[0]

    def _pair_of(self, image: int, key: MapKind) -> _Pair:
        with self._lock:
            held = self._pairs.get(key)
            if held is not None and key.token is not None:         # used: now the newest
                self._pairs[key] = self._pairs.pop(key)
        if held is None:           # not prepared by the worker (yet): made here, on the caller's thread
            held = self.prepare(key)
        return held[image]

    def frame(self, image: int, layer: int | str = -1, head: int | str = "mean", kind: MapKind | str = "cls",
              query: int | None = None) -> CompareFrame:
        """The A, B and A − B maps of one image for a linked selection (see `CompareFrame`).

        Args:
            layer: A's layer (negative counts from the end) or 'mean'; B's is its pair by relative depth.
            head: A's head (its matched partner on B's side), 'mean' or 'max' (each model's own).
            kind: 'cls', 'mean', 'max', 'rollout', 'token:N' or 'key:N' (any attention map of the table of map
                kinds); `query` (A's token) makes it a token map ('key:N' keeps its kind), B's token taken by
                place."""
        key = self._key(kind, query)
        pair = self._pair_of(image, key)
        la = self.spec_a.depth
        if isinstance(layer, str):
            if layer != "mean":
                raise CompareError(f"layer {layer!r}: expected an index or 'mean'")
            li, layer_b, parts = None, "mean", ["mean over A's layers ↔ B's paired layers"]
        else:
            if not -la <= layer < la:
                raise CompareError(f"layer {layer}: A has {la} (0..{la - 1})")
            li = layer % la
            layer_b, parts = int(self.layers_b[li]), [self._layer_words[li]]
        col = pair.a.column(head)
        a, b = pair.a.select(layer, head), pair.b.select(layer, head)
        head_b: Any = head
        sim = None
        if isinstance(head, str):
            parts.append(f"head {head} of each model")
        elif pair.a.num_heads == self.heads_a:          # per-head maps: B's partner
            if li is None:
                head_b = None
                parts.append(f"A head {col}: its partners differ by layer")
            else:
                head_b, sim, text = self._head_words[li].get(col, (None, None, f"A head {col}: no partner in B"))
                parts.append(text)
        else:                                          # rollout: one fused map per layer
            head_b = 0
        b_own = None if head_b is None else pair.b_own.select(layer_b, head_b)
        qa = qb = None
        if key.token is not None:
            qa = int(key.token)
            qb = self.query_b(qa)
            place = self.query_place(qa)
            where = f"query at ({place[0]:.2f}, {place[1]:.2f})" if place else f"query {self.spec_a.token_name(qa)}"
            parts.append(f"{where}: A token {qa} ↔ B token {qb}")
        group = min(2, max(0, col - pair.a.num_heads + 1))
        return CompareFrame(a, b, a - b, b_own, 0.0, float(pair.vmax[group]), float(pair.diff.scale_max(col)),
                            layer, layer_b, head, head_b, qa, qb, sim, " · ".join(parts))

    # summary --------------------------------------------------------------------------------------------------
    def summary(self, features: tuple[Sequence[Any], Sequence[Any]] | None = None) -> CompareSummary:
        """The per-layer JSD and CKA over the images (CKA from `features`, else from the results' token features,
        `ResultMaps.features`, when every result has them)."""
        if self._summary is not None and features is None:
            return self._summary
        c = self.comparison
        notes = list(c.notes)
        feats = features
        if feats is None and all(m.features is not None for m in self.maps_a + self.maps_b):
            feats = ([m.features for m in self.maps_a], [m.features for m in self.maps_b])
        cka = None if feats is None else feature_cka(feats[0], feats[1], self.layers_b)
        if cka is None:
            notes.append("CKA needs both models' token features (the features pass) of every image")
        lb = self.spec_b.depth
        depth_b = self.layers_b / max(1, lb - 1) if lb > 1 else np.ones(len(self.layers_b))
        out = CompareSummary(c.relative_depth, depth_b, self.layers_b, c.jsd, c.jsd_heads, cka, self.images,
                             tuple(notes))
        if features is None:
            self._summary = out
        return out
