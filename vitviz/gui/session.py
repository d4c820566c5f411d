"""The session: the loaded model's spec, the images, their results and the requests that produce them.

It turns user intents (load this checkpoint, run these images, move to CUDA, use another input size) into
worker requests, keeps a bounded cache of results and forwards only fresh answers. No widgets here.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Any

from PySide6.QtCore import QCoreApplication, QObject, Signal

from vitviz.core.spec import ModelSpec
from vitviz.core.maps import PosEmbedData, ResultMaps
from vitviz.gui.worker import Request, WorkerClient

DEFAULT_CACHE_BYTES = 2 * 1024 ** 3
LOAD_FAILED = "Could not load model"     # the error title of a failed load (`--screenshot` exits 2 for it)
DEVICE_FAILED = "Device not available"   # a load's device was refused; the model runs on the CPU (exit 2 too)


class Session(QObject):
    """Owns the worker client and the result cache."""

    model_loaded = Signal(object, str)      # ModelSpec, device
    result_ready = Signal(str)              # image path whose result is now cached
    run_failed = Signal(str, str, str)      # image path, summary, details (the window shows the error)
    run_started = Signal(str)               # image path
    error = Signal(str, str, str)           # dialog title, summary, details
    devices_found = Signal(object)          # list of device names
    device_changed = Signal(str)
    device_refused = Signal(str)            # the device a load asked for, which is not available here
    pos_embed_ready = Signal()              # `pos_embed` / `pos_grid` now describe the current input size

    def __init__(self, cache_bytes: int = DEFAULT_CACHE_BYTES, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.client = WorkerClient(self)
        self.spec: ModelSpec | None = None
        self.device = ""
        self.model_path = ""
        self.image_size: tuple[int, int] | None = None
        self.cache_bytes = cache_bytes
        self.images: list[str] = []
        self.current = ""
        self.failed: dict[str, str] = {}
        self._cache: OrderedDict[str, ResultMaps] = OrderedDict()
        self.param_counts: dict[str, int] = {}
        self.pos_embed: PosEmbedData | None = None  # at `pos_grid` (None: not known yet, or the model has none)
        self.pos_grid: tuple[int, int] | None = None
        self.client.loaded_info.connect(self._on_loaded_info)
        self.client.posembedded.connect(self._on_posembedded)
        self.client.loaded.connect(self._on_loaded)
        self.client.device_refused.connect(self._on_device_refused)
        self.client.ran.connect(self._on_ran)
        self.client.moved.connect(self._on_moved)
        self.client.probed.connect(self.devices_found)
        self.client.failed.connect(self._on_failed)
        app = QCoreApplication.instance()
        if app is not None:
            app.aboutToQuit.connect(self.shutdown)   # never leave the worker thread running at exit

    @property
    def busy(self) -> bool:
        return self.client.busy

    def probe_devices(self) -> None:
        """Ask the worker which devices exist (this is also what first imports torch, off the GUI thread)."""
        self.client.submit("probe")

    def load_model(self, path: str, device: str | None = None, **overrides: Any) -> Request:
        """Load a checkpoint; what is loaded now stays until the new model has loaded successfully."""
        return self.client.submit("load", path=str(path), device=device, **overrides)

    def set_device(self, device: str) -> None:
        if self.spec is not None and device != self.device:
            self.client.submit("move", device=device)

    def set_image_size(self, size: tuple[int, int] | None) -> None:
        """Run every image at another (h, w) (None: the model's native size); older results become stale."""
        if self.spec is not None and size is not None and tuple(size) == tuple(self.spec.image_size):
            size = None
        if size == self.image_size:
            return
        self.image_size = size
        self.client.cancel(lambda r: r.kind in ("run", "posembed"))
        self._cache.clear()
        self.failed.clear()

    def request_pos_embed(self) -> None:
        """Ask the worker for the position embedding at the current input size, ahead of queued runs (answered by
        pos_embed_ready)."""
        if self.spec is None:
            return
        size = self.image_size or self.spec.image_size
        p = self.spec.patch_size
        self.client.cancel(lambda r: r.kind == "posembed")
        self.client.submit("posembed", first=True, grid=(size[0] // p, size[1] // p))

    @property
    def cache_nbytes(self) -> int:
        """Memory held by the cached results (attention and the maps derived from it)."""
        return sum(m.nbytes for m in self._cache.values())

    def cached_paths(self) -> list[str]:
        return list(self._cache)

    def add_images(self, paths: list[str]) -> None:
        self.images.extend(p for p in paths if p not in self.images)

    def result(self, path: str) -> ResultMaps | None:
        """The cached result of an image (marked as recently used), or None."""
        maps = self._cache.get(path)
        if maps is not None:
            self._cache.move_to_end(path)
        return maps

    def ensure(self, path: str, first: bool = False) -> None:
        """Request a run of `path` unless it is cached, failed or already on its way; `first` jumps the queue."""
        if self.spec is None or not path or path in self._cache or path in self.failed:
            return
        pending = [r for r in self.client.pending("run")
                   if r.args["image"] == path and r.args["image_size"] == self.image_size]
        if pending:
            if first:
                self.client.prioritize(lambda r: r in pending)
            return
        self.client.submit("run", first=first, image=path, image_size=self.image_size)
        self.run_started.emit(path)

    def ensure_all(self) -> None:
        """Run the current image first, then every other image without a result."""
        self.ensure(self.current, first=True)
        for path in self.images:
            self.ensure(path)

    def _on_loaded(self, request: Request, spec: ModelSpec, device: str) -> None:
        self.spec, self.device, self.model_path = spec, device, request.args["path"]
        self.image_size = None
        self._cache.clear()
        self.failed.clear()
        self.pos_embed, self.pos_grid = None, None
        self.request_pos_embed()
        self.model_loaded.emit(spec, device)

    def _on_device_refused(self, request: Request, summary: str) -> None:
        device = str(request.args.get("device"))
        self.device_refused.emit(device)
        self.error.emit(DEVICE_FAILED, f"{summary} — running on the CPU instead", f"--device {device}: {summary}\n"
                        "The model was loaded on the CPU. Pick a device in the Controls panel once one is available.")

    def _on_loaded_info(self, counts: dict[str, int]) -> None:
        self.param_counts = dict(counts)

    def _on_posembedded(self, _request: Request, answer: Any) -> None:
        grid, pos = answer
        self.pos_grid, self.pos_embed = tuple(grid), pos
        self.pos_embed_ready.emit()

    def _on_ran(self, request: Request, maps: ResultMaps) -> None:
        if request.args.get("image_size") != self.image_size:
            return   # belongs to a size that is no longer selected
        path = request.args["image"]
        self._cache[path] = maps
        self._cache.move_to_end(path)
        self._evict(keep=path)
        self.result_ready.emit(path)

    def _on_moved(self, _request: Request, device: str) -> None:
        self.device = device
        self.device_changed.emit(device)

    def _on_failed(self, request: Request, summary: str, details: str) -> None:
        if request.kind == "run":
            path = request.args["image"]
            self.failed[path] = summary
            self.run_failed.emit(path, summary, details)
        elif request.kind == "load":
            self.error.emit(LOAD_FAILED, summary, details)
            self.ensure_all()   # the load made queued runs stale; the previous model is still there
        elif request.kind == "posembed":
            self.pos_embed, self.pos_grid = None, None
            self.error.emit("Could not read the position embedding", summary, details)
        elif request.kind == "move":
            self.error.emit("Could not move the model", summary, details)
            self.device_changed.emit(self.device)
        elif request.kind == "catalog":
            self.error.emit("Could not list the models on this computer", summary, details)
        else:
            self.devices_found.emit(["cpu"])
            self.error.emit("Could not start the inference engine", summary, details)

    def _evict(self, keep: str) -> None:
        total = sum(m.nbytes for m in self._cache.values())
        while total > self.cache_bytes and len(self._cache) > 1:
            path, maps = next(iter(self._cache.items()))
            if path == keep:
                self._cache.move_to_end(path)
                continue
            del self._cache[path]
            total -= maps.nbytes

    def shutdown(self) -> bool:
        """Stop the worker (waits a bounded time; see `WorkerClient.shutdown`); True once its thread has
        finished."""
        return self.client.shutdown()
