"""The GUI-thread side of the worker: a queue, request ids, stale answers dropped, bounded shutdown, parking.

`WorkerClient` queues `Request`s and sends them one at a time to the `InferenceWorker` in its thread through a
queued signal. Staleness is decided when an answer arrives: a request made stale while it ran (another model was
asked for, another input size chosen) answers on `dropped`, never on its kind's signal.

Closing never waits for a long request: `WorkerClient.shutdown` asks the thread to stop -- a forward pass stops at
the next transformer block, a download at its next chunk -- and waits a bounded time; a thread still busy after
that is parked (`ParkingLot`) until it finishes, because a QThread destroyed while it runs aborts the process
("QThread: Destroyed while thread is still running").

A request that runs the user's own code (`user_code`) and has not answered after `stop_waiting_after` seconds is
reported on `stuck`; `restart` then gives that worker up -- it is parked as abandoned, its answers are never
delivered, and it is asked to stop with an exception raised in its thread (a Python loop ends at once; a call
blocked in C ends when it returns) -- and a fresh worker takes the queue.
"""
from __future__ import annotations

import atexit
import itertools
import sys
from typing import Any, Callable

from PySide6.QtCore import QObject, QThread, QTimer, Signal, Slot

from vitviz.gui.protocol import Load, Request, Run
from vitviz.gui.signals import wire
from vitviz.gui.worker import InferenceWorker

QUIET_MS = 300              # a quiet request (`Request.quiet`) still running after this long is said after all
SHUTDOWN_WAIT_MS = 2000     # how long closing the window waits for the running request before parking it
EXIT_NOTE_MS = 3000         # at exit, say why the process is still there after this long

RequestFilter = Callable[[Request], bool]


class ParkingLot(QObject):
    """Worker threads still running a request after their window's bounded wait, kept until they have finished.

    What cannot be interrupted (one slow block, decoding an image, loading a checkpoint) may outlast
    `WorkerClient.shutdown`'s wait. Dropping the last reference to a running QThread destroys it and aborts the
    process, so such a thread is held here with its worker; its `finished` (queued to this GUI-thread object)
    releases it, and `wait_all` at exit waits for what is left.
    """

    def __init__(self) -> None:
        super().__init__()
        self._held: list[tuple[QThread, QObject]] = []
        self._abandoned: set[int] = set()     # ids of the threads given up on (`WorkerClient.restart`)

    def __len__(self) -> int:
        return len(self._held)

    def holds(self, thread: QThread) -> bool:
        return any(t is thread for t, _ in self._held)

    def add(self, thread: QThread, worker: QObject, abandoned: bool = False) -> None:
        """Hold `thread` (and its worker) until it has finished; `abandoned`: given up on while it runs the user's
        code, which may never end (`abandoned_running`)."""
        if abandoned:
            self._abandoned.add(id(thread))
        if not self.holds(thread):
            self._held.append((thread, worker))
            thread.finished.connect(self._release)
            if thread.isFinished():     # it finished between the caller's wait and the connection
                self._release()

    def abandoned_running(self) -> bool:
        """Whether a thread given up on is still running (the process must then end without waiting for it)."""
        return any(id(t) in self._abandoned and not t.isFinished() for t, _ in self._held)

    @Slot()
    def _release(self) -> None:
        done = self.sender()
        for entry in list(self._held):
            thread = entry[0]
            # a thread that has emitted finished is only cleaning up: the wait is short (and drops the GIL)
            if (thread is done or thread.isFinished()) and thread.wait(5000):
                self._held.remove(entry)
                self._abandoned.discard(id(thread))
                _retire(entry[1])

    def wait_all(self) -> None:
        """Wait for every parked thread (at exit, before Python destroys them), saying so when it takes long."""
        for thread, worker in list(self._held):
            if not thread.wait(EXIT_NOTE_MS):
                sys.stderr.write("vitviz: waiting for the running inference request to finish…\n")
                while not thread.wait(EXIT_NOTE_MS):
                    pass
            _retire(worker)
        self._held.clear()


def _retire(worker: QObject) -> None:
    """Drop a worker whose thread has ended: its model goes now, not whenever the last Python reference does. Runs
    on the GUI thread (the worker's thread runs no Python once its request is done), and the C++ object goes with the
    last Python reference, there too."""
    release = getattr(worker, "release", None)
    if release is not None:
        release()


parking = ParkingLot()
atexit.register(parking.wait_all)


class WorkerClient(QObject):
    """Queue, ids and stale-answer dropping for one `InferenceWorker` in its own thread.

    Every answer comes on `answered` with the request that produced it (a `vitviz.gui.protocol.Request`, whose
    class says what it is), so the receiver routes it by the request's class.
    """

    answered = Signal(object, object)          # request, its answer (the request class's `answer` type)
    failed = Signal(object, str, str)          # request, summary, details
    stuck = Signal(object, float)              # a request running the user's code, seconds it has run unanswered
    unstuck = Signal()                         # the request `stuck` was about has answered, or was given up on
    progress = Signal(str, float)              # what the running request is doing, fraction done (-1: unknown; said
                                               # as `status` is)
    progressed = Signal(object, str, float)    # the same with the request it is about (routed by its kind)
    busy_changed = Signal(bool)                # the worker is busy (True; a quiet request only after QUIET_MS), idle
    status = Signal(str)                       # what it is doing (a quiet request's line too only after QUIET_MS)
    dropped = Signal(object)                   # a request whose answer was stale, or that was cancelled
    restarted = Signal()                       # a fresh worker took over (`restart`): what the old one held is gone
    _send = Signal(object)

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._ids = itertools.count(1)
        self._queue: list[Request] = []
        self._in_flight: Request | None = None
        self._stale: set[int] = set()
        self._closed = False
        self.stop_waiting_after: float | None = None         # seconds before `stuck` (None: never)
        self.user_code: RequestFilter = lambda _request: False   # which requests run the user's own code
        self._stuck_timer = QTimer(self)
        self._stuck_timer.setSingleShot(True)
        self._stuck_timer.timeout.connect(self._on_stuck_timer)
        self._timed: Request | None = None                   # the request the timer runs for
        self._given_up: set[int] = set()                     # ids of the requests whose worker was abandoned
        self._reported = False                               # `stuck` was emitted for the running request
        self._said_busy = False                              # `busy_changed(True)` was emitted (not yet False)
        self._quiet_timer = QTimer(self)                     # quiet requests running: say them at its timeout
        self._quiet_timer.setSingleShot(True)
        self._quiet_timer.timeout.connect(self._say_busy)
        self._thread, self._worker = self._start_worker()

    def _start_worker(self) -> tuple[QThread, InferenceWorker]:
        """A worker in a thread of its own, wired to this client."""
        thread = QThread()
        thread.setObjectName("vitviz-inference")
        worker = InferenceWorker()
        worker.moveToThread(thread)
        self._send.connect(worker.handle)
        wire(worker, finished=self._on_finished, failed=self._on_failed, cancelled=self._on_cancelled,
             started=self._on_started, progress=self._on_progress)
        # No `thread.finished -> worker.release / deleteLater`: those would run Python and destroy a Python-owned
        # QObject in the finishing thread while the GUI thread may be inside PySide (a `connect` holds the GIL and
        # waits for Qt's signal-slot lock): a CI run hung there once. The worker is released and dropped on the GUI
        # thread once its thread has ended (`_retire`, `ParkingLot._release`).
        thread.start()
        return thread, worker

    @property
    def thread_object(self) -> QThread:
        """The worker's thread (tests check that it has finished)."""
        return self._thread

    @property
    def busy(self) -> bool:
        return self._in_flight is not None or bool(self._queue)

    def submit(self, kind: type[Request] | Request, first: bool = False, **args: Any) -> Request:
        """Queue a request (at the front with `first`): a request class with its arguments
        (`submit(Run, image=..., image_size=...)`) or a request made already. A load makes every earlier request
        about a model stale (`Request.about_model`); a run of the same image and size as a queued one replaces
        it."""
        request = kind.make(**args) if isinstance(kind, type) else kind
        request.id = next(self._ids)
        if self._closed:
            return request      # after shutdown nothing runs any more
        if isinstance(request, Load):
            self.cancel(lambda r: r.about_model)
        elif isinstance(request, Run):
            self._queue = [r for r in self._queue if not (isinstance(r, Run) and r.args == request.args)]
        if first:
            self._queue.insert(0, request)
        else:
            self._queue.append(request)
        self._pump()
        return request

    def prioritize(self, predicate: RequestFilter) -> None:
        """Move queued requests matching `predicate(request)` to the front, keeping their order."""
        front = [r for r in self._queue if predicate(r)]
        self._queue = front + [r for r in self._queue if not predicate(r)]

    def cancel_download(self) -> None:
        """Stop the named model's download that is running (at its next chunk); the load answers `cancelled` and
        the model loaded before stays."""
        self._worker.download_cancel.set()

    def cancel(self, predicate: RequestFilter) -> None:
        """Make every queued or running request matching `predicate(request)` stale."""
        self._queue = [r for r in self._queue if not predicate(r)]
        if self._in_flight is not None and predicate(self._in_flight):
            self._stale.add(self._in_flight.id)

    def pending(self, kind: type[Request]) -> list[Request]:
        """Live requests of a kind (a request class), queued or running."""
        reqs = self._queue + ([self._in_flight] if self._in_flight else [])
        return [r for r in reqs if r.kind is kind and r.id not in self._stale]

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
        self._stuck_timer.stop()
        thread = self._thread
        if not first and parking.holds(thread):
            return False        # already waited for once; the parking lot takes care of it
        thread.requestInterruption()
        thread.quit()
        if thread.wait(SHUTDOWN_WAIT_MS if timeout_ms is None else timeout_ms):
            _retire(self._worker)
            return True
        parking.add(thread, self._worker)
        return False

    def restart(self) -> Request | None:
        """Give up on the running request (the user's code that does not finish): its worker is abandoned --
        parked until its thread ends, never answering -- and asked to stop; a fresh worker (with no model) takes
        the queue. Returns the request given up on (None when nothing ran). Safe after shutdown (then nothing)."""
        if self._closed:
            return None
        request, self._in_flight = self._in_flight, None
        self._stop_clock()
        thread, worker = self._thread, self._worker
        for signal, slot in ((worker.finished, self._on_finished), (worker.failed, self._on_failed),
                             (worker.cancelled, self._on_cancelled), (worker.started, self._on_started),
                             (worker.progress, self._on_progress)):
            signal.disconnect(slot)
        self._send.disconnect(worker.handle)
        thread.requestInterruption()
        thread.quit()
        worker.give_up()                                      # an exception in its thread, while it runs a request
        parking.add(thread, worker, abandoned=True)
        self._thread, self._worker = self._start_worker()
        if request is not None:
            self._stale.discard(request.id)
            self._given_up.add(request.id)          # an answer already on its way is not delivered
        self.restarted.emit()       # before the queue runs on: the parts that kept something in the old worker
        self._after()
        return request

    def _pump(self) -> None:
        """Send the next request when none runs, and say that the worker is busy (`busy_changed`, `status`) --
        for quiet requests only once they have run `QUIET_MS` (an ablate click's run, which its banner says: the
        status bar's line and busy bar laid out and painted for a few milliseconds cost the click a third of its
        GUI-thread time)."""
        if self._in_flight is None and self._queue:
            self._in_flight = self._queue.pop(0)
            self._send.emit(self._in_flight)
            self._time(self._in_flight)
        if self._in_flight is not None and not self._said_busy:
            if not self._in_flight.quiet:
                self._say_busy()
            elif not self._quiet_timer.isActive():
                self._quiet_timer.start(QUIET_MS)

    def _say_busy(self) -> None:
        """`busy_changed(True)` for the running request (with its status line when it is a quiet one, whose line
        was held back)."""
        self._quiet_timer.stop()
        request = self._in_flight
        if request is None or self._said_busy or self._closed:
            return
        self._said_busy = True
        self.busy_changed.emit(True)
        if request.quiet and request.id not in self._stale:
            self.status.emit(request.describe())

    def _stop_clock(self) -> None:
        self._stuck_timer.stop()
        self._timed = None
        if self._reported:
            self._reported = False
            self.unstuck.emit()

    def _time(self, request: Request) -> None:
        """Start the Stop-waiting clock for a request that runs the user's code."""
        self._stop_clock()
        after = self.stop_waiting_after
        if after is not None and after > 0 and self.user_code(request):
            self._timed = request
            self._stuck_timer.start(max(1, int(after * 1000)))

    @Slot()
    def _on_stuck_timer(self) -> None:
        request = self._timed
        if request is not None and request is self._in_flight and not self._closed:
            self._reported = True
            self.stuck.emit(request, float(self.stop_waiting_after or 0.0))

    def _take(self, req_id: int) -> tuple[Request | None, bool]:
        self._stop_clock()
        request, self._in_flight = self._in_flight, None
        stale = request is None or request.id != req_id or req_id in self._stale
        self._stale.discard(req_id)
        return request, stale

    def _after(self) -> None:
        self._pump()
        if self._in_flight is None:
            self._quiet_timer.stop()
            if self._said_busy:
                self._said_busy = False
                self.status.emit("Ready")
                self.busy_changed.emit(False)

    @Slot(int, str)
    def _on_started(self, req_id: int, text: str) -> None:
        if req_id in self._given_up:
            return
        if req_id not in self._stale and not self._closed and self._said_busy:
            self.status.emit(text)

    @Slot(int, str, float)
    def _on_progress(self, req_id: int, text: str, fraction: float) -> None:
        if req_id in self._given_up:
            return
        if self._in_flight is not None and req_id == self._in_flight.id and req_id not in self._stale:
            if self._said_busy:
                self.status.emit(text)
                self.progress.emit(text, fraction)
            self.progressed.emit(self._in_flight, text, fraction)

    @Slot(int, object)
    def _on_finished(self, req_id: int, answer: object) -> None:
        self._settle(req_id, lambda request: self.answered.emit(request, answer))

    def _settle(self, req_id: int, emit: Callable[[Request], None]) -> None:
        """A request ended: `emit(request)` says so, unless it was given up on, the client is closed, or a newer model
        made it stale (then it is dropped)."""
        if req_id in self._given_up or self._closed:
            return
        request, stale = self._take(req_id)
        if stale:
            self.dropped.emit(request)
        else:
            emit(request)
        self._after()

    @Slot(int)
    def _on_cancelled(self, req_id: int) -> None:
        """A request that stopped because the thread was asked to: no answer and no error, like a stale one."""
        if req_id in self._given_up:
            return
        if self._closed:
            return
        request, _stale = self._take(req_id)
        self.dropped.emit(request)
        self._after()

    @Slot(int, str, str)
    def _on_failed(self, req_id: int, summary: str, details: str) -> None:
        self._settle(req_id, lambda request: self.failed.emit(request, summary, details))
