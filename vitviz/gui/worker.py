"""The inference worker: one long-lived QObject in its own QThread that owns the model.

The window never calls the worker directly. `WorkerClient` (GUI thread) queues requests, sends them one at a
time through queued signals and drops answers that became stale while the worker was busy (staleness is decided
when the answer arrives). torch is imported inside the worker thread only, on the first request, so the window
appears before torch is loaded.

Closing never waits for a long request: `WorkerClient.shutdown` asks the thread to stop -- a forward pass stops at
the next transformer block (`InterruptHooks`), a download at its next chunk -- and waits a bounded time; a thread
still busy after that is parked (see `parking`) until it finishes.
"""
from __future__ import annotations

import itertools
import traceback
from dataclasses import dataclass, field
from typing import Any

from PySide6.QtCore import QObject, QThread, Signal, Slot

from vitviz.gui.parking import parking

SHUTDOWN_WAIT_MS = 2000     # how long closing the window waits for the running request before parking it


@dataclass
class Request:
    """One unit of work. kind: 'probe' (list devices), 'load', 'run', 'move', 'posembed' or 'catalog' (the models
    on this computer)."""

    id: int
    kind: str
    args: dict[str, Any] = field(default_factory=dict)


class ForwardInterrupted(Exception):
    """Raised inside a forward pass, before a transformer block, when the worker thread is asked to stop."""


class InterruptHooks:
    """While open, a forward pre-hook on every transformer block (`model.net.blocks`) of `model` raises
    `ForwardInterrupted` when the current thread's interruption has been requested, so a forward pass stops
    within one block of `QThread.requestInterruption`. The hooks are removed on exit, even after a failure.

    `fired` says whether a hook raised: the request was cancelled, whatever the exception became on its way
    out. A model without `net.blocks` (or no model) gets no hooks. Needs no torch import.
    """

    def __init__(self, model: Any) -> None:
        self.model = model
        self.fired = False
        self._handles: list[Any] = []

    def __enter__(self) -> "InterruptHooks":
        blocks = getattr(getattr(self.model, "net", None), "blocks", None)
        self._handles = [block.register_forward_pre_hook(self._check) for block in (blocks or ())]
        return self

    def __exit__(self, *_exc: object) -> None:
        handles, self._handles = self._handles, []
        for handle in handles:
            handle.remove()

    def _check(self, _module: Any, _args: Any) -> None:
        if QThread.currentThread().isInterruptionRequested():
            self.fired = True
            raise ForwardInterrupted("the forward pass was interrupted: vitviz is closing")


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
    """Lives in the worker thread; every slot answers with exactly one `finished`, `failed` or `cancelled`.

    Every request runs with `InterruptHooks` on the loaded model, so whatever runs it (a 'run', or any later
    request that does forward passes) stops within one block when the thread is asked to stop, and answers
    `cancelled` instead of `failed`.
    """

    finished = Signal(int, object)      # request id, answer (ModelSpec, ResultMaps, device list, str)
    failed = Signal(int, str, str)      # request id, one-line summary, details (traceback)
    cancelled = Signal(int)             # request id: it stopped because the thread was asked to (no error)
    started = Signal(int, str)          # request id, what is running
    progress = Signal(int, str, float)  # request id, what is happening, fraction done (-1: unknown)

    def __init__(self) -> None:
        super().__init__()
        self._model: Any = None
        self.running_id = 0

    @Slot(object)
    def handle(self, request: Request) -> None:
        if self.thread().isInterruptionRequested():
            return      # the window has closed: a request that was already on its way is not started
        self.running_id = request.id
        self.started.emit(request.id, describe(request))
        hooks = InterruptHooks(self._model)
        try:
            with hooks:
                answer = getattr(self, "_" + request.kind)(**request.args)
        except Exception as exc:  # noqa: BLE001 - the boundary: every failure becomes a dialog in the window
            if hooks.fired or is_interruption(exc):
                self.cancelled.emit(request.id)
            else:
                self.failed.emit(request.id, summarize(exc), traceback.format_exc())
        else:
            self.finished.emit(request.id, answer)

    @Slot()
    def release(self) -> None:
        """Drop the model (its memory goes now, not whenever the last Python reference does)."""
        self._model = None

    def _probe(self) -> list[str]:
        from vitviz.core.runtime import available_devices

        return list(available_devices())

    def _load(self, path: str, device: str | None = None, **overrides: Any) -> Any:
        """Load a checkpoint; a named model (`torchvision:vit_b_16`) is first found in the torch hub cache or
        downloaded there, with progress reported. A device that is not available here (or no device at all) is
        refused and the model loads on the CPU: the answer's last item says why ('' when the device was used)."""
        import vitviz
        from vitviz import catalog

        refused = ""
        if device not in (None, "", "auto"):
            from vitviz.core.runtime import resolve_device

            try:
                resolve_device(device)
            except (vitviz.DeviceError, RuntimeError, ValueError) as exc:   # no CUDA here, or not a device name
                refused, device = summarize(exc), "cpu"
        if catalog.is_named_model(path):
            path = str(catalog.resolve_named(path, progress=DownloadProgress(self, path)))
        model = vitviz.load(path, device=device, **{k: v for k, v in overrides.items() if v is not None})
        self._model = model   # replaced only on success: a failed load keeps the previous model
        return model.spec, str(model.device), parameter_counts(model.net), refused

    def _run(self, image: str, image_size: tuple[int, int] | None = None) -> Any:
        """Run one image and precompute its CLS and rollout maps here, off the GUI thread."""
        from vitviz.core.maps import ResultMaps

        if self._model is None:
            raise RuntimeError("no model is loaded; open a checkpoint first (File > Open model)")
        maps = ResultMaps(self._model.run(image, image_size=image_size))
        maps.precompute()
        return maps

    def _posembed(self, grid: tuple[int, int] | None = None) -> Any:
        """The position embedding resampled to `grid` with its similarities (`PosEmbedData`; None without a learned
        absolute position embedding), and the grid."""
        if self._model is None:
            raise RuntimeError("no model is loaded; open a checkpoint first (File > Open model)")
        from vitviz.core.maps import pos_embed_data

        grid = tuple(grid) if grid else tuple(self._model.spec.grid)
        pos = self._model.pos_embed(grid)
        return grid, None if pos is None else pos_embed_data(pos, grid, self._model.spec.pos_prefix)

    def _catalog(self, recent: list[str]) -> Any:
        """The ViT checkpoints on this computer (a `catalog.ScanResult`: its `skipped` lists the folders that could
        not be read), and every named model with its cached file (or None) and its download size in bytes."""
        from vitviz import catalog

        entries = catalog.scan(recent=recent)
        named = []
        for name in catalog.named_models():
            cached = catalog.cached_named(name)
            named.append((name, None if cached is None else str(cached), 4 * catalog.lookup_named(name).num_params))
        return entries, named

    def _move(self, device: str) -> str:
        if self._model is None:
            raise RuntimeError("no model is loaded; open a checkpoint first (File > Open model)")
        self._model = self._model.to(device)
        return str(self._model.device)


class DownloadProgress:
    """The `progress` callback of a named-model download: one signal per percent (per MB without a size)."""

    def __init__(self, worker: InferenceWorker, name: str) -> None:
        self.worker, self.name, self._last = worker, name, -1

    def __call__(self, done: int, total: int | None) -> None:
        from vitviz.catalog.scan import format_size

        step = int(100 * done / total) if total else done >> 20
        if self.worker.thread().isInterruptionRequested():
            # vitviz is closing: stop at this chunk (an OSError, so the partial file is removed)
            raise InterruptedError(f"download of {self.name} cancelled")
        if step == self._last:
            return
        self._last = step
        if total:
            text = f"Downloading {self.name}: {step}% ({format_size(done)} of {format_size(total)})…"
        else:
            text = f"Downloading {self.name}: {format_size(done)}…"
        self.worker.progress.emit(self.worker.running_id, text, done / total if total else -1.0)


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


def describe(request: Request) -> str:
    """Status-bar text for a request."""
    a = request.args
    if request.kind == "load":
        return f"Loading model {a.get('path')}…"
    if request.kind == "run":
        size = a.get("image_size")
        return f"Running {a.get('image')}" + (f" at {size[0]}×{size[1]}" if size else "") + "…"
    if request.kind == "move":
        return f"Moving model to {a.get('device')}…"
    if request.kind == "posembed":
        return "Reading the position embedding…"
    if request.kind == "catalog":
        return "Looking for ViT checkpoints on this computer…"
    return "Looking for devices…"


def summarize(exc: BaseException) -> str:
    """One line for the dialog: the message of a vitviz error, or the type and message of anything else."""
    from vitviz.errors import VitvizError

    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if isinstance(exc, VitvizError):
        return text
    if "out of memory" in text.lower():
        return f"Out of memory: {text}"
    return f"{type(exc).__name__}: {text}"


class WorkerClient(QObject):
    """GUI-thread side: queue, ids and stale-answer dropping.

    Signals carry the request that produced the answer, so the window can tell what it belongs to.
    """

    loaded = Signal(object, object, str)       # request, ModelSpec, device
    loaded_info = Signal(object)               # parameter counts per part (emitted just before `loaded`)
    device_refused = Signal(object, str)       # load request, why its device could not be used (it runs on CPU)
    posembedded = Signal(object, object)       # request, ((gh, gw), PosEmbedData or None)
    ran = Signal(object, object)               # request, ResultMaps (the result with its maps precomputed)
    moved = Signal(object, str)                # request, device
    probed = Signal(object)                    # list of device names
    cataloged = Signal(object, object)         # request, (ScanResult with .skipped, [(name, cached or None, bytes)])
    progress = Signal(str, float)              # what the running request is doing, fraction done (-1: unknown)
    failed = Signal(object, str, str)          # request, summary, details
    busy_changed = Signal(bool)
    status = Signal(str)
    dropped = Signal(object)                   # a request whose answer was stale, or that was cancelled
    _send = Signal(object)

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._ids = itertools.count(1)
        self._queue: list[Request] = []
        self._in_flight: Request | None = None
        self._stale: set[int] = set()
        self._closed = False
        self._thread = QThread()
        self._thread.setObjectName("vitviz-inference")
        self._worker = InferenceWorker()
        self._worker.moveToThread(self._thread)
        self._send.connect(self._worker.handle)
        self._worker.finished.connect(self._on_finished)
        self._worker.failed.connect(self._on_failed)
        self._worker.cancelled.connect(self._on_cancelled)
        self._worker.started.connect(self._on_started)
        self._worker.progress.connect(self._on_progress)
        self._thread.finished.connect(self._worker.release)       # direct: runs in the finishing thread
        self._thread.finished.connect(self._worker.deleteLater)
        self._thread.start()

    @property
    def thread_object(self) -> QThread:
        """The worker's thread (tests check that it has finished)."""
        return self._thread

    @property
    def busy(self) -> bool:
        return self._in_flight is not None or bool(self._queue)

    def submit(self, kind: str, first: bool = False, **args: Any) -> Request:
        """Queue a request (at the front with `first`). A 'load' makes every earlier request about a model stale;
        a 'run' of the same image and size as a queued one replaces it."""
        request = Request(next(self._ids), kind, args)
        if self._closed:
            return request      # after shutdown nothing runs any more
        if kind == "load":
            self.cancel(lambda r: r.kind not in ("probe", "catalog"))
        elif kind == "run":
            self._queue = [r for r in self._queue if not (r.kind == "run" and r.args == args)]
        if first:
            self._queue.insert(0, request)
        else:
            self._queue.append(request)
        self._pump()
        return request

    def prioritize(self, predicate: Any) -> None:
        """Move queued requests matching `predicate(request)` to the front, keeping their order."""
        front = [r for r in self._queue if predicate(r)]
        self._queue = front + [r for r in self._queue if not predicate(r)]

    def cancel(self, predicate: Any) -> None:
        """Make every queued or running request matching `predicate(request)` stale."""
        self._queue = [r for r in self._queue if not predicate(r)]
        if self._in_flight is not None and predicate(self._in_flight):
            self._stale.add(self._in_flight.id)

    def pending(self, kind: str) -> list[Request]:
        """Live requests of a kind, queued or running."""
        reqs = self._queue + ([self._in_flight] if self._in_flight else [])
        return [r for r in reqs if r.kind == kind and r.id not in self._stale]

    def shutdown(self, timeout_ms: int | None = None) -> bool:
        """Stop the worker thread; returns whether it has finished. Safe to call more than once.

        Queued requests are dropped and no answer is delivered any more. The thread is asked to stop (a forward
        pass stops before its next transformer block, a download at its next chunk) and waited for at most
        `timeout_ms` (default `SHUTDOWN_WAIT_MS`), so closing the window never hangs on a long request. A thread
        still running after that (one slow block, image decoding, a load) is parked: kept referenced, with its
        worker, until it has finished.
        """
        first, self._closed = not self._closed, True
        self._queue.clear()
        self._in_flight = None
        thread = self._thread
        if not first and parking.holds(thread):
            return False        # already waited for once; the parking lot takes care of it
        thread.requestInterruption()
        thread.quit()
        if thread.wait(SHUTDOWN_WAIT_MS if timeout_ms is None else timeout_ms):
            return True
        parking.add(thread, self._worker)
        return False

    def _pump(self) -> None:
        was_busy = self._in_flight is not None
        if self._in_flight is None and self._queue:
            self._in_flight = self._queue.pop(0)
            self._send.emit(self._in_flight)
        if not was_busy and self._in_flight is not None:
            self.busy_changed.emit(True)

    def _take(self, req_id: int) -> tuple[Request | None, bool]:
        request, self._in_flight = self._in_flight, None
        stale = request is None or request.id != req_id or req_id in self._stale
        self._stale.discard(req_id)
        return request, stale

    def _after(self) -> None:
        self._pump()
        if self._in_flight is None:
            self.status.emit("Ready")
            self.busy_changed.emit(False)

    @Slot(int, str)
    def _on_started(self, req_id: int, text: str) -> None:
        if req_id not in self._stale and not self._closed:
            self.status.emit(text)

    @Slot(int, str, float)
    def _on_progress(self, req_id: int, text: str, fraction: float) -> None:
        if self._in_flight is not None and req_id == self._in_flight.id and req_id not in self._stale:
            self.status.emit(text)
            self.progress.emit(text, fraction)

    @Slot(int, object)
    def _on_finished(self, req_id: int, answer: object) -> None:
        if self._closed:
            return
        request, stale = self._take(req_id)
        if stale:
            self.dropped.emit(request)
        elif request.kind == "load":
            spec, device, counts, refused = answer
            if refused:
                self.device_refused.emit(request, refused)
            self.loaded_info.emit(counts)
            self.loaded.emit(request, spec, device)
        elif request.kind == "run":
            self.ran.emit(request, answer)
        elif request.kind == "move":
            self.moved.emit(request, answer)
        elif request.kind == "posembed":
            self.posembedded.emit(request, answer)
        elif request.kind == "catalog":
            self.cataloged.emit(request, answer)
        else:
            self.probed.emit(answer)
        self._after()

    @Slot(int)
    def _on_cancelled(self, req_id: int) -> None:
        """A request that stopped because the thread was asked to: no answer and no error, like a stale one."""
        if self._closed:
            return
        request, _stale = self._take(req_id)
        self.dropped.emit(request)
        self._after()

    @Slot(int, str, str)
    def _on_failed(self, req_id: int, summary: str, details: str) -> None:
        if self._closed:
            return
        request, stale = self._take(req_id)
        if stale:
            self.dropped.emit(request)
        else:
            self.failed.emit(request, summary, details)
        self._after()

