"""Are the class-specific relevance maps faithful on the demo model? Box mass and deletion curves.

    python -m vitviz.demo.faithfulness resources/demo --seed 7 --count 200

Two checks, on fresh images whose target box is known (`vitviz.demo.shapes`), for the true class:
- box mass: the share of a map's total inside the target's box (`vitviz.demo.evaluate.mass_in_box`), divided by
  the box's share of the image area (1 = no preference), for Chefer relevance, the gradient rollout and the
  last layer's raw CLS attention (heads averaged);
- deletion (Petsiuk et al. 2018, as in Chefer et al.'s perturbation tests): patches are deleted (set to 0 in the
  normalised input, i.e. the normalisation mean) in steps of `step` patches, most relevant first or in random order;
  the curve is the true-class probability after each step, from 0 deleted to all, and its area is the mean over the
  steps. A faithful map makes the probability fall faster: a smaller area than random order.
`tests/core/analyses/test_relevance.py` asserts these on a few images; this script prints them over more.
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from vitviz.demo import shapes
from vitviz.demo.evaluate import mass_in_box


@dataclass(frozen=True)
class Faithfulness:
    """Means over `count` images of stream `seed`.

    Attributes:
        box_share: share of the image area covered by the target's box.
        chefer_ratio / grad_rollout_ratio / cls_ratio: mass in the box over `box_share` for Chefer relevance,
            the gradient rollout (vit-explain exact) and last-layer CLS attention.
        deletion_relevance / deletion_random: area under the true-class probability deletion curve, most
            relevant (Chefer) patches first / random order (mean of `random_orders` orders).
        deletion_grad_rollout / deletion_cls: the same, deleting by the gradient rollout / last-layer CLS attention.
    """

    seed: int
    count: int
    box_share: float
    chefer_ratio: float
    grad_rollout_ratio: float
    cls_ratio: float
    deletion_relevance: float
    deletion_random: float
    deletion_grad_rollout: float
    deletion_cls: float


def deletion_area(model: Any, x: Any, order: np.ndarray, label: int, step: int = 4) -> float:
    """Area under the deletion curve: the mean true-class probability as the patches in `order` (flat patch indices,
    first deleted first) are set to 0 in the normalised input (1, C, H, W), `step` at a time, from none to all."""
    import torch

    gh, gw = model.spec.grid
    p = model.spec.patch_size
    counts = list(range(0, gh * gw, step)) + [gh * gw]
    batch = x.repeat(len(counts), 1, 1, 1)  # (S, C, H, W)
    for i, k in enumerate(counts):
        for flat in order[:k]:
            r, c = divmod(int(flat), gw)
            batch[i, :, r * p:(r + 1) * p, c * p:(c + 1) * p] = 0.0
    _, logits = model.forward_captured(batch, logits=True)
    probs = torch.softmax(torch.as_tensor(logits, dtype=torch.float64), dim=-1)[:, label]  # (S,)
    return float(probs.mean())


def measure(model: Any, seed: int = 7, count: int = 200, step: int = 4, random_orders: int = 3) -> Faithfulness:
    """Run the checks on images 0..count-1 of stream `seed` with `model` (a loaded demo `VitModel`)."""
    from vitviz.core.analyses.analysis import cls_attention
    from vitviz.core.analyses.relevance import class_relevance

    spec = model.spec
    rng = np.random.default_rng([seed, 12345])
    shares, chefer, roll, cls, d_rel, d_rand, d_roll, d_cls = [], [], [], [], [], [], [], []
    for i in range(count):
        sample = shapes.make_sample(seed, i)
        rel = class_relevance(model, sample.image, sample.label)
        result = model.run(sample.image)
        cls_map = cls_attention(result, layer=-1)
        x0, y0, x1, y1 = sample.box
        shares.append((x1 - x0) * (y1 - y0) / float(spec.image_size[0] * spec.image_size[1]))
        chefer.append(mass_in_box(rel.chefer, sample.box, spec.patch_size))
        roll.append(mass_in_box(rel.grad_rollout, sample.box, spec.patch_size))
        cls.append(mass_in_box(cls_map, sample.box, spec.patch_size))
        x, *_ = model.prepare(sample.image)
        n = rel.chefer.size
        d_rel.append(deletion_area(model, x, np.argsort(-rel.chefer.ravel(), kind="stable"), sample.label, step))
        d_roll.append(deletion_area(model, x, np.argsort(-rel.grad_rollout.ravel(), kind="stable"), sample.label, step))
        d_cls.append(deletion_area(model, x, np.argsort(-cls_map.ravel(), kind="stable"), sample.label, step))
        d_rand.append(np.mean([deletion_area(model, x, rng.permutation(n), sample.label, step)
                               for _ in range(random_orders)]))
    share = float(np.mean(shares))
    return Faithfulness(seed=seed, count=count, box_share=share, chefer_ratio=float(np.mean(chefer)) / share,
                        grad_rollout_ratio=float(np.mean(roll)) / share, cls_ratio=float(np.mean(cls)) / share,
                        deletion_relevance=float(np.mean(d_rel)), deletion_random=float(np.mean(d_rand)),
                        deletion_grad_rollout=float(np.mean(d_roll)), deletion_cls=float(np.mean(d_cls)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vitviz.demo.faithfulness", description=__doc__.splitlines()[0])
    parser.add_argument("checkpoint", nargs="?", default=None, help="demo folder (default: the shipped one)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--count", type=int, default=200)
    parser.add_argument("--step", type=int, default=4, help="patches deleted per step")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    import torch

    import vitviz
    from vitviz.demo import demo_checkpoint

    torch.set_num_threads(args.threads)
    model = vitviz.load(args.checkpoint or demo_checkpoint(), device="cpu")
    figures = measure(model, args.seed, args.count, args.step)
    for name, value in asdict(figures).items():
        print(f"{name:<22} {value:.4f}" if isinstance(value, float) else f"{name:<22} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
