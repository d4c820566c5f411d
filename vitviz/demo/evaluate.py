"""Does the demo model earn its place? Accuracy, attention mass on the target, spatial position embeddings.

    python -m vitviz.demo.evaluate resources/demo --seed 7 --count 500

The figures in the README come from this module, and `tests/demo/test_demo.py` asserts them on the shipped checkpoint:
every image goes through the public path (`vitviz.load(folder).run(array)`), so the preprocessing read from
config.json is tested too.

Attention mass in the box: a (gh, gw) map over the patches (prefix tokens left out) is normalised to sum 1 and
spread evenly over each patch's pixels; the mass inside the target's pixel box is compared with the box's share
of the image area. A model that looked everywhere equally would score a ratio of 1.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vitviz.core.analyses.analysis import cls_attention, pos_embed_similarity, rollout
from vitviz.demo import shapes


@dataclass(frozen=True)
class DemoFigures:
    """Measured on `count` fresh images of stream `seed`.

    Attributes:
        accuracy: fraction classified correctly.
        box_share: mean share of the image area covered by the target's box.
        rollout_mass / cls_mass: mean share of rollout (vitviz's default convention: heads averaged, residual
            0.5, nothing discarded) / last-layer CLS attention (heads averaged) in the box.
        rollout_ratio / cls_ratio: `*_mass / box_share`; 1 means no preference for the target.
        rollout_discard_ratio: the same for rollout with the lowest 90 % of each row discarded
            (`discard_ratio=0.9`), which removes the diffuse background of the plain rollout.
        pos_near / pos_far: mean cosine similarity of a position embedding to its 4 grid neighbours / to
            positions at least 4 patches away (Euclidean distance on the grid).
    """

    seed: int
    count: int
    accuracy: float
    box_share: float
    rollout_mass: float
    cls_mass: float
    rollout_ratio: float
    cls_ratio: float
    rollout_discard_ratio: float
    pos_near: float
    pos_far: float


def mass_in_box(patch_map: np.ndarray, box: tuple[int, int, int, int], patch: int) -> float:
    """Share of a (gh, gw) map's total that falls inside the pixel box (x0, y0, x1, y1)."""
    m = np.asarray(patch_map, dtype=np.float64)
    m = m / max(m.sum(), np.finfo(np.float64).tiny)
    pixels = np.kron(m, np.ones((patch, patch))) / (patch * patch)  # (gh, gw) -> (gh*p, gw*p), same total
    x0, y0, x1, y1 = box
    return float(pixels[y0:y1, x0:x1].sum())


def pos_embed_locality(pos_embed: np.ndarray, grid: tuple[int, int], num_prefix_in_pos: int,
                       far: float = 4.0) -> tuple[float, float]:
    """(mean similarity to the 4 grid neighbours, mean similarity to positions >= `far` patches away)."""
    sim = pos_embed_similarity(pos_embed, grid, num_prefix_in_pos)  # (gh, gw, gh, gw)
    gh, gw = grid
    rr, cc = np.meshgrid(np.arange(gh), np.arange(gw), indexing="ij")
    near_vals, far_vals = [], []
    for r in range(gh):
        for c in range(gw):
            dist = np.hypot(rr - r, cc - c)  # (gh, gw) grid distance from (r, c)
            near_vals.append(sim[r, c][dist == 1].mean())
            if (dist >= far).any():
                far_vals.append(sim[r, c][dist >= far].mean())
    return float(np.mean(near_vals)), float(np.mean(far_vals))


def measure(model: Any, seed: int = 7, count: int = 200) -> DemoFigures:
    """Run `model` (a loaded `VitModel` of the demo) on images 0..count-1 of stream `seed`."""
    spec = model.spec
    correct, shares, roll, cls, discard = 0, [], [], [], []
    for i in range(count):
        sample = shapes.make_sample(seed, i)
        result = model.run(sample.image)
        correct += int(np.argmax(result.logits) == sample.label)
        x0, y0, x1, y1 = sample.box
        shares.append((x1 - x0) * (y1 - y0) / float(spec.image_size[0] * spec.image_size[1]))
        roll.append(mass_in_box(rollout(result), sample.box, spec.patch_size))
        discard.append(mass_in_box(rollout(result, discard_ratio=0.9), sample.box, spec.patch_size))
        cls.append(mass_in_box(cls_attention(result, layer=-1), sample.box, spec.patch_size))
    pe = model.pos_embed()
    near, far = pos_embed_locality(pe, spec.pos_grid, spec.pos_prefix)
    share = float(np.mean(shares))
    return DemoFigures(seed=seed, count=count, accuracy=correct / count, box_share=share,
                       rollout_mass=float(np.mean(roll)), cls_mass=float(np.mean(cls)),
                       rollout_ratio=float(np.mean(roll)) / share, cls_ratio=float(np.mean(cls)) / share,
                       rollout_discard_ratio=float(np.mean(discard)) / share,
                       pos_near=near, pos_far=far)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vitviz.demo.evaluate", description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", nargs="?", default=None, help="demo folder (default: the shipped one)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--count", type=int, default=500)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    import torch

    import vitviz
    from vitviz.demo import demo_checkpoint

    torch.set_num_threads(args.threads)
    model = vitviz.load(args.checkpoint or demo_checkpoint(), device="cpu")
    figures = measure(model, args.seed, args.count)
    for name, value in asdict(figures).items():
        print(f"{name:<14} {value:.4f}" if isinstance(value, float) else f"{name:<14} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
