"""Benchmark: scrubbing a 50-checkpoint timeline of a demo-sized model through `TimelineStore`.

Run from the repository root: `python bench/timeline.py [--checkpoints 50] [--images 1]`.

The run: `--checkpoints` folders `checkpoint-{step}/` in the layout `vitviz.demo.train --save-every` writes, each
the demo architecture (64 px, patch 8, width 64, depth 3, 4 heads) with its own random weights. Measured:

- first load per checkpoint: `store.result(k, image)` on a checkpoint not held (vitviz.load of its folder, the
  forward pass, the CLS / rollout stacks and head statistics): the worker's part of a first visit;
- a step once cached: what the window needs to show checkpoint k: `store.peek(k, image)`, the map of the selected
  layer and head, the series for the plots with a box (`store.series`), and the map drawn as a picture by the
  export renderer (`core.render.draw_map`, standing in for the panel's paint until the window has a timeline);
  scrubbed forwards and back over all checkpoints. Target: <= 100 ms a step.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

TARGET_S = 0.100


def make_run(folder: Path, count: int, every: int = 200) -> Path:
    """`count` demo-sized checkpoints with random weights, as `vitviz.demo.train --save-every` lays them out."""
    from vitviz.core.running.model import ReferenceViT
    from vitviz.demo.train import TrainConfig, demo_spec, init_weights, save

    cfg = TrainConfig()
    spec = demo_spec(cfg)
    for i in range(count):
        net = ReferenceViT(spec)
        init_weights(net, seed=i)
        save(net, cfg, folder / f"checkpoint-{(i + 1) * every}")
    return folder


def _pct(times: list[float]) -> tuple[float, float]:
    return float(np.percentile(times, 50)), float(np.percentile(times, 95))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoints", type=int, default=50)
    parser.add_argument("--images", type=int, default=1)
    parser.add_argument("--sweeps", type=int, default=4, help="scrubs over the whole run once cached")
    args = parser.parse_args(argv)
    import torch

    from vitviz.core.drawing.render import RenderOptions, draw_map
    from vitviz.core.analyses.timeline import TimelineStore, open_run
    from vitviz.demo import shapes

    torch.set_num_threads(1)
    keys = [f"img{i}" for i in range(args.images)]
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = open_run(make_run(Path(tmp), args.checkpoints))
        store = TimelineStore(run)
        for i, key in enumerate(keys):
            store.add_image(key, shapes.make_sample(7, i).image)
        first = []
        for k in range(len(run)):
            for key in keys:
                t0 = time.perf_counter()
                store.result(k, key)
                first.append(time.perf_counter() - t0)
    spec = store.peek(0, keys[0]).result.spec
    print(f"{len(run)} checkpoints ({run.order_note}), depth {spec.depth}, heads {spec.num_heads}, grid {spec.grid}; "
          f"{store.nbytes / 2**20:.1f} MiB held for {args.images} image(s)")
    opts = RenderOptions()
    box = (0.25, 0.25, 0.75, 0.75)
    rng = np.random.default_rng(0)
    steps, lookups = [], []
    order = list(range(len(run))) + list(range(len(run) - 1, -1, -1))
    for sweep in range(args.sweeps):
        for k in order:
            key = keys[int(rng.integers(len(keys)))]
            layer, head = int(rng.integers(spec.depth)), "mean" if sweep % 2 else int(rng.integers(spec.num_heads))
            t0 = time.perf_counter()
            maps = store.peek(k, key)
            stack = maps.stack("cls")
            stack.select(layer, head)
            series = store.series(key, box)
            t1 = time.perf_counter()
            draw_map(stack, layer, head, maps.result.image, maps.result.image.shape[:2], spec.patch_size, opts)
            t2 = time.perf_counter()
            lookups.append(t1 - t0)
            steps.append(t2 - t0)
            assert series.done.all()
    f50, f95 = _pct(first)
    l50, l95 = _pct(lookups)
    s50, s95 = _pct(steps)
    print(f"first load per checkpoint (load + run + stacks): p50 {f50 * 1e3:.1f} ms, p95 {f95 * 1e3:.1f} ms")
    print(f"step once cached, store only (peek + map + series with a box): p50 {l50 * 1e3:.3f} ms, p95 "
          f"{l95 * 1e3:.3f} ms = {l95 / TARGET_S:.4f}x the 100 ms target")
    print(f"step once cached, with the picture drawn (draw_map): p50 {s50 * 1e3:.2f} ms, p95 {s95 * 1e3:.2f} ms = "
          f"{s95 / TARGET_S:.3f}x the 100 ms target ({len(steps)} steps)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
