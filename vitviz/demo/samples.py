"""Write the shipped demo images: the first image of each class in stream `SAMPLE_SEED`, unselected otherwise.

    python -m vitviz.demo.samples --out resources/samples
"""
from __future__ import annotations

import argparse
from pathlib import Path

from PIL import Image

from vitviz.demo import DEMO_IMAGE_PREFIX
from vitviz.demo.shapes import CLASSES, DemoSample, make_sample

SAMPLE_SEED = 2024   # neither the training stream (0), the training log's (1) nor the tests' (7)
PER_CLASS = 1


def pick_samples(seed: int = SAMPLE_SEED, per_class: int = PER_CLASS) -> list[tuple[int, DemoSample]]:
    """(index, sample) for the first `per_class` images of every class in stream `seed`, in stream order."""
    counts = dict.fromkeys(range(len(CLASSES)), 0)
    picked: list[tuple[int, DemoSample]] = []
    index = 0
    while min(counts.values()) < per_class:
        sample = make_sample(seed, index)
        if counts[sample.label] < per_class:
            counts[sample.label] += 1
            picked.append((index, sample))
        index += 1
    return picked


def write_samples(out: Path, seed: int = SAMPLE_SEED, per_class: int = PER_CLASS) -> list[Path]:
    """Save the picked images as `shapes_<n>_<class>.png` (64 x 64, lossless) and return their paths."""
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for n, (_, sample) in enumerate(pick_samples(seed, per_class), start=1):
        path = out / f"{DEMO_IMAGE_PREFIX}{n}_{sample.name}.png"
        Image.fromarray(sample.image).save(path, optimize=True)
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vitviz.demo.samples", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("resources/samples"))
    parser.add_argument("--per-class", type=int, default=PER_CLASS)
    args = parser.parse_args(argv)
    for path in write_samples(args.out, per_class=args.per_class):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
