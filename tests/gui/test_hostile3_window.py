"""Hostile inputs, round three (issue 34), in the window: a training run of windowed checkpoints or an unreadable
run folder is said in the Timeline dock (never 'computing…' for good), and an answers store nested too deeply
lets the model load, said instead of a traceback."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from _gui import show_dock, wait_idle
from _windowed import save_tiny_timm_swin

DEMO = Path(__file__).resolve().parents[2] / "resources" / "demo"


def _load_demo(qtbot, window, images) -> None:  # noqa: ANN001
    with qtbot.waitSignal(window.session.model_loaded, timeout=30000):
        window.load_model(str(DEMO))
    window.session.add_images([str(p) for p in images])
    wait_idle(qtbot, window)


@pytest.fixture(scope="module")
def swin_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run of two tiny timm Swin checkpoints (hub folders checkpoint-1/, checkpoint-2/)."""
    pytest.importorskip("timm")
    run = tmp_path_factory.mktemp("swinrun")
    save_tiny_timm_swin(run / "checkpoint-1")
    shutil.copytree(run / "checkpoint-1", run / "checkpoint-2")
    return run


def test_a_windowed_run_is_said_in_the_dock(qtbot, window, images, swin_run: Path) -> None:  # noqa: ANN001
    _load_demo(qtbot, window, images)
    window.open_run(str(swin_run))
    qtbot.waitUntil(lambda: window.timeline.store is not None, timeout=20000)
    panel = show_dock(qtbot, window, "timelineDock")
    qtbot.waitUntil(lambda: 0 in window.timeline.store.failed, timeout=30000)
    wait_idle(qtbot, window, timeout=30000)
    panel.request_redraw()
    assert "windowed model" in panel.failed_label.text()
    assert "cannot be shown" in panel.map_title.text and "computing" not in panel.map_title.text


def test_an_unreadable_run_folder_is_said_in_the_dock(qtbot, window, images, tmp_path: Path,  # noqa: ANN001
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """checkpoint-2/ cannot be listed (mode 000; simulated: the tests may run as root)."""
    _load_demo(qtbot, window, images)
    run = tmp_path / "run"
    for k in (1, 2):
        shutil.copytree(DEMO, run / f"checkpoint-{k}")
    real = Path.iterdir

    def iterdir(self):  # noqa: ANN001, ANN202
        if self.name == "checkpoint-2":
            raise PermissionError(13, "Permission denied", str(self))
        return real(self)

    monkeypatch.setattr(Path, "iterdir", iterdir)
    window.open_run(str(run))
    qtbot.waitUntil(lambda: bool(window.timeline.error) and window.is_idle(), timeout=20000)
    panel = show_dock(qtbot, window, "timelineDock")
    text = panel.run_label.text()
    assert "Could not open the run" in text and "checkpoint-2: cannot be read" in text


def test_an_answers_store_nested_too_deeply_does_not_stop_a_load(qtbot, window, images, tmp_path: Path,  # noqa: ANN001
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The store cannot be read: the model loads without remembered settings, and the error box says why."""
    import shutil

    store = tmp_path / "answers.json"
    store.write_text("{" * 1 + '"a": ' + "[" * 200_000 + "]" * 200_000 + "}")
    monkeypatch.setenv("VITVIZ_ANSWERS", str(store))
    model = shutil.copytree(DEMO, tmp_path / "my_model")   # not the bundled demo, whose answers are never read
    with qtbot.waitSignal(window.session.model_loaded, timeout=30000):
        window.load_model(str(model))
    window.session.add_images([str(p) for p in images])
    wait_idle(qtbot, window)
    assert window.session.model.spec is not None                   # the app goes on: the model is loaded and shown
    [(title, summary)] = window.reporter.errors             # said to the user, naming the file and what is wrong
    assert title == "Remembered settings not read"
    assert str(store) in summary and "nested too deeply" in summary and "VITVIZ_ANSWERS" in summary
