"""Benchmark: `vitviz export` throughput against a plain inference loop over the same images.

Run from the repository root: `python bench/export.py [--images 200] [--rounds 2] [--quick]`.

Both sides start from the same checkpoint file (torchvision `vit_b_16`, random weights) and a folder of JPEGs,
and both include loading the model:
- vitviz: `vitviz export --model vit_b_16.pth FOLDER --out DIR --quiet` (default maps: CLS attention of the last
  layer, head mean, one PNG per image), run in this process through `vitviz.cli.main`, fresh output folder.
- plain: torchvision's `vit_b_16` with its own preset transform, `model(x)` for each image in a loop.
Rounds alternate the order; the ratio of medians is printed. Target: vitviz >= 0.8x the plain loop's images/s.

`--engine ray [--actors 2]` compares the two engines of `vitviz export` instead (`pip install "vitviz[ray]"`): the
local one and `--engine ray --actors N` on a local Ray started once here (`ray.init(num_cpus=N + 1)`: a CPU
each actor reserves, one for decoding; its start-up is timed apart), both into fresh folders; also each engine on
two images, so that the Ray job's fixed cost (actors loading the model, the job's start) and its cost per image
are told apart: overhead per image = ((ray(n) - ray(2)) - (local(n) - local(2))) / (n - 2).
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch

from common import image_folder, torchvision_vit_b16  # noqa: I001

from vitviz.cli import main as vitviz_main


def run_vitviz(ckpt: Path, images: Path, out: Path, device: str, extra: list[str]) -> float:
    """Seconds for one `vitviz export` run into an empty folder."""
    shutil.rmtree(out, ignore_errors=True)
    start = time.perf_counter()
    code = vitviz_main(["export", "--model", str(ckpt), str(images), "--out", str(out), "--quiet",
                        "--device", device, *extra])
    seconds = time.perf_counter() - start
    assert code == 0, f"vitviz export exited {code}"
    return seconds


def run_engines(ckpt: Path, images: Path, folder: Path, n: int, rounds: int, device: str, extra: list[str],
                actors: int) -> None:
    """`vitviz export` local vs `--engine ray --actors N`, n images and two, interleaved."""
    import ray

    start = time.perf_counter()
    ray.init(address="local", num_cpus=actors + 1, include_dashboard=False, log_to_driver=False)
    started = time.perf_counter() - start
    two = folder / "two"
    two.mkdir()
    for path in sorted(images.glob("*.jpg"))[:2]:
        shutil.copy(path, two / path.name)
    ray_args = [*extra, "--engine", "ray", "--actors", str(actors)]
    runs = {"local": (images, extra), "ray": (images, ray_args), "local, 2 images": (two, extra),
            "ray, 2 images": (two, ray_args)}
    times: dict[str, list[float]] = {name: [] for name in runs}
    for r in range(rounds):
        for name in list(runs)[:: 1 if r % 2 == 0 else -1]:
            source, args = runs[name]
            times[name].append(run_vitviz(ckpt, source, folder / "out", device, args))
    ray.shutdown()
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"ViT-B/16 @224, {n} JPEGs, {device}, {torch.get_num_threads()} torch threads (each actor too), {rounds} "
          f"interleaved round(s), model loading included; Ray started in {started:.1f} s (not included)")
    for name, t in med.items():
        count = 2 if "2 images" in name else n
        print(f"  {name:<16} {t:7.2f} s  {count / t:6.2f} images/s   (runs: {', '.join(f'{s:.2f}' for s in times[name])})")
    per_image = ((med["ray"] - med["ray, 2 images"]) - (med["local"] - med["local, 2 images"])) / max(1, n - 2)
    print(f"ray ({actors} actors) / local images/s = {med['local'] / med['ray']:.2f}x; Ray's fixed cost "
          f"{med['ray, 2 images'] - med['local, 2 images']:.1f} s, overhead per image {1000 * per_image:+.0f} ms")


def run_plain(ckpt: Path, images: Path, device: str) -> float:
    """Seconds for the plain loop: build torchvision's model from the file, then one image at a time."""
    import torchvision
    from PIL import Image

    start = time.perf_counter()
    model = torchvision.models.vit_b_16()
    model.load_state_dict(torch.load(ckpt, weights_only=True))
    model = model.eval().to(device)
    transform = torchvision.models.ViT_B_16_Weights.IMAGENET1K_V1.transforms()  # no download: only the preset
    with torch.inference_mode():
        for path in sorted(images.glob("*.jpg")):
            x = transform(Image.open(path).convert("RGB")).unsqueeze(0).to(device)
            model(x).cpu()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="30 images, 1 round")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--extra", default="", help="more `vitviz export` options, e.g. '--layers all --maps cls,rollout'")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's choice)")
    parser.add_argument("--engine", choices=("plain", "ray"), default="plain",
                        help="compare with the plain loop (default), or the local engine with the Ray engine")
    parser.add_argument("--actors", type=int, default=2, help="--engine ray: model actors (default 2)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    n, rounds = (30, 1) if args.quick else (args.images, args.rounds)
    extra = args.extra.split()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        _, ckpt = torchvision_vit_b16(folder)
        images = image_folder(folder / "images", n)
        if args.engine == "ray":
            run_engines(ckpt, images, folder, n, rounds, args.device, extra, args.actors)
            return
        times: dict[str, list[float]] = {"vitviz export": [], "plain loop": []}
        for r in range(rounds):
            order = ["vitviz export", "plain loop"][:: 1 if r % 2 == 0 else -1]
            for name in order:
                t = run_vitviz(ckpt, images, folder / "out", args.device, extra) if name == "vitviz export" \
                    else run_plain(ckpt, images, args.device)
                times[name].append(t)
        pngs = len(list((folder / "out").rglob("*.png")))
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"ViT-B/16 @224, {n} JPEGs, {args.device}, {torch.get_num_threads()} torch threads, {rounds} interleaved "
          f"round(s), model loading included; vitviz wrote {pngs} PNGs {' '.join(extra)}")
    for name, t in med.items():
        print(f"  {name:<14} {t:7.2f} s  {n / t:6.2f} images/s   (runs: {', '.join(f'{s:.2f}' for s in times[name])})")
    print(f"vitviz export / plain loop images/s = {med['plain loop'] / med['vitviz export']:.2f}x  (target >= 0.80x)")


if __name__ == "__main__":
    main()
