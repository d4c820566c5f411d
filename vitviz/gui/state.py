"""The view state: the single source of truth that every panel binds to, and how it selects from the map engine
(no Qt here).

Panels never talk to each other; they call `ViewState.update(...)` and redraw from the state when it tells them
which fields changed. Keeping it Qt-free makes it testable without a display and keeps the rules (what "mean"
means, how a map name is parsed) in one place. The maps themselves, their colour scales, pictures and file names
come from `vitviz.core` (`maps`, `rollout`, `render`): the functions at the bottom only translate the state into
the engine's terms (`map_kind`, `rollout_params`, `render_options`).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from vitviz.core.drawing.colormaps import available_colormaps
from vitviz.core.analyses.mapkinds import KINDS, WINDOW_UNSHOWN, bare_names, of_arg, unavailable
from vitviz.core.analyses.maps import (GRADIENT_KINDS, MAP_KINDS, WINDOW_KINDS, HeadSel, ImageMaps, LayerSel, MapKind,
                                      MapStack, SelectionError, resolve_index)
from vitviz.core.drawing.render import RenderOptions
from vitviz.core.analyses.rollout import FUSIONS, RolloutParams
from vitviz.core.analyses.tokens import Fusion

__all__ = ["ViewState", "MAP_CHOICES", "COLORMAPS", "HEAD_MODES", "FUSIONS", "ROLLOUT_FIELDS", "RELEVANCE_FIELDS",
           "SOURCES", "RELEVANCE_METHODS", "LayerSel", "HeadSel",
           "resolve_index", "parse_map_arg", "state_for", "parse_head_arg", "parse_layer_arg", "map_kind", "map_label",
           "rollout_params", "stack_for", "current_map", "levels_for", "render_options", "view_of", "QueryScaleRule",
           "QUERY_SCALE_NOTE", "QUERY_SOURCES", "default_source", "query_source",
           "ModelView", "view_for_model"]

SOURCES = MAP_KINDS + ("relevance", "pool") + WINDOW_KINDS   # the image panel's map sources: attention, the
                                              # gradient maps of a class or a prompt, a MAP head's attention (only
                                              # for such models), a windowed model's maps ('received', 'query')
# --map: what each name shows (the table of map kinds: the same words and meanings as `vitviz export --maps`)
MAP_CHOICES = {KINDS[k].syntax: KINDS[k].help for k in KINDS if k not in WINDOW_UNSHOWN}
RELEVANCE_METHODS = {"relevance": "Chefer relevance", "gradrollout": "Gradient rollout",
                     "attngrad": "Attention × gradient"}   # the gradient map kinds (`GRADIENT_KINDS`)
# the sources that show one query token's map (the table's kinds that need a token: 'token', 'key', a windowed
# model's 'query'); a click on a patch picks it (rollout takes one optionally: it starts there)
QUERY_SOURCES = tuple(k for k in of_arg("token") if not KINDS[k].optional and k in SOURCES)
COLORMAPS = available_colormaps()   # the window offers exactly what `vitviz export --cmap` accepts (without '_r')
HEAD_MODES = ("mean", "max")
FEATURES_VIEWS = ("pca", "similarity", "norms")   # the Features dock's views
FEATURES_FIELDS = {"features_view", "features_layer", "features_scope", "features_other", "norm_threshold"}


@dataclass
class ViewState:
    """What the user has chosen to look at.

    Attributes:
        source: 'cls' (CLS attention, or mean attention received when there is no CLS), 'mean' / 'max' (the
            attention each patch receives, averaged / maximised over the patch queries, as `vitviz export --maps
            mean,max`), 'rollout', or 'token' (the attention row of `query`); for a windowed model (Swin, SAM /
            ViTDet) 'received' (the attention each patch receives, stitched from its windows) or 'query' (patch
            `query`'s attention inside its window, `--maps query:N`).
        layer: layer index, or 'mean' over layers; for a windowed model the block's index over all stages.
        head: head index, 'mean' or 'max' over heads.
        query: token index used by the 'token' source (prefix tokens included); None when nothing is selected.
        normalize: stretch each map to its own min..max instead of a scale shared by all layers and heads.
        per_tile: in the overview, scale every thumbnail on its own.
        rollout_fusion, rollout_discard, rollout_start, rollout_residual: the rollout's head fusion ('mean',
            'max', 'min'), discard ratio in [0, 1), first layer and residual weight in [0, 1] (see
            `vitviz.core.analyses.rollout`); they drive the rollout panel, the 'rollout' map source and its export. The
            rollout starts from `query` when one is selected, else from CLS (the mean of the patches without CLS),
            or, with `rollout_pool`, from a MAP head's pooling query (`--maps rollout:pool`).
        matrix_log: show the token matrix on a log scale.
        stats_average: head statistics averaged over every image run so far instead of the current one.
        relevance_method: the gradient map the 'relevance' source shows: 'relevance' (Chefer et al.),
            'gradrollout' (vit-explain's gradient rollout) or 'attngrad' (attention x gradient per layer and head).
        relevance_class: the class it explains; None: the image's top class.
        features_view: the Features dock's view: 'pca', 'similarity' or 'norms'.
        features_layer: the block whose output tokens it uses (negative counts from the end: -1 the last).
        features_scope: the PCA fitted on this 'image' alone or on 'all' open images together.
        features_other: the second image of the patch similarity ('' for none).
        norm_threshold: the output-token norm above which patches are outlined (None: chosen for each model).

    The 'pool' source is a MAP pooling head's attention over the patches, one map of the whole model per pooling
    head (SigLIP, PE; `vitviz export --maps pool`).
    """

    source: str = "cls"
    layer: LayerSel = -1
    head: HeadSel = "mean"
    query: int | None = None
    colormap: str = "viridis"
    opacity: float = 0.6
    smooth: bool = True
    normalize: bool = False
    show_grid: bool = False
    per_tile: bool = False
    rollout_fusion: str = "mean"
    rollout_discard: float = 0.0
    rollout_start: int = 0
    rollout_residual: float = 0.5
    rollout_pool: bool = False
    matrix_log: bool = False
    stats_average: bool = False
    relevance_method: str = "relevance"
    relevance_class: int | None = None
    relevance_prompt: str = ""
    features_view: str = "pca"
    features_layer: int = -1
    features_scope: str = "image"
    features_other: str = ""
    norm_threshold: float | None = None
    _listeners: list[Callable[[set[str]], None]] = field(default_factory=list, repr=False, compare=False)

    def subscribe(self, listener: Callable[[set[str]], None]) -> None:
        """Call `listener(changed_field_names)` after every update that changes something."""
        self._listeners.append(listener)

    def update(self, **values: object) -> set[str]:
        """Set fields, validate them and notify listeners once with the names that really changed."""
        changed: set[str] = set()
        for name, value in values.items():
            if name.startswith("_") or name not in _FIELDS:
                raise AttributeError(f"ViewState has no field {name!r}")
            _validate(name, value)
            if getattr(self, name) != value:
                setattr(self, name, value)
                changed.add(name)
        if changed:
            for listener in list(self._listeners):
                listener(changed)
        return changed

    def snapshot(self) -> dict[str, object]:
        """The public fields as a plain dict (for settings and tests)."""
        return {f: getattr(self, f) for f in _FIELDS}


_FIELDS = tuple(f.name for f in dataclasses.fields(ViewState) if not f.name.startswith("_"))

QUERY_SCALE_NOTE = ("The query token's map is drawn on its own scale (Normalise each map is on); untick it to compare "
                    "with the scale shared by all layers and heads")


class QueryScaleRule:
    """A query token's map is drawn on its own scale: on the scale shared by all layers and heads, one patch's
    attention is often a faint smudge (max 0.0175 on a 0-0.24 scale), because some layer attends to itself far
    more. Entering the query map ('token', or a windowed model's 'query') ticks "Normalise each map" (the colorbar
    says "own scale", the export follows) and says so (`note(QUERY_SCALE_NOTE)`); leaving it unticks it again,
    unless the user changed it in between.

    A listener of `state` (`ViewState.subscribe(rule)`), subscribed before the panels so that they draw with the
    rule applied; `auto_normalized` is its memory: the rule, not the user, ticked the box."""

    QUERY_SOURCES = QUERY_SOURCES

    def __init__(self, state: ViewState, note: Callable[[str], None] = lambda _text: None) -> None:
        self.state, self.note = state, note
        self.auto_normalized = False
        self._applying = False          # its own update: not the user's choice

    def __call__(self, changed: set[str]) -> None:
        s = self.state
        if self._applying:
            return
        if "normalize" in changed:
            self.auto_normalized = False           # the user's own choice from now on
        if "source" not in changed:
            return
        self._applying = True
        try:
            if s.source in self.QUERY_SOURCES and not s.normalize:
                s.update(normalize=True)
                self.auto_normalized = True
                self.note(QUERY_SCALE_NOTE)
            elif s.source not in self.QUERY_SOURCES and self.auto_normalized:
                self.auto_normalized = False
                s.update(normalize=False)
        finally:
            self._applying = False


def _validate(name: str, value: object) -> None:
    ok = True
    if name == "source":
        ok = value in SOURCES
    elif name == "relevance_method":
        ok = value in GRADIENT_KINDS
    elif name == "relevance_class":
        ok = value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 0)
    elif name == "relevance_prompt":
        ok = isinstance(value, str)
    elif name == "layer":
        ok = value == "mean" or (isinstance(value, int) and not isinstance(value, bool))
    elif name == "head":
        ok = value in HEAD_MODES or (isinstance(value, int) and not isinstance(value, bool))
    elif name == "query":
        ok = value is None or (isinstance(value, int) and value >= 0)
    elif name == "colormap":
        ok = value in COLORMAPS
    elif name in ("opacity", "rollout_residual"):
        ok = isinstance(value, (int, float)) and 0.0 <= float(value) <= 1.0
    elif name == "rollout_discard":
        ok = isinstance(value, (int, float)) and 0.0 <= float(value) < 1.0
    elif name == "rollout_fusion":
        ok = value in FUSIONS
    elif name == "rollout_start":
        ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
    elif name == "features_view":
        ok = value in FEATURES_VIEWS
    elif name == "features_layer":
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif name == "features_scope":
        ok = value in ("image", "all")
    elif name == "features_other":
        ok = isinstance(value, str)
    elif name == "norm_threshold":
        ok = value is None or (isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0)
    else:
        ok = isinstance(value, bool)
    if not ok:
        raise ValueError(f"invalid value {value!r} for view field {name!r}")


def parse_map_arg(text: str) -> dict[str, object]:
    """Turn the `--map` argument into state fields: the name is parsed as `vitviz export --maps` parses it
    (`MapKind.parse`, the one parser), then `state_for` turns the map into view state (`MAP_CHOICES` says what each
    shows; the heads are chosen by --head, not by the map).

    Raises:
        ValueError: a name neither parses, or a map the window cannot show yet (`WINDOW_UNSHOWN`, a class label),
            with why.
    """
    try:
        kind = MapKind.parse(text)
    except SelectionError as exc:
        raise ValueError(f"{exc}; the window shows: {', '.join(MAP_CHOICES)}") from None
    return state_for(kind)


def state_for(kind: MapKind) -> dict[str, object]:
    """The view-state fields that show `kind` (the inverse of `map_kind`).

    Raises:
        ValueError: a kind the window cannot show yet, saying why (a gradient map's class given by label: the
            window takes an index; PCA and norms live in the Features dock; a windowed model's maps).
    """
    if kind.kind in WINDOW_UNSHOWN:
        raise ValueError(f"--map {kind.label}: {WINDOW_UNSHOWN[kind.kind]}; the window shows: "
                         f"{', '.join(MAP_CHOICES)}")
    if kind.kind in SOURCES and kind.kind in bare_names():
        return {"source": kind.kind}
    if kind.kind == "poolrollout":
        return {"source": "rollout", "rollout_pool": True}
    if kind.kind == "rollout":
        query = kind.rollout.query
        return {"source": "rollout"} if query is None else {"source": "rollout", "query": int(query)}
    if kind.token is not None:                 # a kind that takes a token: the query token picks it
        return {"source": kind.kind, "query": int(kind.token)}
    if kind.kind == "text":
        return {"source": "relevance", "relevance_prompt": str(kind.target)}
    if kind.kind in GRADIENT_KINDS:
        if isinstance(kind.target, str):
            raise ValueError(f"--map {kind.kind}:{kind.target}: the window takes the class as an index "
                             f"({kind.kind}:3) before the model is loaded, so it cannot look a label up; "
                             f"`vitviz export --maps {kind.kind}:{kind.target}` can, and the window's Relevance panel "
                             "picks a class by name")
        return {"source": "relevance", "relevance_method": kind.kind, "relevance_class": kind.target}
    raise ValueError(f"--map {kind.label}: the window cannot show this map yet; the window shows: "
                     f"{', '.join(MAP_CHOICES)}")


def parse_head_arg(text: str) -> HeadSel:
    """'mean', 'max' or an integer head index (negative counts from the end)."""
    text = text.strip().lower()
    if text in HEAD_MODES:
        return text
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"unknown head {text!r}; expected an integer, 'mean' or 'max'") from None


def parse_layer_arg(text: str) -> LayerSel:
    """'mean' or an integer layer index (negative counts from the end)."""
    text = text.strip().lower()
    if text == "mean":
        return text
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"unknown layer {text!r}; expected an integer or 'mean'") from None


ROLLOUT_FIELDS = {"rollout_fusion", "rollout_discard", "rollout_start", "rollout_residual", "rollout_pool"}
RELEVANCE_FIELDS = {"relevance_method", "relevance_class", "relevance_prompt"}


def rollout_params(state: ViewState) -> RolloutParams:
    """The state's rollout settings, from `query` when one is selected (else CLS, or the patch mean without it)."""
    fusion: Fusion = state.rollout_fusion  # type: ignore[assignment]  # validated against FUSIONS
    return RolloutParams(fusion, float(state.rollout_discard), int(state.rollout_start), float(state.rollout_residual),
                         state.query)


def map_kind(state: ViewState) -> MapKind:
    """The map the state selects; the 'token' source without a query token shows CLS attention; rollout from the
    pooling query with `rollout_pool`."""
    if state.source == "rollout" and state.rollout_pool:
        params = rollout_params(state)
        return MapKind("poolrollout", rollout=RolloutParams(params.fusion, params.discard, params.start,
                                                            params.residual))
    if state.source == "rollout":
        return MapKind("rollout", rollout=rollout_params(state))
    if state.source in QUERY_SOURCES:   # a query token's map; none selected: what its lane shows first
        if state.query is not None:
            return MapKind(state.source, state.query)
        return MapKind("received" if KINDS[state.source].source == "windows" else "cls")
    if state.source == "relevance" and state.relevance_prompt:
        return MapKind("text", target=state.relevance_prompt)
    if state.source == "relevance":
        return MapKind(state.relevance_method, target=state.relevance_class)
    return MapKind(state.source)


def default_source(spec: object, can: frozenset[str] | None = None) -> str:
    """The map a model shows first, and falls back to: CLS attention, or a windowed model's attention received
    (`can`: its capabilities; None: what its spec says)."""
    return next(k for k in ("cls", "received") if unavailable(k, spec, can) is None)  # type: ignore[arg-type]


def query_source(source: str, spec: object, can: frozenset[str] | None = None) -> str:
    """The map a query token picked on the image shows: the current map when it shows one query token's map this
    model gives ('token', 'key', 'query'), else the one this model gives that reads the same of the attention (a
    row: a plain ViT's 'token', a windowed model's 'query'; a column: 'key')."""
    given = [k for k in QUERY_SOURCES if unavailable(k, spec, can) is None]  # type: ignore[arg-type]
    if source in given:
        return source
    reads = KINDS[source].reads if source in KINDS and KINDS[source].arg == "token" else "row"
    return next((k for k in given if KINDS[k].reads == reads), given[0])


@dataclass(frozen=True)
class ModelView:
    """What the view becomes when a model loads (`view_for_model`): the fields to update and what to say."""
    changes: dict[str, object]
    notes: tuple[str, ...] = ()


def view_for_model(state: ViewState, spec: object, can: frozenset[str] | None, previous_depth: int,
                   query: int | None, told: bool = False) -> ModelView:
    """The rules for a newly loaded model, without Qt: a valid layer and head, the query token `query` (already
    followed to the new token layout), and a map this model gives.

    The last layer of the previous model (`previous_depth`) stays the last layer; a windowed model has no mean over
    blocks (its stages' grids differ), so 'mean' becomes its last block, said; a query map follows to this model's
    own query map kind (or its first map without a token); a map this model cannot give falls back to its first
    map, said unless it is only the other lane's (a windowed model's maps for a plain ViT and back) or the command
    line asked for it (`told`: reported there)."""
    notes = []
    source = state.source
    if source in QUERY_SOURCES:
        source = query_source(source, spec, can) if query is not None else default_source(spec, can)
    layer: LayerSel = state.layer
    if isinstance(layer, int) and layer == previous_depth - 1:
        layer = -1     # the last layer of the previous model: the last of this one (not the same index)
    depth = spec.depth  # type: ignore[attr-defined]
    layer = resolve_index(layer, depth)
    traits = spec.traits  # type: ignore[attr-defined]
    if isinstance(layer, str) and not traits.layer_mean:
        layer = depth - 1
        notes.append(f"A windowed model has no mean over blocks (its stages' grids differ): showing the last "
                     f"block ({layer})")
    word = state.relevance_method if source == "relevance" else source
    why = unavailable(word, spec, can)  # type: ignore[arg-type]
    # refused only as the other lane's map (a plain ViT's for blocks over stages, a windowed model's for a plain
    # ViT): switched without a note
    other_lanes = not KINDS[word].windows if traits.blocks else "windowed" in KINDS[word].needs
    if why is not None and not told and not other_lanes:
        notes.append(f"Showing {KINDS[default_source(spec, can)].title}: {why}")
    changes = dict(layer=layer, head=resolve_index(state.head, spec.num_heads),  # type: ignore[attr-defined]
                   query=query, source=default_source(spec, can) if why is not None else source,
                   rollout_pool=state.rollout_pool and not unavailable("poolrollout", spec, can))  # type: ignore
    return ModelView(changes, tuple(notes))


def map_label(state: ViewState) -> str:
    """The current map's part of a file name (`MapKind.label`): 'cls', 'token17', 'rollout-token17-max-d0.9'..."""
    return map_kind(state).label


def view_of(maps: ImageMaps, state: ViewState) -> tuple[MapStack, LayerSel, HeadSel, int]:
    """What a per-image holder shows for the state (`ImageMaps.view_or_pending`): the stack holding the selected
    layer's map (a windowed model's: its block's stage, or the rollout's; a placeholder titled with why where there
    is none), the row to select in it, the head selection clamped to the stack's heads (a windowed stage has as many
    as it has), and the input pixels per cell of its grid."""
    stack, row, stride = maps.view_or_pending(map_kind(state), state.layer)
    head = state.head if isinstance(state.head, str) else resolve_index(state.head, stack.num_heads)
    return stack, row, head, stride


def stack_for(maps: ImageMaps, state: ViewState) -> MapStack:
    """The stack of the map the state selects (`view_of`: while its pass runs, a placeholder of zeros titled so,
    which is never exported)."""
    return view_of(maps, state)[0]


def current_map(maps: ImageMaps, state: ViewState) -> tuple[np.ndarray, MapStack]:
    """The (gh, gw) map the state selects (its layer and head) and the stack it comes from."""
    stack, row, head, _stride = view_of(maps, state)
    return stack.select(row, head), stack


def levels_for(state: ViewState, values: np.ndarray, stack: MapStack) -> tuple[float, float]:
    """Colour-scale range of the current map: its own min..max when normalising, else 0..the shared maximum of
    its kind (all single heads of all layers, or all head means, or all head maxima); `MapStack.levels`."""
    return stack.levels(values, state.head, own=state.normalize)


def render_options(state: ViewState, heatmap_only: bool = False, colorbar: bool = True,
                   label: bool = False) -> RenderOptions:
    """How the state draws a map into an exported picture (over the region of the original the model saw);
    `label` names the colorbar with the map and its scale (`vitviz.core.drawing.render.colorbar_label`)."""
    return RenderOptions(style="heatmap" if heatmap_only else "overlay", cmap=state.colormap,
                         opacity=float(state.opacity), smooth=state.smooth,
                         scale="own" if state.normalize else "shared", colorbar=colorbar, size="original",
                         colorbar_label=label)
