"""The Compare dock: model B loaded in the worker, A / B / A − B linked to the view state, the head mapping in words,
the per-layer summary, its export byte for byte as `vitviz export --compare`, and a GUI that keeps ticking while B
loads."""
from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
from _gui import HEADS, show_dock, viewport_pos, wait_idle
from _tiny import write_permuted_heads, write_tiny_checkpoint
from PySide6.QtCore import Qt, QTimer

from vitviz.gui.compare import LoadB

PERM = [2, 0, 3, 1]          # B's head h is A's head PERM[h]


def _compare(qtbot, window, path, **overrides):  # noqa: ANN001, ANN201
    window.compare_with(str(path), **overrides)
    qtbot.waitUntil(lambda: window.compare.view is not None and window.is_idle(), timeout=30000)
    panel = show_dock(qtbot, window, "compareDock")
    panel.request_redraw()
    return panel


def test_a_model_against_itself_is_exactly_zero_and_follows_the_controls(qtbot, loaded, tiny_ckpt) -> None:  # noqa: ANN001
    panel = _compare(qtbot, loaded, tiny_ckpt, heads=HEADS)
    assert loaded.dock("compareDock").isVisible()
    # A's picture under each map is drawn once into a pixmap, not again with every new map above it
    assert all(base.cacheMode() == base.CacheMode.DeviceCoordinateCache for base in panel.bases)
    label = panel.models_label.text()               # B is another model: what its file does not say is named
    assert "B: tiny.pth" in label and "assumed: " in label and "num_heads" not in label   # heads were given
    for layer, head in ((0, 0), (1, 1), (1, "mean"), (0, "max")):
        loaded.state.update(layer=layer, head=head)
        f = panel.frame
        assert f is not None and (f.layer_a, f.head_a) == (layer, head)
        assert np.array_equal(f.diff, np.zeros_like(f.diff)) and np.array_equal(f.a, f.b)
        assert np.array_equal(panel.items[2].image, np.zeros_like(f.diff))        # the A − B view: exactly 0
        assert np.array_equal(panel.items[0].image, panel.items[1].image)
        want = loaded.session.image_list.current_maps.stack("cls").select(layer, head)
        assert np.array_equal(f.a, want)                                           # A is the window's own map
    assert "layers by index" in panel.summary_note.text()
    s = loaded.compare.summary
    assert np.all(s.jsd == 0) and np.allclose(s.cka, 1.0)
    assert "shared scale" in panel.scale.text() and "centred on 0" in panel.scale.text()
    assert not panel.bar_ab.horizontal and not panel.bar_diff.horizontal   # beside the maps, not under them
    assert panel.bar_diff.levels()[0] == -panel.bar_diff.levels()[1]
    loaded.state.update(source="token", query=5)                                   # a query token, B's by place
    qtbot.waitUntil(lambda: panel.frame is not None and panel.frame.query_a == 5, timeout=10000)
    assert "A token 5 ↔ B token 5" in panel.mapping.text()
    assert np.array_equal(panel.frame.diff, np.zeros_like(panel.frame.diff))
    loaded.state.update(source="key", query=6)          # the attention paid to a token: a table row, compared too
    qtbot.waitUntil(lambda: panel.frame is not None and panel.frame.query_a == 6, timeout=10000)
    want = loaded.session.image_list.current_maps.stack("key:6").select(loaded.state.layer, loaded.state.head)
    assert np.array_equal(panel.frame.a, want) and "A token 6 ↔ B token 6" in panel.mapping.text()
    panel.close_button.click()
    assert not loaded.compare.active and not loaded.dock("compareDock").isVisible()


def test_permuted_heads_are_recovered_in_the_label(qtbot, window, images, tmp_path) -> None:  # noqa: ANN001
    heads = len(PERM)
    write_permuted_heads(tmp_path, PERM)
    with qtbot.waitSignal(window.session.model.model_loaded, timeout=20000):
        window.load_model(str(tmp_path / "a.pth"), heads=heads)
    window.session.add_images([str(p) for p in images])
    wait_idle(qtbot, window)
    panel = _compare(qtbot, window, tmp_path / "b.pth", heads=heads)
    for h in range(heads):
        a_head = PERM[h]
        window.state.update(layer=1, head=a_head)
        assert f"A head {a_head} ↔ B head {h}, similarity 1.00" in panel.mapping.text()
        assert panel.frame.head_b == h
        assert np.abs(panel.frame.diff).max() < 1e-6
    window.compare.set_heads("index")                   # by index: head 0 ↔ head 0, and the maps differ
    qtbot.waitUntil(lambda: window.compare.view is not None and window.is_idle(), timeout=20000)
    window.state.update(head=1)
    panel.request_redraw()
    assert "A head 1 ↔ B head 1" in panel.mapping.text() and np.abs(panel.frame.diff).max() > 1e-4


def test_a_click_on_the_summary_selects_the_layer(qtbot, loaded, tiny_ckpt, tmp_path) -> None:  # noqa: ANN001
    deeper = write_tiny_checkpoint(tmp_path / "deep.pth", depth=3, seed=4)
    panel = _compare(qtbot, loaded, deeper, heads=HEADS)
    loaded.state.update(layer=1, head=0)
    assert "A layer 1 ↔ B layer 2 (relative depth 1.00)" in panel.mapping.text()
    assert len(panel.jsd_curve.xData) == 2 and np.all(np.isfinite(panel.jsd_curve.yData))
    qtbot.waitUntil(lambda: panel.plot.vb.sceneBoundingRect().width() > 20, timeout=5000)
    qtbot.mouseClick(panel.plot_widget.viewport(), Qt.MouseButton.LeftButton,
                     pos=viewport_pos(panel.plot_widget, panel.plot.vb, 0.0, 0.5))
    assert loaded.state.layer == 0
    assert "A layer 0 ↔ B layer 0" in panel.mapping.text()


def test_exported_pictures_are_the_clis_byte_for_byte(qtbot, loaded, tiny_ckpt, images, tmp_path) -> None:  # noqa: ANN001
    from vitviz.cli import main

    other = write_tiny_checkpoint(tmp_path / "other.pth", depth=3, seed=7)
    panel = _compare(qtbot, loaded, other, heads=HEADS)
    cli = tmp_path / "cli"
    assert main(["export", "--model", str(tiny_ckpt), "--heads", str(HEADS), "--compare", str(other),
                 str(images[0]), str(images[1]), "--out", str(cli), "--layers", "all", "--which-heads", "0,1,mean",
                 "--no-verify", "--quiet"]) == 0
    written = []
    for image in images[:2]:
        loaded.session.set_current(str(image))
        for layer, head in ((0, 0), (1, 1), (1, "mean"), (0, "mean")):
            loaded.state.update(layer=layer, head=head)
            paths = panel.export_to(tmp_path / "win")
            assert len(paths) == 3
            written += paths
    for path in written:
        assert (cli / path.name).exists(), path.name
        assert path.read_bytes() == (cli / path.name).read_bytes(), f"{path.name} differs from the CLI's"
    names = {p.name for p in written}
    assert any(n.startswith("img0_B_cls_L2_H") for n in names) and "img1_diff_cls_L1_Hmean.png" in names


def test_the_gui_keeps_ticking_while_b_loads(qtbot, loaded, tiny_ckpt, monkeypatch) -> None:  # noqa: ANN001
    """While model B's load is held in the worker, the load runs off the GUI thread, the event loop runs timers
    and the window answers (what is checked is what happens, not how fast)."""
    started, release = threading.Event(), threading.Event()
    loaded_on: list[threading.Thread] = []
    real = LoadB.__call__

    def slow(self, ctx):  # noqa: ANN001, ANN202
        loaded_on.append(threading.current_thread())
        started.set()
        release.wait(120.0)               # held until the test has looked (this only breaks a deadlock)
        return real(self, ctx)

    monkeypatch.setattr(LoadB, "__call__", slow)
    ticks: list[int] = []
    timer = QTimer()
    timer.timeout.connect(lambda: ticks.append(1))
    timer.start(10)
    try:
        loaded.compare_with(str(tiny_ckpt), heads=HEADS)
        qtbot.waitUntil(started.is_set, timeout=60000)
        before = len(ticks)
        qtbot.waitUntil(lambda: len(ticks) >= before + 3, timeout=60000)   # B is loading all this while
        assert not release.is_set() and threading.main_thread() not in loaded_on
        loaded.state.update(layer=0)                            # the window answers
        assert "Loading model B" in show_dock(qtbot, loaded, "compareDock").message.text()
    finally:
        release.set()
        timer.stop()
    qtbot.waitUntil(lambda: loaded.compare.view is not None and loaded.is_idle(), timeout=30000)


def test_a_model_b_that_cannot_load_is_said_in_the_dock(qtbot, loaded, tmp_path) -> None:  # noqa: ANN001
    bad = tmp_path / "not_a_model.pth"
    bad.write_bytes(b"not a checkpoint")
    loaded.compare_with(str(bad))
    qtbot.waitUntil(lambda: bool(loaded.compare.error) and loaded.is_idle(), timeout=20000)
    panel = show_dock(qtbot, loaded, "compareDock")
    panel.request_redraw()
    assert panel.message.text().startswith("Model B could not be loaded: ") and "not_a_model.pth" in panel.message.text()
    assert panel.frame is None and loaded.session.model.spec is not None          # model A is untouched


def test_a_fresh_worker_closes_the_comparison_and_says_so(qtbot, loaded, tiny_ckpt) -> None:  # noqa: ANN001
    """Stop waiting starts a fresh worker, which holds no model B: the comparison closes with a note instead of
    failing later with "model B is not loaded"."""
    _compare(qtbot, loaded, tiny_ckpt, heads=HEADS)
    assert loaded.compare.active
    loaded.session.client.restart()
    assert not loaded.compare.active and loaded.compare.b_spec is None and not loaded.compare.results_b
    assert any("comparison with tiny.pth was closed" in n and "Compare with" in n for n in loaded.notes)
    wait_idle(qtbot, loaded)
    assert loaded.reporter.errors == []


def test_model_b_is_named_by_its_folder_and_the_bars_stand_beside_the_maps() -> None:
    """Round five: B was named 'model.safetensors' (every hub folder's weights file), and horizontal colour bars
    under the maps left them ~80 px in a short dock."""
    from vitviz.gui.panels.base import display_name

    assert display_name("/models/dinov2-small/model.safetensors") == "dinov2-small/model.safetensors"
    assert display_name("/models/run/step-300.pth") == "step-300.pth"
    assert display_name("/models/dinov2-small") == "dinov2-small"
    assert display_name("hf:facebook/dinov2-small") == "hf:facebook/dinov2-small"


def test_closing_lets_go_exactly_what_the_part_keeps_in_the_worker() -> None:
    """Close comparison drops model B and its features, Close run the run's store (`LetGo`), and nothing else."""
    from types import SimpleNamespace

    from vitviz.gui.compare import B_SLOTS, BDropped, DropB
    from vitviz.gui.timeline import STORE_SLOT, CloseRun, RunClosed

    ctx = SimpleNamespace(model=None, slots={slot: (1, object()) for slot in (*B_SLOTS, STORE_SLOT, "other")})
    assert isinstance(DropB()(ctx), BDropped) and set(ctx.slots) == {STORE_SLOT, "other"}
    assert isinstance(CloseRun()(ctx), RunClosed) and set(ctx.slots) == {"other"}
