"""Closing never hangs on a busy worker, and a worker thread is never destroyed while it runs (that aborts the
process with "QThread: Destroyed while thread is still running").

What is checked is what happened, never how long it took (a loaded machine is slow, not wrong): that close
returned while the request was still held, how many blocks of a forward pass began after the interruption."""
from __future__ import annotations

import gc
import os
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path

import pytest
from _tiny import write_tiny_checkpoint
from _gui import HEADS, wait_idle

from vitviz.gui import client as client_mod, worker as worker_mod
from vitviz.gui.client import parking
from vitviz.gui.window import MainWindow
from vitviz.gui.protocol import Probe, Ran, Run

HELD_S = 120.0        # the fake forward pass holds until the test releases it (this only breaks a deadlock)
WAIT_MS = 200         # the bounded wait of shutdown in these tests

DEPTH = 16            # blocks of the model whose forward pass is interrupted
BLOCK_S = 0.3         # how long each of its blocks takes (a sleep in a pre-hook): the whole forward takes 4.8 s
INTERRUPT_WAIT_MS = 60000     # the bounded wait of shutdown in the interruption test: longer than the whole forward,
#                               so an interruption that did not work shows as blocks run, not as a thread parked


def _slow_run(started: threading.Event, release: threading.Event,  # noqa: ANN202
              finished: threading.Event | None = None):
    def run(self, ctx) -> Ran:  # noqa: ANN001 - the work of a Run request
        started.set()
        release.wait(HELD_S)         # an uninterruptible forward pass (ends only when the test says so)
        if finished is not None:
            finished.set()
        return Ran(maps=None)
    return run


def test_close_while_the_worker_is_busy(qtbot, settings, monkeypatch) -> None:  # noqa: ANN001
    started, release, finished = threading.Event(), threading.Event(), threading.Event()
    monkeypatch.setattr(Run, "__call__", _slow_run(started, release, finished))
    monkeypatch.setattr(client_mod, "SHUTDOWN_WAIT_MS", WAIT_MS)
    win = MainWindow(settings)
    win.persist_settings = False
    win.show()
    thread = weakref.ref(win.session.client.thread_object)      # only the window (and parking) hold it
    answers: list[object] = []
    win.session.client.answered.connect(lambda *a: answers.append(a) if isinstance(a[0], Run) else None)
    win.session.client.submit(Run, image="busy.png", image_size=None)
    win.session.client.submit(Run, image="queued.png", image_size=None)
    try:
        qtbot.waitUntil(started.is_set, timeout=60000)
        win.close()
        assert not finished.is_set(), "close waited for the request to end"
        assert thread().isRunning() and parking.holds(thread())
        assert not win.session.busy                      # nothing queued or in flight any more
        assert win.session.shutdown() is False           # a second shutdown returns without waiting
        assert not finished.is_set()
        # the window and everything it owns go away while the thread still runs: only the parked reference
        # keeps the QThread alive (without it, this aborts the whole test process)
        win.deleteLater()
        del win
        qtbot.wait(50)
        gc.collect()
        assert thread() is not None and thread().isRunning()
    finally:
        release.set()
    qtbot.waitUntil(lambda: thread() is None or not parking.holds(thread()), timeout=10000)
    gc.collect()
    assert thread() is None                              # finished, released and destroyed
    assert answers == []                                 # the late answer reached nobody


def test_close_waits_for_a_short_request(qtbot, window, monkeypatch) -> None:  # noqa: ANN001
    """A request that ends within the bounded wait is waited for: the thread has finished when close returns."""
    started, release = threading.Event(), threading.Event()
    monkeypatch.setattr(Run, "__call__", _slow_run(started, release))
    monkeypatch.setattr(client_mod, "SHUTDOWN_WAIT_MS", 60000)   # far longer than the request (released at 0.2 s)
    thread = window.session.client.thread_object
    answers: list[object] = []
    window.session.client.answered.connect(lambda *a: answers.append(a) if isinstance(a[0], Run) else None)
    window.session.client.submit(Run, image="short.png", image_size=None)
    qtbot.waitUntil(started.is_set, timeout=60000)
    threading.Timer(0.2, release.set).start()
    window.persist_settings = False
    window.close()
    assert thread.isFinished() and not parking.holds(thread)
    qtbot.wait(100)                                      # the answer, queued before close, is dropped
    assert answers == [] and window.session.result("short.png") is None


def test_submit_after_shutdown_is_ignored(qtbot, window) -> None:  # noqa: ANN001
    window.persist_settings = False
    window.close()
    window.session.client.submit(Probe)
    assert not window.session.busy and window.is_idle()


def test_error_before_the_event_loop_still_stops_the_worker(tmp_path: Path) -> None:
    """An exception between creating the window and closing it (here in apply_args) used to leave the worker
    thread running, and the interpreter's exit then aborted (exit status 134)."""
    code = ("import argparse, sys; import vitviz.gui.app as app; from vitviz.cli.window import add_window_arguments\n"
            "def boom(window, args): raise RuntimeError('boom')\n"
            "app.apply_args = boom\n"
            "p = argparse.ArgumentParser(); add_window_arguments(p)\n"
            "try:\n    app.run_app(p.parse_args([]))\nexcept RuntimeError:\n    sys.exit(3)\n")
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", VITVIZ_SETTINGS=str(tmp_path / "s.ini"))
    proc = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[2], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3, proc.stderr
    assert "Destroyed while thread" not in proc.stderr


@pytest.fixture
def deep_window(qtbot, window, tmp_path, images):  # noqa: ANN001, ANN201
    """The window with a tiny model of DEPTH blocks loaded (its first images already run), each block made to take
    BLOCK_S from now on; yields (window, the model's blocks, the times blocks were entered)."""
    ckpt = write_tiny_checkpoint(tmp_path / "deep.pth", depth=DEPTH)
    with qtbot.waitSignal(window.session.model.model_loaded, timeout=20000):
        window.load_model(str(ckpt), heads=HEADS)
    wait_idle(qtbot, window)
    blocks = window.session.client._worker.model.net.blocks
    assert len(blocks) == DEPTH
    entered: list[float] = []

    def slow(_module, _args) -> None:  # noqa: ANN001
        entered.append(time.monotonic())
        time.sleep(BLOCK_S)          # releases the GIL, like a real block's kernels

    handles = [block.register_forward_pre_hook(slow) for block in blocks]
    try:
        yield window, blocks, entered
    finally:
        thread = window.session.client.thread_object
        window.persist_settings = False
        window.close()
        thread.wait(30000)           # without interruption the forward pass may still be running: let it end
        for handle in handles:
            handle.remove()


def test_close_interrupts_the_forward_pass_at_the_next_block(qtbot, deep_window, images,  # noqa: ANN001
                                                             monkeypatch) -> None:
    """Closing mid-forward stops the pass before the next block: the thread ends within about one block's time
    (inside the bounded wait, so nothing is parked), with no error and the interruption hooks removed."""
    window, blocks, entered = deep_window
    monkeypatch.setattr(client_mod, "SHUTDOWN_WAIT_MS", INTERRUPT_WAIT_MS)
    client, thread = window.session.client, window.session.client.thread_object
    failed: list[object] = []
    client.failed.connect(lambda *a: failed.append(a))
    parked_before = len(parking)
    client.submit(Run, first=True, image=str(images[1]), image_size=(64, 64))
    qtbot.waitUntil(lambda: len(entered) >= 3, timeout=60000)
    at_request = len(entered)
    window.persist_settings = False
    window.close()
    assert thread.isFinished(), "the worker thread still runs after closing"
    assert not parking.holds(thread) and len(parking) == parked_before
    assert len(entered) <= at_request + 1 < DEPTH        # at most one more block began after the request
    assert failed == [] and window.reporter.errors == [] and window.reporter.box is None
    assert all(len(block._forward_pre_hooks) == 1 for block in blocks)      # only the test's slow hook is left


def test_an_interrupted_forward_pass_is_cancelled_not_an_error(qtbot, deep_window, images) -> None:  # noqa: ANN001
    """The interruption exception never becomes an error dialog: the request is dropped like a stale one."""
    window, blocks, entered = deep_window
    client = window.session.client
    failed: list[object] = []
    ran: list[object] = []
    client.failed.connect(lambda *a: failed.append(a))
    client.answered.connect(lambda *a: ran.append(a) if isinstance(a[0], Run) else None)
    request = client.submit(Run, first=True, image=str(images[2]), image_size=(64, 64))
    qtbot.waitUntil(lambda: len(entered) >= 2, timeout=60000)
    at_request = len(entered)
    with qtbot.waitSignal(client.dropped, timeout=120000) as blocker:
        client.thread_object.requestInterruption()       # what shutdown does, without closing the client
    assert blocker.args == [request]
    assert len(entered) <= at_request + 1 < DEPTH        # stopped at the next block, not at the end of the pass
    assert not client.pending(Run)
    qtbot.wait(100)
    assert failed == [] and ran == [] and window.reporter.errors == [] and window.reporter.box is None
    assert all(len(block._forward_pre_hooks) == 1 for block in blocks)


def test_a_finished_worker_is_released_on_the_gui_thread(qtbot, monkeypatch) -> None:  # noqa: ANN001
    """A worker's model is dropped on the GUI thread once its thread has ended -- on close and when Stop waiting gives
    it up -- never by Python run from `QThread.finished` in the finishing thread: there it raced the GUI thread's
    PySide calls (a CI run hung in a `connect` right after a restart)."""
    from PySide6.QtCore import QThread

    released: list[int] = []
    monkeypatch.setattr(worker_mod.InferenceWorker, "release",
                        lambda self: released.append(threading.get_ident()))
    client = client_mod.WorkerClient()
    given_up = client.thread_object
    assert client.restart() is None                     # nothing ran: the old worker is parked until its thread ends
    qtbot.waitUntil(lambda: not parking.holds(given_up), timeout=10000)
    assert client.shutdown() and client.thread_object.isFinished()
    assert released == [threading.get_ident()] * 2      # both workers, each on this (the GUI) thread
    assert isinstance(given_up, QThread) and given_up.isFinished()
