"""A training run as a timeline: a folder of checkpoints of one model, in order, loaded one at a time.

    from vitviz.core.analyses.timeline import open_run, run_metrics
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

The window's timeline reads a `TimelineStore` (Qt-free; the worker computes, the GUI thread only reads):

    store = TimelineStore(open_run("runs/vit/"), budget_bytes=2 << 30)
    store.add_image("cat", "cat.jpg")
    maps = store.result(3, "cat")           # worker: loads checkpoint 3 if needed, runs the image: a ResultMaps
    store.peek(3, "cat")                     # GUI: the same ResultMaps if held, else None; never computes
    store.series("cat", box=(.2, .2, .6, .7))   # the figures of every checkpoint measured so far, NaN elsewhere
    store.missing("cat", around=3)           # what the worker could compute next, nearest checkpoints first

Its memory budget counts both what it holds: the loaded models (their parameters) and the per-checkpoint,
per-image results (`ResultMaps.nbytes`: attention, rollout caches, map stacks), evicted least recently used first
(never the entry just made). The figures of a result (per layer and head: mean attention distance, entropy, the
head-mean CLS attention row; the top class) are taken when it is made and kept after it is evicted, so the plots
against training step never need a checkpoint again; the box share is then one product over all checkpoints at
once, for any box. Checkpoint 0 is loaded first, so "the run's layout" is the first checkpoint's; a checkpoint
that cannot be loaded or has another layout is recorded (`failed`) and named, and the others go on.
"""
from __future__ import annotations

import re
import os
import threading
import warnings
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vitviz.core.formats import WEIGHT_SUFFIXES
from vitviz.core.protocol import ATTENTION, capabilities_of
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
    if not isinstance(folder, (str, os.PathLike)) or not str(folder):
        raise TimelineError(f"{folder!r}: expected the path of a folder of checkpoints of one run")
    root = Path(folder)
    if not root.is_dir():
        raise TimelineError(f"{root}: expected a folder of checkpoints of one run")
    found = []
    where = root
    try:
        for entry in sorted(root.iterdir()):
            if entry.name.startswith("."):
                continue
            where = entry
            if _is_weights(entry) or (entry.is_dir() and any(_is_weights(p) for p in entry.iterdir())):
                number, epoch = name_number(entry.name if entry.is_dir() else entry.name[: -len(_suffix(entry))])
                found.append(Checkpoint(entry, number, epoch, entry.stat().st_mtime))
    except OSError as e:     # a folder without read permission (mode 000, or 0311: enter but not list)
        raise TimelineError(f"{where}: cannot be read ({e.strerror or e}); expected a readable folder of "
                            "checkpoints of one run") from None
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
        self.checkpoints, self.order_note = find_checkpoints(folder)
        self.folder = Path(folder)
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
        model = self.load(index)
        self._loaded[index] = model
        while len(self._loaded) > 1 and sum(_nbytes(m) for m in self._loaded.values()) > self.budget_bytes:
            self._loaded.popitem(last=False)
        return model

    def load(self, index: int) -> Any:
        """Load checkpoint `index` (not kept here) and check its layout against the run's: the first one loaded
        sets it (`TimelineStore` loads checkpoint 0 first, so there it is the first checkpoint of the run).

        Raises:
            TimelineError: naming the checkpoint and every field that differs."""
        from vitviz.core.running.load import load

        if not 0 <= index < len(self.checkpoints):
            raise TimelineError(f"checkpoint {index}: the run has {len(self.checkpoints)} (0..{len(self) - 1})")
        ckpt = self.checkpoints[index]
        model = load(ckpt.path, **self.overrides)
        if ATTENTION not in capabilities_of(model):    # a windowed model: attention inside windows only
            raise TimelineError(f"{ckpt.path.name}: a windowed model ({model.spec.family}: attention inside "
                                "windows, no image-wide map per head); the timeline follows ViTs with global "
                                "attention")
        found = layout(model.spec)
        if self.layout is None:
            self.layout = found
        elif found != self.layout:
            diff = ", ".join(f"{k} {found[k]!r} (the run: {self.layout[k]!r})" for k in found
                             if found[k] != self.layout[k])
            raise TimelineError(f"{ckpt.path.name}: another layout than the run's: {diff}")
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
    (index, label, probability; None for a model without a classifier, or not yet run). `done` (K,) bool: the
    checkpoints measured so far (`TimelineStore.series`; their rows are NaN until then); None: all of them."""

    labels: tuple[str, ...]
    numbers: tuple[int | None, ...]
    distance: np.ndarray
    entropy: np.ndarray
    box_share: np.ndarray | None
    predictions: tuple[tuple[int, str, float] | None, ...]
    order_note: str
    done: np.ndarray | None = None

    @property
    def steps(self) -> np.ndarray:
        """(K,) float: each checkpoint's number (its step or epoch), NaN for one without; the x axis of the plots."""
        return np.array([np.nan if n is None else n for n in self.numbers], dtype=np.float64)

    @property
    def top_class(self) -> np.ndarray:
        """(K,) int64: each checkpoint's top class, -1 where there is none (yet)."""
        return np.array([-1 if p is None else p[0] for p in self.predictions], dtype=np.int64)

    @property
    def top_probability(self) -> np.ndarray:
        """(K,) float64: the probability of each checkpoint's top class, NaN where there is none (yet)."""
        return np.array([np.nan if p is None else p[2] for p in self.predictions], dtype=np.float64)

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
    from vitviz.core.analyses import analysis
    from vitviz.core.analyses.features import attention_share

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



# ------------------------------------------------------------------------------------------------------ store
class _Figures:
    """One image's figures over the checkpoints, filled in as results are made: (K, L, H) distance and entropy,
    (K, L, N) head-mean CLS attention over the patches (None: no CLS token), (K,) top class and probability."""

    def __init__(self, count: int, depth: int, heads: int, grid: tuple[int, int], has_cls: bool) -> None:
        self.grid = grid
        self.done = np.zeros(count, dtype=bool)
        self.distance = np.full((count, depth, heads), np.nan)
        self.entropy = np.full((count, depth, heads), np.nan)
        self.cls = np.full((count, depth, grid[0] * grid[1]), np.nan) if has_cls else None
        self.predictions: list[tuple[int, str, float] | None] = [None] * count


class TimelineStore:
    """Results of one run's checkpoints on the open images, made on demand within a memory budget (see the module
    docstring).

    Call `result` (which loads and runs) from one thread, the worker's; `peek`, `series`, `missing`, `failed` and
    the properties only read, under a lock held for dictionary updates only, never while a model runs.

    Args:
        run: a `TimelineRun`, or a run folder (then `overrides` go to `open_run`).
        budget_bytes: models' parameters plus results' bytes kept; at least the newest entry always stays.
        image_size: run the images at this (h, w) instead of the model's own size.
        precompute: build every result's CLS and rollout stacks and head statistics when it is made (the window's
            `ResultMaps.precompute`), so that showing a checkpoint indexes arrays only.
    """

    def __init__(self, run: TimelineRun | str | Path, budget_bytes: int = DEFAULT_BUDGET,
                 image_size: tuple[int, int] | None = None, precompute: bool = True, **overrides: Any) -> None:
        self.run = run if isinstance(run, TimelineRun) else open_run(run, **overrides)
        self.budget_bytes = int(budget_bytes)
        self.image_size = image_size
        self.precompute = precompute
        self._images: dict[str, Any] = {}
        self._lru: OrderedDict[tuple, Any] = OrderedDict()     # ('model', k) | ('result', k, key) -> object
        self._figures: dict[str, _Figures] = {}
        self._failed: dict[int, str] = {}
        self._lock = threading.Lock()
        self.loads = 0          # checkpoints loaded so far (a reload after eviction counts again)
        self.runs = 0           # images run so far

    def __len__(self) -> int:
        return len(self.run)

    @property
    def labels(self) -> list[str]:
        return self.run.labels

    @property
    def order_note(self) -> str:
        return self.run.order_note

    @property
    def failed(self) -> dict[int, str]:
        """{checkpoint index: why it could not be used (another layout, an unreadable file)}."""
        return dict(self._failed)

    # images ---------------------------------------------------------------------------------------------------
    def add_image(self, key: str, image: Any) -> None:
        """Open an image under `key` (a path, PIL image or array, as `VitModel.run` takes). A key already open with
        another image forgets its results."""
        with self._lock:
            if key in self._images and self._images[key] is not image:
                self._drop_image(key)
            self._images[key] = image

    def remove_image(self, key: str) -> None:
        """Close an image: its results and figures go."""
        with self._lock:
            self._drop_image(key)
            self._images.pop(key, None)

    def _drop_image(self, key: str) -> None:
        for entry in [e for e in self._lru if e[0] == "result" and e[2] == key]:
            del self._lru[entry]
        self._figures.pop(key, None)

    @property
    def images(self) -> list[str]:
        return list(self._images)

    # results --------------------------------------------------------------------------------------------------
    def peek(self, k: int, key: str) -> Any | None:
        """The `ResultMaps` of image `key` at checkpoint `k` if it is held, else None (never loads or runs: safe on
        the GUI thread). Counts as a use for the eviction order."""
        with self._lock:
            maps = self._lru.get(("result", k, key))
            if maps is not None:
                self._lru.move_to_end(("result", k, key))
            return maps

    def result(self, k: int, key: str) -> Any:
        """The `ResultMaps` of image `key` at checkpoint `k`, loading the checkpoint and running the image when not
        held (the worker's call: it can take a load and a forward pass).

        Raises:
            TimelineError: the checkpoint cannot be used (another layout than the run's, named), or an unknown
                image key or checkpoint index."""
        from vitviz.core.analyses.maps import ResultMaps

        held = self.peek(k, key)
        if held is not None:
            return held
        if key not in self._images:
            raise TimelineError(f"image {key!r} is not open in this timeline; add_image it first")
        if k in self._failed:
            raise TimelineError(self._failed[k])
        model = self._model(k)
        result = model.run(self._images[key], image_size=self.image_size)
        self.runs += 1
        maps = ResultMaps(result)
        if self.precompute:
            maps.precompute()
        self._record(k, key, maps)
        with self._lock:
            if key in self._images:
                self._lru[("result", k, key)] = maps
                self._evict(("result", k, key))
        return maps

    def stack(self, k: int, key: str, kind: Any = "cls") -> Any:
        """The `MapStack` of one map kind of image `key` at checkpoint `k` (`result(k, key).stack(kind)`)."""
        return self.result(k, key).stack(kind)

    def run_vmax(self, key: str, kind: Any = "cls") -> np.ndarray | None:
        """(3,) the largest `MapStack.vmax` over the checkpoints of `key` held now: one colour scale over the run
        (as `vitviz export --timeline` draws it); None when none is held."""
        with self._lock:
            held = [m for e, m in self._lru.items() if e[0] == "result" and e[2] == key]
        tops = [m.stack(kind).vmax for m in held]
        return np.max(tops, axis=0) if tops else None

    def _model(self, k: int) -> Any:
        with self._lock:
            model = self._lru.get(("model", k))
            if model is not None:
                self._lru.move_to_end(("model", k))
                return model
        if self.run.layout is None and k != 0 and 0 not in self._failed:
            try:                                   # the run's layout is its first checkpoint's
                self._model(0)
            except TimelineError:
                pass
        try:
            model = self.run.load(k)
        except TimelineError as e:
            self._failed[k] = str(e)
            raise
        except (VitvizError, OSError, ValueError, RuntimeError) as e:
            self._failed[k] = f"{self.run.checkpoints[k].path.name}: cannot be loaded: {e}"
            raise TimelineError(self._failed[k]) from e
        self.loads += 1
        with self._lock:
            self._lru[("model", k)] = model
            self._evict(("model", k))
        return model

    def _evict(self, keep: tuple) -> None:
        """Drop the least recently used entries (never `keep`) while the total is over the budget (lock held)."""
        sizes = {e: _entry_bytes(e, obj) for e, obj in self._lru.items()}
        total = sum(sizes.values())
        for entry in list(self._lru):
            if total <= self.budget_bytes:
                break
            if entry == keep:
                continue
            total -= sizes[entry]
            del self._lru[entry]

    @property
    def nbytes(self) -> int:
        """Bytes held now: the loaded models' parameters and the results."""
        with self._lock:
            return sum(_entry_bytes(e, obj) for e, obj in self._lru.items())

    @property
    def held(self) -> list[tuple]:
        """What is held, least recently used first: ('model', k) and ('result', k, key) entries."""
        with self._lock:
            return list(self._lru)

    # figures --------------------------------------------------------------------------------------------------
    def _record(self, k: int, key: str, maps: Any) -> None:
        result = maps.result
        distance, entropy, _ = maps.head_stats()                                  # (L, H) each
        p = result.num_prefix
        has_cls = bool(result.spec.cls_token and p)
        top = result.top_k(1) if result.logits.size else []
        with self._lock:
            if key not in self._images:            # closed while it ran
                return
            fig = self._figures.get(key)
            if fig is None:
                depth, heads = distance.shape
                fig = self._figures[key] = _Figures(len(self), depth, heads, tuple(result.grid), has_cls)
            fig.distance[k], fig.entropy[k] = distance, entropy
            if fig.cls is not None:
                fig.cls[k] = np.asarray(result.attentions[:, :, 0, p:], dtype=np.float64).mean(axis=1)   # (L, N)
            fig.predictions[k] = top[0] if top else None
            fig.done[k] = True

    def series(self, key: str, box: tuple[float, float, float, float] | None = None,
               heads: bool = False) -> TimelineMetrics:
        """The figures of image `key` over every checkpoint measured so far (`done`; NaN rows elsewhere): per
        checkpoint and layer the head-mean attention distance (px) and entropy (nats), the CLS attention inside
        `box` (fractions of the image the model saw; None without a box or a CLS token), and the top class.
        With `heads` the distance and entropy are (K, L, H), per head. Vectorised over the checkpoints: no model
        runs here."""
        with self._lock:
            fig = self._figures.get(key)
            if fig is None:
                if key not in self._images:
                    raise TimelineError(f"image {key!r} is not open in this timeline")
                empty = np.full((len(self), 0), np.nan)
                return TimelineMetrics(tuple(self.labels), tuple(c.number for c in self.run.checkpoints), empty,
                                       empty, None, (None,) * len(self), self.order_note, np.zeros(len(self), bool))
            done = fig.done.copy()
            distance, entropy = fig.distance.copy(), fig.entropy.copy()
            cls = None if fig.cls is None else fig.cls
            predictions = tuple(fig.predictions)
            share = None
            if box is not None and cls is not None:
                share = cls @ box_mask(box, fig.grid).ravel().astype(np.float64)    # (K, L, N) @ (N,) -> (K, L)
        if not heads:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)                      # all-NaN rows: not done yet
                distance, entropy = np.nanmean(distance, axis=2), entropy.mean(axis=2)
        return TimelineMetrics(tuple(self.labels), tuple(c.number for c in self.run.checkpoints), distance, entropy,
                               share, predictions, self.order_note, done)

    def missing(self, key: str, around: int = 0) -> list[int]:
        """The checkpoints whose figures for `key` are not measured yet (failed ones left out), nearest to `around`
        first, later before earlier at equal distance: the order a worker fills the plots in while the user looks
        at checkpoint `around`."""
        with self._lock:
            fig = self._figures.get(key)
            done = fig.done if fig is not None else np.zeros(len(self), bool)
            todo = [k for k in range(len(self)) if not done[k] and k not in self._failed]
        return sorted(todo, key=lambda k: (abs(k - around), k < around))


def _entry_bytes(entry: tuple, obj: Any) -> int:
    return _nbytes(obj) if entry[0] == "model" else int(obj.nbytes)
