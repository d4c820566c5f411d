"""The worker's protocol: requests that carry their own work, and their answers (no Qt, no torch at import).

A request is one object made on the GUI thread (`WorkerClient.submit(Run, image=..., image_size=...)`) whose class
says everything about its kind of work: its fields (the arguments), what it answers (`answer`, a frozen dataclass
such as `Ran`, read from the return annotation of its `__call__`), what the status bar says while it runs (`describe`), the title of the dialog when it fails
(`title`), whether it runs the model's own code (`user_code`), whether a new model makes it stale (`about_model`),
and the work itself (`__call__(ctx)`, run by the worker in its thread with `ctx` the worker: its `model`, its
download progress). The worker only calls it; the client sends one `answered(request, answer)` for every kind.
Adding a kind of work is one request class (and its answer) here plus the code that shows its answer.

The on-demand passes of a cached image result (`Relevance`, `Text`, `Features`: `PassRequest`) also say how they
are keyed (`key`: the class, the prompt, nothing), whether a result holds them already (`held`) and how an answer
is kept in it (`keep`, into `vitviz.core.analyses.maps.ResultMaps`), so one `vitviz.gui.passes.PassStore` serves them all.

torch is imported inside the work of each request (in the worker thread), never here, so the window can import
this module before torch is loaded.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, get_type_hints

import numpy as np

from vitviz import catalog
from vitviz.core.analyses.maps import PosEmbedData, ResultMaps
from vitviz.core.spec import AttentionResult, ModelSpec

if TYPE_CHECKING:  # they import torch: the work imports them when it runs, in the worker thread
    from vitviz.core.analyses.features import FeatureStack, PatchSimilarity, PcaResult
    from vitviz.core.analyses.relevance import LeGradMap
    from vitviz.core.analyses.relevance import Relevance as ClassRelevance

NO_MODEL = "no model is loaded; open a checkpoint first (File > Open model)"
HISTOGRAM_BINS = 60      # bins of the token-norm histogram across layers


NamedRow = tuple[str, "str | None", int]      # a named model, its cached file or None, its download size in bytes


@dataclass(frozen=True)
class Probed:
    """The devices this computer offers ('cpu' first), what each is ('cuda' -> 'NVIDIA H200', as torch names
    it) and the torch version running them (with its build suffix, e.g. '2.5.1+cu124')."""

    devices: tuple[str, ...]
    names: tuple[tuple[str, str], ...] = ()
    torch_version: str = ""


@dataclass(frozen=True)
class Loaded:
    """A model has loaded. `counts`: parameters per part (plain ints, so the GUI needs no torch); `refused`: why the
    requested device could not be used and the model went to the CPU ('' when it was used).

    A model run from its own code (the live path, `spec.family == 'live'`) says which mechanism found which
    attention layer (`layers`: (module name, mechanism)) and which attention calls were not self-attention over the
    image tokens (`skipped`: (module name, mechanism, shape)). `interruptible`: a forward pass can stop between
    layers when the window closes (False: a user's module without blocks or attention modules to hook).

    `library_layout`: the family is one whose hyperparameters vitviz has tables for (`families.REGISTERED_FAMILIES`:
    timm, DeiT, HF, ...), not a hand-written or tutorial layout; `described`: (field, sentence) for each of
    `spec.assumptions` (`hyperparams.describe_guess`), so the window needs neither module (they import torch)."""

    spec: ModelSpec
    device: str
    counts: dict[str, int]
    refused: str = ""
    layers: tuple[tuple[str, str], ...] = ()
    skipped: tuple[tuple[str, str, tuple[int, ...]], ...] = ()
    interruptible: bool = True
    library_layout: bool = True
    described: tuple[tuple[str, str], ...] = ()
    capabilities: frozenset[str] = frozenset()   # what the model can do (`vitviz.core.protocol.capabilities_of`)
    own_original: str = ""   # a live model verify can check: its library ('timm'; `verify.own_original`), else ''


@dataclass(frozen=True)
class Ran:
    """One image's result with its CLS and rollout maps and head statistics precomputed; for a windowed model
    (Swin, SAM / ViTDet) a `vitviz.core.analyses.winview.WindowedMaps` with its received stacks, overviews, outlines and
    head statistics."""

    maps: ResultMaps


@dataclass(frozen=True, eq=False)
class RopeKernels:
    """What a RoPE model's rotary position embedding does to attention at `grid` (`vitviz.core.posembed.
    rope_kernel`, computed in the worker): the q·k rotation kernel by 2-D offset, (L', H', 2gh - 1, 2gw - 1),
    entry (dy + gh - 1, dx + gw - 1) the mean cos of the rotation between a query and a key that far apart.
    L' = H' = 1 when every layer and head rotates alike (axial and DINOv3 RoPE: fixed frequencies); RoPE-Mixed
    (learned frequencies) has one kernel per layer and head. Only indexed on the GUI thread."""

    grid: tuple[int, int]
    kernels: np.ndarray
    kind: str

    @property
    def per_head(self) -> bool:
        """Whether the kernel differs per layer and head (learned frequencies)."""
        return self.kernels.shape[0] * self.kernels.shape[1] > 1

    def kernel(self, layer: int | str = 0, head: int | str = "mean") -> np.ndarray:
        """(2gh - 1, 2gw - 1) the kernel of one layer and head; 'mean' (or 'max', which has no meaning for a
        kernel) averages the heads, layer 'mean' the layers."""
        k = self.kernels
        k = k.mean(axis=0) if isinstance(layer, str) else k[min(max(int(layer), -k.shape[0]), k.shape[0] - 1)]
        return k.mean(axis=0) if isinstance(head, str) else k[min(max(int(head), -k.shape[0]), k.shape[0] - 1)]

    def at(self, patch: tuple[int, int], layer: int | str = 0, head: int | str = "mean") -> np.ndarray:
        """(gh, gw) the kernel seen from patch (r, c) (`vitviz.core.posembed.kernel_at`)."""
        from vitviz.core.posembed import kernel_at

        return kernel_at(self.kernel(layer, head), self.grid, patch)


@dataclass(frozen=True)
class PosEmbedded:
    """The position embedding at `grid` (rows, cols) with its similarities; `data` None: the model has no learned
    absolute position embedding. `rope`: the RoPE kernels of a model with rotary positions (None without)."""

    grid: tuple[int, int]
    data: PosEmbedData | None
    rope: RopeKernels | None = None


@dataclass(frozen=True)
class Cataloged:
    """The checkpoints on this computer (a `catalog.ScanResult`: its `skipped` names the folders that could not be
    read) and every named model with its cached file (or None) and its download size in bytes."""

    entries: catalog.ScanResult
    named: tuple[NamedRow, ...]


@dataclass(frozen=True)
class Moved:
    """The model now runs on `device`."""

    device: str


@dataclass(frozen=True, eq=False)
class Explained:
    """The gradient maps of one class of `image` (`vitviz.core.analyses.relevance.class_relevance`): asked for `target`
    (None: the top class; `relevance.target` is the class explained)."""

    image: str
    target: int | None
    relevance: ClassRelevance


@dataclass(frozen=True, eq=False)
class Prompted:
    """LeGrad of a text prompt on `image` (`vitviz.core.analyses.text.prompt_relevance`: its map and per-layer scores)."""

    image: str
    prompt: str
    leg: LeGradMap


@dataclass(frozen=True, eq=False)
class Featured:
    """Every block's output tokens of `image` (raw and after the final norm) with the (L, gh, gw) patch and (L, P)
    prefix output-token norms, and the per-layer histogram of the patch norms on shared bins ((L, bins) counts,
    (bins + 1,) edges)."""

    image: str
    features: FeatureStack
    norms: np.ndarray
    prefix_norms: np.ndarray
    counts: np.ndarray
    edges: np.ndarray


@dataclass(frozen=True, eq=False)
class PcaFitted:
    """Feature PCA of the images `sources` fitted together at block `layer` (colours per image, in order), and the
    feature stacks it was fitted on (`features`, the runs' own objects: a fit of the clean run's features is not
    the intervened run's, though both are of the same images)."""

    sources: tuple[str, ...]
    layer: int
    pca: PcaResult
    features: tuple[FeatureStack, ...]


@dataclass(frozen=True, eq=False)
class Compared:
    """Patch feature similarity at block `layer` within `sources[0]` and to `sources[1]` ('' without a second
    image); `similarity.maps(row, col)` answers a hover in a few milliseconds."""

    sources: tuple[str, str]
    layer: int
    similarity: PatchSimilarity
    features: tuple[FeatureStack, FeatureStack | None]   # the runs' own stacks compared (as `PcaFitted.features`)


@dataclass(frozen=True, eq=False)
class Shared:
    """The patches of `image` whose output-token norm at block `layer` exceeds `threshold` (`mask`, (gh, gw)) and
    the share of attention they receive in every layer and head ((L, H), averaged over all queries)."""

    image: str
    layer: int
    threshold: float
    mask: np.ndarray
    share: np.ndarray
    result: AttentionResult     # the run measured (the clean one's share is not the intervened run's)


@dataclass(frozen=True, eq=False)
class Verified:
    """The loaded model checked against its original (`vitviz.core.analyses.verify.Verification`: `verdict` 'verified',
    'unverified' or 'differs', `summary()`, `first_differing_layer`, `to_dict()`)."""

    verification: Any
    spec: Any = None     # the model's spec with what the check confirmed marked verified (None: unchanged)




class Context(Protocol):
    """What a request's work gets from the worker that runs it (`vitviz.gui.worker.InferenceWorker`)."""

    model: Any      # the loaded model (None before the first load); a load replaces it
    slots: dict[str, Any]   # what requests keep in the worker between requests (a second model, a timeline's store)

    def download_progress(self, name: str) -> Any:
        """The `progress` callback for downloading the named model `name` (stops it when asked to)."""

    def report(self, text: str, fraction: float) -> None:
        """Say how far the running request has got (`fraction` in [0, 1], -1: unknown): the window shows it."""


def held(ctx: Context, slot: str, generation: int, gone: str) -> Any:
    """What `ctx.slots[slot]` holds for `generation` (a comparison's model B, a timeline's store), kept there as
    (generation, value); RuntimeError(`gone`) when it was let go or replaced by a newer one."""
    kept = ctx.slots.get(slot)
    if kept is None or kept[0] != generation:
        raise RuntimeError(gone)
    return kept[1]


def let_go(ctx: Context, *slots: str) -> None:
    """Let what `ctx.slots` keeps under these names go (a comparison's model B and its features, a run's store)."""
    for slot in slots:
        ctx.slots.pop(slot, None)


def _image_name(image: Any) -> str:
    return Path(str(image)).name


@dataclass(eq=False)
class Request:
    """One unit of work. `id` increases with every request (answers to older ids may be stale); the fields of a
    subclass are its arguments (`args`). Requests compare by identity."""

    id: int = field(default=0, kw_only=True)

    answer: ClassVar[type] = object              # what `__call__` returns: read from its annotation (below)
    title: ClassVar[str] = "Could not do that"   # the error dialog's title when it fails
    user_code: ClassVar[bool] = True              # runs the model (and so a live model's own code)
    about_model: ClassVar[bool] = True            # a new model makes it stale
    needs_model: ClassVar[bool] = True
    quiet: ClassVar[bool] = False                 # said where it was asked for: the status bar hears of it only
                                                  # when it runs long (`vitviz.gui.client.QUIET_MS`)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A request's `answer` is the class its own `__call__` says it returns, so the type is named once (a class
        that inherits its work, a `LetGo`, names its answer)."""
        super().__init_subclass__(**kwargs)
        call = cls.__dict__.get("__call__")
        if call is not None and "answer" not in cls.__dict__:
            returned = get_type_hints(call).get("return")
            if isinstance(returned, type) and dataclasses.is_dataclass(returned):    # not `Any` (LetGo's)
                cls.answer = returned

    @classmethod
    def make(cls, **args: Any) -> "Request":
        """The request with these arguments (`WorkerClient.submit(cls, **args)`)."""
        return cls(**args)

    @property
    def kind(self) -> type["Request"]:
        """Its class: `request.kind is Run`."""
        return type(self)

    @property
    def args(self) -> dict[str, Any]:
        """Its arguments by name (every field but `id`)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "id"}

    def describe(self) -> str:
        """What the status bar says while it runs."""
        return "Working…"

    def name_failure(self, summary: str) -> str:
        """The failure's one-line summary as the dialog shows it."""
        return summary

    def __call__(self, ctx: Context) -> Any:
        raise NotImplementedError

    @staticmethod
    def model_of(ctx: Context) -> Any:
        """The loaded model, or a clear error without one."""
        if ctx.model is None:
            raise RuntimeError(NO_MODEL)
        return ctx.model


class Independent(Request):
    """Work that neither runs the loaded model nor belongs to it (the devices, the catalog, a second model, a
    training run): a new model does not make it stale."""

    user_code = False
    about_model = False
    needs_model = False


class LetGo(Independent):
    """Let what a part keeps in the worker go (its `slots`: Close comparison, Close run); its answer is `answer()`,
    a frozen dataclass without fields."""

    slots: ClassVar[tuple[str, ...]] = ()

    def __call__(self, ctx: Context) -> Any:
        let_go(ctx, *self.slots)
        return self.answer()


@dataclass(eq=False)
class Probe(Independent):
    """List the devices (the first request: it imports torch)."""

    title = "Could not start the inference engine"

    def describe(self) -> str:
        return "Looking for devices…"

    def __call__(self, ctx: Context) -> Probed:
        import torch

        from vitviz.core.running.runtime import available_devices

        devices = tuple(available_devices())
        names = [("cpu", "CPU")]
        for device in devices[1:]:
            index = int(device.split(":")[1]) if ":" in device else 0
            names.append((device, str(torch.cuda.get_device_name(index))))
        return Probed(devices, tuple(names), str(torch.__version__))


@dataclass(eq=False)
class Load(Request):
    """Load a checkpoint or a named model (downloaded if needed) on `device`, with `overrides` (heads=, mean=...);
    with code='FILE.py:FACTORY' (asked for by the user), the user's model and its weights `path`."""

    path: str | None = None
    device: str | None = None
    overrides: dict[str, Any] = field(default_factory=dict)

    title = "Could not load model"
    about_model = False   # it is the new model

    @classmethod
    def make(cls, path: str | None = None, device: str | None = None, **overrides: Any) -> "Load":
        return cls(path=path, device=device, overrides=overrides)

    @property
    def args(self) -> dict[str, Any]:
        return {"path": self.path, "device": self.device, **self.overrides}

    @property
    def code(self) -> str:
        return str(self.overrides.get("code") or "")

    def describe(self) -> str:
        if self.code:
            return f"Building the model with {self.code}" + (f" and loading {self.path}" if self.path else "") + "…"
        return f"Loading model {self.path}…"

    def name_failure(self, summary: str) -> str:
        """Names the checkpoint (or model name) it was about, if the summary does not already."""
        subject = self.path or self.code
        return f"{subject}: {summary}" if subject and str(subject) not in summary else summary

    def __call__(self, ctx: Context) -> Loaded:
        """A device that is not available here (or no device at all) is refused and the model loads on the CPU:
        `Loaded.refused` says why ('' when the device was used). A failed load keeps the previous model."""
        import vitviz

        path, device, refused = self.path, self.device, ""
        if device not in (None, "", "auto"):
            from vitviz.core.running.runtime import resolve_device

            try:
                resolve_device(device)
            except (vitviz.DeviceError, RuntimeError, ValueError) as exc:   # no CUDA here, or not a device name
                refused, device = summarize(exc), "cpu"
        if path and catalog.is_named_model(path):
            path = str(catalog.resolve_named(path, progress=ctx.download_progress(path)))
        model = vitviz.load(path or None, device=device,
                            **{k: v for k, v in self.overrides.items() if v is not None})
        ctx.model = model   # replaced only on success: a failed load keeps the previous model
        layers = tuple((str(n), str(m)) for n, m in getattr(model, "layers", None) or ())
        skipped = tuple((str(n), str(m), tuple(int(x) for x in shape))
                        for n, m, shape in getattr(model, "skipped", None) or ())
        from vitviz.core.analyses.verify import own_original
        from vitviz.core.protocol import capabilities_of
        from vitviz.core.reading.families import REGISTERED_FAMILIES

        spec = model.spec    # a `WindowedSpec` for Swin, SAM / ViTDet: stages, heads per stage
        return Loaded(spec, str(model.device), model.parameter_counts(), refused, layers, skipped,
                      bool(model.hook_points()), spec.family.split("-")[0] in REGISTERED_FAMILIES,
                      model.described_assumptions(), frozenset(capabilities_of(model)), own_original(model))


@dataclass(eq=False)
class Run(Request):
    """Run one image at `image_size` (None: the model's) and precompute its maps, off the GUI thread."""

    image: str = ""
    image_size: tuple[int, int] | None = None
    also: tuple[Any, ...] = ()   # map kinds to make here too (the one on show), besides CLS and rollout
    half: bool = False           # keep the maps as float16 (Model settings › Maps in float16)

    title = "Could not run the image"

    def describe(self) -> str:
        size = self.image_size
        return f"Running {_image_name(self.image)}" + (f" at {size[0]}×{size[1]}" if size else "") + "…"

    def __call__(self, ctx: Context) -> Ran:
        model = self.model_of(ctx)
        result = model.run(self.image, image_size=self.image_size, half=self.half)
        from vitviz.core.analyses.winview import holder_of

        maps = holder_of(result)                  # Swin, SAM / ViTDet: per stage, block and window
        for kind in self.also:                    # e.g. the entropy of a ViT-L at 384 px: 0.3 s not on the GUI
            if kind.source == "attention" and maps.has(kind):
                maps.view(kind)
        maps.precompute()
        return Ran(maps)


@dataclass(eq=False)
class PosEmbed(Request):
    """The position embedding resampled to `grid` (None: the model's) with its similarities, and a RoPE model's
    rotation kernels at that grid."""

    grid: tuple[int, int] | None = None

    title = "Could not read the position embedding"

    def describe(self) -> str:
        return "Reading the position embedding…"

    def __call__(self, ctx: Context) -> PosEmbedded:
        from vitviz.core.analyses.maps import pos_embed_data
        from vitviz.core.posembed import rope_kernels

        model = self.model_of(ctx)
        grid = tuple(self.grid) if self.grid else tuple(model.spec.grid)
        pos = model.pos_embed(grid)        # a windowed model's (SAM's) table has no prefix rows
        data = None if pos is None else pos_embed_data(pos, grid, getattr(model.spec, "pos_prefix", 0))
        kernels = rope_kernels(model, grid)
        return PosEmbedded(grid, data, None if kernels is None else RopeKernels(grid, kernels, model.spec.rope))


@dataclass(eq=False)
class Catalog(Independent):
    """The ViT checkpoints on this computer (and the `recent` files), and every named model with its cached file
    and download size."""

    recent: list[str] = field(default_factory=list)

    title = "Could not list the models on this computer"

    def describe(self) -> str:
        return "Looking for ViT checkpoints on this computer…"

    def __call__(self, ctx: Context) -> Cataloged:
        entries = catalog.scan(recent=self.recent)
        named = []
        for name in catalog.named_models():
            cached = catalog.cached_named(name)
            named.append((name, None if cached is None else str(cached), 4 * catalog.lookup_named(name).num_params))
        return Cataloged(entries, tuple(named))


@dataclass(eq=False)
class Move(Request):
    """Move the loaded model to `device`."""

    device: str = "cpu"

    title = "Could not move the model"

    def describe(self) -> str:
        return f"Moving model to {self.device}…"

    def __call__(self, ctx: Context) -> Moved:
        ctx.model = self.model_of(ctx).to(self.device)
        return Moved(str(ctx.model.device))


class PassRequest(Request):
    """An on-demand pass over one cached image result (`vitviz.gui.passes.PassStore`): its `image`, the
    `image_size` it ran at, and a `key` (the class, the prompt; None when the pass has none)."""

    image: str
    redraws: ClassVar[bool] = True   # the current image's maps change when it is answered (`current_changed`)
    intervened: ClassVar[Any] = None   # the intervened run it is made for (`vitviz.gui.interventions.Under`)

    @property
    def key(self) -> Any:
        return None

    @classmethod
    def of(cls, image: str, image_size: tuple[int, int] | None, key: Any) -> "PassRequest":
        """The request for `image` at `image_size` with `key`."""
        raise NotImplementedError

    @staticmethod
    def held(maps: ResultMaps, key: Any) -> bool:
        """Whether `maps` holds this pass's answer for `key` already."""
        raise NotImplementedError

    @staticmethod
    def refused(can: frozenset[str], key: Any) -> str:
        """Why the loaded model (its capabilities `can`) cannot give the pass at all ('' when it can), said without
        asking the worker."""
        return ""

    def keep(self, maps: ResultMaps, answer: Any) -> None:
        """Keep the answer in the image's result."""
        raise NotImplementedError


@dataclass(eq=False)
class Relevance(PassRequest):
    """One class's gradient maps (Chefer relevance, gradient rollout, attention x gradient) of `image`: a forward
    and backward pass of its own (the plain capture is untouched); `target` None: the top class."""

    image: str = ""
    image_size: tuple[int, int] | None = None
    target: int | None = None

    title = "Could not compute the class relevance"

    @property
    def key(self) -> int | None:
        return self.target

    @classmethod
    def of(cls, image: str, image_size: tuple[int, int] | None, key: Any) -> "Relevance":
        return cls(image=image, image_size=image_size, target=key)

    @staticmethod
    def held(maps: ResultMaps, key: Any) -> bool:
        return maps.relevance(key) is not None

    def keep(self, maps: ResultMaps, answer: Explained) -> None:
        maps.add_relevance(answer.relevance, answer.target)

    def describe(self) -> str:
        return f"Class relevance of {_image_name(self.image)}…"

    def __call__(self, ctx: Context) -> Explained:
        from vitviz.core.analyses.relevance import class_relevance

        rel = class_relevance(self.model_of(ctx), self.image, self.target, image_size=self.image_size)
        return Explained(self.image, self.target, rel)


@dataclass(eq=False)
class Text(PassRequest):
    """LeGrad of a text prompt on `image` (the text tower's embedding as the target): a forward and backward
    pass."""

    image: str = ""
    prompt: str = ""
    image_size: tuple[int, int] | None = None

    title = "Could not compute the relevance of the text prompt"

    @property
    def key(self) -> str:
        return self.prompt

    @classmethod
    def of(cls, image: str, image_size: tuple[int, int] | None, key: Any) -> "Text":
        return cls(image=image, prompt=str(key), image_size=image_size)

    @staticmethod
    def held(maps: ResultMaps, key: Any) -> bool:
        return str(key) in maps.texts

    def keep(self, maps: ResultMaps, answer: Prompted) -> None:
        maps.add_text(answer.prompt, answer.leg)

    def describe(self) -> str:
        return f"Relevance of {self.prompt!r} in {_image_name(self.image)}…"

    def __call__(self, ctx: Context) -> Prompted:
        from vitviz.core.analyses.text import prompt_relevance

        leg = prompt_relevance(self.model_of(ctx), self.image, self.prompt, method="legrad",
                               image_size=self.image_size)
        return Prompted(self.image, self.prompt, leg)


LIVE_FEATURES = ("the token features need vitviz's reference ViT; this model runs from its own code, whose block "
                 "outputs are not exposed")


@dataclass(eq=False)
class Features(PassRequest):
    """Every block's output tokens of `image` (a pass of its own) with their norms and the norms' histogram."""

    image: str = ""
    image_size: tuple[int, int] | None = None

    title = "Could not capture the token features"
    redraws = False

    @classmethod
    def of(cls, image: str, image_size: tuple[int, int] | None, key: Any) -> "Features":
        return cls(image=image, image_size=image_size)

    @staticmethod
    def held(maps: ResultMaps, key: Any) -> bool:
        return maps.features is not None

    @staticmethod
    def refused(can: frozenset[str], key: Any) -> str:
        return "" if "features" in can else LIVE_FEATURES

    def keep(self, maps: ResultMaps, answer: Featured) -> None:
        maps.add_features(answer.features, answer.norms, answer.prefix_norms, (answer.counts, answer.edges))

    def describe(self) -> str:
        return f"Token features of {_image_name(self.image)}…"

    def __call__(self, ctx: Context) -> Featured:
        from vitviz.core.analyses.features import capture_features, norm_histogram, prefix_norms, token_norms

        stack = capture_features(self.model_of(ctx), self.image, image_size=self.image_size)
        norms = token_norms(stack)
        counts, edges = norm_histogram(norms, bins=HISTOGRAM_BINS)
        return Featured(self.image, stack, norms, prefix_norms(stack), counts, edges)


class Analysis(Request):
    """An analysis of cached results for the panel that asked (needs no model; a newer one of the same kind
    replaces it)."""

    user_code = False
    needs_model = False


@dataclass(eq=False)
class Pca(Analysis):
    """Feature PCA of the images `sources` (their `features`) fitted together at block `layer`."""

    features: list[Any] = field(default_factory=list)
    sources: tuple[str, ...] = ()
    layer: int = 0
    image_size: tuple[int, int] | None = None

    title = "Could not fit the feature PCA"

    def describe(self) -> str:
        return f"Feature PCA of {len(self.sources)} image(s)…"

    def __call__(self, ctx: Context) -> PcaFitted:
        from vitviz.core.analyses.features import feature_pca

        return PcaFitted(tuple(self.sources), self.layer, feature_pca(list(self.features), self.layer),
                         tuple(self.features))


@dataclass(eq=False)
class Similarity(Analysis):
    """The unit patch features of `a` and `b` (None: no second image) at `layer`, ready for hover queries."""

    a: Any = None
    b: Any = None
    sources: tuple[str, str] = ("", "")
    layer: int = 0
    image_size: tuple[int, int] | None = None

    title = "Could not compare the patch features"

    def describe(self) -> str:
        return "Patch features for the similarity…"

    def __call__(self, ctx: Context) -> Compared:
        from vitviz.core.analyses.features import PatchSimilarity

        return Compared(tuple(self.sources), self.layer,  # type: ignore[arg-type]
                        PatchSimilarity.from_stacks(self.a, self.b, self.layer), (self.a, self.b))


@dataclass(eq=False)
class Share(Analysis):
    """The patches of `image` whose output-token norm at block `layer` exceeds `threshold`, and the share of
    attention they receive in every layer and head."""

    image: str = ""
    result: AttentionResult | None = None
    norms: Any = None
    layer: int = 0
    threshold: float = 0.0
    image_size: tuple[int, int] | None = None

    title = "Could not measure the attention to high-norm tokens"

    def describe(self) -> str:
        return "Attention to the high-norm tokens…"

    def __call__(self, ctx: Context) -> Shared:
        from vitviz.core.analyses.features import attention_share, high_norm_mask

        mask = high_norm_mask(self.norms[self.layer], self.threshold)
        return Shared(self.image, self.layer, float(self.threshold), mask, attention_share(self.result, mask),
                      self.result)


@dataclass(eq=False)
class Verify(Request):
    """Run the loaded model's original (timm, transformers, ..., or the user's `code`) on a probe input and
    compare (`vitviz.core.analyses.verify.verify`); its verdict says whether the maps are the original's. `against`:
    'auto' (the library that names the model), a library, or 'LIBRARY:ARCH' the user chose (Verify against…).
    How far it has got goes to the window as the worker's progress (`Context.report`), when the installed
    `verify` can say so."""

    code: str | None = None
    against: str = "auto"

    title = "Could not check the model against its original"

    def describe(self) -> str:
        return "Checking the model against its original…"

    def __call__(self, ctx: Context) -> Verified:
        from vitviz.core.analyses.verify import apply_verification, remembered_verify

        options: dict[str, Any] = {"progress": lambda fraction, text: ctx.report(str(text), float(fraction))}
        if self.against and self.against != "auto":
            options["against"] = self.against
        model = self.model_of(ctx)
        before = model.spec
        # remembered per file content, settings and versions: the same model opened again is not checked again
        check, _remembered = remembered_verify(model, code=self.code or None, **options)
        apply_verification(model, check)   # what it confirmed is verified, no longer assumed (info, settings, line)
        return Verified(check, model.spec if model.spec is not before else None)


@dataclass(frozen=True)
class Candidates:
    """The library architectures the loaded model could be, shape-matching ones first ('timm:vit_small_patch16_224',
    `vitviz.core.reading.identify.candidate_names`); `available` False when this vitviz cannot list them (then the user
    types a name)."""

    names: tuple[str, ...]
    available: bool = True


@dataclass(eq=False)
class Identify(Request):
    """List the originals the loaded model could be checked against (Verify against…), in the worker: it builds
    nothing, but reads the model's shapes with torch."""

    title = "Could not list the models to verify against"
    user_code = False

    def describe(self) -> str:
        return "Looking for the original implementations this model could be…"

    def __call__(self, ctx: Context) -> Candidates:
        from vitviz.core.reading import identify
        from vitviz.errors import VitvizError

        try:
            found = identify.candidate_names(self.model_of(ctx), progress=lambda f, t: ctx.report(
                f"Looking for this model's architecture: {t}", f))
        except VitvizError:    # the file could not be read again: a name can still be typed
            return Candidates((), available=False)
        return Candidates(tuple(found))


REQUESTS: tuple[type[Request], ...] = (Probe, Load, Run, PosEmbed, Catalog, Move, Relevance, Text, Features, Pca,
                                        Similarity, Share, Verify, Identify)


ANALYSES = (Pca, Similarity, Share)


def summarize(exc: BaseException) -> str:
    """One line for the dialog: the message of a vitviz error, or the type and message of anything else."""
    from vitviz.errors import VitvizError

    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if isinstance(exc, VitvizError):
        return text
    if "out of memory" in text.lower():
        return f"Out of memory: {text}"
    return f"{type(exc).__name__}: {text}"
