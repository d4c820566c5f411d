"""Fine-tune a copy of the demo ViT briefly on another question, for comparing the two (`vitviz export --compare`).

    python -m vitviz.demo.finetune --out /tmp/demo_light_dark            # ~300 steps, CPU, well under 2 minutes
    vitviz export --model resources/demo --compare /tmp/demo_light_dark resources/samples/shapes_*.png --out cmp/

The demo model names the one filled shape in an image, so its CLS attention sits on that shape. The copy is taught
a question the shape does not answer: *is the image light or dark?* (label 'light' when the mean of all its pixels
is above `SPLIT`, the median of the shapes images). Its blocks start from the demo's weights; its head is new
(two classes, 'dark' and 'light'). After a few hundred steps its attention has moved off the shape towards the
background, which is what a comparison of the two shows: the question that fine-tuning changes the maps answers.

The run is seeded and CPU-only: a fixed pool of `--pool` images of stream `FINETUNE_SEED` (drawn once, flipped at
random) and AdamW at a constant rate after a short warm-up. It writes the same hub folder as `vitviz.demo.train`
(model.safetensors with timm key names, config.json with the new labels) and `finetune_log.txt`, whose last lines
give the accuracy on held-out images and how much of the last layer's CLS attention falls on the shape's box,
before and after.
"""
from __future__ import annotations

import argparse
import json
import platform
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import torch
import torch.nn.functional as F

from vitviz.core.running.model import ReferenceViT
from vitviz.demo import shapes
from vitviz.demo.train import TrainConfig, augment, demo_spec, save, to_input

FINETUNE_SEED = 3     # its own stream of images: not the training (0), validation (1) or test (7) streams
CHECK_SEED = 11       # held-out images for the figures in the log
SPLIT = 125.0         # the median pixel mean of the shapes images: 'light' above it, 'dark' below
LABELS = ("dark", "light")


def light_or_dark(images: np.ndarray) -> np.ndarray:
    """(N,) int64 labels of (N, H, W, 3) uint8 images: 1 ('light') when the mean of all pixels is above `SPLIT`."""
    return (images.reshape(len(images), -1).mean(axis=1) > SPLIT).astype(np.int64)


def demo_config(folder: Path) -> TrainConfig:
    """The demo's architecture from its config.json (`vitviz.demo.train.timm_config`)."""
    args = json.loads((folder / "config.json").read_text(encoding="utf-8"))["model_args"]
    return TrainConfig(embed_dim=args["embed_dim"], depth=args["depth"], num_heads=args["num_heads"],
                       mlp_ratio=float(args["mlp_ratio"]))


def load_copy(folder: Path) -> tuple[ReferenceViT, TrainConfig]:
    """The demo's weights in a new net with a two-class head (its blocks, embeddings and norms copied exactly)."""
    from safetensors.torch import load_file

    cfg = demo_config(folder)
    spec = replace(demo_spec(cfg), num_classes=len(LABELS), labels=LABELS)
    net = ReferenceViT(spec)
    weights = {k: v for k, v in load_file(str(folder / "model.safetensors")).items() if not k.startswith("head.")}
    missing, unexpected = net.load_state_dict(weights, strict=False)
    if unexpected or sorted(missing) != ["head.bias", "head.weight"]:
        raise ValueError(f"{folder}: not the demo model's layout (missing {missing}, unexpected {unexpected})")
    torch.nn.init.trunc_normal_(net.head.weight, std=0.02)
    torch.nn.init.zeros_(net.head.bias)
    return net, cfg


def figures(model: Any, images: np.ndarray, boxes: np.ndarray, labels: np.ndarray | None) -> tuple[float, float]:
    """Through the public path (`model.run`, a loaded `VitModel`): (accuracy on `labels`, NaN without them; the
    mean over the images of the last layer's head-mean CLS attention on the shape's box over the box's share of the
    image: 1 means no preference for the shape)."""
    from vitviz.core.analyses.analysis import cls_attention
    from vitviz.demo.evaluate import mass_in_box

    correct, ratios = 0, []
    size = shapes.IMAGE_SIZE
    for i, image in enumerate(images):
        result = model.run(image, logits=labels is not None)
        if labels is not None:
            correct += int(np.argmax(result.logits) == labels[i])
        x0, y0, x1, y1 = (int(v) for v in boxes[i])
        share = (x1 - x0) * (y1 - y0) / float(size * size)
        ratios.append(mass_in_box(cls_attention(result, layer=-1), (x0, y0, x1, y1), shapes.PATCH_SIZE) / share)
    return (correct / len(images) if labels is not None else float("nan")), float(np.mean(ratios))


def _load(folder: Path) -> Any:
    import vitviz

    return vitviz.load(folder, device="cpu")


def finetune(folder: Path, steps: int, batch: int, lr: float, pool: int, log: TextIO, seed: int = 0) -> ReferenceViT:
    """Fine-tune a copy of the demo in `folder` for `steps` steps; progress goes to `log`."""
    torch.manual_seed(seed)
    net, _ = load_copy(folder)
    images, _, _ = shapes.make_batch(FINETUNE_SEED, 0, pool)
    labels = light_or_dark(images)
    log.write(f"pool {pool} images, {labels.mean():.2f} of them light\n")
    x_all, y_all = to_input(images), torch.from_numpy(labels)
    opt = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=0.05)
    gen = torch.Generator().manual_seed(seed)
    warmup = max(1, min(20, steps // 10))
    net.train()
    start, run_loss = time.time(), 0.0
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = lr * min(1.0, (step + 1) / warmup)
        idx = torch.randint(0, pool, (batch,), generator=gen)
        loss = F.cross_entropy(net(augment(x_all[idx], gen)), y_all[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        opt.step()
        run_loss = loss.item() if step == 0 else 0.95 * run_loss + 0.05 * loss.item()
        if (step + 1) % 50 == 0 or step + 1 == steps:
            log.write(f"step {step + 1:4d}/{steps}  loss {run_loss:.4f}  elapsed {time.time() - start:5.1f}s\n")
            log.flush()
    net.eval()
    return net


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vitviz.demo.finetune", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="output folder (a hub folder like resources/demo)")
    parser.add_argument("--demo", type=Path, default=None, help="the demo model folder (default: the shipped one)")
    parser.add_argument("--steps", type=int, default=300, help="optimiser steps")
    parser.add_argument("--batch", type=int, default=32, help="images per step")
    parser.add_argument("--lr", type=float, default=3e-4, help="learning rate (AdamW, constant after a short warm-up)")
    parser.add_argument("--pool", type=int, default=1024, help="images drawn once and reused (flipped at random)")
    parser.add_argument("--check", type=int, default=200, help="held-out images for the figures in the log")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.batch < 1 or args.pool < 1 or args.check < 1:
        parser.error("--steps, --batch, --pool and --check take positive numbers")
    from vitviz.demo import demo_checkpoint

    torch.set_num_threads(args.threads)
    folder = args.demo or demo_checkpoint()
    from vitviz.demo import training_log

    header = (f"vitviz demo ViT fine-tuned on light / dark from {folder}; torch {torch.__version__}, python "
              f"{platform.python_version()}; steps {args.steps}, batch {args.batch}, lr {args.lr}\n")
    with training_log(args.out, "finetune_log.txt", header) as log:   # progress seen every 50 steps, and kept
        start = time.time()
        net = finetune(folder, args.steps, args.batch, args.lr, args.pool, log)
        save(net, demo_config(folder), args.out)
        images, _, boxes = shapes.make_batch(CHECK_SEED, 0, args.check)
        _, before = figures(_load(folder), images, boxes, None)
        acc, after = figures(_load(args.out), images, boxes, light_or_dark(images))
        log.write(f"light/dark accuracy {acc:.3f} on {args.check} held-out images (stream {CHECK_SEED}); last-layer "
                  f"CLS attention on the shape {after:.2f}x its area share (the demo model: {before:.2f}x)\n")
        log.write(f"done in {time.time() - start:.0f}s; wrote {args.out}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
