"""Closing never hangs on a busy worker, and a worker thread is never destroyed while it runs (that aborts the
process with "QThread: Destroyed while thread is still running")."""
from __future__ import annotations

import gc
import os
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path

from vitviz.gui import worker as worker_mod
from vitviz.gui.parking import parking
from vitviz.gui.window import MainWindow

BUSY_S = 4.0          # how long the fake forward pass takes
WAIT_MS = 200         # the bounded wait of shutdown in these tests
CLOSE_BOUND_S = 2.0   # closing must return well before the request ends


def _slow_run(started: threading.Event, release: threading.Event):  # noqa: ANN202
    def run(self, image: str, image_size=None) -> str:  # noqa: ANN001
        started.set()
        release.wait(BUSY_S)         # an uninterruptible forward pass (ends early only when the test says so)
        return "maps"
    return run


def test_close_while_the_worker_is_busy(qtbot, settings, monkeypatch) -> None:  # noqa: ANN001
    started, release = threading.Event(), threading.Event()
    monkeypatch.setattr(worker_mod.InferenceWorker, "_run", _slow_run(started, release))
    monkeypatch.setattr(worker_mod, "SHUTDOWN_WAIT_MS", WAIT_MS)
    win = MainWindow(settings)
    win.persist_settings = False
    win.show()
    thread = weakref.ref(win.session.client.thread_object)      # only the window (and parking) hold it
    answers: list[object] = []
    win.session.client.ran.connect(lambda *a: answers.append(a))
    win.session.client.submit("run", image="busy.png", image_size=None)
    win.session.client.submit("run", image="queued.png", image_size=None)
    try:
        qtbot.waitUntil(started.is_set, timeout=10000)
        begin = time.monotonic()
        win.close()
        elapsed = time.monotonic() - begin
        assert elapsed < CLOSE_BOUND_S, f"close took {elapsed:.2f} s while the worker was busy"
        assert thread().isRunning() and parking.holds(thread())
        assert not win.session.busy                      # nothing queued or in flight any more
        assert win.session.shutdown() is False           # a second shutdown returns at once
        assert time.monotonic() - begin < CLOSE_BOUND_S
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
    monkeypatch.setattr(worker_mod.InferenceWorker, "_run", _slow_run(started, release))
    thread = window.session.client.thread_object
    answers: list[object] = []
    window.session.client.ran.connect(lambda *a: answers.append(a))
    window.session.client.submit("run", image="short.png", image_size=None)
    qtbot.waitUntil(started.is_set, timeout=10000)
    threading.Timer(0.2, release.set).start()
    window.persist_settings = False
    window.close()
    assert thread.isFinished() and not parking.holds(thread)
    qtbot.wait(100)                                      # the answer, queued before close, is dropped
    assert answers == [] and window.session.result("short.png") is None


def test_submit_after_shutdown_is_ignored(qtbot, window) -> None:  # noqa: ANN001
    window.persist_settings = False
    window.close()
    window.session.client.submit("probe")
    assert not window.session.busy and window.is_idle()


def test_error_before_the_event_loop_still_stops_the_worker(tmp_path: Path) -> None:
    """An exception between creating the window and closing it (here in apply_args) used to leave the worker
    thread running, and the interpreter's exit then aborted (exit status 134)."""
    code = ("import argparse, sys; import vitviz.gui.app as app; from vitviz.gui.args import add_window_arguments\n"
            "def boom(window, args): raise RuntimeError('boom')\n"
            "app.apply_args = boom\n"
            "p = argparse.ArgumentParser(); add_window_arguments(p)\n"
            "try:\n    app.run_app(p.parse_args([]))\nexcept RuntimeError:\n    sys.exit(3)\n")
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", VITVIZ_SETTINGS=str(tmp_path / "s.ini"))
    proc = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[2], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3, proc.stderr
    assert "Destroyed while thread" not in proc.stderr
