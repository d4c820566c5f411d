"""Starting the window from the command line (`vitviz.gui.app.apply_args`): --device that is not here is said and
the model runs on the CPU, --device reaches the demo's load, and a --head the map ignores is noted."""
from __future__ import annotations

from pathlib import Path

import pytest
from _gui import HEADS, parse, wait_idle

from vitviz.gui.app import EXIT_2_TITLES, apply_args
from vitviz.gui.protocol import Load
from vitviz.gui.session import DEVICE_FAILED


@pytest.mark.parametrize("device", ["tpu", "cuda:7"])
def test_unavailable_device_is_reported_and_the_model_runs_on_cpu(qtbot, window, tiny_ckpt, images,  # noqa: ANN001
                                                                   device) -> None:
    import torch

    if device.startswith("cuda") and torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    with qtbot.waitSignal(window.session.model.model_loaded, timeout=20000):
        apply_args(window, parse(str(images[0]), "--model", str(tiny_ckpt), "--heads", str(HEADS),
                                 "--device", device))
    wait_idle(qtbot, window)
    assert [t for t, _ in window.reporter.errors] == [DEVICE_FAILED], window.reporter.errors
    assert device in window.reporter.errors[0][1] and "CPU" in window.reporter.errors[0][1]
    assert DEVICE_FAILED in EXIT_2_TITLES                                  # --screenshot exits 2, as `vitviz info`
    assert window.session.model.device == "cpu" and window.session.result(str(images[0])) is not None
    assert window.session.model.device_preference is None                                # later loads do not repeat the error


def test_device_reaches_the_demo_load(qtbot, window, monkeypatch, tiny_ckpt, images) -> None:  # noqa: ANN001
    """`vitviz --device X` (no model) loads the demo there; it used to ignore --device."""
    from vitviz.gui import bundled

    monkeypatch.setattr(bundled, "demo_checkpoint", lambda: tiny_ckpt)
    monkeypatch.setattr(bundled, "demo_images", lambda: list(images))
    asked = []
    monkeypatch.setattr(window.session.client, "submit",
                        lambda kind, first=False, **kw: asked.append(kw["device"]) if kind is Load else None)
    apply_args(window, parse("--device", "cpu"))
    assert asked == ["cpu"]


def test_head_ignored_by_rollout_is_noted(window) -> None:  # noqa: ANN001
    apply_args(window, parse("--map", "rollout", "--head", "max"))
    assert any(n.startswith("--head max is ignored") for n in window.notes), window.notes
    assert window.status.idle_message().startswith("--head max is ignored")    # the status bar once idle
    window.notes.clear()
    apply_args(window, parse("--map", "mean", "--head", "1"))
    assert not any("ignored" in n for n in window.notes)


QUIT_CHILD = r"""
import atexit, os, sys
atexit.register(lambda: print("atexit ran", flush=True))
real_exit = os._exit
def leaving(status):
    print("ended by os._exit", status, flush=True)
    real_exit(status)
os._exit = leaving
from PySide6.QtCore import QTimer
import vitviz.gui.app as app_module
app_module.QUICK_EXIT = sys.argv.pop(1) == "quick"
def quit_when_loaded(win):
    if win.session.model.spec is None or not win.is_idle():
        QTimer.singleShot(50, lambda: quit_when_loaded(win))
        return
    win.state.update(opacity=0.31)           # a setting that must reach the settings file
    win.menus.actions["quit"].trigger()
apply_args = app_module.apply_args
def apply_then_quit(win, args):
    apply_args(win, args)
    quit_when_loaded(win)
app_module.apply_args = apply_then_quit
from vitviz.cli import main
sys.exit(main())
"""


def test_ctrl_q_ends_the_process_without_the_interpreters_teardown(tmp_path: Path, images) -> None:  # noqa: ANN001
    """Ctrl+Q took 2-4 s to end the process (issue 35): bench/quit.py found the window closed in ~0.05 s and
    the rest was Python freeing torch's, Qt's and the model's objects. `vitviz` now ends (os._exit) once its window
    has closed: atexit handlers still run and the settings are on disk. With QUICK_EXIT off it returns as before."""
    import os
    import subprocess
    import sys

    root = str(Path(__file__).resolve().parents[2])
    for mode in ("quick", "full"):
        ini = tmp_path / f"{mode}.ini"
        env = dict(os.environ, QT_QPA_PLATFORM="offscreen", VITVIZ_SETTINGS=str(ini),
                   PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
        done = subprocess.run([sys.executable, "-c", QUIT_CHILD, mode, str(images[0])], env=env,
                              capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stderr
        assert "atexit ran" in done.stdout and "0.31" in ini.read_text(), (done.stdout, ini.read_text())
        assert ("ended by os._exit 0" in done.stdout) == (mode == "quick"), done.stdout
