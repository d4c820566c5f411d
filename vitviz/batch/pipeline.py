"""The export pipeline: read and preprocess in threads, run the model in batches, render and write in threads.

Memory stays bounded: at most `2 * batch_size + workers` images are read ahead, and a batch runs only once at most
one batch of results still waits for its PNGs (two batches' maps in flight: what `--memory` bounds), so the peak
does not grow with the number of images. When the maps are a rollout and CLS / token maps (`Plan.stream`), the
capture keeps of each layer, as it is computed, only what they read (`Kept`: the query rows, the heads fused), so
an image in flight holds a fraction of its (L, H, T, T) stack.

Maps of a class (relevance, gradient rollout, attention x gradient) take a forward and backward pass per image and
class, and the PCA and norms maps a pass that keeps every block's output tokens; both run only when such a map is
asked for, one image at a time after the batch's attention pass (which is skipped when no attention map and no
.npz is asked for). The plain export is as fast as without them.
"""
from __future__ import annotations

import errno
import hashlib
import io
import threading
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vitviz.batch.jobs import Job, sha256_file
from vitviz.batch.plan import Plan
from vitviz.core import files
from vitviz.core.running import images
from vitviz.core.running.capture import out_of_memory_said, pool_rows
from vitviz.core.analyses.maps import ResultMaps
from vitviz.core.drawing.render import draw_colors, draw_map
from vitviz.core.spec import AttentionResult, ModelSpec, split_output
from vitviz.errors import DiskFullError, VitvizError

# Write errors that no later image can avoid: the run stops and says so (naming the output folder) instead of
# failing every remaining image with the same message.
FULL_ERRNOS = {errno.ENOSPC: "the disk is full", errno.EDQUOT: "the disk quota is used up",
               errno.EFBIG: "a file size limit was reached", errno.EROFS: "the disk is read-only"}
POLL_SECONDS = 0.2  # the main thread wakes this often while it waits, so SIGINT/SIGTERM act within it


class Stopped(Exception):
    """A write that saw the run stopping before its next file (the files it wrote are recorded)."""


def wait_for(future: "Future[Any]") -> Any:
    """`future.result()`, waking every POLL_SECONDS: a signal delivered to another thread (a reader, a writer,
    a torch thread) is only acted on when the main thread runs Python code, so it never blocks for long."""
    while True:
        try:
            return future.result(timeout=POLL_SECONDS)
        except TimeoutError:
            continue


@dataclass
class Prepared:
    """A read image: the model input (1, C, H, W), the display (H, W, 3) and the region maps are drawn over."""

    job: Job
    x: Any
    display: np.ndarray
    region: np.ndarray


def prepare(job: Job, spec: ModelSpec, plan: Plan, *, file: Path | None = None, data: bytes | None = None,
            complete: Callable[[Job], bool] | None = None) -> Prepared | None:
    """Read one image: hash the file; None when every output exists (skip), else decode and preprocess it. A path
    that is not a regular file (a FIFO would block the hash for good) is refused before it is opened.

    The Ray engine's decoding tasks run this too, reading `file` (the image's absolute path) or its bytes `data`
    (an image fetched from a pyarrow.fs URI, named by `job.path` in errors), with `complete` saying whether a
    job's outputs all exist at a destination that is not a local folder.
    """
    if data is None:
        path = job.path if file is None else file
        images.check_image_path(path)
        job.sha256 = sha256_file(path)
        source: Any = path
    else:
        job.sha256 = hashlib.sha256(data).hexdigest()
        source = io.BytesIO(data)
        source.name = str(job.path)  # what errors name
    if not plan.overwrite and (complete(job) if complete is not None else all(p.exists() for p in job.outputs)):
        return None
    img = images.load_image(source, channels=spec.in_chans)
    x, display = images.preprocess(img, spec.preprocess, channels=spec.in_chans)
    region = images.seen_region(img, spec.preprocess) if plan.render.size == "original" else display
    return Prepared(job, x, display, region)


def run_passes(maps: ResultMaps, model: Any, x: Any, classes: list[int | None], features: bool,
               texts: dict[str, np.ndarray] | None = None) -> ResultMaps:
    """Add to one image's `maps` the gradient maps of each class (one forward and backward pass each), the LeGrad
    map of each text prompt of `texts` (prompt -> its text embedding; a pass each) and, with `features`, every
    block's output tokens (one pass); `x` is its (1, C, H, W) input."""
    from vitviz.core.analyses.relevance import class_relevance, legrad

    for target in classes:
        maps.add_relevance(class_relevance(model, x, target), target)
    for prompt, emb in (texts or {}).items():
        maps.add_text(prompt, legrad(model, x, emb))
    if features:
        from vitviz.core.analyses.features import capture_features, prefix_norms, token_norms

        stack = capture_features(model, x)
        maps.add_features(stack, token_norms(stack), prefix_norms(stack))
    return maps


class Kept:
    """A streamed capture of one batch (`Plan.stream`): of each layer's (B, H, T, T) attention, as the model
    computes it (`forward_streamed`), only what the plan's maps read is kept -- the query rows of its CLS / token
    maps (float16 with --half) and, for each rollout fusion, the layer's heads fused as `RolloutEngine` fuses them
    (`fuse_heads`, float32) -- and the layer is let go: an image holds (L, H, k, T) rows and (L, T, T) per fusion,
    never the (L, H, T, T) stack.

    Rows and fusions are taken on the model's device, and only they leave it (`HostCopy`: asynchronous copies
    through pinned staging buffers on CUDA); `rows_of` and `fused` wait for those copies before they are read."""

    def __init__(self, spec: ModelSpec, plan: Plan, batch: int, device: Any = "cpu") -> None:
        import torch

        from vitviz.batch.plan import streamed_rows
        from vitviz.core.running.runtime import HostCopy

        self.spec, self.rows = spec, streamed_rows(plan.maps)
        self.host = HostCopy(device)
        t, depth = spec.num_tokens, spec.depth
        self._rows = self.host.empty((batch, depth, spec.num_heads, len(self.rows), t),
                                     torch.float16 if plan.half else torch.float32)
        self._rows.zero_()
        self._index: Any = None
        fusions = sorted({m.rollout.fusion for m in plan.maps if m.kind == "rollout"})
        self._fused = {f: self.host.empty((batch, depth, t, t), torch.float32) for f in fusions}
        self._views = self._rows.numpy(), {f: a.numpy() for f, a in self._fused.items()}  # read after `wait` only
        self.layers = 0

    @property
    def rows_of(self) -> np.ndarray:
        """(B, L, H, k, T): the kept query rows of every layer, once their copies have arrived."""
        self.host.wait()
        return self._views[0]

    @property
    def fused(self) -> dict[str, np.ndarray]:
        """Rollout fusion -> (B, L, T, T): every layer's fused heads, once their copies have arrived."""
        self.host.wait()
        return self._views[1]

    def append(self, layer: Any) -> None:
        """Keep what the maps read of the next layer's (B, H, T, T) attention."""
        import torch

        i = self.layers
        if i >= self.spec.depth or layer.dim() != 4 or layer.shape[-1] != self.spec.num_tokens:
            raise VitvizError(f"the model gave attention layer {i} of shape {tuple(layer.shape)}; expected "
                              f"{self.spec.depth} layers of (batch, heads, {self.spec.num_tokens}, "
                              f"{self.spec.num_tokens})")
        a = layer.detach().float()
        if self._index is None:
            self._index = torch.tensor(self.rows, dtype=torch.long, device=a.device)
        self.host.copy(self._rows[:, i], a.index_select(2, self._index))
        for fusion, out in self._fused.items():
            self.host.copy(out[:, i], _fused_heads(a, fusion))
        self.layers += 1

    def check(self) -> None:
        """After the forward: every layer was given (a model that computes fewer would leave zeros), and every copy
        has arrived."""
        self.host.wait()
        if self.layers != self.spec.depth:
            raise VitvizError(f"the model gave {self.layers} attention layers; expected {self.spec.depth}")

    def rollout(self, index: int) -> Any:
        """Image `index`'s rollout engine of the fused layers (None: no rollout map)."""
        from vitviz.core.analyses.rollout import RolloutEngine

        if not self.fused:
            return None
        return RolloutEngine(None, self.spec.num_prefix, self.spec.cls_token,
                             fused={f: stack[index] for f, stack in self.fused.items()})


def _fused_heads(layer: Any, fusion: str) -> Any:
    """(B, H, T, T) -> (B, T, T), the heads fused on the layer's device as `fuse_heads` fuses one image's in NumPy
    ('mean': summed head by head in order, then divided, as NumPy's mean over the first axis sums; 'max', 'min'),
    so that the maps are the same bits as the host-side fusion's."""
    if fusion == "max":
        return layer.amax(dim=1)
    if fusion == "min":
        return layer.amin(dim=1)
    if fusion != "mean":
        raise VitvizError(f"rollout fusion {fusion!r}: expected 'mean', 'max' or 'min'")
    total = layer[:, 0].clone()
    for h in range(1, layer.shape[1]):
        total += layer[:, h]
    return total / layer.shape[1]


class Exporter:
    """Runs a plan over its jobs; `counts` and each job's status say what happened.

    Args:
        model: a loaded `VitModel`.
        on_progress: called on this thread with each job as it finishes (its `status` is then 'done', 'skipped'
            or 'failed', with `error` saying why); the CLI draws its progress bar from it.
    """

    def __init__(self, model: Any, plan: Plan, jobs: list[Job],
                 on_progress: Callable[[Job], None] | None = None, spec: ModelSpec | None = None) -> None:
        self.model, self.plan, self.jobs = model, plan, jobs
        self.spec = model.spec if spec is None else spec  # the Ray engine's actors: the driver's (same model)
        self.combos = plan.combos()
        self.texts: dict[str, np.ndarray] = {}
        if plan.prompts:  # the text tower runs once, here: a file without one fails before any image is read
            from vitviz.core.analyses.text import text_embedding

            self.texts = dict(zip(plan.prompts, text_embedding(model, plan.prompts)))
        self.counts = {"done": 0, "skipped": 0, "failed": 0, "files": 0}
        self.on_progress = on_progress or (lambda _job: None)
        self._writes: deque[tuple[Job, Future[None]]] = deque()
        self._stop = threading.Event()
        self._writers: ThreadPoolExecutor | None = None  # export_batch's, kept between its calls

    def run(self) -> None:
        """Process every job. On KeyboardInterrupt (or a full disk: `DiskFullError`), drop queued work, let
        running writes finish, count and record what they wrote, re-raise."""
        readers = ThreadPoolExecutor(self.plan.workers, thread_name_prefix="vitviz-read")
        writers = ThreadPoolExecutor(max(1, min(2, self.plan.workers)), thread_name_prefix="vitviz-write")
        try:
            for batch in self._batches(readers):
                self._forward(batch, writers)
            while self._writes:
                self._finish_oldest()
        except BaseException:
            self._stop.set()  # running writes stop after the file they are writing
            raise
        finally:
            readers.shutdown(wait=True, cancel_futures=True)
            writers.shutdown(wait=True, cancel_futures=True)  # every file is complete: none is half-written
            self._settle()

    def export_batch(self, batch: list[Prepared]) -> None:
        """Forward one batch of read images and write its files, waiting for them: each job is then 'done' or
        'failed' (with `error`). The Ray engine's actors run the local engine's steps through this, one call per
        batch Ray hands them; `run` is not used then.

        Raises:
            DiskFullError: a write hit a full (or read-only) disk; the batch's other writes were finished first.
        """
        if self._writers is None:
            self._writers = ThreadPoolExecutor(max(1, min(2, self.plan.workers)), thread_name_prefix="vitviz-write")
        self._forward(batch, self._writers)
        full: DiskFullError | None = None
        while self._writes:
            try:
                self._finish_oldest()
            except DiskFullError as e:  # that image failed with it; the others still finish
                full = full or e
        if full is not None:
            raise full

    def _settle(self) -> None:
        """After a stop: writes that completed count as done (their files are on disk), cancelled ones stay
        pending; the file count is what every image wrote."""
        while self._writes:
            job, future = self._writes.popleft()
            if future.cancelled():
                continue
            error = future.exception()
            if isinstance(error, Stopped):  # part of its files: recorded, the image stays pending
                continue
            if error is None:
                job.status = "done"
                self.counts["done"] += 1
            elif isinstance(error, DiskFullError):
                job.status, job.error = "failed", str(error)
                self.counts["failed"] += 1
            else:
                self._fail(job, error)
        self.counts["files"] = sum(len(job.written) for job in self.jobs)

    def _batches(self, readers: ThreadPoolExecutor) -> Iterator[list[Prepared]]:
        """Lists of up to `batch_size` read images, in input order, reading ahead in `readers`."""
        ahead: deque[tuple[Job, Future[Prepared | None]]] = deque()
        lookahead = 2 * self.plan.batch_size + self.plan.workers
        batch: list[Prepared] = []
        pending = iter(self.jobs)
        while True:
            while len(ahead) < lookahead and (job := next(pending, None)) is not None:
                ahead.append((job, readers.submit(self._read, job)))
            if not ahead:
                break
            item = self._take(*ahead[0])
            ahead.popleft()
            if item is not None:
                batch.append(item)
            if len(batch) == self.plan.batch_size or (batch and not ahead):
                yield batch
                batch = []
            self._finish_ready()

    def _read(self, job: Job) -> Prepared | None:
        return prepare(job, self.spec, self.plan)

    def _take(self, job: Job, future: Future[Prepared | None]) -> Prepared | None:
        try:
            item = wait_for(future)
        except (VitvizError, OSError) as e:
            self._fail(job, e)
            return None
        if item is None:
            job.status = "skipped"
            self.counts["skipped"] += 1
            self.on_progress(job)
        return item

    def _forward(self, batch: list[Prepared], writers: ThreadPoolExecutor) -> None:
        """One forward pass for the batch (once at most one batch is still being written), then its PNGs queued for
        writing: the maps of at most two batches are alive at once, as `plan.auto_batch_size` counts them."""
        import torch

        plan = self.plan
        while len(self._writes) > plan.batch_size:   # two batches in flight: this one and one being written
            self._finish_oldest()
        attn: Any = [None] * len(batch)
        logits: Any = [None] * len(batch)
        pools: list[np.ndarray | None] = [None] * len(batch)
        engines: list[Any] = [None] * len(batch)
        rows = plan.rows
        if plan.needs_attention:
            try:
                x = torch.cat([p.x for p in batch])
                if plan.stream:   # of each layer as it is computed, only what the maps read
                    kept = Kept(self.spec, plan, len(batch), self.model.device)
                    with out_of_memory_said(self.model.device, x):
                        self.model.forward_streamed(x, kept.append)
                    kept.check()
                    rows = kept.rows
                    attn, engines = kept.rows_of, [kept.rollout(i) for i in range(len(batch))]
                else:
                    # logits only go into .npz; without it the pass stops at the last softmax, unless a MAP head's
                    # map is asked for (the head runs after the blocks)
                    pool: list[np.ndarray] = []   # filled by a model with a MAP head (every model takes it)
                    attn, logits = self.model.forward_captured(x, plan.half, logits=plan.npz or plan.needs_pool,
                                                               rows=rows, pool=pool)
                    pools = [pool_rows(pool, self.spec, i) for i in range(len(batch))]
            except VitvizError as e:
                for p in batch:
                    self._fail(p.job, e)
                return
        results: list[ResultMaps | None] = []
        for i, p in enumerate(batch):  # maps of a class or of the features: passes of their own, only when asked
            scores, features = (split_output(logits[i], self.spec) if logits[i] is not None
                                else (np.zeros(0, np.float32), None))
            result = AttentionResult(attentions=attn[i] if attn[i] is not None else np.zeros(0, np.float32),
                                     logits=scores, input=p.x[0].numpy(), image=p.display, spec=self.spec,
                                     source=str(p.job.path), features=features, pool_attention=pools[i],
                                     interventions=tuple(getattr(self.model, "interventions", ())))
            maps = ResultMaps(result, rows=rows, rollout=engines[i])
            try:
                if plan.classes or plan.needs_features or self.texts:
                    run_passes(maps, self.model, p.x, plan.classes, plan.needs_features, self.texts)
                results.append(maps)
            except VitvizError as e:
                self._fail(p.job, e)
                results.append(None)
        for p, maps in zip(batch, results):
            if p.job.status != "failed" and maps is not None:
                self._writes.append((p.job, writers.submit(self._write_taken, [p, maps])))

    def _write_taken(self, held: list[Any]) -> None:
        """`_write` of the image and maps `held` holds, taken out of it first: the pool's work item keeps the
        arguments it was given until its thread has moved on, which may be after the future is done, and an image's
        maps then outlived its write (a third image's alive while the next forward ran)."""
        p, maps = held
        held.clear()
        self._write(p, maps)

    def _write(self, p: Prepared, maps: ResultMaps) -> None:
        """Render and atomically write one image's PNGs (and .npz) from its `ResultMaps` (the window's holder: the
        same stacks and arrays); an output that exists is left alone."""
        job, plan, spec = p.job, self.plan, self.spec
        input_hw = p.display.shape[:2]

        def draw(m: Any, layer: Any, head: Any) -> np.ndarray:
            if m.kind == "pca":  # a colour image per layer, not a stack
                return draw_colors(maps.pca_at(layer).colors[0], p.region, input_hw, spec.patch_size, plan.render)
            return draw_map(maps.stack(m), layer, head, p.region, input_hw, spec.patch_size, plan.render)

        self._write_pngs(job, draw)
        if plan.npz and (plan.overwrite or not job.outputs[-1].exists()):
            extra = maps.arrays(plan.maps, plan.layers)
            self._save(job, job.outputs[-1],
                       lambda: files.write_npz_atomic(job.outputs[-1], maps.result, plan.overwrite, extra=extra))

    def _write_pngs(self, job: Job, draw: Callable[[Any, Any, Any], np.ndarray]) -> None:
        """Each of `job`'s map outputs that is not there yet (or every one, with --overwrite) drawn by `draw(kind,
        layer, head)` and written atomically, its folder made first; a stop request ends it between two maps."""
        for folder in {path.parent for path in job.outputs}:
            self._save(job, folder, lambda: folder.mkdir(parents=True, exist_ok=True), record=False)
        for (m, layer, head), path in zip(self.combos, job.outputs):
            if self._stop.is_set():
                raise Stopped
            if not self.plan.overwrite and path.exists():
                continue
            rgb = draw(m, layer, head)
            self._save(job, path, lambda: files.write_png_atomic(path, rgb, self.plan.overwrite))

    @staticmethod
    def _save(job: Job, path: Path, write: Any, record: bool = True) -> None:
        """Run one write; a full disk (or quota, or read-only disk) becomes a `DiskFullError` naming the folder,
        which stops the run."""
        try:
            write()
        except files.OutputExistsError:  # another run wrote it meanwhile: keep theirs
            return
        except OSError as e:
            if e.errno in FULL_ERRNOS:
                folder = path if not record else path.parent
                raise DiskFullError(f"{folder}: {FULL_ERRNOS[e.errno]} ({e.strerror or e}) while writing "
                                    f"{path.name}; the export stopped. Free some space (or choose another --out "
                                    "folder) and run it again: finished images are skipped") from e
            raise
        if record:
            job.written.append(path)

    def _finish_ready(self) -> None:
        while self._writes and self._writes[0][1].done():
            self._finish_oldest()

    def _finish_oldest(self) -> None:
        job, future = self._writes[0]
        try:
            wait_for(future)  # an interruption here leaves the write queued: `_settle` counts it
        except DiskFullError as e:  # every later image would fail the same way: stop the run
            self._writes.popleft()
            job.status, job.error = "failed", str(e)
            self.counts["failed"] += 1
            raise
        except (VitvizError, OSError, ValueError) as e:
            self._writes.popleft()
            self._fail(job, e)
            return
        self._writes.popleft()
        job.status = "done"
        self.counts["done"] += 1
        self.counts["files"] += len(job.written)
        self.on_progress(job)

    def _fail(self, job: Job, error: BaseException) -> None:
        job.status, job.error = "failed", failure_text(job, error)
        self.counts["failed"] += 1
        self.on_progress(job)

    def summary(self, out: Path, seconds: float, interrupted: bool) -> str:
        """One line: images done, skipped, failed, files written, time and rate."""
        return summary_line(self.counts, len(self.jobs), out, seconds, interrupted)


def failure_text(job: Job, error: BaseException) -> str:
    """Why an image failed, naming it (once)."""
    text = str(error) or type(error).__name__
    return text if str(job.path) in text else f"{job.path}: {text}"


def summary_line(counts: dict[str, int], total: int, out: Any, seconds: float, interrupted: bool,
                 engine: str = "") -> str:
    """`vitviz export: 3 done, 0 skipped, 1 failed of 4 images; 12 files written to OUT in 2.0 s (0.67 s per
    image)`; the pace as images/s when faster than one a second ('0.0 images/s' said nothing for a slow model);
    `engine` (e.g. 'on Ray, 2 actors') follows 'vitviz export'."""
    c = counts
    head = "vitviz export" + (f" {engine}" if engine else "") + (" interrupted" if interrupted else "")
    images = "image" if total == 1 else "images"
    files = "file" if c["files"] == 1 else "files"
    return (f"{head}: {c['done']} done, {c['skipped']} skipped, {c['failed']} failed of {total} "
            f"{images}; {c['files']} {files} written to {out} in {seconds:.1f} s{pace(c['done'], seconds)}")


def pace(done: int, seconds: float) -> str:
    """' (12.5 images/s)', ' (3.2 s per image)', or '' when nothing was done or no time passed."""
    if done <= 0 or seconds <= 0:
        return ""
    rate = done / seconds
    return f" ({rate:.1f} images/s)" if rate >= 1 else f" ({seconds / done:.3g} s per image)"
