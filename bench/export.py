"""Benchmark: `vitviz export` throughput against a plain inference loop over the same images.

Run from the repository root: `python bench/export.py [--images 200] [--rounds 2] [--quick]`.

Both sides start from the same checkpoint file (torchvision `vit_b_16`, random weights) and a folder of JPEGs,
and both include loading the model:
- vitviz: `vitviz export --model vit_b_16.pth FOLDER --out DIR --quiet` (default maps: CLS attention of the last
  layer, head mean, one PNG per image), run in this process through `vitviz.cli.main`, fresh output folder.
- plain: torchvision's `vit_b_16` with its own preset transform, `model(x)` for each image in a loop.
Rounds alternate the order; the ratio of medians is printed. Target: vitviz >= 0.8x the plain loop's images/s.
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
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    n, rounds = (30, 1) if args.quick else (args.images, args.rounds)
    extra = args.extra.split()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        _, ckpt = torchvision_vit_b16(folder)
        images = image_folder(folder / "images", n)
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
