"""Benchmark: the Compare view model with two ViT-B/16 results (random weights, 224 px).

Run from the repository root: `python bench/compare.py [--images 2] [--switches 2000]`.

Two timm `vit_base_patch16_224` state dicts with random weights (two seeds) are loaded with `vitviz.load` and run
on generated images; `vitviz.core.analyses.compare.CompareView` is built from their results (the worker's part: CLS stacks,
Hungarian head matching over the images, B aligned to A) and then asked for the A, B and A − B maps of random
linked (layer, head) selections, as the window does on every switch. Printed: p50 / p95 of one `frame` call
against the 16 ms frame budget (the GUI's painting comes on top: `bench/gui.py` once the Compare mode exists), the
first call of a query token map (its stacks are built once per query), and the build.
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

from bench.common import timm_vit_b16  # noqa: E402

TARGET_S = 0.016


def _pct(times: list[float]) -> tuple[float, float]:
    return float(np.percentile(times, 50)), float(np.percentile(times, 95))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=2)
    parser.add_argument("--switches", type=int, default=2000)
    parser.add_argument("--queries", type=int, default=20)
    args = parser.parse_args(argv)
    import torch

    import vitviz
    from vitviz.core.analyses.compare import CompareView

    torch.set_num_threads(2)
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, (224, 224, 3), dtype=np.uint8) for _ in range(args.images)]
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        results = []
        for seed in (0, 1):
            folder = Path(tmp) / f"m{seed}"
            folder.mkdir()
            _, path = timm_vit_b16(folder, seed=seed)
            model = vitviz.load(path)
            results.append([model.run(img, logits=False) for img in images])
            del model
    spec = results[0][0].spec
    print(f"two ViT-B/16 results: depth {spec.depth}, heads {spec.num_heads}, grid {spec.grid}, {args.images} images")
    start = time.perf_counter()
    view = CompareView(results[0], results[1])
    build = time.perf_counter() - start
    depth, heads = spec.depth, spec.num_heads
    choices = [(int(rng.integers(args.images)), int(rng.integers(depth)),
                int(rng.integers(heads)) if rng.random() < 0.8 else str(rng.choice(["mean", "max"])))
               for _ in range(args.switches)]
    for n, layer, head in choices[:50]:
        view.frame(n, layer, head)                                         # warm-up
    times = []
    for n, layer, head in choices:
        t0 = time.perf_counter()
        view.frame(n, layer, head)
        times.append(time.perf_counter() - t0)
    p50, p95 = _pct(times)
    first_query, again = [], []
    p = spec.num_prefix
    for q in rng.choice(spec.grid[0] * spec.grid[1], args.queries, replace=False):
        t0 = time.perf_counter()
        view.frame(0, int(rng.integers(depth)), int(rng.integers(heads)), query=p + int(q))
        first_query.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        view.frame(0, int(rng.integers(depth)), int(rng.integers(heads)), query=p + int(q))
        again.append(time.perf_counter() - t0)
    q50, q95 = _pct(first_query)
    a50, a95 = _pct(again)
    print(f"CompareView build (worker, once per image set): {build * 1e3:.1f} ms")
    print(f"linked layer/head switch, frame(): p50 {p50 * 1e3:.3f} ms, p95 {p95 * 1e3:.3f} ms over "
          f"{args.switches} switches; p95 / 16 ms target = {p95 / TARGET_S:.4f}x")
    print(f"new query token (its stacks for all {args.images} images built): p50 {q50 * 1e3:.1f} ms, "
          f"p95 {q95 * 1e3:.1f} ms = {q95 / TARGET_S:.2f}x the 16 ms target; the same query again: "
          f"p95 {a95 * 1e3:.3f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
