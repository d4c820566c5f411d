"""Benchmark the window (offscreen): startup, panel updates on layer/head changes, event-loop stalls.

    python bench/gui.py            # everything (writes a random ViT-B/16 checkpoint to a temp folder)
    python bench/gui.py --quick    # skip ViT-L/16 at 384

Prints, measured in this run:
  * time from process start to the window being shown, and whether torch was imported by then (target 1.0 s);
  * p50/p95 time to update every visible panel after a layer or head change, ViT-B/16 at 224 and ViT-L/16 at
    384 (target p95 16 ms), plus the one-off cost of a new image's maps and of rollout;
  * the longest GUI event-loop stall while a ViT-B/16 forward pass runs in the worker (target 50 ms).
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
    win.show()
    app.processEvents()
    return app, win


def bench_updates(name: str, depth: int, heads: int, size: int, patch: int = 16, steps: int = 120) -> None:
    from vitviz.gui.maps import ResultMaps

    app, win = _window()
    result = synthetic_result(depth, heads, size, patch)
    win.session.spec = result.spec
    win.controls.set_spec(result.spec, "cpu")
    maps = ResultMaps(result)
    t0 = time.perf_counter()
    maps.stack("cls")
    cls_time = time.perf_counter() - t0
    t0 = time.perf_counter()
    maps.stack("rollout")
    rollout = time.perf_counter() - t0
    win.session._cache[result.source] = maps
    t0 = time.perf_counter()
    win.session.current = result.source
    win._refresh({"image"})
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

    from vitviz.core.images import find_images  # noqa: F401 - warm the import the worker uses

    app, win = _window()
    image = Path(tempfile.mkdtemp()) / "bench.png"
    from PIL import Image

    Image.fromarray((np.random.default_rng(0).random((300, 400, 3)) * 255).astype(np.uint8)).save(image)
    win.load_model(str(checkpoint), heads=heads)
    _wait(app, lambda: win.session.spec is not None and win.is_idle(), 300)
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
    win.add_images([str(image)])
    last[0] = clock.elapsed()
    timer.start()
    _wait(app, lambda: win.session.result(str(image)) is not None and win._values is not None, 300)
    wall = time.perf_counter() - t0
    for _ in range(20):   # let the drawing of the result land in the measurement too
        app.processEvents()
        time.sleep(0.002)
    timer.stop()
    stall = max(gaps) if gaps else 0
    print(f"event-loop stall during a ViT-B/16 forward pass in the worker: longest {stall} ms over {len(gaps)} "
          f"ticks (target 50 ms, ratio {stall / 50:.2f}); run + display took {wall * 1000:.0f} ms")
    win.close()


def _wait(app, condition, timeout_s: float) -> None:  # noqa: ANN001
    end = time.time() + timeout_s
    while not condition():
        if time.time() > end:
            raise TimeoutError("benchmark step did not finish")
        app.processEvents()
        time.sleep(0.001)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="skip ViT-L/16 at 384")
    args = parser.parse_args()
    bench_startup()
    bench_updates("ViT-B/16 @224 (12 x 12, 197 tokens)", 12, 12, 224)
    if not args.quick:
        bench_updates("ViT-L/16 @384 (24 x 16, 577 tokens)", 24, 16, 384)
    from _tiny import write_tiny_checkpoint

    with tempfile.TemporaryDirectory() as tmp:
        ckpt = write_tiny_checkpoint(Path(tmp) / "vit_b16.pth", embed_dim=768, depth=12, patch=16, grid=(14, 14),
                                     num_classes=1000)
        bench_stall(ckpt, heads=12)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
