"""Benchmark: what the Ray engine's progress a batch at a time costs (`vitviz export --engine ray`).

Run from the repository root: `python bench/ray_progress.py [--images 64] [--batch-size 8] [--rounds 2]`.

The Ray engine hands Ray Data one block per batch (`vitviz.batch.ray_engine.BATCHES_PER_BLOCK = 1`) and takes each
finished block as it comes, so the progress moves a batch at a time. Before, blocks held four batches (and the
driver also read one block ahead, which is not reproduced here: it costs nothing), so the first progress came after
several batches and then jumped. This runs the same export with both block sizes on a local Ray started once here
(`ray.init(num_cpus=actors + 1)`), interleaved, with a small model (timm `vit_tiny_patch16_224`, random weights) so
that Ray's cost per block weighs as much as it can, and prints per setting: images/s, seconds to the first
progress step, the longest wait between two steps, and the images/s ratio (the overhead of the smaller blocks).
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from common import image_folder  # noqa: I001

import vitviz.batch.ray_engine as ray_engine
from vitviz.cli import main as vitviz_main
from vitviz.cli.progress import ProgressBar


def tiny_checkpoint(folder: Path) -> Path:
    """timm `vit_tiny_patch16_224` (5.7 M parameters) with random weights, saved as a timm state dict."""
    import timm
    import torch

    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False).eval()
    path = folder / "vit_tiny_patch16_224.pth"
    torch.save(model.state_dict(), path)
    return path


def one_run(ckpt: Path, images: Path, out: Path, batch: int, actors: int, per_block: int) -> dict[str, float]:
    """One `vitviz export --engine ray` with `per_block` batches a block: seconds, first step, longest gap."""
    shutil.rmtree(out, ignore_errors=True)
    steps: list[float] = []
    advance = ProgressBar.advance

    def timed(self: ProgressBar, n: int = 1) -> None:
        steps.append(time.perf_counter())
        advance(self, n)

    ProgressBar.advance = timed  # type: ignore[method-assign]
    ray_engine.BATCHES_PER_BLOCK = per_block
    try:
        start = time.perf_counter()
        code = vitviz_main(["export", "--model", str(ckpt), "--heads", "3", str(images), "--out", str(out), "--quiet",
                            "--no-verify", "--engine", "ray", "--actors", str(actors), "--batch-size", str(batch)])
        seconds = time.perf_counter() - start
    finally:
        ProgressBar.advance = advance  # type: ignore[method-assign]
    assert code == 0, f"vitviz export exited {code}"
    gaps = [b - a for a, b in zip([start, *steps], steps)]
    return {"seconds": seconds, "first": steps[0] - start, "gap": max(gaps[1:] or [0.0])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--actors", type=int, default=1)
    args = parser.parse_args()
    import ray

    settings = {"a block per batch (now)": 1, "4 batches a block (before)": 4}
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in settings}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        ckpt = tiny_checkpoint(folder)
        images = image_folder(folder / "images", args.images)
        ray.init(address="local", num_cpus=args.actors + 1, include_dashboard=False, log_to_driver=False)
        try:
            one_run(ckpt, images, folder / "out", args.batch_size, args.actors, 1)  # warm-up (workers, imports)
            for r in range(args.rounds):
                for name in list(settings)[:: 1 if r % 2 == 0 else -1]:
                    runs[name].append(one_run(ckpt, images, folder / "out", args.batch_size, args.actors,
                                              settings[name]))
        finally:
            ray.shutdown()
    print(f"vit_tiny_patch16_224 @224, {args.images} JPEGs, batches of {args.batch_size}, {args.actors} actor(s), "
          f"{args.rounds} interleaved round(s), medians; Ray started once (not included)")
    med = {name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in runs.items()}
    for name, m in med.items():
        print(f"  {name:<28} {m['seconds']:6.2f} s  {args.images / m['seconds']:6.2f} images/s  first progress "
              f"after {m['first']:5.2f} s, longest wait between steps {m['gap']:5.2f} s")
    now, before = med["a block per batch (now)"], med["4 batches a block (before)"]
    print(f"images/s, a block per batch / 4 batches a block = {before['seconds'] / now['seconds']:.2f}x "
          f"(overhead {100 * (now['seconds'] / before['seconds'] - 1):+.1f} %)")


if __name__ == "__main__":
    main()
