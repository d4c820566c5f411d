"""The inference worker: one long-lived QObject in its own QThread that owns the model and runs requests.

What a request does is the request's own (`vitviz.gui.protocol`: each request class carries its work, its answer
type, its status text and its failure title); the worker only runs `request(self)` with the loaded model at hand,
and answers every request with exactly one `finished` (the request's answer dataclass), `failed` or `cancelled`.
The window never calls the worker directly: `vitviz.gui.client.WorkerClient` (GUI thread) queues the requests,
sends them one at a time through queued signals and drops stale answers. torch is imported inside the worker
thread only, on the first request, so the window appears before torch is loaded.

A forward pass stops at the next transformer block once the thread is asked to stop (`InterruptHooks`), a download
at its next chunk (`DownloadProgress`); such a request answers `cancelled`, never `failed`.
"""
from __future__ import annotations

import threading
import traceback
from typing import Any

from PySide6.QtCore import QObject, QThread, Signal, Slot

from vitviz import catalog
from vitviz.gui.protocol import Request, summarize

__all__ = ["InferenceWorker", "InterruptHooks", "ForwardInterrupted", "DownloadCancelled", "DownloadProgress",
           "is_interruption", "summarize"]


class ForwardInterrupted(Exception):
    """Raised inside a forward pass, before a transformer block, when the worker thread is asked to stop."""


class DownloadCancelled(InterruptedError, ForwardInterrupted):
    """The user cancelled a named model's download: an OSError (so the partial file is removed) that answers the
    request `cancelled`, not `failed`."""


class InterruptHooks:
    """While open, a forward pre-hook on every transformer block of `model` (`hook_points()`: for a user's module
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
        points = self.model.hook_points() if self.model is not None else []
        self._handles = [module.register_forward_pre_hook(self._check) for module in points]
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

    finished = Signal(int, object)      # request id, its answer (the request class's `answer` type)
    failed = Signal(int, str, str)      # request id, one-line summary, details (traceback)
    cancelled = Signal(int)             # request id: it stopped because the thread was asked to (no error)
    started = Signal(int, str)          # request id, what is running
    progress = Signal(int, str, float)  # request id, what is happening, fraction done (-1: unknown)

    def __init__(self) -> None:
        super().__init__()
        self.model: Any = None                     # the loaded model (`vitviz.gui.protocol.Context`)
        self.slots: dict[str, Any] = {}            # what other requests keep between requests (a second model...)
        self.running_id = 0
        self.download_cancel = threading.Event()   # set from the GUI thread: stop the running download
        self._running = threading.Lock()           # held by `give_up` and the end of `handle`
        self._in_request = False
        self._ident = 0                            # the worker thread's id, while it runs a request

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
        self.started.emit(request.id, request.describe())
        hooks = InterruptHooks(self.model)
        try:
            with hooks:
                answer = request(self)
        except Exception as exc:  # noqa: BLE001 - the boundary: every failure becomes a dialog in the window
            if hooks.fired or is_interruption(exc):
                self.cancelled.emit(request.id)
            else:
                self.failed.emit(request.id, request.name_failure(summarize(exc)), traceback.format_exc())
        else:
            self.finished.emit(request.id, answer)

    @Slot()
    def release(self) -> None:
        """Drop the model (its memory goes now, not whenever the last Python reference does)."""
        self.model = None
        self.slots.clear()

    def report(self, text: str, fraction: float) -> None:
        """How far the running request has got (a `Verify`'s sizes compared): `progress` to the GUI thread, queued
        (this runs in the worker thread)."""
        self.progress.emit(self.running_id, text, fraction)

    def download_progress(self, name: str) -> "DownloadProgress":
        """The progress callback of a named model's download (a fresh Cancel: the last one is forgotten)."""
        self.download_cancel.clear()
        return DownloadProgress(self, name)


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


