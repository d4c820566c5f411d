"""Benchmark: class relevance against a plain forward, feature PCA of one image, patch-similarity hover.

Run from the repository root: `python bench/relevance.py [--repeats N] [--threads N] [--device cpu|cuda]`. On a
shared, loaded machine run it single-threaded (`OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 ... --threads 1`): idle
worker threads waiting for a descheduled sibling make small multi-threaded ops tens of times slower there.

- relevance: `class_relevance` (one forward and one backward with autograd; Chefer, gradient rollout and
  attention x gradient maps) and `legrad` on a random-weight timm ViT-B/16 at 224, against a bare no-grad forward
  (`net(x)` under inference mode) and against `VitModel.run` (the plain capture), medians of interleaved repeats;
  target <= 2.5x the bare forward;
- PCA: `feature_pca` of one image's last-layer features (ViT-B/16 @224: 196 x 768, from a real capture), and of a
  37 x 37 x 1024 grid (ViT-L/14 @518 sized, random features) for scale; target <= 50 ms for one ViT-B/16 image;
- hover: `PatchSimilarity.maps` across two 37 x 37 grids (D = 768 and 1024), p50/p95 over random patches; target
  p95 <= 16 ms (one frame).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from bench.common import interleaved, ratio_line  # noqa: E402

LABELS = tuple(f"class {i}" for i in range(1000))  # random weights: no ImageNet names guessed

def bench_relevance(repeats: int, device: str) -> None:
    import timm
    import torch

    import vitviz
    from vitviz.core.analyses.relevance import class_relevance, legrad

    torch.manual_seed(0)
    timm_model = timm.create_model("vit_base_patch16_224", pretrained=False).eval()
    model = vitviz.load(timm_model, device=device, labels=LABELS)
    del timm_model
    x = torch.rand(1, 3, 224, 224) * 2 - 1
    xd = x.to(model.device)

    def bare() -> None:
        with torch.inference_mode():
            model.net(xd)
        if xd.is_cuda:
            torch.cuda.synchronize()

    times = interleaved({
        "bare": bare,
        "run": lambda: model.run(x),
        "relevance": lambda: class_relevance(model, x, 281),
        "legrad": lambda: legrad(model, x, 281),
    }, repeats=repeats)
    print(f"ViT-B/16 @224 on {model.device} (packed linears: {model.packed_layers}), median of {repeats} interleaved")
    print(ratio_line("class_relevance / bare forward", times["relevance"], times["bare"], "(target <= 2.5x)"))
    print(ratio_line("class_relevance / VitModel.run (capture)", times["relevance"], times["run"]))
    print(ratio_line("legrad (last 2 layers) / bare forward", times["legrad"], times["bare"]))
    print(ratio_line("VitModel.run / bare forward", times["run"], times["bare"]))


def _median_ms(fn, repeats: int) -> float:  # noqa: ANN001
    fn()
    ts = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - start)
    return statistics.median(ts) * 1e3


def bench_pca(repeats: int) -> None:
    import timm
    import torch

    import vitviz
    from vitviz.core.analyses.features import capture_features, feature_pca, pca_colors

    torch.manual_seed(0)
    model = vitviz.load(timm.create_model("vit_base_patch16_224", pretrained=False).eval(), device="cpu",
                        labels=LABELS)
    feats = capture_features(model, torch.rand(1, 3, 224, 224) * 2 - 1, layers=[-1])
    capture = _median_ms(lambda: capture_features(model, torch.rand(1, 3, 224, 224), layers=[-1]), max(3, repeats // 4))
    one = _median_ms(lambda: feature_pca(feats, foreground="auto", threshold=-1.0), repeats)
    rng = np.random.default_rng(0)
    # features with a decaying spectrum (64 directions, ratio 0.8) plus noise, like real ones; and plain noise, the
    # worst case (a flat spectrum: no fast top eigenvectors, the full eigh)
    basis = np.linalg.qr(rng.standard_normal((1024, 64)))[0].T  # (64, 1024)
    big = (rng.standard_normal((1369, 64)) * 0.8 ** np.arange(64)) @ basis + 0.05 * rng.standard_normal((1369, 1024))
    big = big.reshape(37, 37, 1024).astype(np.float32)
    flat = rng.standard_normal((37, 37, 1024)).astype(np.float32)
    large = _median_ms(lambda: pca_colors([big], threshold=-1.0), max(3, repeats // 4))
    worst = _median_ms(lambda: pca_colors([flat], threshold=-1.0), 3)
    print(f"feature PCA, median of {repeats}")
    print(f"  one ViT-B/16 @224 image (196 x 768)            {one:8.2f} ms  (target <= 50 ms)")
    print(f"  one 37 x 37 x 1024 grid (ViT-L/14 @518 sized)  {large:8.2f} ms (decaying spectrum)")
    print(f"  the same size, white noise (flat spectrum)     {worst:8.2f} ms (worst case)")
    print(f"  capture_features, last layer, ViT-B/16 @224    {capture:8.2f} ms (a forward pass)")


def bench_hover(count: int) -> None:
    from vitviz.core.analyses.features import PatchSimilarity

    rng = np.random.default_rng(0)
    print(f"similarity hover across two 37 x 37 grids, {count} random patches")
    for d in (768, 1024):
        a, b = (rng.standard_normal((37, 37, d)).astype(np.float32) for _ in range(2))
        start = time.perf_counter()
        sim = PatchSimilarity(a, b)
        setup = (time.perf_counter() - start) * 1e3
        ts = []
        for r, c in rng.integers(0, 37, size=(count, 2)):
            start = time.perf_counter()
            sim.maps(int(r), int(c))
            ts.append((time.perf_counter() - start) * 1e3)
        p50, p95 = np.percentile(ts, [50, 95])
        print(f"  D={d:<5} p50 {p50:6.3f} ms  p95 {p95:6.3f} ms  (target p95 <= 16 ms); unit features once: "
              f"{setup:.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--hover", type=int, default=500, help="hover queries")
    args = parser.parse_args()
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    import os

    blas = os.environ.get("OPENBLAS_NUM_THREADS") or os.environ.get("OMP_NUM_THREADS") or "default"
    print(f"torch {torch.__version__}, {torch.get_num_threads()} torch threads, BLAS threads: {blas}")
    bench_relevance(args.repeats, args.device)
    bench_pca(args.repeats)
    bench_hover(args.hover)


if __name__ == "__main__":
    main()
