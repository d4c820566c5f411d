"""A training run as a timeline: a folder of checkpoints of one model, in order, loaded one at a time.

    from vitviz.core.timeline import open_run, run_metrics
    run = open_run("runs/vit/", heads=4)            # the overrides of vitviz.load, for every checkpoint
    run.order_note                                   # 'ordered by the step in the names' / '... by file time: ...'
    model = run.model(3)                             # loaded on first use; at most `budget_bytes` kept
    metrics = run_metrics(run, "cat.jpg", box=(0.2, 0.2, 0.6, 0.7))

What counts as a checkpoint: a weights file (`vitviz.core.formats.WEIGHT_SUFFIXES`: `epoch_12.pth`,
`step-3000.safetensors`, Lightning's `epoch=3-step=1200.ckpt`, ...) or a subfolder holding one (Hugging Face
Trainer's `checkpoint-500/`). The order is the number in the name — Lightning names by their step (then epoch),
others by their last number — when every name has one; otherwise every checkpoint is ordered by its file time
(modification time), and `order_note` says so, naming a checkpoint without a number.

Checkpoints are loaded lazily with `vitviz.load`, the most recently used kept while their parameters fit in
`budget_bytes` (at least one is always kept). Every checkpoint must have the layout of the first one loaded
(family, depth, heads, width, patch, grid, prefix tokens, classes); one that differs raises `TimelineError` naming
it and the fields that differ.
"""
from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vitviz.core.formats import WEIGHT_SUFFIXES
from vitviz.errors import VitvizError

LAYOUT_FIELDS = ("family", "depth", "num_heads", "embed_dim", "patch_size", "grid", "num_prefix", "num_classes")
DEFAULT_BUDGET = 1 << 30   # bytes of parameters kept loaded


class TimelineError(VitvizError, ValueError):
    """A run folder without checkpoints, or a checkpoint whose layout is not the run's."""


@dataclass(frozen=True)
class Checkpoint:
    """One checkpoint of a run: its path, the number its name gives (None: none), a short label for names."""

    path: Path
    number: int | None
    epoch: int | None
    mtime: float

    @property
    def label(self) -> str:
        """The name without its suffix, file-name safe (e.g. 'epoch_3-step_1200', 'checkpoint-500')."""
        name = self.path.name if self.path.is_dir() else self.path.name[: -len(_suffix(self.path))]
        return re.sub(r"[^A-Za-z0-9.-]+", "_", name).strip("_") or "checkpoint"


def _suffix(path: Path) -> str:
    name = path.name.lower()
    return next((s for s in sorted(WEIGHT_SUFFIXES, key=len, reverse=True) if name.endswith(s)), path.suffix)


def name_number(name: str) -> tuple[int | None, int | None]:
    """(number, epoch) from a checkpoint's name: Lightning 'epoch=3-step=1200' -> (1200, 3); 'step-3000' -> (3000,
    None); 'epoch_12' -> (12, None); otherwise its last number; (None, None) without one."""
    lightning = re.search(r"epoch=(\d+)-step=(\d+)", name)
    if lightning:
        return int(lightning.group(2)), int(lightning.group(1))
    for word in ("step", "checkpoint", "epoch", "iter"):
        m = re.search(rf"{word}[-_=]?(\d+)", name, re.I)
        if m:
            return int(m.group(1)), None
    numbers = re.findall(r"\d+", name)
    return (int(numbers[-1]), None) if numbers else (None, None)


def _is_weights(path: Path) -> bool:
    return path.is_file() and any(path.name.lower().endswith(s) for s in WEIGHT_SUFFIXES)


def find_checkpoints(folder: str | Path) -> tuple[list[Checkpoint], str]:
    """The run's checkpoints in order and how they were ordered (see the module docstring).

    Raises:
        TimelineError: not a folder, or no checkpoint in it."""
    root = Path(folder)
    if not root.is_dir():
        raise TimelineError(f"{root}: expected a folder of checkpoints of one run")
    found = []
    for entry in sorted(root.iterdir()):
        if entry.name.startswith("."):
            continue
        if _is_weights(entry) or (entry.is_dir() and any(_is_weights(p) for p in entry.iterdir())):
            number, epoch = name_number(entry.name if entry.is_dir() else entry.name[: -len(_suffix(entry))])
            found.append(Checkpoint(entry, number, epoch, entry.stat().st_mtime))
    if not found:
        raise TimelineError(f"{root}: no checkpoints (weights files {', '.join(sorted(WEIGHT_SUFFIXES))}, or "
                            "folders holding one, such as checkpoint-500/)")
    plain = [c for c in found if c.number is None]
    if not plain:
        found.sort(key=lambda c: (c.number, c.epoch or 0, c.path.name))
        lightning = any(c.epoch is not None for c in found)
        return found, "ordered by the " + ("step in the names (Lightning epoch=E-step=S)" if lightning
                                           else "number in the names")
    found.sort(key=lambda c: (c.mtime, c.path.name))
    return found, (f"ordered by file time: {plain[0].path.name} has no number in its name"
                   + (f" (and {len(plain) - 1} more)" if len(plain) > 1 else ""))


def layout(spec: Any) -> dict[str, Any]:
    """The fields every checkpoint of a run must share."""
    return {name: getattr(spec, name) for name in LAYOUT_FIELDS}


class TimelineRun:
    """The checkpoints of one run, loaded on demand (see the module docstring)."""

    def __init__(self, folder: str | Path, budget_bytes: int = DEFAULT_BUDGET, **overrides: Any) -> None:
        self.folder = Path(folder)
        self.checkpoints, self.order_note = find_checkpoints(folder)
        self.budget_bytes = int(budget_bytes)
        self.overrides = overrides
        self.layout: dict[str, Any] | None = None
        self._loaded: OrderedDict[int, Any] = OrderedDict()

    def __len__(self) -> int:
        return len(self.checkpoints)

    @property
    def labels(self) -> list[str]:
        return [c.label for c in self.checkpoints]

    def model(self, index: int) -> Any:
        """The `VitModel` of checkpoint `index`, loading it (and letting older ones go past the budget).

        Raises:
            TimelineError: its layout differs from the run's (the first checkpoint loaded)."""
        if index in self._loaded:
            self._loaded.move_to_end(index)
            return self._loaded[index]
        from vitviz.core.load import load

        ckpt = self.checkpoints[index]
        model = load(ckpt.path, **self.overrides)
        found = layout(model.spec)
        if self.layout is None:
            self.layout = found
        elif found != self.layout:
            diff = ", ".join(f"{k} {found[k]!r} (the run: {self.layout[k]!r})" for k in found
                             if found[k] != self.layout[k])
            raise TimelineError(f"{ckpt.path.name}: another layout than the run's: {diff}")
        self._loaded[index] = model
        while len(self._loaded) > 1 and sum(_nbytes(m) for m in self._loaded.values()) > self.budget_bytes:
            self._loaded.popitem(last=False)
        return model

    @property
    def loaded(self) -> list[int]:
        """The checkpoints held now, least recently used first."""
        return list(self._loaded)


def _nbytes(model: Any) -> int:
    return int(sum(p.numel() * p.element_size() for p in model.net.parameters()))


def open_run(folder: str | Path, budget_bytes: int = DEFAULT_BUDGET, **overrides: Any) -> TimelineRun:
    """`TimelineRun(folder, budget_bytes, **overrides)`."""
    return TimelineRun(folder, budget_bytes, **overrides)


def box_mask(box: tuple[float, float, float, float], grid: tuple[int, int]) -> np.ndarray:
    """(gh, gw) bool: the patches whose centres lie inside `box` = (left, top, right, bottom), fractions 0..1 of the
    image the model saw."""
    left, top, right, bottom = (float(v) for v in box)
    if not (0 <= left < right <= 1 and 0 <= top < bottom <= 1):
        raise TimelineError(f"box {box}: expected (left, top, right, bottom) fractions with left < right, top < "
                            "bottom, all in 0..1")
    gh, gw = grid
    ys, xs = (np.arange(gh) + 0.5) / gh, (np.arange(gw) + 0.5) / gw
    return ((ys >= top) & (ys <= bottom))[:, None] & ((xs >= left) & (xs <= right))[None, :]


@dataclass(frozen=True)
class TimelineMetrics:
    """Per checkpoint (K) and layer (L), head means: `distance` mean attention distance (px), `entropy` (nats, patch
    queries), `box_share` the CLS attention inside the box (None without a box); and each checkpoint's top class
    (index, label, probability; None for a model without a classifier)."""

    labels: tuple[str, ...]
    numbers: tuple[int | None, ...]
    distance: np.ndarray
    entropy: np.ndarray
    box_share: np.ndarray | None
    predictions: tuple[tuple[int, str, float] | None, ...]
    order_note: str

    def rows(self) -> list[dict[str, Any]]:
        """One row per checkpoint and layer, for a CSV."""
        out = []
        for k, label in enumerate(self.labels):
            pred = self.predictions[k]
            for layer in range(self.distance.shape[1]):
                out.append({"checkpoint": label, "number": "" if self.numbers[k] is None else self.numbers[k],
                            "layer": layer, "distance_px": round(float(self.distance[k, layer]), 6),
                            "entropy_nats": round(float(self.entropy[k, layer]), 6),
                            "box_share": "" if self.box_share is None else round(float(self.box_share[k, layer]), 6),
                            "top_class": "" if pred is None else pred[0], "top_label": "" if pred is None else pred[1],
                            "top_probability": "" if pred is None else round(pred[2], 6)})
        return out

    def to_dict(self) -> dict[str, Any]:
        def arr(a: np.ndarray | None) -> Any:
            return None if a is None else np.round(a, 6).tolist()

        return {"order": self.order_note, "checkpoints": list(self.labels), "numbers": list(self.numbers),
                "distance_px": arr(self.distance), "entropy_nats": arr(self.entropy), "box_share": arr(self.box_share),
                "predictions": [None if p is None else {"class": p[0], "label": p[1], "probability": round(p[2], 6)}
                                for p in self.predictions]}


def result_metrics(result: Any, box: tuple[float, float, float, float] | None = None
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, tuple[int, str, float] | None]:
    """(L,) head-mean attention distance and entropy, (L,) CLS share inside `box` (None without one or without a
    CLS token) and the top class of one `AttentionResult`."""
    from vitviz.core import analysis
    from vitviz.core.features import attention_share

    distance = np.nanmean(analysis.mean_attention_distance(result), axis=1)
    entropy = analysis.attention_entropy(result.attentions, num_prefix=result.num_prefix).mean(axis=1)
    share = None
    if box is not None and result.spec.cls_token and result.num_prefix:
        share = attention_share(result, box_mask(box, result.grid), query="cls").mean(axis=1).astype(np.float64)
    top = result.top_k(1) if result.logits.size else []
    return distance, entropy, share, (top[0] if top else None)


def run_metrics(run: TimelineRun, image: Any, box: tuple[float, float, float, float] | None = None,
                results: Sequence[Any] | None = None) -> TimelineMetrics:
    """The figures of one image at every checkpoint (each loaded in turn; `results`: runs already made)."""
    per = [result_metrics(r, box) for r in (results if results is not None
                                            else (run.model(k).run(image) for k in range(len(run))))]
    shares = [p[2] for p in per]
    return TimelineMetrics(tuple(run.labels), tuple(c.number for c in run.checkpoints),
                           np.stack([p[0] for p in per]), np.stack([p[1] for p in per]),
                           None if any(s is None for s in shares) else np.stack(shares),  # type: ignore[misc]
                           tuple(p[3] for p in per), run.order_note)
