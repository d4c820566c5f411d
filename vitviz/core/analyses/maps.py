"""The map engine: every attention map the window shows and `vitviz export` writes, computed once (no Qt here).

A map kind (`MapKind`: CLS attention, attention received averaged or maximised over the patch queries, one token's
attention row, the attention every patch pays to one token (its column), the entropy of each patch's attention row,
or attention rollout with its settings; the table of kinds is `vitviz.core.analyses.mapkinds.KINDS`) becomes a `MapStack`: a (L, H + 2, gh, gw) array holding the H heads
followed by the head mean and the head max for every layer, with the colour scale shared by each kind of column.
Switching layer or head is then an index into that stack, which keeps every panel update inside one frame even
for ViT-L/16 at 384 px. `ResultMaps` holds one image's result and every pass added to it, and caches its stacks:
the window keeps one per image, `vitviz export` makes one per image, `vitviz.show` draws through it and the .npz
writers take its `arrays()`. They select, scale and name a map through the same code here, so the window's export
and the CLI write the same files.

Beyond attention, two families of maps need a pass of their own (`vitviz.core.analyses.relevance`, `vitviz.core.analyses.features`),
made only when such a map is asked for:

- gradient maps of one class (`GRADIENT_KINDS`): 'relevance' (Chefer et al.'s generic relevance), 'gradrollout'
  (vit-explain's gradient rollout) -- one map of the whole model, a stack of one layer and one head, named `Lall`
  -- and 'attngrad' (attention x gradient, signed, per layer and head). `MapKind.target` is the class (None: the
  top class); `relevance_stack` turns a `Relevance` into their stacks and `ResultMaps.add_relevance` keeps it.
- feature maps (`FEATURE_KINDS`): 'norms' (each patch's output-token norm per layer, `norm_stack`) and 'pca' (the
  DINOv2-style PCA colours of a layer: a colour image, drawn by `vitviz.core.drawing.render.draw_colors`, not a heatmap).

Windowed models (Swin, SAM / ViTDet: `vitviz.core.winspec`) attend inside windows, so their maps (`WINDOW_KINDS`) are
made per block from (windows, heads, n, n) attention by `vitviz.core.analyses.winmaps`: 'received' (the attention each
patch receives, stitched from its windows) and 'query' (`query:N`: patch N's attention inside its window, placed
on the grid); 'key' (`key:N`: the attention patch N receives from each query of its window) and rollout within one
grid they share with plain ViTs (the table's `windows`). The other maps of plain ViTs are not defined for them (no
CLS token, no single token grid).

Models that pool with a MAP head (SigLIP, Perception Encoder: `spec.pooling == 'map'`) have no CLS token; their
latent query's attention over the patches (`AttentionResult.pool_attention`) is their "CLS attention". Its maps
(`POOL_KINDS`, `pool_stack`) come from the same forward pass with the head run (logits on): 'pool' (per pooling
head, one map of the whole model: files `{image}_pool_Lall_H{head}.png`) and 'poolrollout' (`--maps rollout:pool`:
the rollout of the pooling query, its fused attention pulled back through the layers like a token's row).
"""
from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, Union

import numpy as np

from vitviz.core.analyses import analysis
from vitviz.core.analyses.mapkinds import KINDS, of_arg, of_source, unavailable
from vitviz.core.analyses.rollout import RolloutEngine, RolloutParams
from vitviz.core.spec import AttentionResult, ModelSpec
from vitviz.errors import VitvizError

if TYPE_CHECKING:  # both import torch; the maps only read their arrays
    from collections.abc import Iterable

    from vitviz.core.analyses.features import FeatureStack, PcaResult
    from vitviz.core.analyses.relevance import LeGradMap, Relevance

LayerSel = Union[int, str]   # a layer index (negative counts from the end), 'mean' over the layers, or 'all' (a
                             # map of the whole model: relevance, gradient rollout)
HeadSel = Union[int, str]    # a head index (negative counts from the end), 'mean' or 'max' over the heads

MAP_KINDS = of_source("attention")          # attention maps: one captured forward pass
GRADIENT_KINDS = of_source("gradients")     # one class's maps: a forward and backward pass
FEATURE_KINDS = of_source("features")       # from the blocks' output tokens: a pass of its own
POOL_KINDS = of_source("pool")              # a MAP head's attention: the forward pass with the head
TEXT_KINDS = of_source("text")              # a text prompt's LeGrad (CLIP / SigLIP text tower)
WINDOW_KINDS = of_source("windows")         # windowed models' maps (vitviz.core.analyses.winmaps)
ALL_KINDS = tuple(KINDS)
WHOLE_MODEL_KINDS = ("relevance", "gradrollout", "pool", "text")  # one map of all layers together: files say `Lall`
POOL_TITLE = KINDS["pool"].title                                      # the titles are the table's
GRADIENT_TITLES = {kind: KINDS[kind].title for kind in GRADIENT_KINDS}
PROMPT_ALIASES = {"prompt": "text"}   # another word a prompt's kind is written with ('prompt:a cat')


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
        kind: a word of the table of map kinds (`vitviz.core.analyses.mapkinds.KINDS`): 'cls' (the CLS token's attention
            over the patches), 'mean' / 'max' (the attention each patch receives, averaged / maximised over the
            patch queries), 'token' (the attention row of `token`), 'entropy' (the entropy of each patch's row),
            'rollout' (attention rollout with the settings `rollout`, from `rollout.query`), one of the gradient
            maps of class `target` ('relevance', 'gradrollout', 'attngrad'), a feature map ('pca', 'norms'), or
            a MAP head's map: 'pool' (its attention over the patches per pooling head) or 'poolrollout' (the
            rollout of its query, with the settings `rollout`; `rollout.query` is not used).
        token: the query token of 'token' (prefix tokens count: token 0 is CLS when the model has one); of
            'query', a windowed model's patch (first-stage grid, row-major).
        rollout: the rollout's settings; only used by 'rollout'.
        target: the class a gradient map explains: an index, a label not yet looked up (`vitviz.batch.plan.
            resolve_targets` turns it into the index), or None for the image's top class.
    """

    kind: str
    token: int | None = None
    rollout: RolloutParams = field(default_factory=RolloutParams)
    target: int | str | None = None

    def __post_init__(self) -> None:
        if self.kind not in ALL_KINDS:
            raise SelectionError(f"map kind {self.kind!r}: expected one of {', '.join(ALL_KINDS)}")
        row = KINDS[self.kind]
        token = row.arg == "token" and not row.optional      # an optional token is the rollout's query
        if token != (self.token is not None):
            raise SelectionError(f"a {self.kind} map {'needs' if token else 'takes no'} query token")
        if row.arg == "prompt" and not (isinstance(self.target, str) and self.target.strip()):
            raise SelectionError(f"a {self.kind} map needs a prompt, e.g. {row.name}:a photo of a cat")
        if self.target is not None and row.arg not in ("class", "prompt"):
            raise SelectionError(f"a {self.kind} map takes no class; only {', '.join(of_arg('class'))} do")

    @classmethod
    def parse(cls, text: str, rollout: RolloutParams | None = None) -> "MapKind":
        """A map name as the table of map kinds writes it (`KindInfo.syntax`, its argument read by `KindInfo.arg`):
        'cls', 'mean', 'max', 'rollout', 'token:N' (the attention row of token N), 'key:N' (the attention paid to
        token N), 'rollout:N' (the rollout of token N), 'entropy', 'relevance', 'gradrollout' or 'attngrad' with an
        optional ':CLASS' (an index or a label; without it the top class), 'pca' or 'norms', 'pool' (a MAP head's
        attention) or 'rollout:pool' (the rollout of the MAP head's query), 'text:PROMPT' or 'prompt:PROMPT'
        (LeGrad of a text prompt, its case kept); `rollout` gives the rollout's other settings."""
        name, colon, value = text.strip().partition(":")
        name = PROMPT_ALIASES.get(name.lower(), name.lower())
        base = rollout or RolloutParams()
        if name == "rollout" and value.strip().lower() == "pool":
            return cls("poolrollout", rollout=RolloutParams(base.fusion, base.discard, base.start, base.residual))
        row = KINDS.get(name) if name in KINDS and KINDS[name].name == name else None
        if row is None:
            raise SelectionError(f"map {text.strip().lower()!r}: expected one of "
                                 f"{', '.join(i.syntax for i in KINDS.values())} (e.g. token:0, key:5, rollout:5, "
                                 "relevance:3, text:a photo of a cat; received and query:N are windowed models' "
                                 "(Swin, SAM))")
        if row.arg == "prompt":
            prompt = " ".join(value.split()) if colon else ""
            return cls(name, target=prompt or None)
        value = value.strip().lower()
        if not colon and row.optional or row.arg == "none" and not colon:
            return cls(name, rollout=base) if name == "rollout" else cls(name)
        if row.arg == "class":
            if not value:
                raise SelectionError(f"map {text.strip().lower()!r}: expected a class index or label after ':' (e.g. "
                                     f"{name}:3), or {name} alone for the top class")
            return cls(name, target=int(value) if value.isdigit() else value)
        if row.arg != "token" or not value.isdigit():
            raise SelectionError(f"map {text.strip().lower()!r}: expected {row.syntax}"
                                 + (" (N a token index, e.g. " + f"{name}:5)" if row.arg == "token" else ""))
        if row.optional:                                         # rollout:N, the rollout from token N
            return cls(name, rollout=RolloutParams(base.fusion, base.discard, base.start, base.residual, int(value)))
        return cls(name, int(value))

    @property
    def label(self) -> str:
        """The map's part of a file name: 'cls', 'mean', 'token17', 'pca', 'norms', 'pool'; a gradient map with its
        class, 'relevance-c3' ('relevance' for the top class); 'query17' (a windowed model's patch 17); for rollout
        'rollout' with the settings that differ from the defaults: 'rollout-token17-max-d0.9-r0.3-from2'
        ('rollout-pool-max' from a MAP head's query); 'key5' (the attention paid to token 5)."""
        if self.token is not None:
            return f"{self.kind}{self.token}"
        if KINDS[self.kind].arg == "prompt":
            from vitviz.core.analyses.text import prompt_label

            return prompt_label(str(self.target))
        if KINDS[self.kind].arg == "class":
            if self.target is None:
                return self.kind
            if isinstance(self.target, int):
                return f"{self.kind}-c{self.target}"
            return f"{self.kind}-{re.sub(r'[^a-z0-9]+', '_', str(self.target).lower()).strip('_')}"
        if self.kind not in ("rollout", "poolrollout"):
            return self.kind
        r, parts = self.rollout, ["rollout"]
        if self.kind == "poolrollout":
            parts.append("pool")
        elif r.query is not None:
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
        """The one attention row this map reads (CLS: 0, token N: N; the table's `reads`), or None when it needs
        more: whole matrices, or a key's column over every query."""
        if KINDS[self.kind].reads != "row" or self.source != "attention":
            return None
        return 0 if self.token is None else self.token

    @property
    def arg(self) -> str:
        """The argument it takes (`vitviz.core.analyses.mapkinds.ARGS`): 'none', 'token', 'class' or 'prompt'."""
        return KINDS[self.kind].arg

    @property
    def query(self) -> int | None:
        """Its token argument, wherever it is kept (`token`, or a rollout's `rollout.query`); None without one."""
        if self.token is not None:
            return self.token
        return self.rollout.query if self.kind == "rollout" else None

    @property
    def source(self) -> str:
        """What the map is made from: 'attention' (the captured forward pass), 'pool' (the same pass with the MAP
        head run: its attention, and all layers' for 'poolrollout'), 'gradients' (a forward and backward pass for
        its class), 'text' (one for its prompt's embedding), 'features' (the blocks' output tokens) or 'windows' (a
        windowed model's captured pass, `vitviz.core.analyses.winmaps`)."""
        return KINDS[self.kind].source

    @property
    def per_layer(self) -> bool:
        """Whether there is a map per layer (False: one map of the whole model, files named `Lall`)."""
        return KINDS[self.kind].per_layer

    @property
    def per_head(self) -> bool:
        """Whether there is a map per head (rollout fuses the heads; relevance, PCA and norms have none; 'pool' has
        one per pooling head)."""
        return KINDS[self.kind].per_head


@dataclass(frozen=True)
class MapStack:
    """Maps for every layer and head of one map kind.

    Attributes:
        maps: (L, H + 2, gh, gw) float32; columns H and H + 1 are the head mean and max. For rollout H is 1; a
            map of the whole model (relevance) is one layer and one head.
        vmax: (3,) the largest value over all layers of the single heads, of the head means and of the head
            maxima: the shared colour scale of a map is 0..vmax of its group, so maps of one kind compare.
        title: what the maps are, for labels.
        vmin: (3,) the bottom of the shared scale of each group for signed maps (attention x gradient:
            -max|x|..max|x|); None: 0.
        pending: the maps are placeholders (zeros) while the real ones are being computed; never drawn into a
            file (`vitviz.core.drawing.render.draw_map` refuses).
    """

    maps: np.ndarray
    vmax: np.ndarray
    title: str
    vmin: np.ndarray | None = None
    pending: bool = False

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
        """The (gh, gw) map of one layer (or the mean over layers) and one head selection; a stack of one layer
        (a map of the whole model) gives its map for any layer, 'all' included."""
        col = self.maps[:, self.column(head)]          # (L, gh, gw)
        if col.shape[0] == 1:
            return col[0]
        if layer in ("mean", "all"):
            return col.mean(axis=0)
        return col[int(resolve_index(layer, col.shape[0]))]

    def scale_max(self, column: int) -> float:
        """Top of the shared colour scale for a column of `maps` (heads, mean or max)."""
        group = min(2, max(0, column - self.num_heads + 1))
        value = float(self.vmax[group])
        return value if value > 0 else 1.0

    def scale_min(self, column: int) -> float:
        """Bottom of the shared colour scale for a column of `maps`: 0, or the group's `vmin` for signed maps."""
        if self.vmin is None:
            return 0.0
        return float(self.vmin[min(2, max(0, column - self.num_heads + 1))])

    def levels(self, values: np.ndarray, head: HeadSel, own: bool) -> tuple[float, float]:
        """Colour range of `values`, a map of this stack's `head` column: its own min..max (`own`), else 0..the
        shared maximum of its kind of column (all single heads of all layers, or all head means, or all maxima;
        -m..m for a signed map)."""
        if own:
            lo, hi = float(values.min()), float(values.max())
            return (lo, hi if hi > lo else lo + 1e-12)
        column = self.column(head)
        return (self.scale_min(column), self.scale_max(column))

    def shared_scaled(self) -> np.ndarray:
        """`maps` on the shared scale of their group, mapped to one 0..1 scale for every column."""
        cols = range(self.maps.shape[1])
        lo = np.array([self.scale_min(c) for c in cols], dtype=np.float32)[None, :, None, None]
        hi = np.array([self.scale_max(c) for c in cols], dtype=np.float32)[None, :, None, None]
        if self.vmin is None:
            return self.maps / hi
        return (self.maps - lo) / np.where(hi > lo, hi - lo, 1.0)


def map_stack(attn: np.ndarray, kind: MapKind, spec: ModelSpec, rows: list[int] | None = None,
              engine: RolloutEngine | None = None) -> MapStack:
    """Every layer's and head's map of one kind for one image.

    'cls' for a model without a CLS token gives the mean over the patch queries ('mean', titled as the fallback).

    Args:
        attn: (L, H, T, T) attention of one image, or (L, H, k, T) holding only the query rows `rows`
            (enough for 'cls' and 'token').
        engine: the image's `RolloutEngine` when one is kept (its caches make other settings cheap; with `rows`,
            one of the layers fused as they were captured).
    """
    if kind.source != "attention":
        raise SelectionError(f"the {kind.label} map is not made from attention: use relevance_stack / norm_stack "
                             "(or ResultMaps.stack once its pass has run)")
    p, (gh, gw) = spec.num_prefix, spec.grid
    has_cls = spec.cls_token and p > 0
    if kind.kind == "token" or (kind.kind == "cls" and has_cls):
        token = 0 if kind.kind == "cls" else min(int(kind.token or 0), attn.shape[-1] - 1)
        data = attn[:, :, token if rows is None else rows.index(token), p:]          # (L, H, N)
        title = "CLS attention" if kind.kind == "cls" else f"attention of token {token}"
    elif kind.kind == "rollout" and (rows is None or engine is not None):   # (an engine of layers fused as captured)
        engine = engine or RolloutEngine(attn, p, spec.cls_token)
        data = engine.through_each_layer(kind.rollout)[:, None, p:]                  # (L, 1, N)
        title = rollout_title(kind.rollout, spec)
    elif rows is not None:   # whole matrices: a key's column holds every query's row
        raise ValueError(f"the {kind.label} map needs whole attention matrices, not rows {rows}")
    elif kind.kind == "key":
        token = min(int(kind.token or 0), attn.shape[-1] - 1)
        data = attn[:, :, p:, token]                                                  # (L, H, N): column N
        title = f"attention paid to token {token}"
    elif kind.kind in ("mean", "max"):
        data = analysis.attention_received(attn, p, kind.kind)                       # (L, H, N) over patch queries
        title = f"{kind.kind} attention received (over the patch queries)"
    elif kind.kind == "entropy":
        data = query_entropy(attn, p)                                                # (L, H, N)
        title = f"attention entropy of each patch's query (nats; at most log {attn.shape[-1]} = " \
                f"{np.log(attn.shape[-1]):.2f})"
    else:
        data = analysis.attention_received(attn, p, "mean")                          # (L, H, N): no CLS token
        title = "mean patch attention (no CLS token)"
    data = np.asarray(data, dtype=np.float32)
    fused = np.concatenate([data, data.mean(1, keepdims=True), data.max(1, keepdims=True)], axis=1)
    maps = fused.reshape(fused.shape[0], fused.shape[1], gh, gw)   # (L, H + 2, N) -> (L, H + 2, gh, gw)
    h = data.shape[1]
    vmax = np.array([maps[:, :h].max(), maps[:, h].max(), maps[:, h + 1].max()], dtype=np.float64)
    vmin = None
    if kind.kind == "entropy":   # it lies near log T almost everywhere: the scale starts at its lowest, not at 0
        vmin = np.array([maps[:, :h].min(), maps[:, h].min(), maps[:, h + 1].min()], dtype=np.float64)
    return MapStack(maps=maps, vmax=vmax, title=title, vmin=vmin)


def query_entropy(attn: np.ndarray, num_prefix: int) -> np.ndarray:
    """(L, H, N) the Shannon entropy in nats of each patch query's attention row (over all T keys; 0 log 0 = 0),
    one layer at a time in float32 so a ViT-L at 384 px needs no float64 copy of its attention."""
    out = np.empty((attn.shape[0], attn.shape[1], attn.shape[2] - num_prefix), dtype=np.float32)
    for layer in range(attn.shape[0]):
        a = np.asarray(attn[layer, :, num_prefix:, :], dtype=np.float32)            # (H, N, T)
        out[layer] = -(a * np.log(np.maximum(a, np.float32(1e-30)))).sum(axis=-1)
    return out


def rollout_title(params: RolloutParams, spec: ModelSpec, who: str = "") -> str:
    """E.g. 'rollout of cls (max, discard 0.9, from layer 2, residual 0.5)'; `who` names the query instead of
    `params.query` (e.g. 'the pooling query')."""
    q = params.query
    if not who:
        who = spec.token_name(q) if q is not None else ("cls" if spec.cls_token and spec.num_prefix else "mean patch")
    knobs = [params.fusion]
    if params.discard > 0:
        knobs.append(f"discard {params.discard:.2f}")
    if params.start > 0:
        knobs.append(f"from layer {params.start}")
    knobs.append(f"residual {params.residual:.2f}")
    return f"rollout of {who} ({', '.join(knobs)})"


def _fused_stack(data: np.ndarray, title: str, signed: bool = False) -> MapStack:
    """A stack from per-head maps (L, H, gh, gw), with the head mean and max appended and the shared scales
    (symmetric about 0 when `signed`)."""
    data = np.asarray(data, dtype=np.float32)
    maps = np.concatenate([data, data.mean(1, keepdims=True), data.max(1, keepdims=True)], axis=1)  # (L, H + 2, ..)
    h = data.shape[1]
    groups = (maps[:, :h], maps[:, h], maps[:, h + 1])
    if not signed:
        return MapStack(maps=maps, vmax=np.array([g.max() for g in groups], dtype=np.float64), title=title)
    vmax = np.array([np.abs(g).max() for g in groups], dtype=np.float64)
    return MapStack(maps=maps, vmax=vmax, title=title, vmin=-vmax)


def pool_vector(pool_attention: np.ndarray, fusion: str) -> np.ndarray:
    """(T,) a MAP head's (H', T) attention with its heads fused like a rollout layer's ('mean', 'max' or 'min'),
    scaled to sum 1: the pooling query's row to roll out."""
    rows = np.asarray(pool_attention, dtype=np.float32)
    v = {"mean": rows.mean, "max": rows.max, "min": rows.min}[fusion](axis=0)
    total = float(v.sum())
    return (v / total if total > 0 else v).astype(np.float32)


def pool_stack(kind: MapKind, pool_attention: np.ndarray | None, spec: ModelSpec, attn: np.ndarray | None = None,
               engine: RolloutEngine | None = None) -> MapStack:
    """The stack of a MAP head's map (`POOL_KINDS`).

    'pool': its attention over the patches per pooling head, one map of the whole model: (1, H' + 2, gh, gw).
    'poolrollout': the pooling query's row (`pool_vector`) pulled back through layers l..start for every layer l,
    as a token's rollout row is (`RolloutEngine.pull`, O(L²·T²)): (L, 3, gh, gw).

    Args:
        pool_attention: (H', T) `AttentionResult.pool_attention` (zeros on prefix tokens the head does not see).
        attn: (L, H, T, T) the image's attention (only for 'poolrollout', unless `engine` is given).

    Raises:
        SelectionError: no pooling attention (the model has no MAP head, or the run stopped before it).
    """
    if kind.kind not in POOL_KINDS:
        raise SelectionError(f"{kind.label} is not a map of a MAP head; expected one of {', '.join(POOL_KINDS)}")
    if pool_attention is None:
        raise SelectionError(f"the {kind.label} map needs a MAP pooling head's attention: this model pools with "
                             f"{spec.pooling!r}" + (" (and the run stopped before the head)"
                                                     if spec.pooling == "map" else "; only SigLIP / PE have one"))
    p, (gh, gw) = spec.num_prefix, spec.grid
    if kind.kind == "pool":
        rows = np.asarray(pool_attention, dtype=np.float32)[:, p:]                  # (H', N)
        return _fused_stack(rows.reshape(1, rows.shape[0], gh, gw), POOL_TITLE)     # (1, H', gh, gw)
    if engine is None:
        if attn is None:
            raise SelectionError("the rollout of the pooling query needs the image's attention")
        engine = RolloutEngine(attn, p, spec.cls_token)
    params = kind.rollout
    v = pool_vector(pool_attention, params.fusion)
    data = np.zeros((engine.depth, engine.num_tokens), dtype=np.float32)
    for end in range(params.start, engine.depth):
        data[end] = engine.pull(v, params, end)
    maps = data[:, p:].reshape(engine.depth, 1, gh, gw)                            # (L, T) -> (L, 1, gh, gw)
    return _fused_stack(maps, rollout_title(params, spec, who="the pooling query"))


def gradient_title(kind: str, target: int | None, spec: ModelSpec) -> str:
    """E.g. "class relevance (Chefer) of 'tabby' (class 281)"."""
    what = GRADIENT_TITLES[kind]
    if target is None:
        return f"{what} of the top class"
    labels = spec.labels
    name = f"'{labels[target]}' (class {target})" if 0 <= target < len(labels) else f"class {target}"
    return f"{what} of {name}"


def relevance_stack(rel: "Relevance", kind: str) -> MapStack:
    """The stack of one gradient map of a `vitviz.core.analyses.relevance.Relevance`: 'relevance' (Chefer) and
    'gradrollout' as one layer and one head (the map of the whole model), 'attngrad' per layer and head on a
    scale symmetric about 0 (it is signed)."""
    if kind not in GRADIENT_KINDS:
        raise SelectionError(f"{kind!r} is not a gradient map; expected one of {', '.join(GRADIENT_KINDS)}")
    title = gradient_title(kind, rel.target, rel.spec)
    if kind == "attngrad":
        return _fused_stack(rel.attn_grad, title, signed=True)                   # (L, H, gh, gw)
    values = rel.chefer if kind == "relevance" else rel.grad_rollout             # (gh, gw)
    return _fused_stack(np.asarray(values)[None, None], title)                   # (1, 1, gh, gw)


def text_stack(leg: "LeGradMap", prompt: str) -> MapStack:
    """The stack of a text prompt's LeGrad map (`vitviz.core.analyses.relevance.LeGradMap`): one layer and one head."""
    return _fused_stack(np.asarray(leg.map, dtype=np.float32)[None, None], f"LeGrad of the prompt {prompt!r}")


def relevance_arrays(kind: MapKind, rel: "Relevance") -> dict[str, np.ndarray]:
    """The .npz arrays of one gradient map, keyed by its label as `vitviz export --npz` keys them: e.g.
    'relevance_c3' (gh, gw) and 'relevance_c3_class' (the class explained); 'attngrad...' is (L, H, gh, gw)."""
    key = kind.label.replace("-", "_")
    values = {"relevance": rel.chefer, "gradrollout": rel.grad_rollout, "attngrad": rel.attn_grad}[kind.kind]
    return {key: np.asarray(values), f"{key}_class": np.array(rel.target)}


def pool_arrays(pool_attention: np.ndarray | None) -> dict[str, np.ndarray]:
    """The .npz array of a MAP head's attention, as `vitviz export --npz` keys it: 'pool_attention' (H', T);
    nothing without one."""
    return {} if pool_attention is None else {"pool_attention": np.asarray(pool_attention, dtype=np.float32)}


def norm_stack(norms: np.ndarray) -> MapStack:
    """The stack of the output-token norms (L, gh, gw) (`vitviz.core.analyses.features.token_norms`): one 'head' per
    layer, on a scale shared by all layers."""
    return _fused_stack(np.asarray(norms)[:, None], "output-token norm")         # (L, gh, gw) -> (L, 1, gh, gw)


def pending_stack(kind: MapKind, grid: tuple[int, int], depth: int, heads: int, title: str = "") -> MapStack:
    """Zeros the shape of `kind`'s stack while its pass runs (`MapStack.pending`), titled so (or `title`: a map
    that will not come, e.g. a MAP head's map of a model without one)."""
    layers = depth if kind.per_layer else 1
    columns = heads if kind.per_head else 1
    what = GRADIENT_TITLES.get(kind.kind, POOL_TITLE if kind.kind == "pool" else kind.kind)
    return MapStack(maps=np.zeros((layers, columns + 2, *grid), dtype=np.float32), vmax=np.zeros(3),
                    title=title or f"{what}: computing…", pending=True)


MAX_ROLLOUT_STACKS = 8


class ImageMaps(Protocol):
    """What every per-image holder answers, whatever lane made it: `ResultMaps` (a plain ViT's result, the live
    path's too) and `vitviz.core.analyses.winview.WindowedMaps` (Swin, SAM / ViTDet). The window's panels, export,
    Compare, the Timeline and `vitviz.show` ask this, never which holder they have.

    `view(kind, layer)` is the one question a panel asks to draw a map: the stack holding layer `layer`'s map (a
    windowed model's: its block's stage), the row to select in it, and the input pixels per cell of its grid (the
    patch size, or the stage's stride); `view_or_pending` a placeholder titled with why where there is none yet
    (or none at all: `unshown`). `outlines(layer)` the geometry of the layer's windows to draw over the map (None:
    no windows), `query_outline(layer, cell)` the window of the query at first-grid cell `cell`; `caption` names
    what a view shows and which of the holder's layers or blocks it is, for a title; `row_blocks(kind, layer)` the block
    each row of the view's stack is where its rows are not the layers themselves (None: row i is layer i);
    `picks(kind)` every (layer, head) it has a map of `kind` at, as export names them; `write_npz` its .npz.
    What a dock asks besides maps: `rollout_depth` the layers (or blocks) a rollout multiplies, `query_count` the
    token indices a query may name, `why_not(what)` why it has no token matrix ('matrix') or no token features
    ('features') (None: it has), `info_rows()` the model-info rows its run adds (a windowed model's stages);
    `title` what every stack's title starts with before its own ('': a clean run; an intervened one's steps)."""

    result: Any
    title: str

    @property
    def grid(self) -> tuple[int, int]: ...

    @property
    def nbytes(self) -> int: ...

    def has(self, kind: MapKind) -> bool: ...

    def unshown(self, kind: MapKind) -> str | None: ...

    def view(self, kind: MapKind | str, layer: LayerSel = -1) -> tuple[MapStack, Any, int]: ...

    def view_or_pending(self, kind: MapKind | str, layer: LayerSel = -1) -> tuple[MapStack, Any, int]: ...

    def outlines(self, layer: Any) -> Any: ...

    def query_outline(self, layer: Any, cell: tuple[int, int]) -> Any: ...

    def row_blocks(self, kind: MapKind, layer: Any) -> list[int] | None: ...

    def heads_of(self, layer: Any) -> int: ...

    def picks(self, kind: MapKind) -> list[tuple[Any, HeadSel]]: ...

    def write_npz(self, path: str | Path, overwrite: bool = False) -> Path: ...

    def caption(self, kind: MapKind, layer: LayerSel, row: Any, stack: MapStack) -> tuple[str, str]: ...

    def resolved(self, kind: MapKind) -> MapKind: ...

    def head_stats(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]: ...

    def stack_or_pending(self, kind: MapKind) -> MapStack: ...

    @property
    def rollout_depth(self) -> int: ...

    @property
    def query_count(self) -> int: ...

    def why_not(self, what: str) -> str | None: ...

    def info_rows(self) -> list[tuple[str, str]]: ...


class MapNotReady(SelectionError):
    """A gradient, text or feature map whose pass has not run for this result yet."""


class ResultMaps:
    """One image's results and every map they give: the one holder the window (one per image, in its cache),
    `vitviz export` (one per image, dropped once written), the notebook API and the .npz writer all use, so what
    the window shows and exports and what the CLI writes cannot drift.

    It holds the captured attention (`result`; export's may be query rows only, `rows`, with a rollout engine of
    the layers fused as they were captured, `rollout`), and the passes run for the
    image as they arrive: the gradient maps per class (`add_relevance`), the LeGrad map per text prompt
    (`add_text`), the token features with their norms (`add_features`) and the feature PCA per layer made from
    them (`pca_at`). `stack(kind)` is the one dispatch from a map kind to its stack, `arrays(kinds)` the one table
    of .npz arrays, `nbytes` counts every holder.

    It may be read from two threads (the window's worker measures a timeline's results while the GUI draws
    them): one lock guards its caches, held while a stack is made, so a reader never sees them change under it.
    """

    title = ""   # what every stack's title starts with before its own ('ablated L1.H3 · ...': an intervened run's)

    def __init__(self, result: AttentionResult, rows: list[int] | None = None,
                 rollout: RolloutEngine | None = None) -> None:
        self.result = result
        self.rows = None if rows is None else list(rows)   # the query rows `result.attentions` holds (None: all)
        self._lock = threading.RLock()
        self._rollout: RolloutEngine | None = rollout   # given: made of the layers fused as captured (export's)
        self._stacks: dict[MapKind, MapStack] = {}
        self._stats: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self._layer_means: dict[HeadSel, np.ndarray] = {}   # head -> (T, T) its mean over layers (`matrix`)
        self._relevance: dict[int | None, Relevance] = {}
        self.texts: dict[str, LeGradMap] = {}               # prompt -> its LeGrad map
        self.features: FeatureStack | None = None
        self.norms: np.ndarray | None = None            # (L, gh, gw) output-token norms, with `features`
        self.prefix_norms: np.ndarray | None = None     # (L, P)
        self.norm_histogram: tuple[np.ndarray, np.ndarray] | None = None   # (L, bins) counts, (bins + 1,) edges
        self._pca: dict[int, PcaResult] = {}

    def __repr__(self) -> str:
        passes = [name for name, held in (("relevance", self._relevance), ("text", self.texts)) if held]
        return f"ResultMaps({self.result!r}{', with ' + ' and '.join(passes) if passes else ''})"

    @property
    def grid(self) -> tuple[int, int]:
        return self.result.grid

    @property
    def rollout(self) -> RolloutEngine:
        """The image's rollout engine (made on first use; its caches make other rollout settings cheap)."""
        if self._rollout is None:
            if self.rows is not None:
                raise MapNotReady(f"the rollout of {self.result.source} needs whole attention matrices; this result "
                                  f"holds query rows {self.rows} only")
            r = self.result
            self._rollout = RolloutEngine(r.attentions, r.num_prefix, r.spec.cls_token)
        return self._rollout

    def __getstate__(self) -> dict[str, object]:
        state = dict(self.__dict__)
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        self._lock = threading.RLock()

    @property
    def nbytes(self) -> int:
        """Memory held by the result, every pass added to it and the caches derived from them."""
        with self._lock:
            return self._nbytes()

    def _nbytes(self) -> int:
        extra = sum(r.attn_grad.nbytes for r in {id(r): r for r in self._relevance.values()}.values())
        extra += sum(np.asarray(leg.map).nbytes + np.asarray(leg.scores).nbytes
                     + np.asarray(getattr(leg, "per_layer", 0)).nbytes for leg in self.texts.values())
        if self.features is not None:
            extra += self.features.raw.nbytes + (0 if self.features.normed is None else self.features.normed.nbytes)
        for held in (self.norms, self.prefix_norms):
            extra += 0 if held is None else held.nbytes
        extra += sum(np.asarray(pca.colors).nbytes + np.asarray(pca.foreground).nbytes for pca in self._pca.values())
        rollout = 0 if self._rollout is None else self._rollout.nbytes
        extra += sum(m.nbytes for m in self._layer_means.values())
        return self.result.nbytes + rollout + sum(s.maps.nbytes for s in self._stacks.values()) + extra

    # ------------------------------------------------------------------ the passes of their own

    def add_relevance(self, rel: Relevance, requested: int | None = None) -> None:
        """Keep the gradient maps of one class, under the class asked for (None: the top class) and the class
        they explain."""
        with self._lock:
            self._relevance[requested] = rel
            self._relevance[rel.target] = rel

    def relevance(self, target: int | None = None) -> Relevance | None:
        """The gradient maps of class `target` (None: the top class), if that pass has run."""
        return self._relevance.get(target)

    def add_text(self, prompt: str, leg: LeGradMap) -> None:
        """Keep the LeGrad map of a text prompt (`vitviz.core.analyses.relevance.LeGradMap`: its map and per-layer
        scores)."""
        with self._lock:
            self.texts[str(prompt)] = leg
            self._stacks.pop(MapKind("text", target=str(prompt)), None)

    def add_features(self, features: FeatureStack, norms: np.ndarray, prefix_norms: np.ndarray,
                     histogram: tuple[np.ndarray, np.ndarray] | None = None) -> None:
        """Keep the image's token features with their (L, gh, gw) patch and (L, P) prefix output-token norms (and
        their per-layer histogram: (L, bins) counts, (bins + 1,) edges)."""
        with self._lock:
            self.features, self.norms, self.prefix_norms = features, norms, prefix_norms
            self.norm_histogram = histogram
            self._stacks.pop(MapKind("norms"), None)
            self._pca.clear()

    def pca_at(self, layer: int) -> PcaResult:
        """The image's feature PCA at block `layer`, fitted on this image alone (made once per layer), as
        `vitviz export --maps pca` draws it.

        Raises:
            MapNotReady: the token features have not been captured for this result."""
        if self.features is None:
            raise MapNotReady(f"the pca map of {self.result.source} needs the token features, which have not been "
                              "captured yet")
        layer = int(layer)
        with self._lock:
            if layer not in self._pca:
                from vitviz.core.analyses.features import feature_pca

                self._pca[layer] = feature_pca(self.features, layer)
            return self._pca[layer]

    # ------------------------------------------------------------------ maps

    def has(self, kind: MapKind) -> bool:
        """Whether `stack(kind)` can be made now (a gradient, text or feature map needs its pass first)."""
        if kind.source == "gradients":
            return kind.target in self._relevance
        if kind.source == "text":
            return str(kind.target) in self.texts
        if kind.source == "features":
            return self.features is not None if kind.kind == "pca" else self.norms is not None
        if kind.source == "pool":
            return self.result.pool_attention is not None
        return kind.source == "attention"

    def stack(self, kind: MapKind | str) -> MapStack:
        """The stack of a map kind (or its `MapKind.parse` text: 'cls', 'rollout', 'token:5', 'relevance:3'...):
        the one dispatch from a kind to its maps.

        Raises:
            MapNotReady: a gradient or text map, or the norms, before their pass has run, or a MAP head's map of a
                result without one ('pca' is a colour image per layer, `pca_at`, not a stack).
        """
        kind = MapKind.parse(kind) if isinstance(kind, str) else kind
        with self._lock:
            return self._stack(kind)

    def _stack(self, kind: MapKind) -> MapStack:
        if kind not in self._stacks:
            if kind.kind == "pca":
                raise MapNotReady("the pca map is a colour image per layer (ResultMaps.pca_at), not a stack")
            if not self.has(kind) and kind.source == "pool":
                raise MapNotReady(f"the {kind.label} map of {self.result.source}: the result has no pooling "
                                  f"attention (the model pools with {self.result.spec.pooling!r})")
            if not self.has(kind):
                raise MapNotReady(f"the {kind.label} map of {self.result.source} has not been computed yet")
            if kind.source == "gradients":
                self._stacks[kind] = relevance_stack(self._relevance[kind.target], kind.kind)  # type: ignore[index]
            elif kind.source == "text":
                self._stacks[kind] = text_stack(self.texts[str(kind.target)], str(kind.target))
            elif kind.kind == "norms":
                self._stacks[kind] = norm_stack(self.norms)  # type: ignore[arg-type]
            elif kind.source == "pool":
                engine = self.rollout if kind.kind == "poolrollout" else None
                self._stacks[kind] = pool_stack(kind, self.result.pool_attention, self.result.spec, engine=engine)
                self._forget_old_rollouts()
            else:
                engine = self.rollout if kind.kind == "rollout" else None
                self._stacks[kind] = map_stack(self.result.attentions, kind, self.result.spec, rows=self.rows,
                                               engine=engine)
                self._forget_old_rollouts()
        return self._stacks[kind]

    def stack_or_pending(self, kind: MapKind) -> MapStack:
        """`stack(kind)`, or while its pass runs a placeholder of zeros of its shape titled so (`MapStack.pending`,
        never exported); a MAP head's map of a model without one is such a placeholder titled with why."""
        if self.has(kind) and kind.kind != "pca":
            return self.stack(kind)
        spec = self.result.spec
        if kind.source == "text":
            return pending_stack(kind, self.grid, 1, 1, title=f"LeGrad of {kind.target!r}: computing…")
        none = (f"no pooling attention: this model pools with {spec.pooling!r} (only MAP-head models, SigLIP and PE, "
                "have one)") if kind.source == "pool" else self.unshown(kind) or ""   # or a windowed model's map
        return pending_stack(kind, self.grid, spec.depth, spec.pool_num_heads or spec.num_heads, title=none)

    def unshown(self, kind: MapKind) -> str | None:
        """Why this result has no map of `kind` whatever its passes (None: it has, or will once its pass has run):
        a windowed model's map (`vitviz.core.analyses.mapkinds.unavailable` of the kind's word; 'cls' without a
        CLS token is the patch mean here, `resolved`)."""
        return unavailable(kind.kind, self.result.spec)

    def view(self, kind: MapKind | str, layer: LayerSel = -1) -> tuple[MapStack, LayerSel, int]:
        """The stack that shows layer `layer`'s map of `kind`, the row to select in it (the layer itself: every
        layer is a row) and the input pixels per cell (the patch size): `ImageMaps.view`."""
        return self.stack(kind), layer, self.result.spec.patch_size

    def view_or_pending(self, kind: MapKind | str, layer: LayerSel = -1) -> tuple[MapStack, LayerSel, int]:
        """`view`, or a placeholder while its pass runs or where this result has none (`stack_or_pending`)."""
        kind = MapKind.parse(kind) if isinstance(kind, str) else kind
        return self.stack_or_pending(kind), layer, self.result.spec.patch_size

    @property
    def rollout_depth(self) -> int:
        """The layers a rollout multiplies (`ImageMaps.rollout_depth`): all of them."""
        return self.rollout.depth

    @property
    def query_count(self) -> int:
        """The token indices a query may name: every token, prefix tokens included (`ImageMaps.query_count`)."""
        return int(self.result.attentions.shape[-1])

    def why_not(self, what: str) -> str | None:
        """None: a plain ViT's result has the token matrix and the token features ('matrix', 'features') a dock
        shows (`ImageMaps.why_not`; the features once their pass has run)."""
        return None

    def info_rows(self) -> list[tuple[str, str]]:
        """No rows beyond the spec's: a plain ViT's layers share one grid (`ImageMaps.info_rows`)."""
        return []

    def outlines(self, layer: LayerSel) -> None:
        """No window outlines: a plain ViT attends over all its tokens (`ImageMaps.outlines`)."""
        return None

    def picks(self, kind: MapKind) -> list[tuple[LayerSel, HeadSel]]:
        """Every (layer, head) this result has a map of `kind` at, as `vitviz export --layers all --which-heads
        all,mean,max` draws them (`ImageMaps.picks`): 'all' for a map of the whole model, head 'mean' only for a
        map without heads."""
        stack = self.stack_or_pending(kind)
        layers: list[LayerSel] = list(range(stack.maps.shape[0])) if kind.per_layer else ["all"]
        heads: list[HeadSel] = [*range(stack.num_heads), "mean", "max"] if kind.per_head else ["mean"]
        return [(layer, head) for layer in layers for head in heads]

    def write_npz(self, path: str | Path, overwrite: bool = False) -> Path:
        """Write the result's arrays and spec with every pass held (`arrays`), as `vitviz export --npz` does
        (`vitviz.core.files.write_npz_atomic`); returns the path written."""
        from vitviz.core import files

        return files.write_npz_atomic(path, self.result, overwrite=overwrite, extra=self.arrays())

    def heads_of(self, layer: LayerSel) -> int:
        """The heads of layer `layer` (every layer has the model's)."""
        return int(self.result.attentions.shape[1])

    def row_blocks(self, kind: MapKind, layer: LayerSel) -> None:
        """None: row i of every view's stack is layer i (`ImageMaps.row_blocks`)."""
        return None

    def query_outline(self, layer: LayerSel, cell: tuple[int, int]) -> None:
        """No query window either (`ImageMaps.query_outline`)."""
        return None

    def caption(self, kind: MapKind, layer: LayerSel, row: LayerSel, stack: MapStack) -> tuple[str, str]:
        """(what the map is, which layer it shows) for a title (`ImageMaps.caption`): 'attention of patch (1, 2)
        (token 5)', 'layer 3' / 'through layer 3' (rollout) / 'all layers' (a map of the whole model)."""
        what = stack.title
        if KINDS[kind.kind].reads == "row" and kind.token is not None:
            what = f"attention of {self.result.spec.token_name(kind.token)} (token {kind.token})"
        if not kind.per_layer:
            return what, "all layers"
        return what, f"through layer {layer}" if kind.kind in ("rollout", "poolrollout") else f"layer {layer}"

    def arrays(self, kinds: "Iterable[MapKind] | None" = None, layers: "Iterable[int] | None" = None
               ) -> dict[str, np.ndarray]:
        """The .npz arrays beyond attention (`vitviz.core.files.write_npz_atomic`'s `extra`), the one table
        export and the window write. For `kinds` (None: every pass held for this result):

        - a gradient map, under its label with the class it explains: 'relevance_c3' (gh, gw) and
          'relevance_c3_class', 'attngrad' (L, H, gh, gw) (`relevance_arrays`; with None, all three maps of every
          class held, the top class as 'relevance', 'gradrollout', 'attngrad');
        - a text prompt's LeGrad map and per-layer scores: 'text_a_cat' (gh, gw), 'text_a_cat_scores' (L,);
        - the feature PCA colours (gh, gw, 3) and foreground (gh, gw) of each layer of `layers` ('pca_L11',
          'pca_foreground_L11'; with None, the layers fitted so far);
        - the output-token norms of every layer ('norms' (L, gh, gw), 'prefix_norms' (L, P));
        - always a MAP head's attention ('pool_attention' (H', T)) when the result has one.

        Raises:
            MapNotReady: a kind asked for whose pass has not run.
        """
        with self._lock:
            return self._arrays(kinds, layers)

    def _arrays(self, kinds: "Iterable[MapKind] | None", layers: "Iterable[int] | None") -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        if kinds is None:
            wanted: list[MapKind] = [MapKind(k, target=t) for t in self._relevance for k in GRADIENT_KINDS]
            wanted += [MapKind("text", target=prompt) for prompt in self.texts]
            wanted += [MapKind("pca")] if self._pca else []
            wanted += [MapKind("norms")] if self.norms is not None else []
            layers = sorted(self._pca) if layers is None else layers
        else:
            wanted = list(kinds)
        for m in wanted:
            if m.source not in ("gradients", "text", "features"):
                continue
            if m.kind != "pca" and not self.has(m):
                raise MapNotReady(f"the {m.label} map of {self.result.source} has not been computed yet")
            if m.source == "gradients":
                out.update(relevance_arrays(m, self._relevance[m.target]))  # type: ignore[index]
            elif m.source == "text":
                leg = self.texts[str(m.target)]
                key = m.label.replace("-", "_")
                out[key], out[f"{key}_scores"] = np.asarray(leg.map), np.asarray(leg.scores)
            elif m.kind == "pca":
                for layer in layers or ():
                    pca = self.pca_at(int(layer))
                    out[f"pca_L{layer}"], out[f"pca_foreground_L{layer}"] = pca.colors[0], pca.foreground[0]
            elif m.kind == "norms":
                assert self.norms is not None and self.prefix_norms is not None
                out["norms"], out["prefix_norms"] = self.norms, self.prefix_norms
        out.update(pool_arrays(self.result.pool_attention))
        return out

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

    def has_matrix(self, layer: LayerSel, head: HeadSel) -> bool:
        """Whether `matrix(layer, head)` is at hand without reducing anything (one head of one layer always is; a
        layer's heads' mean is after `precompute`)."""
        if layer == "mean":
            return head in self._layer_means
        if not isinstance(head, str):
            return True
        engine, depth = self._rollout, self.result.attentions.shape[0]
        return engine is not None and engine.has_fused(head, int(resolve_index(layer, depth)))

    def matrix(self, layer: LayerSel, head: HeadSel) -> np.ndarray:
        """(T, T) float32 attention of a layer (or 'mean' over layers) and a head (or 'mean' / 'max' over heads):
        the attention-matrix view's picture. Read only.

        A layer's fused heads are the rollout engine's (`RolloutEngine.fused_layer`), made once per layer and
        fusion and shared with the rollout: `precompute` (in the worker) makes every layer's mean, so a layer
        change in the view at T = 1370 reads a (T, T) array instead of reducing (H, T, T) on the GUI thread. A
        mean over layers is made once per head and kept. What `has_matrix` says is not at hand yet, the window makes
        off the GUI thread (its attention-matrix view)."""
        attn = self.result.attentions
        if layer != "mean":
            at = int(resolve_index(layer, attn.shape[0]))
            if isinstance(head, str):
                return self.rollout.fused_layer(head, at)
            return np.asarray(attn[at, int(resolve_index(head, attn.shape[1]))], dtype=np.float32)
        with self._lock:
            held = self._layer_means.get(head)
        if held is None:   # reduced outside the lock: the GUI thread's `stack` never waits for a pool thread's mean
            if isinstance(head, str):
                fused = [self.rollout.fused_layer(head, at) for at in range(attn.shape[0])]
                mean = np.mean(fused, axis=0, dtype=np.float32)
            else:
                mean = np.asarray(attn[:, int(resolve_index(head, attn.shape[1]))].mean(axis=0, dtype=np.float32))
            with self._lock:
                held = self._layer_means.setdefault(head, mean)
        return held

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
        keys = [k for k in self._stacks if k.kind in ("rollout", "poolrollout") and k != MapKind("rollout")]
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
