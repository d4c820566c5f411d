"""The demo task: name the one filled shape among hollow distractors on a textured background.

Every image holds exactly one *target*, a shape filled with a saturated colour (circle, square, triangle, star
or cross; random colour, size, position and a small rotation), and two to four *distractors*: shapes of the
same five kinds drawn only as thin outlines. The label is the target's kind, so a classifier cannot answer
from the distractors or the background: it has to find the filled object and look at its outline. That is
what makes the demo a fair test of attention maps: the right answer to "where does the model look" is the
target's box, which `DemoSample.box` records.

Images are drawn at twice the size and reduced with a box filter (anti-aliased edges). Each image comes from
its own generator `np.random.default_rng([seed, index])`, so any image can be regenerated alone and a test set
with another seed shares no image with the training stream.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw

CLASSES = ("circle", "square", "triangle", "star", "cross")
IMAGE_SIZE = 64
PATCH_SIZE = 8
SCALE = 2  # supersampling factor for anti-aliased drawing

TARGET_SIZE = (18, 26)       # target bounding size in pixels (min, max)
DISTRACTOR_SIZE = (12, 20)
DISTRACTORS = (2, 4)         # how many outlines (min, max), inclusive


@dataclass(frozen=True)
class DemoSample:
    """One generated image.

    Attributes:
        image: (H, W, 3) uint8 RGB.
        label: index into `CLASSES`.
        box: the target's bounding box (x0, y0, x1, y1) in pixels, x1/y1 exclusive.
    """

    image: np.ndarray
    label: int
    box: tuple[int, int, int, int]

    @property
    def name(self) -> str:
        return CLASSES[self.label]


def _outline(kind: str, cx: float, cy: float, r: float, angle: float) -> list[tuple[float, float]]:
    """Polygon vertices of `kind` centred at (cx, cy) with circumradius r, rotated by `angle` radians."""
    if kind == "circle":
        pts = [(math.cos(t), math.sin(t)) for t in np.linspace(0, 2 * math.pi, 40, endpoint=False)]
    elif kind == "square":
        s = 1 / math.sqrt(2)
        pts = [(-s, -s), (s, -s), (s, s), (-s, s)]
    elif kind == "triangle":
        pts = [(math.cos(t), math.sin(t)) for t in (-math.pi / 2, math.pi / 6, 5 * math.pi / 6)]
    elif kind == "star":
        pts = [((1.0 if i % 2 == 0 else 0.42) * math.cos(-math.pi / 2 + i * math.pi / 5),
                (1.0 if i % 2 == 0 else 0.42) * math.sin(-math.pi / 2 + i * math.pi / 5)) for i in range(10)]
    elif kind == "cross":
        a, b = 0.3, 0.9
        pts = [(-a, -b), (a, -b), (a, -a), (b, -a), (b, a), (a, a), (a, b), (-a, b), (-a, a), (-b, a), (-b, -a),
               (-a, -a)]
    else:
        raise ValueError(f"unknown shape {kind!r}; expected one of {CLASSES}")
    c, s = math.cos(angle), math.sin(angle)
    return [(cx + r * (x * c - y * s), cy + r * (x * s + y * c)) for x, y in pts]


def _background(rng: np.random.Generator, size: int) -> np.ndarray:
    """(size, size, 3) float texture in [0, 255]: a muted base colour, smooth blotches, stripes and grain."""
    base = rng.uniform(70, 190) + rng.uniform(-25, 25, size=3)
    coarse = rng.normal(0, 1, size=(5, 5, 3)).astype(np.float32)
    blotch = np.asarray(Image.fromarray(coarse[..., 0]).resize((size, size), Image.Resampling.BICUBIC))
    tint = coarse.reshape(-1, 3).std(axis=0)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32)
    theta, period = rng.uniform(0, math.pi), rng.uniform(6, 14) * SCALE
    stripes = np.sin((xx * math.cos(theta) + yy * math.sin(theta)) * 2 * math.pi / period)
    img = base + blotch[..., None] * (12 + 4 * tint) + stripes[..., None] * rng.uniform(6, 16)
    return img + rng.normal(0, 6, size=(size, size, 3))


def _saturated(rng: np.random.Generator) -> tuple[int, int, int]:
    """A vivid random colour (HSV with high saturation and value)."""
    h, s, v = rng.uniform(0, 1), rng.uniform(0.7, 1.0), rng.uniform(0.75, 1.0)
    i, f = int(h * 6) % 6, h * 6 - int(h * 6)
    p, q, t = v * (1 - s), v * (1 - f * s), v * (1 - (1 - f) * s)
    rgb = [(v, t, p), (q, v, p), (p, v, t), (p, q, v), (t, p, v), (v, p, q)][i]
    return tuple(int(255 * c) for c in rgb)  # type: ignore[return-value]


def _place(rng: np.random.Generator, r: float, taken: list[tuple[float, float, float]], size: int,
           tries: int = 50) -> tuple[float, float] | None:
    """A centre for a shape of radius r inside the image, clear of every (cx, cy, r) in `taken`."""
    for _ in range(tries):
        cx, cy = rng.uniform(r + 1, size - r - 1, size=2)
        if all(math.hypot(cx - x, cy - y) > r + q + 2 for x, y, q in taken):
            return float(cx), float(cy)
    return None


def make_sample(seed: int, index: int, difficulty: float = 1.0) -> DemoSample:
    """Image `index` of the stream `seed`; the same arguments always give the same image.

    `difficulty` in [0, 1] scales the number of distractors and the texture contrast (training warms up with
    easier images); every evaluation uses the full task, 1.0.
    """
    rng = np.random.default_rng([seed, index])
    big = IMAGE_SIZE * SCALE
    texture = _background(rng, big)
    texture = texture.mean() + (texture - texture.mean()) * (0.4 + 0.6 * difficulty)
    canvas = Image.fromarray(np.clip(texture, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(canvas)
    label = int(rng.integers(len(CLASSES)))
    r = rng.uniform(*TARGET_SIZE) / 2 * SCALE
    cx, cy = _place(rng, r, [], big) or (big / 2, big / 2)
    taken = [(cx, cy, r)]
    target = _outline(CLASSES[label], cx, cy, r, rng.uniform(-0.15, 0.15))
    count = int(rng.integers(DISTRACTORS[0], DISTRACTORS[1] + 1))
    for _ in range(int(round(count * difficulty))):
        q = rng.uniform(*DISTRACTOR_SIZE) / 2 * SCALE
        spot = _place(rng, q, taken, big)
        if spot is None:
            continue
        taken.append((spot[0], spot[1], q))
        pts = _outline(CLASSES[int(rng.integers(len(CLASSES)))], spot[0], spot[1], q, rng.uniform(-0.3, 0.3))
        draw.line(pts + pts[:1], fill=_saturated(rng), width=SCALE, joint="curve")
    draw.polygon(target, fill=_saturated(rng), outline=(20, 20, 20), width=SCALE)  # a 1 px dark rim
    image = np.asarray(canvas.resize((IMAGE_SIZE, IMAGE_SIZE), Image.Resampling.BOX))
    xs, ys = [p[0] / SCALE for p in target], [p[1] / SCALE for p in target]
    box = (max(0, math.floor(min(xs))), max(0, math.floor(min(ys))),
           min(IMAGE_SIZE, math.ceil(max(xs))), min(IMAGE_SIZE, math.ceil(max(ys))))
    return DemoSample(image=image, label=label, box=box)


def make_batch(seed: int, start: int, count: int,
               difficulty: float = 1.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Images `start .. start+count-1` of stream `seed` as (N, H, W, 3) uint8, (N,) int64 labels, (N, 4) boxes."""
    samples = [make_sample(seed, start + i, difficulty) for i in range(count)]
    return (np.stack([s.image for s in samples]), np.array([s.label for s in samples], dtype=np.int64),
            np.array([s.box for s in samples], dtype=np.int64))
