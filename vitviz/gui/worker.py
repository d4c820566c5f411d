"""The inference worker and its protocol: one long-lived QObject in its own QThread that owns the model.

A `Request` names what to do with a `Kind`; the worker answers every request with exactly one `finished` (carrying
the kind's answer dataclass: `Probed`, `Loaded`, `Ran`, `PosEmbedded`, `Cataloged`, `Moved`, `Explained`,
`Featured`, `PcaFitted`, `Compared`, `Shared` or `Verified`), `failed` or `cancelled`. The window never calls the worker
directly: `vitviz.gui.client.WorkerClient` (GUI thread) queues the requests, sends them one at a time through
queued signals and drops stale answers. torch is imported inside the
worker thread only, on the first request, so the window appears before torch is loaded.

A forward pass stops at the next transformer block once the thread is asked to stop (`InterruptHooks`), a download
at its next chunk (`DownloadProgress`); such a request answers `cancelled`, never `failed`.
"""
from __future__ import annotations

import enum
import threading
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Union

import numpy as np
from PySide6.QtCore import QObject, QThread, Signal, Slot

from vitviz import catalog
from vitviz.core.maps import PosEmbedData, ResultMaps
from vitviz.core.spec import AttentionResult, ModelSpec

if TYPE_CHECKING:  # they import torch: the worker imports them when a request needs them, in its thread
    from vitviz.core.features import FeatureStack, PatchSimilarity, PcaResult
    from vitviz.core.relevance import Relevance

NO_MODEL = "no model is loaded; open a checkpoint first (File > Open model)"
HISTOGRAM_BINS = 60      # bins of the token-norm histogram across layers


class Kind(enum.Enum):
    """What a request asks the worker to do; the keyword arguments of each are those of its handler."""

    PROBE = "probe"          # list the devices (the first request: it imports torch)
    LOAD = "load"            # path, device, overrides: load a checkpoint or a named model (downloaded if needed);
                             # with code='FILE.py:FACTORY' (asked for by the user), the user's model and its weights
    RUN = "run"              # image, image_size: run one image and precompute its maps
    POSEMBED = "posembed"    # grid: the position embedding resampled to a grid with its similarities, RoPE kernels
    CATALOG = "catalog"      # recent: the ViT checkpoints on this computer, and the named models
    MOVE = "move"            # device: move the loaded model
    RELEVANCE = "relevance"  # image, image_size, target: one class's gradient maps (a forward and backward pass)
    TEXT = "text"            # image, image_size, prompt: LeGrad of a text prompt (CLIP / SigLIP text tower)
    FEATURES = "features"    # image, image_size: every block's output tokens and their norms (a pass of its own)
    PCA = "pca"              # features, sources, layer, image_size: feature PCA of images fitted together
    SIMILARITY = "similarity"  # a, b, sources, layer, image_size: patch feature similarity, within a and to b
    SHARE = "share"          # image, result, norms, layer, threshold, image_size: attention the high-norm tokens get
    VERIFY = "verify"        # code: the loaded model against its original (`vitviz.core.verify`), on a probe input


@dataclass
class Request:
    """One unit of work: an increasing id (answers to older ids may be stale), what to do and its arguments."""

    id: int
    kind: Kind
    args: dict[str, Any] = field(default_factory=dict)


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

    `library_layout`: the family is one whose hyperparameters vitviz has tables for (`hyperparams.TABLE_FAMILIES`:
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


@dataclass(frozen=True)
class Ran:
    """One image's result with its CLS and rollout maps and head statistics precomputed."""

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
        """(gh, gw) the kernel seen from patch (r, c): entry (i, j) is kernel[i - r + gh - 1, j - c + gw - 1] (as
        `vitviz.core.posembed.kernel_at`, without its torch import)."""
        (gh, gw), (r, c) = self.grid, patch
        return self.kernel(layer, head)[gh - 1 - r: 2 * gh - 1 - r, gw - 1 - c: 2 * gw - 1 - c]


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
    """The gradient maps of one class of `image` (`vitviz.core.relevance.class_relevance`): asked for `target`
    (None: the top class; `relevance.target` is the class explained)."""

    image: str
    target: int | None
    relevance: Relevance


@dataclass(frozen=True, eq=False)
class Prompted:
    """LeGrad of a text prompt on `image` (`vitviz.core.text.prompt_relevance`) as its one-layer stack
    (`vitviz.core.maps.text_stack`)."""

    image: str
    prompt: str
    stack: Any


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
    """Feature PCA of the images `sources` fitted together at block `layer` (colours per image, in order)."""

    sources: tuple[str, ...]
    layer: int
    pca: PcaResult


@dataclass(frozen=True, eq=False)
class Compared:
    """Patch feature similarity at block `layer` within `sources[0]` and to `sources[1]` ('' without a second
    image); `similarity.maps(row, col)` answers a hover in a few milliseconds."""

    sources: tuple[str, str]
    layer: int
    similarity: PatchSimilarity


@dataclass(frozen=True, eq=False)
class Shared:
    """The patches of `image` whose output-token norm at block `layer` exceeds `threshold` (`mask`, (gh, gw)) and
    the share of attention they receive in every layer and head ((L, H), averaged over all queries)."""

    image: str
    layer: int
    threshold: float
    mask: np.ndarray
    share: np.ndarray


@dataclass(frozen=True, eq=False)
class Verified:
    """The loaded model checked against its original (`vitviz.core.verify.Verification`: `verdict` 'verified',
    'unverified' or 'differs', `summary()`, `first_differing_layer`, `to_dict()`)."""

    verification: Any


Answer = Union[Probed, Loaded, Ran, PosEmbedded, Cataloged, Moved, Explained, Prompted, Featured, PcaFitted,
               Compared, Shared, Verified]
ANSWERS: dict[Kind, type] = {Kind.PROBE: Probed, Kind.LOAD: Loaded, Kind.RUN: Ran, Kind.POSEMBED: PosEmbedded,
                             Kind.CATALOG: Cataloged, Kind.MOVE: Moved, Kind.RELEVANCE: Explained, Kind.TEXT: Prompted,
                             Kind.FEATURES: Featured, Kind.PCA: PcaFitted, Kind.SIMILARITY: Compared,
                             Kind.SHARE: Shared, Kind.VERIFY: Verified}


class ForwardInterrupted(Exception):
    """Raised inside a forward pass, before a transformer block, when the worker thread is asked to stop."""


class DownloadCancelled(InterruptedError, ForwardInterrupted):
    """The user cancelled a named model's download: an OSError (so the partial file is removed) that answers the
    request `cancelled`, not `failed`."""


def hook_points(model: Any) -> list[Any]:
    """The modules a forward pass of `model` can be stopped before: its transformer blocks (`model.net.blocks`:
    the reference ViT's, or a user's module's when it has them), else the modules a live model found its attention
    in (`LiveModel.layers`); [] when there are none (no model, or a user's module with neither). Needs no torch."""
    net = getattr(model, "net", None)
    if net is None:
        return []
    blocks = getattr(net, "blocks", None)
    children = getattr(blocks, "children", None)
    points = [b for b in children() if hasattr(b, "register_forward_pre_hook")] if callable(children) else []
    if points:
        return points
    found: dict[int, Any] = {}
    for name, _mechanism in getattr(model, "layers", None) or ():
        try:
            module = net.get_submodule(name) if name else None
        except (AttributeError, TypeError, ValueError):    # a name read from the call stack, not a submodule path
            module = None
        if module is not None and module is not net and hasattr(module, "register_forward_pre_hook"):
            found[id(module)] = module
    return list(found.values())


class InterruptHooks:
    """While open, a forward pre-hook on every transformer block of `model` (`hook_points`: for a user's module
    without blocks, on the modules its attention was found in) raises `ForwardInterrupted` when the current
    thread's interruption has been requested, so a forward pass stops within one block of
    `QThread.requestInterruption`. The hooks are removed on exit, even after a failure.

    `fired` says whether a hook raised: the request was cancelled, whatever the exception became on its way
    out (a live model wraps its module's errors; `is_interruption` follows the chain). A model with no hook points
    (or no model) gets no hooks: its forward pass runs to the end, and closing the window parks the thread until
    it has (`vitviz.gui.client.ParkingLot`). Needs no torch import.
    """

    def __init__(self, model: Any) -> None:
        self.model = model
        self.fired = False
        self._handles: list[Any] = []

    def __enter__(self) -> "InterruptHooks":
        self._handles = [module.register_forward_pre_hook(self._check) for module in hook_points(self.model)]
        return self

    def __exit__(self, *_exc: object) -> None:
        handles, self._handles = self._handles, []
        for handle in handles:
            handle.remove()

    def _check(self, _module: Any, _args: Any) -> None:
        if QThread.currentThread().isInterruptionRequested():
            self.fired = True
            raise ForwardInterrupted("the forward pass was interrupted: vitviz is closing")


def _raise_in_thread(ident: int, exc: type[BaseException] | None) -> None:
    """Raise `exc` in the Python thread `ident` at its next line (None: withdraw one not raised yet)."""
    import ctypes

    if ident:
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident),
                                                   ctypes.py_object(exc) if exc is not None else None)


def is_interruption(exc: BaseException | None) -> bool:
    """Whether `exc`, or an exception it was raised from or while handling, is `ForwardInterrupted`."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, ForwardInterrupted):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False


class InferenceWorker(QObject):
    """Lives in the worker thread; every request is answered with exactly one `finished`, `failed` or `cancelled`.

    Every request runs with `InterruptHooks` on the loaded model, so whatever runs it (a run, or any later
    request that does forward passes) stops within one block when the thread is asked to stop, and answers
    `cancelled` instead of `failed`.
    """

    finished = Signal(int, object)      # request id, the kind's answer (`ANSWERS`)
    failed = Signal(int, str, str)      # request id, one-line summary, details (traceback)
    cancelled = Signal(int)             # request id: it stopped because the thread was asked to (no error)
    started = Signal(int, str)          # request id, what is running
    progress = Signal(int, str, float)  # request id, what is happening, fraction done (-1: unknown)

    def __init__(self) -> None:
        super().__init__()
        self._model: Any = None
        self.running_id = 0
        self.download_cancel = threading.Event()   # set from the GUI thread: stop the running download
        self._running = threading.Lock()           # held by `give_up` and the end of `handle`
        self._in_request = False
        self._ident = 0                            # the worker thread's id, while it runs a request

    def handlers(self) -> dict[Kind, Callable[..., Answer]]:
        """The method that answers each kind (looked up per request, so a replaced method takes effect)."""
        return {Kind.PROBE: self._probe, Kind.LOAD: self._load, Kind.RUN: self._run, Kind.POSEMBED: self._posembed,
                Kind.CATALOG: self._catalog, Kind.MOVE: self._move, Kind.RELEVANCE: self._relevance, Kind.TEXT: self._text,
                Kind.FEATURES: self._features, Kind.PCA: self._pca, Kind.SIMILARITY: self._similarity,
                Kind.SHARE: self._share, Kind.VERIFY: self._verify}

    @Slot(object)
    def handle(self, request: Request) -> None:
        try:
            try:
                with self._running:
                    self._in_request, self._ident = True, threading.get_ident()
                self._handle(request)
            finally:
                with self._running:
                    self._in_request = False
                    _raise_in_thread(self._ident, None)      # a `give_up` that came too late is withdrawn
        except ForwardInterrupted:
            pass        # given up on between the request's end and the lines above: nothing to answer

    def give_up(self) -> None:
        """From the GUI thread, for a worker being abandoned: raise `ForwardInterrupted` in its thread while it runs
        a request, so the user's code that does not finish ends at its next Python line (a call blocked in C
        ends when it returns). Its answer is never delivered (the client has disconnected it)."""
        with self._running:
            if self._in_request and self._ident:
                _raise_in_thread(self._ident, ForwardInterrupted)

    def _handle(self, request: Request) -> None:
        if self.thread().isInterruptionRequested():
            return      # the window has closed: a request that was already on its way is not started
        self.running_id = request.id
        self.started.emit(request.id, describe(request))
        hooks = InterruptHooks(self._model)
        try:
            with hooks:
                answer = self.handlers()[request.kind](**request.args)
        except Exception as exc:  # noqa: BLE001 - the boundary: every failure becomes a dialog in the window
            if hooks.fired or is_interruption(exc):
                self.cancelled.emit(request.id)
            else:
                self.failed.emit(request.id, named(request, summarize(exc)), traceback.format_exc())
        else:
            self.finished.emit(request.id, answer)

    @Slot()
    def release(self) -> None:
        """Drop the model (its memory goes now, not whenever the last Python reference does)."""
        self._model = None

    def _probe(self) -> Probed:
        import torch

        from vitviz.core.runtime import available_devices

        devices = tuple(available_devices())
        names = [("cpu", "CPU")]
        for device in devices[1:]:
            index = int(device.split(":")[1]) if ":" in device else 0
            names.append((device, str(torch.cuda.get_device_name(index))))
        return Probed(devices, tuple(names), str(torch.__version__))

    def _load(self, path: str | None, device: str | None = None, **overrides: Any) -> Loaded:
        """Load a checkpoint; a named model (`torchvision:vit_b_16`) is first found in the torch hub cache or
        downloaded there, with progress reported. A device that is not available here (or no device at all) is
        refused and the model loads on the CPU: `Loaded.refused` says why ('' when the device was used).

        `code='FILE.py:FACTORY'` runs that file's code to build the model (the window asks the user first), with
        `path` its weights file or None."""
        import vitviz

        refused = ""
        if device not in (None, "", "auto"):
            from vitviz.core.runtime import resolve_device

            try:
                resolve_device(device)
            except (vitviz.DeviceError, RuntimeError, ValueError) as exc:   # no CUDA here, or not a device name
                refused, device = summarize(exc), "cpu"
        if path and catalog.is_named_model(path):
            self.download_cancel.clear()
            path = str(catalog.resolve_named(path, progress=DownloadProgress(self, path)))
        model = vitviz.load(path or None, device=device, **{k: v for k, v in overrides.items() if v is not None})
        if getattr(model, "windowed", False):   # Swin, SAM / ViTDet: a result of its own the views cannot show yet
            raise vitviz.VitvizError(
                f"{path}: a windowed model ({model.spec.family}; attention per window and stage) opened correctly, "
                "but the window's views of windowed attention are not ready yet; use `vitviz info` and `vitviz "
                "export --maps received,query:N` for its maps. The model loaded before is still open")
        self._model = model   # replaced only on success: a failed load keeps the previous model
        layers = tuple((str(n), str(m)) for n, m in getattr(model, "layers", None) or ())
        skipped = tuple((str(n), str(m), tuple(int(x) for x in shape))
                        for n, m, shape in getattr(model, "skipped", None) or ())
        from vitviz.core.hyperparams import TABLE_FAMILIES, describe_guess

        spec = model.spec
        described = tuple((name, describe_guess(spec, name)) for name, _source in spec.assumptions)
        return Loaded(spec, str(model.device), parameter_counts(model.net), refused, layers, skipped,
                      bool(hook_points(model)), spec.family.split("-")[0] in TABLE_FAMILIES, described)

    def _run(self, image: str, image_size: tuple[int, int] | None = None) -> Ran:
        """Run one image and precompute its CLS and rollout maps here, off the GUI thread."""
        if self._model is None:
            raise RuntimeError(NO_MODEL)
        maps = ResultMaps(self._model.run(image, image_size=image_size))
        maps.precompute()
        return Ran(maps)

    def _posembed(self, grid: tuple[int, int] | None = None) -> PosEmbedded:
        """The position embedding resampled to `grid` (default: the model's) with its similarities, and a RoPE
        model's rotation kernels at that grid."""
        if self._model is None:
            raise RuntimeError(NO_MODEL)
        from vitviz.core.maps import pos_embed_data

        grid = tuple(grid) if grid else tuple(self._model.spec.grid)
        pos = self._model.pos_embed(grid)
        data = None if pos is None else pos_embed_data(pos, grid, self._model.spec.pos_prefix)
        return PosEmbedded(grid, data, rope_kernels(self._model, grid))

    def _catalog(self, recent: list[str]) -> Cataloged:
        """The ViT checkpoints on this computer and every named model with its cached file and download size."""
        entries = catalog.scan(recent=recent)
        named = []
        for name in catalog.named_models():
            cached = catalog.cached_named(name)
            named.append((name, None if cached is None else str(cached), 4 * catalog.lookup_named(name).num_params))
        return Cataloged(entries, tuple(named))

    def _move(self, device: str) -> Moved:
        if self._model is None:
            raise RuntimeError(NO_MODEL)
        self._model = self._model.to(device)
        return Moved(str(self._model.device))

    def _relevance(self, image: str, image_size: tuple[int, int] | None = None,
                   target: int | None = None) -> Explained:
        """One class's Chefer relevance, gradient rollout and attention x gradient: a forward and backward pass
        of its own (the plain capture is untouched)."""
        if self._model is None:
            raise RuntimeError(NO_MODEL)
        from vitviz.core.relevance import class_relevance

        return Explained(image, target, class_relevance(self._model, image, target, image_size=image_size))

    def _text(self, image: str, prompt: str, image_size: tuple[int, int] | None = None) -> Prompted:
        """LeGrad of a text prompt (the text tower's embedding as the target): a forward and backward pass."""
        if self._model is None:
            raise RuntimeError(NO_MODEL)
        from vitviz.core.maps import text_stack
        from vitviz.core.text import prompt_relevance

        leg = prompt_relevance(self._model, image, prompt, method="legrad", image_size=image_size)
        return Prompted(image, prompt, text_stack(leg, prompt))

    def _features(self, image: str, image_size: tuple[int, int] | None = None) -> Featured:
        """Every block's output tokens (a pass of its own) and their norms."""
        if self._model is None:
            raise RuntimeError(NO_MODEL)
        from vitviz.core.features import capture_features, norm_histogram, prefix_norms, token_norms

        stack = capture_features(self._model, image, image_size=image_size)
        norms = token_norms(stack)
        counts, edges = norm_histogram(norms, bins=HISTOGRAM_BINS)
        return Featured(image, stack, norms, prefix_norms(stack), counts, edges)

    def _pca(self, features: list[FeatureStack], sources: tuple[str, ...], layer: int,
             image_size: tuple[int, int] | None = None) -> PcaFitted:
        """Feature PCA of `features` fitted together (needs no model)."""
        from vitviz.core.features import feature_pca

        return PcaFitted(tuple(sources), layer, feature_pca(list(features), layer))

    def _similarity(self, a: FeatureStack, b: FeatureStack | None, sources: tuple[str, str], layer: int,
                    image_size: tuple[int, int] | None = None) -> Compared:
        """The unit patch features of `a` and `b` at `layer`, ready for hover queries (needs no model)."""
        from vitviz.core.features import PatchSimilarity

        return Compared(tuple(sources), layer, PatchSimilarity.from_stacks(a, b, layer))  # type: ignore[arg-type]

    def _share(self, image: str, result: AttentionResult, norms: np.ndarray, layer: int, threshold: float,
               image_size: tuple[int, int] | None = None) -> Shared:
        """The high-norm patches at `layer` and the share of attention they receive (needs no model)."""
        from vitviz.core.features import attention_share, high_norm_mask

        mask = high_norm_mask(norms[layer], threshold)
        return Shared(image, layer, float(threshold), mask, attention_share(result, mask))

    def _verify(self, code: str | None = None) -> Verified:
        """Run the loaded model's original (timm, transformers, ..., or the user's `code`) on a probe input and
        compare (`vitviz.core.verify.verify`); its verdict says whether the maps are the original's."""
        if self._model is None:
            raise RuntimeError(NO_MODEL)
        from vitviz.core.verify import verify

        return Verified(verify(self._model, code=code or None))


class DownloadProgress:
    """The `progress` callback of a named-model download: one signal per percent (per MB without a size)."""

    def __init__(self, worker: InferenceWorker, name: str) -> None:
        self.worker, self.name, self._last = worker, name, -1

    def __call__(self, done: int, total: int | None) -> None:
        step = int(100 * done / total) if total else done >> 20
        if self.worker.thread().isInterruptionRequested():
            # vitviz is closing: stop at this chunk (an OSError, so the partial file is removed)
            raise InterruptedError(f"download of {self.name} cancelled")
        if self.worker.download_cancel.is_set():   # the status bar's Cancel
            raise DownloadCancelled(f"download of {self.name} cancelled")
        if step == self._last:
            return
        self._last = step
        size = catalog.format_size
        if total:
            text = f"Downloading {self.name}: {step}% ({size(done)} of {size(total)})…"
        else:
            text = f"Downloading {self.name}: {size(done)}…"
        self.worker.progress.emit(self.worker.running_id, text, done / total if total else -1.0)


def rope_kernels(model: Any, grid: tuple[int, int]) -> RopeKernels | None:
    """The RoPE kernels of `model` at `grid` (None for a model without RoPE): one for axial and DINOv3 RoPE, one
    per layer and head for RoPE-Mixed. Runs torch: worker thread only."""
    spec = model.spec
    if not spec.rope:
        return None
    from vitviz.core.posembed import rope_kernel

    if spec.rope != "mixed":
        return RopeKernels(grid, rope_kernel(model, grid)[None, None], spec.rope)   # (1, 1, 2gh-1, 2gw-1)
    kernels = np.stack([np.stack([rope_kernel(model, grid, head=h, layer=layer) for h in range(spec.num_heads)])
                        for layer in range(spec.depth)])                          # (L, H, 2gh-1, 2gw-1)
    return RopeKernels(grid, kernels.astype(np.float32), spec.rope)


PARAM_PARTS = (("patch embedding", ("patch_embed.",)), ("position embedding", ("pos_embed",)),
               ("prefix tokens", ("cls_token", "dist_token", "reg_token")), ("blocks", ("blocks.",)),
               ("final norm", ("norm.", "fc_norm.")), ("head", ("head", "pre_logits")))


def parameter_counts(net: Any) -> dict[str, int]:
    """Parameters per part of the reference ViT, by name prefix (plain ints, so the GUI needs no torch)."""
    counts = {name: 0 for name, _ in PARAM_PARTS}
    counts["other"] = 0
    for key, param in net.named_parameters():
        part = next((name for name, prefixes in PARAM_PARTS if key.startswith(prefixes)), "other")
        counts[part] += int(param.numel())
    return {k: v for k, v in counts.items() if v or k != "other"}


def _describe_load(args: dict[str, Any]) -> str:
    path, code = args.get("path"), args.get("code")
    if code:
        return f"Building the model with {code}" + (f" and loading {path}" if path else "") + "…"
    return f"Loading model {path}…"


def _describe_run(args: dict[str, Any]) -> str:
    size = args.get("image_size")
    return f"Running {Path(str(args.get('image'))).name}" + (f" at {size[0]}×{size[1]}" if size else "") + "…"


DESCRIPTIONS: dict[Kind, Callable[[dict[str, Any]], str]] = {
    Kind.PROBE: lambda _a: "Looking for devices…",
    Kind.LOAD: _describe_load,
    Kind.RUN: _describe_run,
    Kind.POSEMBED: lambda _a: "Reading the position embedding…",
    Kind.CATALOG: lambda _a: "Looking for ViT checkpoints on this computer…",
    Kind.MOVE: lambda a: f"Moving model to {a.get('device')}…",
    Kind.RELEVANCE: lambda a: f"Class relevance of {Path(str(a.get('image'))).name}…",
    Kind.TEXT: lambda a: f"Relevance of {a.get('prompt')!r} in {Path(str(a.get('image'))).name}…",
    Kind.FEATURES: lambda a: f"Token features of {Path(str(a.get('image'))).name}…",
    Kind.PCA: lambda a: f"Feature PCA of {len(a.get('sources', ()))} image(s)…",
    Kind.SIMILARITY: lambda _a: "Patch features for the similarity…",
    Kind.SHARE: lambda _a: "Attention to the high-norm tokens…",
    Kind.VERIFY: lambda _a: "Checking the model against its original…",
}


def describe(request: Request) -> str:
    """Status-bar text for a request."""
    return DESCRIPTIONS[request.kind](request.args)


def named(request: Request, summary: str) -> str:
    """A load's `summary` naming the checkpoint (or model name) it was about, if it does not already (a run's
    error is named by the window, which also gathers images failing alike)."""
    subject = (request.args.get("path") or request.args.get("code")) if request.kind is Kind.LOAD else None
    return f"{subject}: {summary}" if subject and str(subject) not in summary else summary


def summarize(exc: BaseException) -> str:
    """One line for the dialog: the message of a vitviz error, or the type and message of anything else."""
    from vitviz.errors import VitvizError

    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if isinstance(exc, VitvizError):
        return text
    if "out of memory" in text.lower():
        return f"Out of memory: {text}"
    return f"{type(exc).__name__}: {text}"
