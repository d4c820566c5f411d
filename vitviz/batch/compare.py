"""`vitviz export --compare B` and `vitviz export --timeline RUN_DIR`: two models, or every checkpoint of a run, on
the same images, written through the export's own names (`plan.output_name`), readers (`pipeline.prepare`),
renderer (`render.draw_map`), atomic writers (`core.files`) and manifest entries (`jobs.Job.record`).

Names, for image `cat`, map `cls`, layer 11, head 3 (the stem carries the model, then `output_name` as everywhere):

- compare: `cat_A_cls_L11_H3.png` (A's map), `cat_B_cls_L5_H7.png` (B's own map at its own layer and head: the
  ones matched with A's, `vitviz.core.analyses.compare`), `cat_diff_cls_L11_H3.png` (A − B on A's grid, on the diverging
  colormap `core.colormaps.DIVERGING`, centred on 0, symmetric scale). A and B are drawn on one shared scale
  (`vitviz.core.analyses.compare.shared_scale`: 0..the larger of both models' maxima of the column group, all layers; with
  --colorbar-label the bar says 'scale shared by A and B'), so their colours compare; --scale own draws each on its
  own. The heads are matched once, on CLS attention over all the images, and that matching is used for every map.
  The window's Compare dock writes the same pictures (`compare_pictures`), byte for byte; `cat_compare.npz` with --npz (a, b, diff
  stacks (L, H + 2, gh, gw), B's own stack, the layer pairs and the head partners).
- timeline: `cat_{checkpoint}_cls_L11_H3.png` per checkpoint (e.g. `cat_epoch_3_cls_L11_Hmean.png`), every
  checkpoint on one colour scale (the largest of theirs), and the contact sheet `cat_timeline_cls_L11_H3.png`: the
  maps over time, labelled with the checkpoints; `timeline.csv` with the figures of every image, checkpoint and
  layer; `cat_timeline.npz` with --npz. The same maps played over time where Pillow can write them (`can_animate`;
  off with `animate=False`, the CLI's --no-animation): `cat_animation_cls_L11_H3.png` (an APNG: lossless, every
  frame's picture exactly the checkpoint's PNG) and `cat_animation_cls_L11_H3.gif` (colours quantised to one
  palette shared by all frames), one frame per checkpoint in the run's order, each with the checkpoint's label in a
  strip below the map, `ANIMATION_MS` per frame and the last held `ANIMATION_HOLD` times as long, looping.
"""
from __future__ import annotations

import csv
import io
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from vitviz.batch.jobs import Job, inside
from vitviz.batch.pipeline import Prepared, prepare, summary_line
from vitviz.batch.plan import Plan, combos, output_name
from vitviz.core import files
from vitviz.core.drawing.colormaps import DIVERGING
from vitviz.core.analyses.compare import (Comparison, HeadMode, check_comparable, compare_stacks, on_scale, resolved_kind,
                                         shared_scale)
from vitviz.core.analyses.maps import MapKind, MapStack, map_stack
from vitviz.core.drawing.render import RenderOptions, draw_map
from vitviz.core.spec import ModelSpec
from vitviz.core.analyses.timeline import TimelineRun, result_metrics
from vitviz.errors import VitvizError

TIMELINE_CSV = "timeline.csv"
SHEET_COLUMNS = 10
ANIMATION_MS = 500          # per frame of the timeline animations
ANIMATION_HOLD = 3          # the last frame shows this many times as long
ANIMATION_FORMATS = {".png": "PNG", ".gif": "GIF"}   # APNG and GIF: suffix -> Pillow's format
LABEL_STRIP = 14            # px of white below each picture for its label (contact sheet and animation frames)


@dataclass
class SideExport:
    """What a compare or timeline export did, shaped as `pipeline.Exporter` is for the CLI's summary and manifest
    (`plan`, `jobs`, `counts`, `summary`), plus `record()`: the manifest's 'compare' or 'timeline' entry."""

    plan: Plan
    jobs: list[Job]
    counts: dict[str, int] = field(default_factory=lambda: {"done": 0, "skipped": 0, "failed": 0, "files": 0})
    extra: dict[str, Any] = field(default_factory=dict)

    def summary(self, out: Path, seconds: float, interrupted: bool) -> str:
        return summary_line(self.counts, len(self.jobs), out, seconds, interrupted)

    interrupted: bool = False

    def record(self) -> dict[str, Any]:
        return self.extra

    def stop(self) -> None:
        """After Ctrl-C or SIGTERM: every image not finished keeps, as written, the outputs that are on disk
        (atomic writes leave no partial file), so the manifest matches the disk, as the plain export's does."""
        self.interrupted = True
        for job in self.jobs:
            if job.status == "pending":
                job.written = [p for p in dict.fromkeys([*job.outputs, *job.written]) if p.exists()]
                self.counts["files"] += len(job.written)


def until_interrupted(exp: SideExport, work: Callable[[], None]) -> SideExport:
    """Run `work` (which fills `exp`); Ctrl-C or SIGTERM (raised as KeyboardInterrupt by the CLI) stops it with
    `exp` settled (`SideExport.stop`), for the manifest."""
    try:
        work()
    except KeyboardInterrupt:
        exp.stop()
    return exp


def _write(job: Job, path: Path, rgb_or_arrays: Any, overwrite: bool) -> None:
    """Write one output, named among the job's outputs first: a B or difference picture's name is known only
    once the heads are matched, and a signal between its write and its record must still find it (`stop`)."""
    if path not in job.outputs:
        job.outputs.append(path)
    if path.exists() and not overwrite:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(rgb_or_arrays, dict):
        files.write_arrays_atomic(path, rgb_or_arrays, overwrite)
    else:
        files.write_png_atomic(path, rgb_or_arrays, overwrite)
    job.written.append(path)


def _finish(exp: SideExport, job: Job, error: BaseException | None, on_progress: Callable[[Job], None]) -> None:
    if error is None:
        job.status = "done"
        exp.counts["done"] += 1
    else:
        job.status, job.error = "failed", f"{job.path}: {error}"
        exp.counts["failed"] += 1
    exp.counts["files"] += len(job.written)
    on_progress(job)


@dataclass(frozen=True)
class Seen:
    """What one model's maps are drawn over: the region it saw (`Prepared.region`, or the window's `render.
    native_view`), its input's size in pixels and its patch size."""

    region: np.ndarray
    input_hw: tuple[int, int]
    patch: int


def signed_picture(stack: MapStack, layer: Any, head: Any, seen: Seen, render: RenderOptions) -> np.ndarray:
    """A difference map drawn on the diverging colormap, -m..m: m shared by the stack's column group, or this map's
    own largest |value| with --scale own (never an off-centre min..max)."""
    opts = replace(render, cmap=DIVERGING, scale="shared")
    if render.scale == "own":
        m = float(np.nanmax(np.abs(stack.select(layer, head))))
        m = m if m > 0 else 1e-12
        stack = MapStack(stack.maps, np.full(3, m), stack.title + " (own scale)", np.full(3, -m))
    return draw_map(stack, layer, head, seen.region, seen.input_hw, seen.patch, opts)


def compare_names(stem: str, m: MapKind, layer: Any, head: Any, b_layer: Any, partner: Any) -> tuple[str, str, str]:
    """The file names of A's, B's and the difference's picture of one selection (see the module docstring)."""
    return (output_name(f"{stem}_A", m, layer, head), output_name(f"{stem}_B", m, b_layer, partner),
            output_name(f"{stem}_diff", m, layer, head))


def compare_pictures(a: MapStack, b_own: MapStack, diff: MapStack, vmax: np.ndarray, layer: Any, head: Any,
                     b_layer: Any, partner: Any, seen_a: Seen, seen_b: Seen, render: RenderOptions
                     ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
    """A's picture, B's (its own map at its own layer `b_layer` and head `partner`, over what B saw; None without a
    partner) and A − B's, as `vitviz export --compare` and the window's Compare dock write them.

    A and B are drawn on one shared scale (`vmax`: `vitviz.core.analyses.compare.shared_scale`, 0..the larger of both
    models' maxima of the column group; the colorbar label says 'scale shared by A and B'), unless --scale own;
    A − B on the diverging colormap centred on 0 (`signed_picture`)."""
    if render.scale != "own":
        a, b_own = on_scale(a, vmax), on_scale(b_own, vmax)
    rgb_a = draw_map(a, layer, head, seen_a.region, seen_a.input_hw, seen_a.patch, render)
    rgb_b = None if partner is None else draw_map(b_own, b_layer, partner, seen_b.region, seen_b.input_hw,
                                                  seen_b.patch, render)
    return rgb_a, rgb_b, signed_picture(diff, layer, head, seen_a, render)


def compare_jobs(plan: Plan, pairs: list[tuple[Path, Path]], out: Path, stems: list[str]) -> list[Job]:
    """One job per image; its outputs are known once the heads are matched, so only A's and the differences are
    listed up front (B's are added as they are written)."""
    todo = combos(plan.maps, plan.layers, plan.heads)
    jobs = []
    for i, ((path, sub), stem) in enumerate(zip(pairs, stems)):
        folder = out / inside(sub)
        outputs = [folder / output_name(f"{stem}_{side}", m, layer, head) for side in ("A", "diff")
                   for m, layer, head in todo]
        jobs.append(Job(i, path, outputs))
    return jobs


def export_compare(model_a: Any, model_b: Any, plan: Plan, pairs: list[tuple[Path, Path]], out: Path,
                   stems: list[str], heads: HeadMode = "match",
                   on_progress: Callable[[Job], None] = lambda _job: None) -> SideExport:
    """Run every image through A and B, match the heads over all of them, and write A's, B's and the difference
    maps (see the module docstring). An image that cannot be read fails alone."""
    for side, model in (("A", model_a), ("B", model_b)):
        check_comparable(model, side)
    jobs = compare_jobs(plan, pairs, out, stems)
    exp = SideExport(plan, jobs)
    exp.extra = {"compare": {"model_b": {"checkpoint": str(model_b.spec.source), "spec": model_b.spec.to_dict()},
                             "heads": heads, "maps": {}}}
    return until_interrupted(exp, lambda: _compare(exp, model_a, model_b, plan, stems, heads, on_progress))


def _compare(exp: SideExport, model_a: Any, model_b: Any, plan: Plan, stems: list[str], heads: HeadMode,
             on_progress: Callable[[Job], None]) -> None:
    jobs = exp.jobs
    spec_a, spec_b = model_a.spec, model_b.spec
    read: list[tuple[Job, Prepared, Prepared, list[MapStack], list[MapStack]]] = []
    cls_a: list[MapStack] = []
    cls_b: list[MapStack] = []
    cls = MapKind("cls")
    force = replace(plan, overwrite=True)           # B's reader: never skipped (A's outputs decide that)
    for job in jobs:
        try:
            pa = prepare(job, spec_a, force)
            pb = prepare(Job(job.index, job.path, []), spec_b, force)
            assert pa is not None and pb is not None
            ra, rb = model_a.run(pa.x, logits=False), model_b.run(pb.x, logits=False)
            read.append((job, pa, pb, [map_stack(ra.attentions, m, ra.spec) for m in plan.maps],
                         [map_stack(rb.attentions, m, rb.spec) for m in plan.maps]))
            cls_a.append(map_stack(ra.attentions, resolved_kind(cls, spec_a), ra.spec))
            cls_b.append(map_stack(rb.attentions, resolved_kind(cls, spec_b), rb.spec))
        except (VitvizError, OSError) as e:
            _finish(exp, job, e, on_progress)
    if not read:
        return
    # the heads are matched once, on CLS attention over all the images, and used for every map (as the window's
    # `CompareView` does): a head's partner does not change with the map drawn
    matched = compare_stacks(cls_a, cls_b, spec_a, spec_b, cls, heads).heads
    records = {}
    for k, m in enumerate(plan.maps):
        records[m.label] = compare_stacks([r[3][k] for r in read], [r[4][k] for r in read], spec_a, spec_b, m,
                                          matched if m.per_head else heads, [str(r[0].path) for r in read])
    exp.extra["compare"]["maps"] = {label: c.to_dict() for label, c in records.items()}
    for n, (job, pa, pb, _, _) in enumerate(read):
        try:
            _write_compare(job, stems[job.index], pa, pb, n, records, plan, spec_a, spec_b)
            _finish(exp, job, None, on_progress)
        except (VitvizError, OSError, ValueError) as e:
            _finish(exp, job, e, on_progress)


def _write_compare(job: Job, stem: str, pa: Prepared, pb: Prepared, n: int, records: dict[str, Comparison], plan: Plan,
                   spec_a: ModelSpec, spec_b: ModelSpec) -> None:
    folder = job.outputs[0].parent
    arrays: dict[str, np.ndarray] = {}
    for m in plan.maps:
        c = records[m.label]
        im = c.images[n]
        vmax = shared_scale(im.a, im.b)
        seen_a = Seen(pa.region, pa.display.shape[:2], spec_a.patch_size)
        seen_b = Seen(pb.region, pb.display.shape[:2], spec_b.patch_size)
        for layer in plan.layers:
            for head in (plan.heads if m.per_head else ["mean"]):
                b_layer, partner = b_selection(c, layer, head)
                names = compare_names(stem, m, layer, head, b_layer, partner)
                rgb_a, rgb_b, rgb_d = compare_pictures(im.a, im.b_own, im.diff, vmax, layer, head, b_layer, partner,
                                                       seen_a, seen_b, plan.render)
                _write(job, folder / names[0], rgb_a, plan.overwrite)
                if rgb_b is None:                 # more heads in A than in B: no B map, no difference
                    continue
                _write(job, folder / names[1], rgb_b, plan.overwrite)
                _write(job, folder / names[2], rgb_d, plan.overwrite)
        key = m.label.replace("-", "_")
        arrays.update({f"{key}_a": im.a.maps, f"{key}_b": im.b.maps, f"{key}_diff": im.diff.maps,
                       f"{key}_b_own": im.b_own.maps, f"{key}_layers_b": c.layers_b,
                       f"{key}_head_partner": np.array([[m2.partner(h) if m2.partner(h) is not None else -1
                                                         for h in range(im.a.num_heads)] for m2 in c.heads])})
    if plan.npz:
        _write(job, folder / f"{stem}_compare.npz", arrays, plan.overwrite)
    job.outputs = list(dict.fromkeys([*job.outputs, *job.written]))


def b_selection(c: Comparison, layer: Any, head: Any) -> tuple[Any, Any]:
    """B's layer and head drawn for A's `layer` and `head`: the layer paired by relative depth ('mean' for the mean
    over layers), the head matched with A's (the last layer's match for the layer mean; None without a partner),
    'mean' / 'max' for those."""
    li = layer if isinstance(layer, int) else None
    if li is not None:
        li = li % len(c.layers_b)
    partner: Any = head
    if isinstance(head, int):
        partner = c.heads[li if li is not None else -1].partner(head % c.images[0].a.num_heads)
    return (int(c.layers_b[li]) if li is not None else layer), partner


# -------------------------------------------------------------------------------------------------- timeline
def export_timeline(run: TimelineRun, plan: Plan, pairs: list[tuple[Path, Path]], out: Path, stems: list[str],
                    box: tuple[float, float, float, float] | None = None,
                    on_progress: Callable[[Job], None] = lambda _job: None, animate: bool = True) -> SideExport:
    """Every checkpoint (loaded one at a time, checkpoints outermost) on every image: one map per checkpoint, the
    contact sheet, the animations (`animate`, where Pillow can) and the figures (see the module docstring)."""
    todo = combos(plan.maps, plan.layers, plan.heads)
    labels = run.labels
    jobs = []
    for i, ((path, sub), stem) in enumerate(zip(pairs, stems)):
        sub = inside(sub)
        outs = [out / sub / output_name(f"{stem}_{label}", m, layer, head) for label in labels
                for m, layer, head in todo]
        outs += [out / sub / output_name(f"{stem}_timeline", m, layer, head) for m, layer, head in todo]
        outs += [path for m, layer, head in todo for path in animation_paths(out / sub, stem, m, layer, head, animate)]
        jobs.append(Job(i, path, outs + ([out / sub / f"{stem}_timeline.npz"] if plan.npz else [])))
    exp = SideExport(plan, jobs)
    exp.extra = {"timeline": {"run": str(run.folder), "order": run.order_note, "checkpoints": [
        {"label": c.label, "path": str(c.path), "number": c.number} for c in run.checkpoints],
        "box": list(box) if box is not None else None, "csv": None,
        "animation": ({"files": ["APNG" if s == ".png" else "GIF" for s in animation_suffixes()],
                       "frame_ms": ANIMATION_MS, "last_frame_ms": ANIMATION_MS * ANIMATION_HOLD} if animate else None),
        "images": []}}
    return until_interrupted(exp, lambda: _timeline(exp, run, plan, out, stems, box, on_progress, animate))


def _timeline(exp: SideExport, run: TimelineRun, plan: Plan, out: Path, stems: list[str],
              box: tuple[float, float, float, float] | None, on_progress: Callable[[Job], None],
              animate: bool) -> None:
    jobs, labels = exp.jobs, run.labels
    record = exp.extra["timeline"]
    force = replace(plan, overwrite=True)
    stacks: dict[int, list[list[MapStack]]] = {j.index: [] for j in jobs}
    figures: dict[int, list[Any]] = {j.index: [] for j in jobs}
    views: dict[int, Prepared] = {}
    failed: set[int] = set()
    for k in range(len(run)):
        model = run.model(k)               # a checkpoint with another layout stops the run (TimelineError)
        for job in jobs:
            if job.index in failed:
                continue
            try:
                p = prepare(job, model.spec, force)
                assert p is not None
                views.setdefault(job.index, p)
                r = model.run(p.x)
                stacks[job.index].append([map_stack(r.attentions, m, r.spec) for m in plan.maps])
                figures[job.index].append(result_metrics(r, box))
            except (VitvizError, OSError) as e:
                failed.add(job.index)
                _finish(exp, job, e, on_progress)
    rows: list[dict[str, Any]] = []
    per_image = record["images"]
    for job in jobs:
        if job.index in failed:
            continue
        try:
            _write_timeline(job, stems[job.index], views[job.index], stacks[job.index], labels, plan, model.spec,
                            animate)
            metrics = _metrics(run, figures[job.index])
            per_image.append({"path": str(job.path), **metrics.to_dict()})
            rows += [{"image": str(job.path), **row} for row in metrics.rows()]
            _finish(exp, job, None, on_progress)
        except (VitvizError, OSError, ValueError) as e:
            _finish(exp, job, e, on_progress)
    if rows:
        text = io.StringIO()
        writer = csv.DictWriter(text, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
        _atomic_text(out / TIMELINE_CSV, text.getvalue())
        record["csv"] = TIMELINE_CSV


def _atomic_text(path: Path, text: str) -> None:
    files._atomic_write(path, lambda handle: handle.write(text.encode("utf-8")), True)


def _metrics(run: TimelineRun, per: list[Any]) -> Any:
    from vitviz.core.analyses.timeline import TimelineMetrics

    shares = [p[2] for p in per]
    return TimelineMetrics(tuple(run.labels), tuple(c.number for c in run.checkpoints),
                           np.stack([p[0] for p in per]), np.stack([p[1] for p in per]),
                           None if any(s is None for s in shares) else np.stack(shares),
                           tuple(p[3] for p in per), run.order_note)


def _write_timeline(job: Job, stem: str, p: Prepared, per_ckpt: list[list[MapStack]], labels: list[str], plan: Plan,
                    spec: ModelSpec, animate: bool = True) -> None:
    folder = job.outputs[0].parent
    arrays: dict[str, np.ndarray] = {}
    for n, m in enumerate(plan.maps):
        stacks = [s[n] for s in per_ckpt]
        top = np.max([s.vmax for s in stacks], axis=0)           # one colour scale over the whole run
        stacks = [MapStack(s.maps, top, s.title + " (scale shared by the run)", s.vmin) for s in stacks]
        for layer in plan.layers:
            for head in (plan.heads if m.per_head else ["mean"]):
                pictures = []
                for label, stack in zip(labels, stacks):
                    rgb = draw_map(stack, layer, head, p.region, p.display.shape[:2], spec.patch_size, plan.render)
                    _write(job, folder / output_name(f"{stem}_{label}", m, layer, head), rgb, plan.overwrite)
                    pictures.append(rgb)
                _write(job, folder / output_name(f"{stem}_timeline", m, layer, head), contact_sheet(pictures, labels),
                       plan.overwrite)
                paths = animation_paths(folder, stem, m, layer, head, animate)
                if paths:
                    frames = animation_frames(pictures, labels)
                    for path in paths:
                        if plan.overwrite or not path.exists():
                            write_animation(path, frames, plan.overwrite)
                            job.written.append(path)
        arrays[m.label.replace("-", "_")] = np.stack([s.maps for s in stacks])   # (K, L, H + 2, gh, gw)
    if plan.npz:
        arrays["checkpoints"] = np.array(labels)
        _write(job, folder / f"{stem}_timeline.npz", arrays, plan.overwrite)


def fit_label(label: str, width: float, measure: Any) -> str:
    """`label` if `measure(label)` (its drawn width) fits in `width`, else its end after '..': what tells one
    checkpoint from the next is the step at the end ('checkpoint-1200' -> '..1200'), which cutting the end off lost
    on small pictures (every frame read 'checkpoin..')."""
    if measure(label) <= width:
        return label
    for start in range(1, len(label)):
        if measure(".." + label[start:]) <= width:
            return ".." + label[start:]
    return label[-1:]


def contact_sheet(pictures: list[np.ndarray], labels: list[str], columns: int = SHEET_COLUMNS) -> np.ndarray:
    """The pictures in rows of `columns`, in order, each with its label below it on white: (H', W', 3) uint8."""
    from PIL import Image, ImageDraw, ImageFont

    h = max(p.shape[0] for p in pictures)
    w = max(p.shape[1] for p in pictures)
    font = ImageFont.load_default()
    label_h, gap = LABEL_STRIP, 4
    cols = min(columns, len(pictures))
    rows = -(-len(pictures) // cols)
    sheet = Image.new("RGB", (cols * (w + gap) + gap, rows * (h + label_h + gap) + gap), "white")
    draw = ImageDraw.Draw(sheet)
    for i, (pic, label) in enumerate(zip(pictures, labels)):
        r, c = divmod(i, cols)
        x, y = gap + c * (w + gap), gap + r * (h + label_h + gap)
        sheet.paste(Image.fromarray(pic), (x, y))
        draw.text((x, y + h + 1), fit_label(label, w, lambda s: draw.textlength(s, font=font)), fill="black",
                  font=font)
    return np.asarray(sheet)


# ------------------------------------------------------------------------------------------------- animations
def animation_suffixes() -> list[str]:
    """The animation files this Pillow can write: '.png' (APNG) and '.gif', each where `Image.SAVE_ALL` has it."""
    from PIL import Image

    Image.init()
    return [suffix for suffix, fmt in ANIMATION_FORMATS.items() if fmt in Image.SAVE_ALL]


def can_animate() -> bool:
    """Whether Pillow can write any of the timeline animations here."""
    return bool(animation_suffixes())


def animation_paths(folder: Path, stem: str, m: MapKind, layer: Any, head: Any, animate: bool = True) -> list[Path]:
    """The animation files of one map of a timeline: `{stem}_animation_{map}_L.._H...png` (APNG) and `.gif`, those
    Pillow can write; none without `animate`."""
    if not animate:
        return []
    base = folder / output_name(f"{stem}_animation", m, layer, head)
    return [base.with_suffix(suffix) for suffix in animation_suffixes()]


def animation_frames(pictures: list[np.ndarray], labels: list[str]) -> list[np.ndarray]:
    """One frame per picture, in order: the picture (exactly its pixels, top-left) above a white strip with its
    label, every frame the size of the largest picture: (h + LABEL_STRIP, w, 3) uint8."""
    from PIL import Image, ImageDraw, ImageFont

    if not pictures or len(pictures) != len(labels):
        raise ValueError(f"expected one label per picture; found {len(pictures)} pictures, {len(labels)} labels")
    h = max(p.shape[0] for p in pictures)
    w = max(p.shape[1] for p in pictures)
    font = ImageFont.load_default()
    frames = []
    for pic, label in zip(pictures, labels):
        frame = Image.new("RGB", (w, h + LABEL_STRIP), "white")
        frame.paste(Image.fromarray(pic), (0, 0))
        draw = ImageDraw.Draw(frame)
        draw.text((2, h + 1), fit_label(label, w - 4, lambda s: draw.textlength(s, font=font)), fill="black",
                  font=font)
        frames.append(np.asarray(frame))
    return frames


def write_animation(path: Path, frames: list[np.ndarray], overwrite: bool = False, ms: int = ANIMATION_MS) -> Path:
    """Write frames as a looping animation, atomically; the format by suffix ('.png': APNG, lossless; '.gif': one
    palette of up to 256 colours made from all the frames, no dithering, so the colours do not flicker).

    Pillow folds a frame identical to the one before into it (a longer duration), so frames are counted as frames
    only when consecutive ones differ; the labels below the maps make them differ."""
    from PIL import Image

    fmt = ANIMATION_FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise ValueError(f"{path.name}: animations are written as {' or '.join(ANIMATION_FORMATS)}")
    images = [Image.fromarray(np.ascontiguousarray(f)) for f in frames]
    if fmt == "GIF":
        palette = Image.fromarray(np.concatenate([np.asarray(f) for f in frames], axis=0)).quantize(
            colors=256, method=Image.Quantize.FASTOCTREE)
        images = [im.quantize(palette=palette, dither=Image.Dither.NONE) for im in images]
    durations = [ms] * (len(images) - 1) + [ms * ANIMATION_HOLD]
    first, rest = images[0], images[1:]

    def write(handle: Any) -> None:
        first.save(handle, format=fmt, save_all=True, append_images=rest, duration=durations, loop=0,
                   **({"optimize": False} if fmt == "GIF" else {}))

    path.parent.mkdir(parents=True, exist_ok=True)
    return files._atomic_write(path, write, overwrite)
