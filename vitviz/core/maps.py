"""The map engine: every attention map the window shows and `vitviz export` writes, computed once (no Qt here).

A map kind (`MapKind`: CLS attention, attention received averaged or maximised over the patch queries, one token's
attention row, or attention rollout with its settings) becomes a `MapStack`: a (L, H + 2, gh, gw) array holding
the H heads followed by the head mean and the head max for every layer, with the colour scale shared by each kind
of column. Switching layer or head is then an index into that stack, which keeps every panel update inside one
frame even for ViT-L/16 at 384 px. `ResultMaps` caches the stacks of one result for the window; `vitviz export`
calls `map_stack` for each image. Both select, scale and name a map through the same code here, so the window's
export and the CLI write the same files.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Union

import numpy as np

from vitviz.core import analysis
from vitviz.core.rollout import RolloutEngine, RolloutParams
from vitviz.core.spec import AttentionResult, ModelSpec
from vitviz.errors import VitvizError

LayerSel = Union[int, str]   # a layer index (negative counts from the end) or 'mean' over the layers
HeadSel = Union[int, str]    # a head index (negative counts from the end), 'mean' or 'max' over the heads

MAP_KINDS = ("cls", "mean", "max", "rollout", "token")


class SelectionError(VitvizError, ValueError):
    """A map, layer or head selection that is malformed or out of range for the model."""


def resolve_index(sel: int | str, count: int) -> int | str:
    """Clamp an index into range(count), counting negatives from the end; strings pass through."""
    if isinstance(sel, str):
        return sel
    if sel < 0:
        sel += count
    return max(0, min(count - 1, sel))


@dataclass(frozen=True)
class MapKind:
    """What a map shows.

    Attributes:
        kind: 'cls' (the CLS token's attention over the patches), 'mean' / 'max' (the attention each patch
            receives, averaged / maximised over the patch queries), 'token' (the attention row of `token`) or
            'rollout' (attention rollout with the settings `rollout`, from `rollout.query`).
        token: the query token of 'token' (prefix tokens count: token 0 is CLS when the model has one).
        rollout: the rollout's settings; only used by 'rollout'.
    """

    kind: str
    token: int | None = None
    rollout: RolloutParams = field(default_factory=RolloutParams)

    def __post_init__(self) -> None:
        if self.kind not in MAP_KINDS:
            raise SelectionError(f"map kind {self.kind!r}: expected one of {', '.join(MAP_KINDS)}")
        if (self.kind == "token") != (self.token is not None):
            raise SelectionError(f"a {self.kind} map {'needs' if self.kind == 'token' else 'takes no'} query token")

    @classmethod
    def parse(cls, text: str, rollout: RolloutParams | None = None) -> "MapKind":
        """'cls', 'mean', 'max', 'rollout', 'token:N' (the attention row of token N) or 'rollout:N' (the rollout
        of token N); `rollout` gives the rollout's other settings."""
        text = text.strip().lower()
        base = rollout or RolloutParams()
        if text in ("cls", "mean", "max"):
            return cls(text)
        if text == "rollout":
            return cls("rollout", rollout=base)
        match = re.fullmatch(r"(token|rollout):(\d+)", text)
        if match is None:
            raise SelectionError(f"map {text!r}: expected one of cls, mean, max, rollout, token:N (e.g. token:0) "
                                 "or rollout:N")
        token = int(match.group(2))
        if match.group(1) == "token":
            return cls("token", token)
        return cls("rollout", rollout=RolloutParams(base.fusion, base.discard, base.start, base.residual, token))

    @property
    def label(self) -> str:
        """The map's part of a file name: 'cls', 'mean', 'token17', and for rollout 'rollout' with the settings
        that differ from the defaults: 'rollout-token17-max-d0.9-r0.3-from2'."""
        if self.kind == "token":
            return f"token{self.token}"
        if self.kind != "rollout":
            return self.kind
        r, parts = self.rollout, ["rollout"]
        if r.query is not None:
            parts.append(f"token{r.query}")
        if r.fusion != "mean":
            parts.append(r.fusion)
        if r.discard:
            parts.append(f"d{r.discard:g}")
        if r.residual != 0.5:
            parts.append(f"r{r.residual:g}")
        if r.start:
            parts.append(f"from{r.start}")
        return "-".join(parts)

    @property
    def query_row(self) -> int | None:
        """The one attention row this map reads (CLS: 0, token N: N), or None when it needs whole matrices."""
        return 0 if self.kind == "cls" else self.token if self.kind == "token" else None


@dataclass(frozen=True)
class MapStack:
    """Maps for every layer and head of one map kind.

    Attributes:
        maps: (L, H + 2, gh, gw) float32; columns H and H + 1 are the head mean and max. For rollout H is 1.
        vmax: (3,) the largest value over all layers of the single heads, of the head means and of the head
            maxima: the shared colour scale of a map is 0..vmax of its group, so maps of one kind compare.
        title: what the maps are, for labels.
    """

    maps: np.ndarray
    vmax: np.ndarray
    title: str

    @property
    def num_heads(self) -> int:
        return self.maps.shape[1] - 2

    def column(self, head: HeadSel) -> int:
        """Index into axis 1 of `maps` for a head selection."""
        if head == "mean":
            return self.num_heads
        if head == "max":
            return self.num_heads + 1
        return int(resolve_index(head, self.num_heads))

    def select(self, layer: LayerSel, head: HeadSel) -> np.ndarray:
        """The (gh, gw) map of one layer (or the mean over layers) and one head selection."""
        col = self.maps[:, self.column(head)]          # (L, gh, gw)
        if layer == "mean":
            return col.mean(axis=0)
        return col[int(resolve_index(layer, col.shape[0]))]

    def scale_max(self, column: int) -> float:
        """Top of the shared colour scale for a column of `maps` (heads, mean or max)."""
        group = min(2, max(0, column - self.num_heads + 1))
        value = float(self.vmax[group])
        return value if value > 0 else 1.0

    def levels(self, values: np.ndarray, head: HeadSel, own: bool) -> tuple[float, float]:
        """Colour range of `values`, a map of this stack's `head` column: its own min..max (`own`), else 0..the
        shared maximum of its kind of column (all single heads of all layers, or all head means, or all maxima)."""
        if own:
            lo, hi = float(values.min()), float(values.max())
            return (lo, hi if hi > lo else lo + 1e-12)
        return (0.0, self.scale_max(self.column(head)))

    def shared_scaled(self) -> np.ndarray:
        """`maps` divided by the scale of their group: every column on one 0..1 scale."""
        scale = np.array([self.scale_max(c) for c in range(self.maps.shape[1])], dtype=np.float32)
        return self.maps / scale[None, :, None, None]


def map_stack(attn: np.ndarray, kind: MapKind, spec: ModelSpec, rows: list[int] | None = None,
              engine: RolloutEngine | None = None) -> MapStack:
    """Every layer's and head's map of one kind for one image.

    'cls' for a model without a CLS token gives the mean over the patch queries ('mean', titled as the fallback).

    Args:
        attn: (L, H, T, T) attention of one image, or (L, H, k, T) holding only the query rows `rows`
            (enough for 'cls' and 'token').
        engine: the image's `RolloutEngine` when one is kept (its caches make other settings cheap).
    """
    p, (gh, gw) = spec.num_prefix, spec.grid
    has_cls = spec.cls_token and p > 0
    if kind.kind == "token" or (kind.kind == "cls" and has_cls):
        token = 0 if kind.kind == "cls" else min(int(kind.token or 0), attn.shape[-1] - 1)
        data = attn[:, :, token if rows is None else rows.index(token), p:]          # (L, H, N)
        title = "CLS attention" if kind.kind == "cls" else f"attention of token {token}"
    elif rows is not None:
        raise ValueError(f"the {kind.label} map needs whole attention matrices, not rows {rows}")
    elif kind.kind == "rollout":
        engine = engine or RolloutEngine(attn, p, spec.cls_token)
        data = engine.through_each_layer(kind.rollout)[:, None, p:]                  # (L, 1, N)
        title = rollout_title(kind.rollout, spec)
    elif kind.kind in ("mean", "max"):
        data = analysis.attention_received(attn, p, kind.kind)                       # (L, H, N) over patch queries
        title = f"{kind.kind} attention received (over the patch queries)"
    else:
        data = analysis.attention_received(attn, p, "mean")                          # (L, H, N): no CLS token
        title = "mean patch attention (no CLS token)"
    data = np.asarray(data, dtype=np.float32)
    fused = np.concatenate([data, data.mean(1, keepdims=True), data.max(1, keepdims=True)], axis=1)
    maps = fused.reshape(fused.shape[0], fused.shape[1], gh, gw)   # (L, H + 2, N) -> (L, H + 2, gh, gw)
    h = data.shape[1]
    vmax = np.array([maps[:, :h].max(), maps[:, h].max(), maps[:, h + 1].max()], dtype=np.float64)
    return MapStack(maps=maps, vmax=vmax, title=title)


def rollout_title(params: RolloutParams, spec: ModelSpec) -> str:
    """E.g. 'rollout of cls (max, discard 0.9, from layer 2, residual 0.5)'."""
    q = params.query
    who = spec.token_name(q) if q is not None else ("cls" if spec.cls_token and spec.num_prefix else "mean patch")
    knobs = [params.fusion]
    if params.discard > 0:
        knobs.append(f"discard {params.discard:.2f}")
    if params.start > 0:
        knobs.append(f"from layer {params.start}")
    knobs.append(f"residual {params.residual:.2f}")
    return f"rollout of {who} ({', '.join(knobs)})"


MAX_ROLLOUT_STACKS = 8


class ResultMaps:
    """Lazily computed, cached map stacks for one result (the window keeps one per image)."""

    def __init__(self, result: AttentionResult) -> None:
        self.result = result
        self.rollout = RolloutEngine(result.attentions, result.num_prefix, result.spec.cls_token)
        self._stacks: dict[MapKind, MapStack] = {}
        self._stats: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    @property
    def grid(self) -> tuple[int, int]:
        return self.result.grid

    @property
    def nbytes(self) -> int:
        """Memory held by the result and the caches derived from it."""
        return self.result.nbytes + self.rollout.nbytes + sum(s.maps.nbytes for s in self._stacks.values())

    def stack(self, kind: MapKind | str) -> MapStack:
        """The stack of a map kind (or its `MapKind.parse` text: 'cls', 'rollout', 'token:5'...)."""
        kind = MapKind.parse(kind) if isinstance(kind, str) else kind
        if kind not in self._stacks:
            self._stacks[kind] = map_stack(self.result.attentions, kind, self.result.spec, engine=self.rollout)
            self._forget_old_rollouts()
        return self._stacks[kind]

    def resolved(self, kind: MapKind) -> MapKind:
        """The kind a map really is, which names its files: 'cls' of a model without CLS is 'mean'."""
        spec = self.result.spec
        return MapKind("mean") if kind.kind == "cls" and not (spec.cls_token and spec.num_prefix) else kind

    def precompute(self) -> None:
        """Build what every image needs (CLS and rollout stacks, head statistics); the worker calls this off the
        GUI thread."""
        self.stack(MapKind("cls"))
        self.stack(MapKind("rollout"))
        self.head_stats()

    def head_stats(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(L, H) mean attention distance in pixels, (L, H) attention entropy in nats (patch queries) and
        (L, H, P + 1) attention by token kind (`core.analysis.attention_by_token_kind`)."""
        if self._stats is None:
            r = self.result
            self._stats = (analysis.mean_attention_distance(r),
                           analysis.attention_entropy(r.attentions, num_prefix=r.num_prefix),
                           analysis.attention_by_token_kind(r))
        return self._stats

    def _forget_old_rollouts(self) -> None:
        keys = [k for k in self._stacks if k.kind == "rollout" and k != MapKind("rollout")]
        for key in keys[: max(0, len(keys) - MAX_ROLLOUT_STACKS)]:
            del self._stacks[key]


def mosaic(maps: np.ndarray, per_tile: bool, gap: int) -> np.ndarray:
    """Lay out (L, C, gh, gw) tiles as one (L·(gh+gap)-gap, C·(gw+gap)-gap) image, NaN between tiles.

    With `per_tile` every tile is stretched to 0..1 on its own.
    """
    tiles = maps.astype(np.float32, copy=True)
    if per_tile:
        lo = tiles.min(axis=(2, 3), keepdims=True)
        span = tiles.max(axis=(2, 3), keepdims=True) - lo
        tiles = (tiles - lo) / np.where(span > 0, span, 1.0)
    nl, nc, gh, gw = tiles.shape
    padded = np.full((nl, nc, gh + gap, gw + gap), np.nan, dtype=np.float32)
    padded[:, :, :gh, :gw] = tiles
    out = padded.transpose(0, 2, 1, 3).reshape(nl * (gh + gap), nc * (gw + gap))  # (L, gh, C, gw) -> rows, cols
    return out[: out.shape[0] - gap, : out.shape[1] - gap]


MOSAIC_MAX_POSITIONS = 50 * 50   # the all-pairs similarity and the mosaic only up to this many grid positions
LEVEL_SAMPLE_ROWS = 64            # beyond that, the colour scale's low end comes from this many positions' rows


@dataclass(frozen=True)
class PosEmbedData:
    """A model's position embedding at one grid, with the similarities the position-embedding panel shows.

    Only what the panel shows is computed: the row of one position (`similarity_to`, on demand) and the CLS row;
    the all-pairs similarity and the mosaic only for grids of at most `MOSAIC_MAX_POSITIONS` positions (a 500 × 500
    grid would need 250 000² similarities).

    Attributes:
        grid: (gh, gw) the embedding was resampled to.
        pos: (N_pos, D) float32, `prefix_rows` prefix rows (0 for no_embed_class models) then the grid row-major.
        unit: (gh·gw, D) float32, the grid rows scaled to unit length (zero rows stay zero).
        similarity: (gh, gw, gh, gw) float32 cosine similarity between every pair of positions, or None for a grid
            too large for it.
        cls_similarity: (gh, gw) similarity of the first prefix row (CLS) to every position, or None.
        mosaic: the ViT-paper figure as one image, tiles of (gh, gw) separated by a NaN gap of `gap`; None for a
            grid too large for it.
        low: the lowest similarity (exact with `similarity`; else over the CLS row and `LEVEL_SAMPLE_ROWS` evenly
            spread positions), for the colour scale.
    """

    grid: tuple[int, int]
    pos: np.ndarray
    prefix_rows: int
    unit: np.ndarray
    similarity: np.ndarray | None
    cls_similarity: np.ndarray | None
    mosaic: np.ndarray | None
    gap: int
    low: float

    @property
    def has_mosaic(self) -> bool:
        return self.mosaic is not None

    def similarity_to(self, row: int, col: int) -> np.ndarray:
        """(gh, gw) cosine similarity of position (row, col) to every position."""
        if self.similarity is not None:
            return self.similarity[row, col]
        gh, gw = self.grid
        return (self.unit @ self.unit[row * gw + col]).reshape(gh, gw)


def pos_embed_data(pos: np.ndarray, grid: tuple[int, int], prefix_rows: int) -> PosEmbedData:
    """Similarities (and, for grids up to `MOSAIC_MAX_POSITIONS`, the mosaic) of a resampled position embedding
    (the worker calls this, off the GUI thread)."""
    pos = np.asarray(pos, dtype=np.float32).reshape(-1, np.shape(pos)[-1])          # (1, N_pos, D) -> (N_pos, D)
    gh, gw = int(grid[0]), int(grid[1])
    rows = pos[prefix_rows:]
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    unit = (rows / np.where(norms > 0, norms, 1.0)).astype(np.float32)               # (N, D)
    gap = 1
    if gh * gw <= MOSAIC_MAX_POSITIONS:
        cls_sim = analysis.prefix_pos_similarity(pos, grid, prefix_rows).astype(np.float32) if prefix_rows else None
        sim = analysis.pos_embed_similarity(pos, grid, prefix_rows).astype(np.float32)  # (gh, gw, gh, gw)
        return PosEmbedData((gh, gw), pos, prefix_rows, unit, sim, cls_sim, mosaic(sim, False, gap), gap,
                            float(np.nanmin(sim)))
    cls_sim = None  # a large grid: from the unit rows already made, not another float64 copy of the embedding
    if prefix_rows:
        c = pos[0] / max(float(np.linalg.norm(pos[0])), np.finfo(np.float32).tiny)
        cls_sim = (unit @ c.astype(np.float32)).reshape(gh, gw)
    low = float(cls_sim.min()) if cls_sim is not None else 1.0
    picks = np.linspace(0, gh * gw - 1, LEVEL_SAMPLE_ROWS).astype(int)
    for chunk in np.array_split(picks, 4):
        low = min(low, float((unit[chunk] @ unit.T).min()))                          # (16, N) at a time
    return PosEmbedData((gh, gw), pos, prefix_rows, unit, None, cls_sim, None, gap, low)
