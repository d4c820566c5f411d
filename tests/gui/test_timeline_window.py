"""The Timeline dock: a run's checkpoints on the slider, each checkpoint's map equal to the library's, the plots
against step, a checkpoint of another layout named, and a slider that never waits for the worker."""
from __future__ import annotations

import shutil
import threading
import warnings
from pathlib import Path

import numpy as np
import pytest
from _gui import HEADS, show_dock, wait_idle
from _hostile import DEMO
from _tiny import write_tiny_checkpoint
from _windowed import save_tiny_timm_swin
from PySide6.QtCore import QTimer

import vitviz
from vitviz.core.analyses.maps import MapKind, map_stack
from vitviz.core.analyses.timeline import TimelineStore
from vitviz.gui.timeline import TimelineResult

STEPS = (100, 200, 300)


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "run"
    folder.mkdir()
    for i, step in enumerate(STEPS):
        write_tiny_checkpoint(folder / f"step-{step}.pth", seed=10 + i)
    return folder


def _open(qtbot, window, folder):  # noqa: ANN001, ANN201
    window.open_run(str(folder))
    qtbot.waitUntil(lambda: window.timeline.store is not None, timeout=20000)
    panel = show_dock(qtbot, window, "timelineDock")
    wait_idle(qtbot, window, timeout=30000)
    panel.request_redraw()
    return panel


def _library_map(path: Path, image: str, layer, head) -> np.ndarray:  # noqa: ANN001
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = vitviz.load(path, heads=HEADS)
    r = model.run(image)
    return map_stack(r.attentions, MapKind("cls"), r.spec).select(layer, head)


def test_slider_shows_each_checkpoints_map_as_the_library(qtbot, loaded, run_dir, images) -> None:  # noqa: ANN001
    panel = _open(qtbot, loaded, run_dir)
    store = loaded.timeline.store
    assert len(store) == 3 and panel.slider.maximum() == 2 and "number in the names" in panel.run_label.text()
    image = loaded.session.image_list.current
    for layer, head in ((-1, "mean"), (0, 1)):
        loaded.state.update(layer=layer, head=head)
        for k, step in enumerate(STEPS):
            panel.set_checkpoint(k)
            qtbot.waitUntil(lambda: panel.shown_k == k, timeout=20000)
            assert f"step-{step}" in panel.checkpoint_label.text()
            want = _library_map(run_dir / f"step-{step}.pth", image, layer, head)
            assert np.allclose(panel.values, want, atol=1e-6)
            assert np.array_equal(panel.item.image, panel.values)               # what the view draws
    maps = [store.peek(k, image) for k in range(3)]                   # all held: they differ between checkpoints
    assert all(m is not None for m in maps)
    assert not np.allclose(maps[0].stack("cls").maps, maps[2].stack("cls").maps)
    wait_idle(qtbot, loaded)
    panel.request_redraw()
    x, y = panel.curves["distance"].getData()
    assert list(x) == list(STEPS)                                     # plotted against the step
    series = store.series(image)
    assert np.allclose(y, series.distance[:, 0])
    assert "3 of 3 checkpoints measured" in panel.prediction.text()
    panel.set_box((0.0, 0.0, 0.5, 0.5))
    bx, by = panel.curves["box"].getData()
    assert np.allclose(by, store.series(image, box=(0.0, 0.0, 0.5, 0.5)).box_share[:, 0]) and len(bx) == 3
    panel.box_check.setChecked(True)                                  # a drawn box: the rectangle's region
    assert panel.box is not None and panel.roi is not None


def test_a_checkpoint_of_another_layout_is_named(qtbot, loaded, run_dir) -> None:  # noqa: ANN001
    write_tiny_checkpoint(run_dir / "step-400.pth", depth=3, seed=20)
    panel = _open(qtbot, loaded, run_dir)
    panel.set_checkpoint(3)
    qtbot.waitUntil(lambda: 3 in loaded.timeline.store.failed, timeout=20000)
    wait_idle(qtbot, loaded)
    panel.request_redraw()
    text = panel.failed_label.text()
    assert "step-400.pth" in text and "another layout" in text and "depth 3" in text
    assert "cannot be shown" in panel.map_title.text and panel.values is None
    panel.set_checkpoint(1)                                           # the others go on
    qtbot.waitUntil(lambda: panel.shown_k == 1, timeout=20000)


def test_the_slider_never_waits_for_the_worker(qtbot, loaded, run_dir, monkeypatch) -> None:  # noqa: ANN001
    """Moving the slider while the worker is held computing a checkpoint: the moves return at once (what is shown
    says 'computing'), the computing happens off the GUI thread, and the event loop keeps running meanwhile."""
    panel = _open(qtbot, loaded, run_dir)
    qtbot.waitUntil(lambda: panel.shown_k == 0, timeout=20000)
    image = loaded.session.image_list.current
    started, release = threading.Event(), threading.Event()
    computed_on: list[threading.Thread] = []
    real = TimelineStore.result

    def slow(self, k, key):  # noqa: ANN001, ANN202
        if self.peek(k, key) is None:
            computed_on.append(threading.current_thread())
            started.set()
            release.wait(120.0)            # held until the test has looked (this only breaks a deadlock)
        return real(self, k, key)

    monkeypatch.setattr(TimelineStore, "result", slow)
    store = loaded.timeline.store
    for k in (1, 2):                       # nothing but checkpoint 0 held: the next moves must go to the worker
        for entry in [e for e in store.held if e[0] == "result" and e[1] == k]:
            store._lru.pop(entry)
    ticks: list[int] = []
    timer = QTimer()
    timer.timeout.connect(lambda: ticks.append(1))
    timer.start(10)
    try:
        panel.set_checkpoint(1)
        panel.set_checkpoint(2)            # the newest position wins: 2 is asked first, 1 only as a neighbour
        assert not release.is_set() and "computing" in panel.map_title.text   # returned without the result
        queued = [r.k for r in loaded.session.client.pending(TimelineResult)]
        assert queued[0] == 2 or started.is_set()
        qtbot.waitUntil(started.is_set, timeout=60000)
        before = len(ticks)
        qtbot.waitUntil(lambda: len(ticks) >= before + 3, timeout=60000)    # the event loop runs timers
        assert threading.main_thread() not in computed_on
    finally:
        release.set()
        timer.stop()
    qtbot.waitUntil(lambda: panel.shown_k == 2, timeout=20000)
    assert store.peek(2, image) is not None


def test_a_folder_without_checkpoints_is_said_in_the_dock(qtbot, loaded, tmp_path) -> None:  # noqa: ANN001
    empty = tmp_path / "empty"
    empty.mkdir()
    loaded.open_run(str(empty))
    qtbot.waitUntil(lambda: bool(loaded.timeline.error) and loaded.is_idle(), timeout=20000)
    panel = show_dock(qtbot, loaded, "timelineDock")
    assert "Could not open the run" in panel.run_label.text() and "no checkpoints" in panel.run_label.text()
    assert not panel.slider.isEnabled()


def test_a_fresh_worker_closes_the_run_and_says_so(qtbot, loaded, run_dir) -> None:  # noqa: ANN001
    """Stop waiting starts a fresh worker, which holds no open run: the timeline closes with a note."""
    _open(qtbot, loaded, run_dir)
    loaded.session.client.restart()
    assert loaded.timeline.store is None and loaded.timeline.folder == ""
    assert any("training run run was closed" in n and "Open training run" in n for n in loaded.notes)
    wait_idle(qtbot, loaded)
    assert loaded.reporter.errors == []


def test_the_unit_plots_keep_three_ticks_on_zero_to_one(qtbot, loaded, run_dir) -> None:  # noqa: ANN001
    """The box share and the top-class probability are in [0, 1]: fixed at that range with ticks 0, 0.5, 1 (auto
    ticks 0, 0.2, ... piled onto each other in a short plot)."""
    panel = _open(qtbot, loaded, run_dir)
    for name in ("box", "top"):
        plot = panel.plots[name]
        low, high = plot.viewRange()[1]
        assert low <= 0.0 and high >= 1.0 and high - low < 1.2, (name, low, high)
        assert [v for v, _ in plot.getAxis("left")._tickLevels[0]] == [0.0, 0.5, 1.0]


def test_plots_are_tall_enough_and_share_one_step_axis(qtbot, loaded, run_dir) -> None:  # noqa: ANN001
    """Round five: the four plots were ~45 px high with overlapping tick labels, and the box plot showed an x axis
    of 99.6-100.4 until Box was ticked (an empty plot ranges around its marker alone)."""
    from vitviz.gui.panels.timeline import PLOT_MIN_HEIGHT

    panel = _open(qtbot, loaded, run_dir)
    loaded.resize(1280, 800)
    qtbot.waitUntil(lambda: panel.plots["box"].viewRange()[0][1] > 250, timeout=5000)
    steps = panel.plots["distance"].viewRange()[0]
    assert steps[0] <= STEPS[0] and steps[1] >= STEPS[-1]
    box = panel.plots["box"].viewRange()[0]                              # no box yet: the same step axis
    assert box[0] <= STEPS[0] and box[1] >= STEPS[-1] and box[1] - box[0] < 2 * (steps[1] - steps[0])
    for name, plot in panel.plots.items():
        assert plot.minimumHeight() >= PLOT_MIN_HEIGHT
        ticks = plot.getAxis("left")._tickLevels
        assert ticks is not None and 1 <= len(ticks[0]) <= 3, (name, ticks)   # at most three labels
    shown = [v for v, _ in panel.plots["distance"].getAxis("left")._tickLevels[0]]
    distance = panel.curves["distance"].getData()[1]
    assert min(shown) == pytest.approx(distance.min()) and max(shown) == pytest.approx(distance.max())


def test_no_run_no_empty_dock_on_the_next_start(qtbot, settings, tiny_ckpt, run_dir) -> None:  # noqa: ANN001
    """The dock came back empty ('No training run', blank plots, a third of the window) on the next start: a saved
    layout with the dock open shows it only when a run is open."""
    from PySide6.QtCore import QRect

    from vitviz.gui.window import MainWindow, default_size

    first = MainWindow(settings)
    first.use_size(default_size(QRect(0, 0, 1600, 1000)))
    qtbot.addWidget(first)
    first.show()
    _open(qtbot, first, run_dir)
    dock = next(d for d in first.side_docks if d.objectName() == "timelineDock")
    assert dock.isVisible()
    first.save_settings()
    first.persist_settings = False
    first.close()
    first.session.shutdown()
    second = MainWindow(settings)
    qtbot.addWidget(second)
    second.show()
    try:
        dock = next(d for d in second.side_docks if d.objectName() == "timelineDock")
        assert not dock.isVisible() and second.timeline.folder == ""
    finally:
        second.persist_settings = False
        second.close()
        second.session.shutdown()


def test_checkpoints_written_later_are_offered_as_a_reload(qtbot, loaded, run_dir) -> None:  # noqa: ANN001
    """A run still training writes checkpoints after the dock opened it: the dock notices (a folder watcher) and
    offers Reload (+N), which opens the run again at the same checkpoint."""
    panel = _open(qtbot, loaded, run_dir)
    panel.set_checkpoint(1)
    assert not panel.reload_button.isVisible()
    write_tiny_checkpoint(run_dir / "step-400.pth", seed=20)
    qtbot.waitUntil(lambda: panel.reload_button.isVisible(), timeout=10000)
    assert panel.reload_button.text() == "Reload (+1)" and "1 new in the folder" in panel.run_label.text()
    panel.reload_button.click()
    qtbot.waitUntil(lambda: loaded.timeline.store is not None and len(loaded.timeline.store) == 4, timeout=20000)
    assert loaded.timeline.k == 1 and panel.slider.value() == 1 and not panel.reload_button.isVisible()
    wait_idle(qtbot, loaded, timeout=30000)
    assert loaded.reporter.errors == []


def test_a_timeline_of_a_model_without_class_names_says_class_n_once(qtbot, loaded, tmp_path: Path) -> None:  # noqa: ANN001
    """The Timeline's prediction line said 'class 1 (class 1)' for a model without class names."""
    from _gui import show_dock
    from _tiny import write_tiny_checkpoint

    folder = tmp_path / "run"
    folder.mkdir()
    for i, step in enumerate((100, 200)):
        write_tiny_checkpoint(folder / f"step-{step}.pth", seed=10 + i)
    window = loaded
    window.open_run(str(folder))
    qtbot.waitUntil(lambda: window.timeline.store is not None, timeout=20000)
    panel = show_dock(qtbot, window, "timelineDock")
    wait_idle(qtbot, window, timeout=30000)
    panel.request_redraw()
    qtbot.waitUntil(lambda: "p = " in panel.prediction.text(), timeout=20000)
    text = panel.prediction.text()
    index = text.split("class ")[1].split(",")[0]
    assert f"class {index}, p = " in text and f"(class {index})" not in text, text


# ---------------------------------------------------------------------------------------------- hostile runs (issue 34)

def _load_demo(qtbot, window, images) -> None:  # noqa: ANN001
    with qtbot.waitSignal(window.session.model.model_loaded, timeout=30000):
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
