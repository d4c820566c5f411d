"""Benchmark the window (offscreen): startup, panel updates on layer/head changes, event-loop stalls.

    python bench/gui.py            # everything (writes a random ViT-B/16 checkpoint to a temp folder)
    python bench/gui.py --quick    # skip ViT-L/16 at 384, the Compare and Timeline rows
    python bench/gui.py --compare --timeline   # only the Compare and Timeline rows
    python bench/gui.py --matrix   # only the window at T = 1370 (attention matrix, all docks visible)
    python bench/gui.py --matrix --against /tmp/base --pairs 3   # ... interleaved with another checkout's vitviz

Prints, measured in this run:
  * time from process start to the window being shown, and whether torch was imported by then (target 1.0 s);
  * p50/p95 time to update every visible panel after a layer or head change, ViT-B/16 at 224 and ViT-L/16 at
    384 (target p95 16 ms), plus the one-off cost of a new image's maps and of rollout;
  * the longest GUI event-loop stall while a ViT-B/16 forward pass runs in the worker (target 50 ms);
  * analysis panels: rollout-panel update per control change at T = 577 (target 50 ms), position-similarity hover
    update at a 37 × 37 grid (target 16 ms), attention-matrix update at T = 1370 (DINOv2 at 518 px);
  * Compare dock: linked layer/head switching with two ViT-B/16 (random weights) loaded and the dock visible
    (target p95 16 ms); Timeline dock: scrubbing a 50-checkpoint run of a small model once cached (target
    100 ms per step);
  * Ctrl+Q on an idle window (a ViT-B/16 loaded, three images run): from the Quit action to the end of the
    process, with the exit-time `gc.freeze` (vitviz.gui.app.FREEZE_AT_EXIT) and without it, interleaved.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
WINDOW_SIZE: tuple[int, int] | None = (1280, 800)   # `--window-size`: the smaller of the two screens we check at
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

STARTUP_CHILD = """
import sys, time, json, tempfile
from PySide6.QtCore import QSettings
from PySide6.QtWidgets import QApplication
from vitviz.gui.app import ensure_app
from vitviz.gui.window import MainWindow
app = ensure_app()
win = MainWindow(QSettings(tempfile.mktemp(suffix='.ini'), QSettings.Format.IniFormat))
win.show()
app.processEvents()
shown = time.time()
torch_loaded = 'torch' in sys.modules
print(json.dumps({'shown': shown, 'torch': torch_loaded}))
win.persist_settings = False
win.close()
"""


def bench_startup(repeats: int = 5) -> None:
    times, torch_seen = [], False
    for _ in range(repeats):
        start = time.time()
        out = subprocess.run([sys.executable, "-c", STARTUP_CHILD], cwd=ROOT, capture_output=True, text=True,
                             check=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
        data = json.loads(out.stdout.strip().splitlines()[-1])
        times.append(data["shown"] - start)
        torch_seen |= data["torch"]
    best, median = min(times), float(np.median(times))
    print(f"startup to window shown: median {median * 1000:.0f} ms, best {best * 1000:.0f} ms "
          f"(target 1000 ms, ratio {median / 1.0:.2f}); torch imported before shown: {torch_seen}")


def synthetic_result(depth: int, heads: int, size: int, patch: int):  # noqa: ANN201
    """A result with random row-stochastic attention, shaped like a real ViT's (no model needed)."""
    from vitviz.core.spec import AttentionResult, ModelSpec

    spec = ModelSpec(family="bench", source="bench", image_size=(size, size), patch_size=patch,
                     embed_dim=64 * heads, depth=depth, num_heads=heads)
    t = spec.num_tokens
    rng = np.random.default_rng(0)
    attn = rng.random((depth, heads, t, t), dtype=np.float32) ** 8
    attn /= attn.sum(-1, keepdims=True)
    image = (rng.random((size, size, 3)) * 255).astype(np.uint8)
    return AttentionResult(attn, np.zeros(1000, np.float32), np.zeros((3, size, size), np.float32), image, spec,
                           source=f"synthetic_{size}.png")


def _window():  # noqa: ANN202
    from PySide6.QtCore import QSettings

    from vitviz.gui.app import ensure_app
    from vitviz.gui.window import MainWindow

    app = ensure_app()
    win = MainWindow(QSettings(tempfile.mktemp(suffix=".ini"), QSettings.Format.IniFormat))
    win.persist_settings = False
    if WINDOW_SIZE:   # the offscreen screen is 800 x 800: too narrow for the docks, which then overlap and paint twice
        win.resize(*WINDOW_SIZE)
    win.show()
    _settle(app, win)
    return app, win


def _settle(app, win, timeout: float = 60.0) -> None:  # noqa: ANN001
    """Wait until the worker has imported torch and probed the devices (a one-off at startup), so that its
    background work does not compete with the GUI-thread updates being measured."""
    import sys

    end = time.perf_counter() + timeout
    while time.perf_counter() < end and ("torch" not in sys.modules or win.session.busy or not win._probed):
        app.processEvents()
        time.sleep(0.01)
    app.processEvents()


def _show(win, maps) -> None:  # noqa: ANN001
    """Put a result computed here into the window's session as if the worker had just run it (with its model's
    spec), and make it the current image: the panels draw it by themselves."""
    spec = maps.result.spec
    win.session.model.spec = spec
    win.controls.set_spec(spec, "cpu")
    win.session.results.put(maps.result.source, maps)
    win.session.set_current(maps.result.source)


def bench_updates(name: str, depth: int, heads: int, size: int, patch: int = 16, steps: int = 120) -> None:
    from vitviz.core.analyses.maps import ResultMaps

    app, win = _window()
    result = synthetic_result(depth, heads, size, patch)
    maps = ResultMaps(result)
    t0 = time.perf_counter()
    maps.stack("cls")
    cls_time = time.perf_counter() - t0
    t0 = time.perf_counter()
    maps.stack("rollout")
    rollout = time.perf_counter() - t0
    t0 = time.perf_counter()
    _show(win, maps)
    app.processEvents()
    first = time.perf_counter() - t0
    times = []
    rng = np.random.default_rng(1)
    for i in range(steps):
        change = {"layer": int(rng.integers(depth))} if i % 2 else {"head": int(rng.integers(heads))}
        t0 = time.perf_counter()
        win.state.update(**change)
        app.processEvents()       # paints every widget the change touched, once
        times.append(time.perf_counter() - t0)
    p50, p95 = np.percentile(times, [50, 95]) * 1000
    print(f"{name}: layer/head change p50 {p50:.1f} ms, p95 {p95:.1f} ms (target p95 16 ms, ratio "
          f"{p95 / 16:.2f}); first show of a new result {first * 1000:.0f} ms (GUI thread); in the worker: "
          f"CLS maps {cls_time * 1000:.0f} ms, rollout of all layers {rollout * 1000:.0f} ms")
    win.close()


def bench_stall(checkpoint: Path, heads: int) -> None:
    from PySide6.QtCore import QElapsedTimer, QTimer

    from vitviz.core.running.images import find_images  # noqa: F401 - warm the import the worker uses

    app, win = _window()
    image = Path(tempfile.mkdtemp()) / "bench.png"
    from PIL import Image

    Image.fromarray((np.random.default_rng(0).random((300, 400, 3)) * 255).astype(np.uint8)).save(image)
    win.load_model(str(checkpoint), heads=heads)
    _wait(app, lambda: win.session.model.spec is not None and win.is_idle(), 300)
    clock, gaps, last = QElapsedTimer(), [], [0]
    clock.start()

    def tick() -> None:
        now = clock.elapsed()
        gaps.append(now - last[0])
        last[0] = now

    timer = QTimer()
    timer.setInterval(2)
    timer.timeout.connect(tick)
    t0 = time.perf_counter()
    win.session.add_images([str(image)])
    last[0] = clock.elapsed()
    timer.start()
    _wait(app, lambda: win.session.result(str(image)) is not None and win.panel.values is not None, 300)
    wall = time.perf_counter() - t0
    for _ in range(20):   # let the drawing of the result land in the measurement too
        app.processEvents()
        time.sleep(0.002)
    timer.stop()
    stall = max(gaps) if gaps else 0
    print(f"event-loop stall during a ViT-B/16 forward pass in the worker: longest {stall} ms over {len(gaps)} "
          f"ticks (target 50 ms, ratio {stall / 50:.2f}); run + display took {wall * 1000:.0f} ms")
    win.close()


def _pct(times: list[float]) -> tuple[float, float]:
    p50, p95 = np.percentile(times, [50, 95]) * 1000
    return float(p50), float(p95)


def bench_rollout_panel(depth: int = 12, heads: int = 12, size: int = 384, steps: int = 30) -> None:
    """Rollout dock redraw after a control change (rollout through the last layer + two overlays), T = 577."""
    from vitviz.core.analyses.maps import ResultMaps

    app, win = _window()
    result = synthetic_result(depth, heads, size, 16)
    maps = ResultMaps(result)
    maps.precompute()                   # done in the worker for every result
    win.dock("rolloutDock").raise_()
    _show(win, maps)
    app.processEvents()
    first = time.perf_counter()
    for fusion in ("max", "min", "mean"):        # one-off per result: fuse the heads, sort keys for discarding
        win.state.update(rollout_fusion=fusion, rollout_discard=0.5)
        app.processEvents()
    first = time.perf_counter() - first
    rng = np.random.default_rng(2)
    times: dict[str, list[float]] = {"residual/start/fusion": [], "discard": []}
    for i in range(steps):
        change = ({"rollout_residual": float(rng.uniform(0.1, 0.9))} if i % 3 == 0 else
                  {"rollout_start": int(rng.integers(depth // 2))} if i % 3 == 1 else
                  {"rollout_fusion": ("mean", "max", "min")[i % 3]})
        for kind, values in (("residual/start/fusion", change), ("discard", {"rollout_discard": 0.1 + 0.8 * i / steps})):
            t0 = time.perf_counter()
            win.state.update(**values)
            app.processEvents()
            times[kind].append(time.perf_counter() - t0)
    t = result.spec.num_tokens
    for kind, values in times.items():
        p50, p95 = _pct(values)
        print(f"rollout panel, ViT-B/16 @{size} (T={t}), {kind} change: p50 {p50:.1f} ms, p95 {p95:.1f} ms "
              f"(target 50 ms, ratio {p95 / 50:.2f}); panel's own compute {win.rollout_panel.last_update_ms:.1f} ms")
    print(f"  one-off per result, first use of max and min fusion and of discarding (fuse heads, sort keys), all "
          f"three together: {first * 1000:.0f} ms (the mean fusion is prepared in the worker)")
    win.state.update(source="rollout")
    app.processEvents()
    t0 = time.perf_counter()
    win.state.update(rollout_residual=0.33)
    app.processEvents()
    print(f"  with the image panel on 'rollout' (every layer's map for the overview too): "
          f"{(time.perf_counter() - t0) * 1000:.1f} ms per change")
    win.close()


def bench_posembed_hover(grid: int = 37, dim: int = 1024, steps: int = 200) -> None:
    """Position-embedding dock: one hover (new similarity map + two frames + repaint) at a 37 x 37 grid."""
    from vitviz.core.spec import ModelSpec
    from vitviz.core.analyses.maps import pos_embed_data

    app, win = _window()
    spec = ModelSpec(family="bench", source="bench", image_size=(grid * 14, grid * 14), patch_size=14,
                     embed_dim=dim, depth=24, num_heads=16, pos_grid=(grid, grid))
    pos = np.random.default_rng(0).normal(size=(1 + grid * grid, dim)).astype(np.float32)
    t0 = time.perf_counter()
    data = pos_embed_data(pos, (grid, grid), 1)
    prep = time.perf_counter() - t0
    win.dock("posEmbedDock").raise_()
    win.posembed.set_data(data, spec)
    app.processEvents()
    rng = np.random.default_rng(3)
    times = []
    for _ in range(steps):
        r, c = (int(v) for v in rng.integers(grid, size=2))
        t0 = time.perf_counter()
        win.panel.hovered.emit(r, c)           # what the image panel sends on a mouse move
        app.processEvents()
        times.append(time.perf_counter() - t0)
    p50, p95 = _pct(times)
    print(f"position-similarity hover at {grid}x{grid} (D={dim}): p50 {p50:.1f} ms, p95 {p95:.1f} ms (target 16 ms, "
          f"ratio {p95 / 16:.2f}); similarities + mosaic in the worker once per size: {prep * 1000:.0f} ms")
    win.close()


def bench_matrix(depth: int = 2, heads: int = 16, size: int = 518, patch: int = 14, steps: int = 30) -> dict:
    """The window at T = 1370 (DINOv2-L/14 at 518 px without registers; the stored layers do not change the
    per-update cost, so only `depth` are built): with the attention-matrix dock raised, a head change, a layer
    change with the heads' mean and max shown, and a query click; a layer change with the Overview or the Head
    statistics dock raised; then with the Overview, Matrix and Head statistics docks floating (520 × 520) beside
    the image panel (all visible at once), a layer change and a head change.
    The result is prepared as the worker prepares a run (`ResultMaps.precompute`); what the view makes off the
    GUI thread (a layer's heads' max, on its first visit) is let finish, untimed, before the next change. Returns
    {row: [p50, p95]} ms and the load average; prints them."""
    from PySide6.QtCore import QThreadPool

    from vitviz.core.analyses.maps import ResultMaps

    app, win = _window()
    result = synthetic_result(depth, heads, size, patch)
    maps = ResultMaps(result)
    maps.precompute()                   # what the worker does after the capture
    win.dock("matrixDock").raise_()
    _show(win, maps)
    app.processEvents()
    times: dict[str, list[float]] = {}

    def timed(kind: str, change: dict) -> None:
        t0 = time.perf_counter()
        win.state.update(**change)
        app.processEvents()       # paints every widget the change touched, once
        times.setdefault(kind, []).append(time.perf_counter() - t0)
        QThreadPool.globalInstance().waitForDone()   # a reduction made off the GUI thread (the heads' max) is done
        app.processEvents()                          # and drawn before the next change, untimed

    for i in range(steps):
        timed("matrix: single head", {"head": i % heads, "layer": i % depth})
        timed("matrix: head mean, layer change", {"head": "mean", "layer": (i + 1) % depth})
        timed("matrix: head max, layer change", {"head": "max", "layer": i % depth})
        timed("matrix: query click", {"query": int(1 + i * 37) % result.spec.num_tokens})
    win.state.update(head="mean", query=None)
    for dock in ("overviewDock", "headStatsDock"):
        win.dock(dock).raise_()
        app.processEvents()
        for i in range(steps):
            timed(f"{dock[:-4]} raised: layer change (head mean)", {"layer": i % depth})
    for dock in ("overviewDock", "matrixDock", "headStatsDock"):
        win.dock(dock).setFloating(True)
        win.dock(dock).resize(520, 520)
        win.dock(dock).show()
    app.processEvents()
    for i in range(steps):
        timed("all visible: layer change (head mean)", {"layer": i % depth})
        timed("all visible: head change", {"head": i % heads})
        win.state.update(head="mean")
        app.processEvents()
    load = os.getloadavg()
    out: dict = {k: list(_pct(v)) for k, v in times.items()}
    out["load"] = list(load)
    print(f"window at T={result.spec.num_tokens} ({heads} heads; load average {load[0]:.2f} {load[1]:.2f}):")
    for kind, values in times.items():
        p50, p95 = _pct(values)
        print(f"  {kind}: p50 {p50:.1f} ms, p95 {p95:.1f} ms (target p95 16 ms)")
    win.close()
    return out


def matrix_pairs(other: Path, pairs: int) -> None:
    """`--matrix` in fresh processes, alternately with the vitviz of the checkout `other` (e.g. one made by `git
    worktree add /tmp/base 18c531f`) and of this one, so that both see the same load; prints each row's p50/p95
    of every run side by side, with the load average each run saw."""
    runs: dict[str, list[dict]] = {"other": [], "this": []}
    for _ in range(pairs):
        for side, root in (("other", other), ("this", ROOT)):
            out = subprocess.run([sys.executable, __file__, "--matrix", "--json", "--root", str(root)], cwd=root,
                                 capture_output=True, text=True, check=True, env=dict(os.environ, PYTHONPATH=str(root)))
            runs[side].append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"window at T = 1370, {pairs} interleaved pairs, p50/p95 ms per run: {other} | this checkout")
    print("  load average (1 min): " + " ".join(f"{r['load'][0]:.1f}" for r in runs["other"]) + " | "
          + " ".join(f"{r['load'][0]:.1f}" for r in runs["this"]))
    for row in (k for k in runs["this"][0] if k != "load"):
        cells = {side: " ".join(f"{r[row][0]:.1f}/{r[row][1]:.1f}" for r in rs) for side, rs in runs.items()}
        print(f"  {row}: {cells['other']} | {cells['this']}")


def _wait(app, condition, timeout_s: float) -> None:  # noqa: ANN001
    end = time.time() + timeout_s
    while not condition():
        if time.time() > end:
            raise TimeoutError("benchmark step did not finish")
        app.processEvents()
        time.sleep(0.001)


def _images(count: int, size: tuple[int, int] = (300, 400)) -> list[str]:
    from PIL import Image

    folder = Path(tempfile.mkdtemp())
    rng = np.random.default_rng(5)
    paths = []
    for i in range(count):
        path = folder / f"bench_{i}.png"
        Image.fromarray((rng.random((*size, 3)) * 255).astype(np.uint8)).save(path)
        paths.append(str(path))
    return paths


def bench_compare(ckpt_a: Path, ckpt_b: Path, heads: int, images: int = 2, steps: int = 120,
                  label: str = "two ViT-B/16 @224") -> None:
    """Switching the linked layer/head with two ViT-B/16 loaded (A in the window, B in the worker's slot), the
    comparison built over the open images and the Compare dock visible: the whole window's update (image panel,
    overview, Compare dock's A / B / A − B, its mapping and scale lines, the summary's layer marker)."""
    app, win = _window()
    paths = _images(images)
    win.load_model(str(ckpt_a), heads=heads)
    _wait(app, lambda: win.session.model.spec is not None and win.is_idle(), 600)
    win.session.add_images(paths)
    _wait(app, lambda: all(win.session.cached(p) is not None for p in paths) and win.is_idle(), 600)
    t0 = time.perf_counter()
    win.compare_with(str(ckpt_b), heads=heads)
    _wait(app, lambda: win.compare.view is not None and win.is_idle(), 900)
    built = time.perf_counter() - t0
    win.dock("compareDock").raise_()
    for _ in range(20):
        app.processEvents()
        time.sleep(0.005)
    assert win.compare_panel.is_shown() and win.compare_panel.frame is not None
    depth = win.session.model.spec.depth
    rng = np.random.default_rng(1)
    times, own, cpu = [], [], []     # cpu: the GUI thread's own CPU time, less swayed by the load than the wall time
    for i in range(steps):
        change = {"layer": int(rng.integers(depth))} if i % 2 else {"head": int(rng.integers(heads))}
        t0, c0 = time.perf_counter(), time.thread_time()
        win.state.update(**change)
        app.processEvents()
        times.append(time.perf_counter() - t0)
        cpu.append(time.thread_time() - c0)
        t1 = time.perf_counter()
        win.compare_panel.redraw()
        own.append(time.perf_counter() - t1)
    win.dock("timelineDock").raise_()              # the same window with the Compare dock behind another tab
    for _ in range(10):
        app.processEvents()
    hidden = []
    for i in range(steps):
        change = {"layer": int(rng.integers(depth))} if i % 2 else {"head": int(rng.integers(heads))}
        t0 = time.perf_counter()
        win.state.update(**change)
        app.processEvents()
        hidden.append(time.perf_counter() - t0)
    p50, p95 = _pct(times)
    o50, o95 = _pct(own)
    h50, h95 = _pct(hidden)
    c50, c95 = _pct(cpu)
    print(f"compare, {label} (random weights, {images} images), linked layer/head change with the Compare "
          f"dock visible: p50 {p50:.1f} ms, p95 {p95:.1f} ms (target p95 16 ms, ratio {p95 / 16:.2f}; the GUI thread's "
          f"CPU time p50 {c50:.1f} ms, p95 {c95:.1f} ms); the dock's own "
          f"redraw p50 {o50:.1f} ms, p95 {o95:.1f} ms; the same window with the dock hidden p50 {h50:.1f} ms, p95 "
          f"{h95:.1f} ms; B loaded, run and heads matched (with CKA features) in the "
          f"worker in {built:.1f} s")
    win.compare.close()
    win.close()


def bench_timeline(checkpoints: int = 50, steps: int = 200) -> None:
    """Scrubbing a 50-checkpoint run of a small model (4 layers, 4 heads, width 64, 8 x 8 patches) once every
    checkpoint's result is held: one slider step to the map and the plots redrawn, per step."""
    from _tiny import write_tiny_checkpoint

    app, win = _window()
    run = Path(tempfile.mkdtemp()) / "run"
    run.mkdir()
    for k in range(checkpoints):
        write_tiny_checkpoint(run / f"step-{(k + 1) * 100}.pth", embed_dim=64, depth=4, grid=(8, 8), seed=k)
    paths = _images(1, (64, 64))
    win.session.add_images(paths, show=True)
    _wait(app, lambda: win.session.image_list.current, 60)
    t0 = time.perf_counter()
    win.open_run(str(run), heads=4)
    _wait(app, lambda: win.timeline.store is not None, 120)
    store = win.timeline.store
    _wait(app, lambda: not store.missing(paths[0]) and win.is_idle(), 900)
    filled = time.perf_counter() - t0
    held = sum(store.peek(k, paths[0]) is not None for k in range(checkpoints))
    win.dock("timelineDock").raise_()
    for _ in range(20):
        app.processEvents()
        time.sleep(0.005)
    panel = win.timeline_panel
    times = []
    for i in range(steps):
        k = (i * 7) % checkpoints if i % 2 else (i // 2) % checkpoints      # neighbours and jumps
        t0 = time.perf_counter()
        panel.set_checkpoint(k)
        app.processEvents()
        times.append(time.perf_counter() - t0)
        assert panel.shown_k == k
    p50, p95 = _pct(times)
    print(f"timeline, {checkpoints} checkpoints of a small ViT (4 x 4 heads, 64 px), all {held} held: scrubbing p50 "
          f"{p50:.1f} ms, p95 {p95:.1f} ms per step (target 100 ms, ratio {p95 / 100:.2f}); every checkpoint loaded "
          f"and run in the worker in {filled:.1f} s")
    win.timeline.close()
    win.close()


QUIT_CHILD = """
import sys, time
from PySide6.QtCore import QTimer
import vitviz.gui.app as app_module
app_module.FREEZE_AT_EXIT = sys.argv.pop(1) == "freeze"
def quit_when_idle(win):
    if win.session.model.spec is None or not win.is_idle() or not all(win.session.result(p) for p in win.session.image_list.paths):
        QTimer.singleShot(50, lambda: quit_when_idle(win))
        return
    print("quit", time.time(), flush=True)
    win.menus.actions["quit"].trigger()
apply_args = app_module.apply_args
def apply_then_quit(win, args):
    apply_args(win, args)
    QTimer.singleShot(500, lambda: quit_when_idle(win))
app_module.apply_args = apply_then_quit
from vitviz.cli import main
sys.exit(main())
"""


def bench_quit(checkpoint: Path, heads: int, repeats: int = 3) -> None:
    """Seconds from Ctrl+Q's action to the end of a `vitviz` process, with and without the exit-time gc.freeze."""
    times: dict[str, list[float]] = {"freeze": [], "no freeze": []}
    env = dict(os.environ, PYTHONPATH=str(ROOT), VITVIZ_SETTINGS=str(Path(tempfile.mkdtemp()) / "quit.ini"))
    for _ in range(repeats):
        for mode in times:
            proc = subprocess.Popen([sys.executable, "-c", QUIT_CHILD, mode.replace(" ", "-"), "--model",
                                     str(checkpoint), "--heads", str(heads)], cwd=ROOT, env=env,
                                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            out, _ = proc.communicate(timeout=300)
            ended = time.time()
            quit_at = float(next(line.split()[1] for line in out.splitlines() if line.startswith("quit ")))
            times[mode].append(ended - quit_at)
    with_freeze, without = float(np.median(times["freeze"])), float(np.median(times["no freeze"]))
    print(f"Ctrl+Q on an idle window to process end (ViT-B/16 loaded, median of {repeats}): {with_freeze:.2f} s "
          f"with the exit-time gc.freeze, {without:.2f} s without (ratio {with_freeze / without:.2f})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="skip ViT-L/16 at 384")
    parser.add_argument("--panels", action="store_true", help="only the analysis-panel benchmarks")
    parser.add_argument("--quit", action="store_true", help="only Ctrl+Q's time to exit")
    parser.add_argument("--compare", action="store_true",
                        help="only the Compare dock: linked layer/head switching with two ViT-B/16 loaded")
    parser.add_argument("--timeline", action="store_true",
                        help="only the Timeline dock: scrubbing a 50-checkpoint run once cached")
    parser.add_argument("--matrix", action="store_true", help="only the window at T = 1370: the attention-matrix "
                        "view and a layer change with the Overview, Matrix and Head statistics docks visible")
    parser.add_argument("--large", action="store_true", help="with --compare: two ViT-L/14 @518 (T = 1370) instead "
                        "of two ViT-B/16 (minutes; ~15 GiB)")
    parser.add_argument("--json", action="store_true", help="with --matrix: also print its numbers as one JSON line")
    parser.add_argument("--against", type=Path, metavar="CHECKOUT",
                        help="with --matrix: interleaved runs with the vitviz of another checkout and of this one")
    parser.add_argument("--pairs", type=int, default=3, help="with --against: how many pairs of runs")
    parser.add_argument("--root", type=Path, help=argparse.SUPPRESS)   # the checkout whose vitviz a child runs
    parser.add_argument("--window-size", default="1280x800", help="the window's size, WxH (default 1280x800, a "
                        "laptop screen; 'screen': as the window opens itself on the offscreen 800 x 800 screen)")
    args = parser.parse_args()
    global WINDOW_SIZE
    WINDOW_SIZE = None if args.window_size == "screen" else tuple(int(v) for v in args.window_size.split("x"))
    if args.root is not None:
        sys.path[:0] = [str(args.root), str(args.root / "tests")]
    if args.matrix and args.against is not None:
        matrix_pairs(args.against.resolve(), args.pairs)
        return 0
    if args.matrix:
        numbers = bench_matrix()
        if args.json:
            print(json.dumps(numbers))
        return 0
    if args.compare or args.timeline:
        if args.timeline:
            bench_timeline()
        if args.compare:
            _bench_compare_models(large=args.large)
        return 0
    if args.quit:
        from _tiny import write_tiny_checkpoint

        with tempfile.TemporaryDirectory() as tmp:
            ckpt = write_tiny_checkpoint(Path(tmp) / "vit_b16.pth", embed_dim=768, depth=12, patch=16,
                                         grid=(14, 14), num_classes=1000)
            bench_quit(ckpt, heads=12)
        return 0
    bench_rollout_panel()
    bench_posembed_hover()
    bench_matrix()
    if args.panels:
        return 0
    bench_startup()
    bench_updates("ViT-B/16 @224 (12 x 12, 197 tokens)", 12, 12, 224)
    if not args.quick:
        bench_updates("ViT-L/16 @384 (24 x 16, 577 tokens)", 24, 16, 384)
    from _tiny import write_tiny_checkpoint

    with tempfile.TemporaryDirectory() as tmp:
        ckpt = write_tiny_checkpoint(Path(tmp) / "vit_b16.pth", embed_dim=768, depth=12, patch=16, grid=(14, 14),
                                     num_classes=1000)
        bench_stall(ckpt, heads=12)
        bench_quit(ckpt, heads=12)
    if not args.quick:
        bench_timeline()
        _bench_compare_models()
    return 0


def _bench_compare_models(large: bool = False) -> None:
    """Two ViT-B/16 @224 (`large`: two ViT-L/14 @518, T = 1370, 24 layers x 16 heads) with random weights."""
    from _tiny import write_tiny_checkpoint

    with tempfile.TemporaryDirectory() as tmp:
        if large:
            a, b = (write_tiny_checkpoint(Path(tmp) / f"vit_l14_{n}.pth", embed_dim=1024, depth=24, patch=14,
                                          grid=(37, 37), num_classes=1000, seed=n) for n in (0, 1))
        else:
            a, b = (write_tiny_checkpoint(Path(tmp) / f"vit_b16_{n}.pth", embed_dim=768, depth=12, patch=16,
                                          grid=(14, 14), num_classes=1000, seed=n) for n in (0, 1))
        bench_compare(a, b, heads=16 if large else 12, images=1 if large else 2,
                      label="two ViT-L/14 @518" if large else "two ViT-B/16 @224")


if __name__ == "__main__":
    raise SystemExit(main())
