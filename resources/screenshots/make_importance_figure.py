"""The README's interventions figure: which of the demo model's heads the shape task needs, and what ablating the
most important one costs.

Run from the repository root: `python resources/screenshots/make_importance_figure.py [--count 200]`.

On `--count` freshly generated demo images (seed 7, the evaluation's: `vitviz.demo.evaluate`), each image's true
class: the importance grid (drop of P(true class) when each head alone is zero-ablated, mean over the images, with
attribution patching's estimate beside it), then the top head and the least important head ablated (zero, and
mean over the same images), with the mean probability of the true class and the accuracy before and after. Writes
`resources/screenshots/importance_demo.png` (the grid, and one image per class with P(true class) clean ->
ablated) and prints the numbers the README quotes.
"""
from __future__ import annotations

import argparse
import warnings
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

import vitviz
from vitviz.core.analyses.importance import HeadImportance, head_importance
from vitviz.core.drawing.importance import draw_importance
from vitviz.core.running.interventions import Ablate
from vitviz.demo import demo_checkpoint
from vitviz.demo.shapes import CLASSES, make_batch

OUT = Path(__file__).resolve().parent / "importance_demo.png"


def probabilities(model, images: np.ndarray, labels: np.ndarray, intervene=None) -> tuple[np.ndarray, np.ndarray]:
    """P(true class) and the predicted class of each image."""
    p, pred = [], []
    for image, label in zip(images, labels):
        r = model.run(image, intervene=intervene)
        z = r.logits.astype(np.float64)
        e = np.exp(z - z.max())
        p.append(e[label] / e.sum())
        pred.append(int(z.argmax()))
    return np.array(p), np.array(pred)


def grid_over(model, images: np.ndarray, labels: np.ndarray) -> HeadImportance:
    """Each image's true class as the target (one scan per class), merged into one grid over all images."""
    parts = [head_importance(model, list(images[labels == c]), target=c, attribution=True)
             for c in range(len(CLASSES)) if (labels == c).any()]
    per_image = np.concatenate([p.per_image for p in parts])
    weights = np.array([len(p.sources) for p in parts], dtype=np.float64)
    estimate = sum(w * p.estimate for w, p in zip(weights, parts)) / weights.sum()
    drop = per_image.mean(0)
    return HeadImportance(drop=drop, per_image=per_image, clean=np.concatenate([p.clean for p in parts]),
                          metric="probability", mode="zero", targets=sum((p.targets for p in parts), ()),
                          sources=sum((p.sources for p in parts), ()), labels=sum((p.labels for p in parts), ()),
                          estimate=estimate, correlation=float(np.corrcoef(drop.ravel(), estimate.ravel())[0, 1]),
                          seconds=sum(p.seconds for p in parts), forwards=sum(p.forwards for p in parts))


def strip(images: np.ndarray, labels: np.ndarray, before: np.ndarray, after: np.ndarray,
          scale: int = 2) -> Image.Image:
    """One example image per class, enlarged, with the class's mean P(true class) clean -> ablated under it (over
    all its images: one example would say little about a head)."""
    font = ImageFont.load_default(size=12)
    picks = [int(np.flatnonzero(labels == c)[0]) for c in range(len(CLASSES))]
    side = images.shape[1] * scale
    canvas = Image.new("RGB", (len(picks) * (side + 10) + 10, side + 44), "white")
    draw = ImageDraw.Draw(canvas)
    for k, i in enumerate(picks):
        mine = labels == labels[i]
        x = 10 + k * (side + 10)
        canvas.paste(Image.fromarray(images[i]).resize((side, side), Image.Resampling.NEAREST), (x, 4))
        draw.text((x, side + 8), f"{CLASSES[labels[i]]} ({int(mine.sum())} images)", fill="black", font=font)
        draw.text((x, side + 24), f"{before[mine].mean():.3f} -> {after[mine].mean():.3f}", fill="black", font=font)
    return canvas


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=200)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    model = vitviz.load(demo_checkpoint(), device="cpu")
    images, labels, _boxes = make_batch(7, 0, args.count)
    imp = grid_over(model, images, labels)
    (tl, th, td), = imp.top(1)
    low = min(((l_, h) for l_ in range(imp.drop.shape[0]) for h in range(imp.drop.shape[1])),
              key=lambda lh: abs(imp.drop[lh]))
    print(f"{len(labels)} images (seed 7); importance grid, drop of P(true class) when one head is zero-ablated:")
    print(np.array2string(imp.drop, precision=3, suppress_small=True))
    print(f"attribution estimate: r = {imp.correlation:.2f} against the exact grid; top head L{tl}.H{th} "
          f"(drop {td:.3f}); least important L{low[0]}.H{low[1]} (drop {imp.drop[low]:.4f})")
    order = np.concatenate([np.flatnonzero(labels == c) for c in range(len(CLASSES))])   # grid_over's image order
    for c, name in enumerate(CLASSES):
        mine = imp.per_image[labels[order] == c].mean(0)
        best = sorted(np.ndenumerate(mine), key=lambda kv: -kv[1])[:2]
        print(f"  {name}: top heads " + ", ".join(f"L{l_}.H{h} {d:.3f}" for (l_, h), d in best))
    p0, pred0 = probabilities(model, images, labels)
    print(f"clean: mean P(true class) {p0.mean():.3f}, accuracy {np.mean(pred0 == labels):.1%}")
    reference = list(images[:64])
    after = {}
    for name, item in (("top head, zero", Ablate([(tl, th)])),
                       ("top head, mean over 64 images", Ablate([(tl, th)], "mean", reference=reference)),
                       ("least important head, zero", Ablate([low]))):
        p, pred = probabilities(model, images, labels, item)
        after[name] = p
        print(f"{item.describe()} ({name}): mean P(true class) {p.mean():.3f} (drop {p0.mean() - p.mean():.3f}), "
              f"accuracy {np.mean(pred == labels):.1%}; per class "
              + ", ".join(f"{c} {p0[labels == k].mean():.3f}->{p[labels == k].mean():.3f}"
                          for k, c in enumerate(CLASSES)))
    grid = Image.fromarray(draw_importance(imp))
    row = strip(images, labels, p0, after["top head, zero"])
    font = ImageFont.load_default(size=12)
    width = max(grid.width, row.width)
    figure = Image.new("RGB", (width, grid.height + row.height + 22), "white")
    figure.paste(grid, (0, 0))
    ImageDraw.Draw(figure).text((10, grid.height + 4), f"ablating L{tl}.H{th} (zero): mean P(true class) per class, "
                                f"clean -> ablated", fill="black", font=font)
    figure.paste(row, (0, grid.height + 22))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    figure.save(args.out, optimize=True)
    print(f"wrote {args.out} ({figure.width}x{figure.height})")


if __name__ == "__main__":
    main()
