"""Compare mode: a second model B beside the loaded one (A), on the same images, linked to the view state.

The work (loading B, running B on the images, matching the heads over the open images, the token features for
CKA) runs in the worker through the request classes here; B itself lives in the worker's `slots` (`B_SLOT`), never
on the GUI thread. `CompareSession` is the small session part that asks for that work (its answers come through
`Session.route`), keeps B's results per image and the `vitviz.core.analyses.compare.CompareView` built over every open image
both models have run; the Compare dock (`vitviz.gui.panels.compare`) only reads `frame_for(state)` from it, which
indexes arrays (microseconds), so switching the linked layer, head or query never waits for the worker.

`export_view` writes the dock's A, B and A − B pictures through `vitviz.batch.compare.compare_pictures`, the
function `vitviz export --compare B` draws with, under the CLI's names: the same bytes for the same image, map,
layer and head (tests/gui/test_compare_window.py).
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, Signal
from PySide6.QtWidgets import QFileDialog, QWidget

from vitviz.core.analyses.compare import CompareFrame, CompareSummary, CompareView
from vitviz.core.analyses.mapkinds import of_source
from vitviz.core.analyses.maps import MapKind, ResultMaps
from vitviz.core.spec import ModelSpec
from vitviz.gui.docks import SideDock, action, ask_then, panel_of, register
from vitviz.gui.protocol import Context, Independent, LetGo, Request, _image_name, held, let_go

B_SLOT = "compare_b"                 # ctx.slots[B_SLOT] = (generation, model B)
FEATURES_SLOT = "compare_features"   # ctx.slots[FEATURES_SLOT] = {(side, who, size, image): FeatureStack}
FEATURES_OWNER_SLOT = "compare_features_a"   # a weak reference to the model A those features are of
COMPARED_SOURCES = of_source("attention")   # the view-state sources a comparison draws: every attention map kind
B_SLOTS = (B_SLOT, FEATURES_SLOT, FEATURES_OWNER_SLOT)    # what a comparison keeps in the worker
HEAD_MODES = {"match": "heads matched by similarity", "index": "heads by index"}


# ------------------------------------------------------------------------------------------------- answers
# An answer holds what the work computed; what was asked (image, generation, ...) is its request's, which the
# answer's handler is given beside it (`Session.route`).

@dataclass(frozen=True)
class LoadedB:
    """Model B has loaded (in the worker's slot) for the comparison its request names."""

    spec: ModelSpec
    device: str


@dataclass(frozen=True, eq=False)
class RanB:
    """The asked image's result by model B (its maps precomputed)."""

    maps: ResultMaps


@dataclass(frozen=True, eq=False)
class ViewBuilt:
    """The comparison over the asked `sources` (every open image both models have run), heads matched over all of
    them, with its per-layer summary (JSD, and CKA when both models' token features could be captured)."""

    view: CompareView
    summary: CompareSummary


@dataclass(frozen=True, eq=False)
class MapsPrepared:
    """The stacks of one more map kind (a query token, rollout...) built in `view`."""

    view: CompareView
    kind: MapKind
    query: int | None


@dataclass(frozen=True)
class BDropped:
    """Model B was let go (its memory freed)."""


# ------------------------------------------------------------------------------------------------ requests
def _model_b(ctx: Context, generation: int) -> Any:
    return held(ctx, B_SLOT, generation, "model B of this comparison is not loaded (it was closed or replaced)")


@dataclass(eq=False)
class LoadB(Independent):
    """Load model B (a checkpoint or a named model, any family and size) into the worker's slot, on A's device."""

    path: str = ""
    overrides: dict[str, Any] = field(default_factory=dict)
    generation: int = 0

    title = "Could not load model B for the comparison"

    def describe(self) -> str:
        return f"Loading model B {self.path}…"

    def name_failure(self, summary: str) -> str:
        return summary if self.path in summary else f"{self.path}: {summary}"

    def __call__(self, ctx: Context) -> LoadedB:
        import vitviz
        from vitviz import catalog

        path = self.path
        if catalog.is_named_model(path):
            path = str(catalog.resolve_named(path, progress=ctx.download_progress(path)))
        device = str(ctx.model.device) if ctx.model is not None else None
        let_go(ctx, *B_SLOTS)                       # the previous B goes first (its memory)
        model = vitviz.load(path, device=device, **{k: v for k, v in self.overrides.items() if v is not None})
        if model.spec.traits.blocks:       # no one token grid across its layers to compare on
            raise vitviz.VitvizError(f"{self.path}: a windowed model ({model.spec.family}) cannot be compared in the "
                                     "window yet; `vitviz export --compare` neither")
        ctx.slots[B_SLOT] = (self.generation, model)
        return LoadedB(model.spec, str(model.device))


@dataclass(eq=False)
class RunB(Request):
    """Run one image through model B (at B's own input size) and precompute its maps."""

    image: str = ""
    generation: int = 0

    title = "Model B could not run the image"
    about_model = False
    needs_model = False

    def describe(self) -> str:
        return f"Running {_image_name(self.image)} through model B…"

    def __call__(self, ctx: Context) -> RanB:
        maps = ResultMaps(_model_b(ctx, self.generation).run(self.image))
        maps.precompute()
        return RanB(maps)


@dataclass(eq=False)
class BuildView(Request):
    """Build the comparison of the images `sources` (A's and B's results, in order): layers by relative depth, heads
    matched over all of them (or by index), and the per-layer JSD and CKA (both models' token features, captured
    here once per image and kept in the worker's slot). A new model A makes it stale."""

    results_a: list[Any] = field(default_factory=list)
    results_b: list[Any] = field(default_factory=list)
    sources: tuple[str, ...] = ()
    heads: str = "match"
    generation: int = 0
    size_a: tuple[int, int] | None = None
    cka: bool = True
    what: MapKind | None = None      # the map shown now, built ahead of the first frame
    query: int | None = None

    title = "Could not compare the models"
    user_code = False

    def describe(self) -> str:
        return f"Matching the heads of A and B over {len(self.sources)} image(s)…"

    def __call__(self, ctx: Context) -> ViewBuilt:
        view = CompareView(self.results_a, self.results_b, heads=self.heads)  # type: ignore[arg-type]
        if self.what is not None:
            view.prepare(self.what, self.query)
        features = self._features(ctx) if self.cka else None
        summary = view.summary(features) if features is not None else view.summary()
        return ViewBuilt(view, summary)

    def _features(self, ctx: Context) -> tuple[list[Any], list[Any]] | None:
        """Both models' raw token features of every image (kept per model and image), or None when a model has no
        feature capture (a model run from its own code): the summary then says CKA is missing."""
        from vitviz.core.analyses.features import FeatureError, capture_features

        model_a, model_b = ctx.model, _model_b(ctx, self.generation)
        if model_a is None:
            return None
        held = ctx.slots.setdefault(FEATURES_SLOT, {})
        owner = ctx.slots.get(FEATURES_OWNER_SLOT)            # the model A the held features are of
        if owner is None or owner() is not model_a:           # another model A since (an id may be reused)
            for key in [k for k in held if k[0] == "a"]:
                del held[key]
            ctx.slots[FEATURES_OWNER_SLOT] = weakref.ref(model_a)
        out: tuple[list[Any], list[Any]] = ([], [])
        try:
            for image in self.sources:
                for side, model, who, size in (("a", model_a, id(model_a), self.size_a),
                                               ("b", model_b, self.generation, None)):
                    key = (side, who, size, image)
                    if key not in held:
                        held[key] = capture_features(model, image, normed=False, image_size=size)
                    out[0 if side == "a" else 1].append(held[key])
        except FeatureError:
            return None
        live = {k[3] for k in held} - set(self.sources)       # images closed since: their features go
        for key in [k for k in held if k[3] in live]:
            del held[key]
        return out


@dataclass(eq=False)
class PrepareMaps(Independent):
    """Build one more map kind's stacks of the comparison (a query token's, the rollout) for every image."""

    view: Any = None
    what: MapKind | None = None
    query: int | None = None

    title = "Could not compare the maps"

    def describe(self) -> str:
        return "Comparing the maps of A and B…"

    def __call__(self, ctx: Context) -> MapsPrepared:
        self.view.prepare(self.what, self.query)
        return MapsPrepared(self.view, self.what, self.query)  # type: ignore[arg-type]


@dataclass(eq=False)
class DropB(LetGo):
    """Let model B and its features go (Close comparison)."""

    answer = BDropped
    slots = B_SLOTS

    def describe(self) -> str:
        return "Closing the comparison…"


REQUESTS = (LoadB, RunB, BuildView, PrepareMaps, DropB)


def compared_kind(state: Any) -> tuple[MapKind, int | None, str]:
    """(the map kind, the query token, a note) a comparison draws for the view state: its attention map, or CLS
    attention with a note for a source a comparison does not draw (class relevance, a pooling head)."""
    from vitviz.gui.state import map_kind

    if state.source not in COMPARED_SOURCES or (state.source == "rollout" and state.rollout_pool):
        return MapKind("cls"), None, (f"the comparison draws attention maps ({', '.join(COMPARED_SOURCES)}); "
                                      f"showing CLS attention instead of {state.source}")
    kind = map_kind(state)
    return kind, kind.token, ""        # a map of one query token (token:N, key:N): B's token by place


# ------------------------------------------------------------------------------------------------- session
class CompareSession(QObject):
    """Model B, its results and the comparison, for the window (see the module docstring).

    `changed` fires whenever what the dock shows may have changed (B loaded, a result or a view arrived, closed);
    `failed(title, summary)` for a failure of the comparison's own work (the dock says it, no dialog)."""

    changed = Signal()
    failed = Signal(str, str)

    def __init__(self, session: Any, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.session = session
        self.client = session.client
        self.generation = 0
        self.active = False
        self.b_path = ""
        self.b_spec: ModelSpec | None = None
        self.b_device = ""
        self.loading = False
        self.heads = "match"
        self.cka = True
        self.results_b: dict[str, ResultMaps] = {}
        self.failed_b: dict[str, str] = {}
        self.view: CompareView | None = None
        self.summary: CompareSummary | None = None
        self.error = ""
        self._building: Request | None = None
        self._dirty = False
        for kind, answer in ((LoadB, self._on_loaded), (RunB, self._on_ran), (BuildView, self._on_built),
                             (PrepareMaps, self._on_prepared), (DropB, lambda _r, _a: None)):
            session.route(kind, answer, self._on_failed)
        session.client.dropped.connect(self._on_dropped)
        session.client.restarted.connect(self._on_restarted)
        session.image_list.result_ready.connect(lambda _path: self.maybe_build())
        session.model.model_loaded.connect(self._on_model_a)
        session.image_list.images_added.connect(lambda _paths: self.run_all())
        session.image_list.images_removed.connect(self._on_removed)
        session.image_list.current_changed.connect(lambda _maps: self._on_current())

    # ------------------------------------------------------------------------------------------ intents
    def open(self, path: str, **overrides: Any) -> None:
        """Compare the loaded model with model B at `path` (a checkpoint, folder or named model): loads it in the
        worker, then runs every open image through it and matches the heads."""
        self._forget()
        self.active, self.loading, self.b_path, self.b_spec, self.error = True, True, str(path), None, ""
        self.client.submit(LoadB, first=True, path=str(path), overrides=dict(overrides), generation=self.generation)
        self.changed.emit()

    def close(self) -> None:
        """Close the comparison: its pending work is cancelled and model B is let go in the worker."""
        if not self.active and not self.loading:
            return
        self._forget()
        self.active, self.loading, self.b_path, self.b_spec, self.error = False, False, "", None, ""
        self.client.submit(DropB, first=True)
        self.changed.emit()

    def set_heads(self, mode: str) -> None:
        """Match the heads by similarity ('match') or pair them by index ('index'); the view is built again."""
        if mode not in HEAD_MODES:
            raise ValueError(f"heads={mode!r}; expected one of {', '.join(HEAD_MODES)}")
        if mode != self.heads:
            self.heads = mode
            self.rematch()

    def rematch(self) -> None:
        """Match the heads again over every open image both models have run (the worker builds a new view)."""
        self.view, self.summary = None, None
        self.maybe_build(force=True)
        self.changed.emit()

    def _forget(self) -> None:
        self.generation += 1
        mine = (LoadB, RunB, BuildView, PrepareMaps)
        self.client.cancel(lambda r: type(r) in mine)
        self.results_b.clear()
        self.failed_b.clear()
        self.view, self.summary, self._building, self._dirty = None, None, None, False

    def run_all(self) -> None:
        """Run every open image through B that it has not run (the current one first)."""
        if not self.active or self.b_spec is None:
            return
        pending = {r.image for r in self.client.pending(RunB)}      # type: ignore[attr-defined]
        current = self.session.image_list.current
        order = ([current] if current else []) + [p for p in self.session.image_list.paths if p != current]
        for path in order:
            if path and path not in self.results_b and path not in self.failed_b and path not in pending:
                self.client.submit(RunB, image=path, generation=self.generation)

    def pairs(self) -> list[str]:
        """The open images both models have a result of now, in the image list's order."""
        return [p for p in self.session.image_list.paths if p in self.results_b and self.session.cached(p) is not None]

    def maybe_build(self, force: bool = False) -> None:
        """Build the comparison over every open image both models have run, when that set has changed (one build at
        a time; a change while one runs builds again after it)."""
        if not self.active or self.b_spec is None or self.a_refused():
            return
        pairs = self.pairs()
        if not pairs:
            return
        if not force and self.view is not None and list(self.view.sources) == pairs:
            return
        if self._building is not None:
            self._dirty = True
            return
        kind, query, _note = compared_kind(self._state) if self._state is not None else (None, None, "")
        s = self.session
        self._building = self.client.submit(
            # the worker builds the view on results of its own (the same captures, fresh map caches): the window's
            # cached ResultMaps are drawn from on this thread and must not be filled from another one
            BuildView, results_a=[s.cached(p).result for p in pairs],
            results_b=[self.results_b[p].result for p in pairs],
            sources=tuple(pairs), heads=self.heads, generation=self.generation, size_a=s.model.image_size, cka=self.cka,
            what=None if kind is None or kind == MapKind("cls") else kind, query=query)

    _state: Any = None

    def bind(self, state: Any) -> None:
        """The view state whose map a new view builds ahead (the dock's)."""
        self._state = state

    def ensure_kind(self, kind: MapKind, query: int | None) -> bool:
        """Whether the view holds this map kind's stacks; if not, ask the worker to build them (answered by
        `changed`). False while it is being built."""
        view = self.view
        if view is None:
            return False
        try:
            if view.has(kind, query):
                return True
        except Exception:  # noqa: BLE001 - a query B has no token for: frame_for says so
            return True
        waiting = [r for r in self.client.pending(PrepareMaps) if r.view is view]    # type: ignore[attr-defined]
        if not any(r.what == kind and r.query == query for r in waiting):           # type: ignore[attr-defined]
            self.client.cancel(lambda r: type(r) is PrepareMaps)
            self.client.submit(PrepareMaps, first=True, view=view, what=kind, query=query)
        return False

    # ------------------------------------------------------------------------------------------ reading
    def a_refused(self) -> str:
        """Why the loaded model A cannot be compared ('' when it can): a windowed model (Swin, SAM) has no one token
        grid across its layers, which the comparison's maps and head matching are drawn on."""
        spec = self.session.model.spec
        if not self.session.model.traits.blocks:     # a plain ViT, or nothing loaded yet
            return ""
        return (f"Model A is a windowed model ({spec.family}): a comparison draws two plain ViTs' attention on one "
                "token grid, which a windowed model's stages do not share (`vitviz export --compare` neither). Load a "
                "plain ViT as model A to compare.")

    def frame_for(self, state: Any) -> tuple[CompareFrame | None, str]:
        """The current image's A, B and A − B maps for the view state's layer, head, map and query, or None and
        what the dock says instead. Only indexes arrays (the maps are built in the worker)."""
        if not self.active:
            return None, "No comparison. Models › Compare with… loads a second model B."
        if refused := self.a_refused():
            return None, refused
        if self.error and self.b_spec is None:
            return None, f"Model B could not be loaded: {self.error}"
        if self.b_spec is None:
            return None, f"Loading model B {Path(self.b_path).name}…"
        path = self.session.image_list.current
        if not path:
            return None, "Open images to compare the models on."
        if path in self.failed_b:
            return None, f"Model B could not run {Path(path).name}: {self.failed_b[path]}"
        view = self.view
        if view is None or path not in view.sources:
            if path not in self.results_b or self.session.cached(path) is None:
                return None, f"Running {Path(path).name} through both models…"
            return None, "Matching the heads of A and B over the open images…"
        kind, query, note = compared_kind(state)
        if not self.ensure_kind(kind, query):
            return None, f"Comparing the {kind.label} maps of A and B…"
        try:
            frame = view.frame(view.sources.index(path), state.layer, state.head, kind, query)
        except Exception as exc:  # noqa: BLE001 - a selection one model cannot show: said in the dock
            return None, str(exc)
        return frame, note

    # ------------------------------------------------------------------------------------------ answers
    def _on_loaded(self, request: LoadB, answer: LoadedB) -> None:
        if request.generation != self.generation:
            return
        self.loading, self.b_spec, self.b_device = False, answer.spec, answer.device
        self.run_all()
        self.changed.emit()

    def _on_ran(self, request: RunB, answer: RanB) -> None:
        if request.generation != self.generation:
            return
        self.results_b[request.image] = answer.maps
        self.maybe_build()
        self.changed.emit()

    def _on_built(self, request: BuildView, answer: ViewBuilt) -> None:
        if request is self._building:
            self._building = None
        if request.generation != self.generation or request.heads != self.heads:
            self.maybe_build()
            return
        self.view, self.summary = answer.view, answer.summary
        if self._dirty:
            self._dirty = False
            self.maybe_build()
        self.changed.emit()

    def _on_prepared(self, _request: Request, answer: MapsPrepared) -> None:
        if answer.view is self.view:
            self.changed.emit()

    def _on_failed(self, request: Request, summary: str, _details: str) -> None:
        if isinstance(request, LoadB):
            if request.generation == self.generation:
                self.loading, self.error = False, summary
        elif isinstance(request, RunB):
            if request.generation == self.generation:
                self.failed_b[request.image] = summary
        elif isinstance(request, BuildView):
            if request is self._building:
                self._building = None
            self.error = summary
        elif isinstance(request, PrepareMaps):
            self.error = summary
        self.failed.emit(request.title, summary)
        self.changed.emit()

    def _on_dropped(self, request: Request | None) -> None:
        if request is not None and request is self._building:     # a new model A made it stale, or cancelled
            self._building = None
            if self._dirty:
                self._dirty = False
                self.maybe_build()

    def _on_restarted(self) -> None:
        """A fresh worker (Stop waiting) holds no model B: the comparison closes, and the status bar says so."""
        if not self.active and not self.loading:
            return
        name = Path(self.b_path).name or self.b_path
        self.close()       # its DropB finds nothing to let go in the fresh worker
        self.session.note.emit(f"The comparison with {name} was closed: the worker was started afresh (Stop "
                               "waiting) and model B went with it — Models › Compare with… opens it again")

    def _on_model_a(self, _spec: Any, _device: str) -> None:
        """Another model A: its results are gone, so is the view (built again as A's results come)."""
        self.view, self.summary = None, None
        if self._building is not None:
            self._building, self._dirty = None, False
        self.changed.emit()

    def _on_removed(self, paths: list[str]) -> None:
        for path in paths:
            self.results_b.pop(path, None)
            self.failed_b.pop(path, None)
        if self.view is not None and set(paths) & set(self.view.sources):
            self.view, self.summary = None, None
            self.maybe_build()
        self.changed.emit()

    def _on_current(self) -> None:
        if self.active:
            self.run_all()
            self.maybe_build()


# -------------------------------------------------------------------------------------------------- export
def export_view(view: CompareView, source: str, state: Any, folder: Path, overwrite: bool = False
                ) -> list[Path]:
    """Write the Compare dock's A, B and A − B pictures of image `source` for the view state's map, layer and head
    into `folder`, exactly as `vitviz export --compare B` writes them (`compare_pictures`, `compare_names`; over the
    region each model saw at the original's resolution, the state's colormap, opacity, smoothing and scale; no
    colorbar). B's picture is left out when A's head has no partner in B. Returns the paths written."""
    from vitviz.batch.compare import Seen, b_selection, compare_names, compare_pictures
    from vitviz.core import files
    from vitviz.core.drawing import render
    from vitviz.gui.exporting import image_stem
    from vitviz.gui.state import render_options

    kind, query, _note = compared_kind(state)
    i = view.sources.index(source)
    pair = view.pair(i, kind, query)
    ma, mb = view.maps_a[i], view.maps_b[i]
    depth = view.spec_a.depth
    layer = state.layer % depth if isinstance(state.layer, int) else state.layer
    head: Any = state.head
    if not kind.per_head:
        head = "mean"
    elif isinstance(head, int):
        head = head % pair.a.num_heads
    b_layer, partner = b_selection(view.comparison, layer, head)
    seen_a = Seen(render.native_view(ma.result), tuple(ma.result.image.shape[:2]), view.spec_a.patch_size)
    seen_b = Seen(render.native_view(mb.result), tuple(mb.result.image.shape[:2]), view.spec_b.patch_size)
    opts = render_options(state, colorbar=False)
    rgbs = compare_pictures(pair.a, pair.b_own, pair.diff, pair.vmax, layer, head, b_layer, partner, seen_a, seen_b,
                            opts)
    names = compare_names(image_stem(source), kind, layer, head, b_layer, partner)
    folder.mkdir(parents=True, exist_ok=True)
    return [files.write_png_atomic(folder / name, rgb, overwrite=overwrite)
            for name, rgb in zip(names, rgbs) if rgb is not None]


def _ask_for_b(window: QWidget) -> str:
    """Model B's checkpoint, asked for with a file dialog ('' when cancelled)."""
    return QFileDialog.getOpenFileName(window, "Compare with model B", "", "Checkpoints (*.pth *.pt *.bin "
                                       "*.safetensors *.ckpt *.npz *.json);;All files (*)")[0]


register(SideDock(
    "compareDock", "Compare", "Compare two models",
    "A, B and A − B linked to the controls, and JSD / CKA per layer (Models › Compare with…)",
    attribute="compare", part=lambda window: CompareSession(window.session, window),
    panel=panel_of("vitviz.gui.panels.compare:ComparePanel"), order=10,
    work=lambda part: bool(part.active), work_changed="changed",
    actions=lambda window, _part: [action(
        window, "&Compare with…", "compare_with", "Load a second model B (any family or size) and compare it with "
        "the loaded one on the open images", ask_then(window, _ask_for_b, window.compare_with))]))
