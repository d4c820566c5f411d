"""`vitviz export`: attention heatmaps (and raw arrays) for a folder of images, from the command line.

    vitviz export --model vit_b_16.pth photos/ --out maps/ --maps cls,rollout --layers all --which-heads mean

Images are read, hashed and preprocessed by a pool of threads while the model runs on the previous batch; the
PNGs of a batch are rendered and written by another pool as soon as its forward pass is done. Every file is
written atomically, an image whose outputs all exist is skipped (unless --overwrite), and an image that cannot be
read is reported and skipped. Ctrl-C (or SIGTERM) stops after the files being written are complete.

`--engine ray` runs the same export on a Ray cluster (`pip install "vitviz[ray]"`; `vitviz.batch.ray_engine`):
the same files, byte for byte, under the same names, and one manifest.

Exit codes: 0 every image done or skipped, 1 some images failed, 2 bad arguments or an unloadable model,
130 interrupted.
"""
from __future__ import annotations

import argparse
import errno
import os
import re
import signal
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

from vitviz.batch.jobs import MANIFEST, InputError, Job, collect_inputs, is_uri, unique_stems
from vitviz.batch.plan import (Plan, auto_batch_size, check_classes, check_layers, check_maps, parse_maps, parse_picks, prompt_names,
                               resolve_picks, safe_stem, with_rollout)
from vitviz.batch.plan import check_budget, class_index, parse_ablation, streamable
from vitviz.cli.options import MODEL_HELP, add_override_arguments, argument_type, checked_argument
from vitviz.cli.progress import ProgressBar
from vitviz.core.drawing.colormaps import available_colormaps, colormap
from vitviz.core.files import remove_stale_temps, write_json_atomic
from vitviz.core.analyses.mapkinds import info, maps_help
from vitviz.core.analyses.maps import HeadSel, LayerSel, MapKind
from vitviz.core.drawing.render import RenderOptions
from vitviz.core.analyses.rollout import RolloutParams
from vitviz.core.protocol import WINDOWS, capabilities_of
from vitviz.core.reading.validate import MAX_DEPTH
from vitviz.errors import CheckpointError, DiskFullError, VitvizError


def add_export_parser(sub: Any) -> argparse.ArgumentParser:
    """Add the `export` subcommand to the `vitviz` subparsers."""
    p = sub.add_parser("export", allow_abbrev=False, help="write attention heatmaps for many images",
                       description=__doc__.split("\n\n")[0] + " Output names: {image}_{map}_L{layer}_H{head}.png "
                       "(rollout with non-default settings: {image}_rollout-max-d0.9_L{layer}_Hmean.png; maps "
                       "without heads: {image}_pca_L{layer}.png, {image}_norms_L{layer}.png; maps of the whole "
                       "model: {image}_relevance-c3_Lall.png, {image}_pool_Lall_H{head}.png; the window's exports "
                       "write the same names).")
    p.add_argument("--model", metavar="CHECKPOINT",
                   help=MODEL_HELP + "; required unless --code builds a model with its own weights")
    p.add_argument("inputs", nargs="+", metavar="INPUT",
                   help="image files and folders (searched recursively); with --engine ray also glob patterns "
                        "('photos/**/*.jpg'), text files listing images (.txt / .lst, one a line) and pyarrow.fs "
                        "URIs (s3://bucket/photos/)")
    p.add_argument("--out", required=True, type=_destination, metavar="DIR",
                   help="output folder (created if missing); with --engine ray also a pyarrow.fs URI "
                        "(s3://bucket/maps)")
    p.add_argument("--glob", metavar="PATTERN", help="only files in folders whose name matches, e.g. '*.jpg'")
    p.add_argument("--maps", default="cls", type=argument_type(parse_maps),
                   help=maps_help() + "; files are named {image}_{map}_L{layer}_H{head}.png, a map of the "
                        "whole model L'all', a text prompt's e.g. {image}_text-a_photo_of_a_cat_Lall.png "
                        "(default: cls)")
    p.add_argument("--layers", default="last", type=argument_type(lambda t: parse_picks(t, "layer", ("all", "last", "mean"), MAX_DEPTH)),
                   help="all, last, mean (over layers), indices and ranges, e.g. 0-3,11 or -1 (default: last)")
    p.add_argument("--which-heads", default="mean", metavar="HEADS",
                   type=argument_type(lambda t: parse_picks(t, "head", ("all", "mean", "max"))),
                   help="all, mean, max, indices and ranges, e.g. 0-2,mean (default: mean). "
                        "--heads is the model's head count")
    _add_render_arguments(p)
    g = p.add_argument_group("rollout (defaults are the window's)")
    g.add_argument("--fusion", choices=("mean", "max", "min"), default="mean",
                   help="how rollout fuses the heads of each layer (default mean)")
    g.add_argument("--discard-ratio", type=_discard, default=0.0, metavar="R",
                   help="fraction of each row's lowest patch attention rollout sets to 0, 0 <= R < 1 (vit-explain "
                        "uses 0.9; default 0)")
    g.add_argument("--residual", type=_unit, default=0.5, metavar="W",
                   help="identity weight in rollout: A' = W*I + (1-W)*A, 0..1 (default 0.5)")
    g.add_argument("--start-layer", type=_nonnegative, default=0, metavar="N",
                   help="the first layer rollout multiplies in; the maps of earlier layers are zero (default 0)")
    g = p.add_argument_group("run")
    g.add_argument("--npz", action="store_true", help="also write {image}.npz: attentions, logits, input, spec")
    g.add_argument("--half", action="store_true", help="keep attentions as float16: half the memory, each value "
                   "within 2.4e-4 of float32's (4.9e-4 relative)")
    g.add_argument("--device", default="auto", help="auto (CUDA when available), cpu, cuda, cuda:N")
    g.add_argument("--batch-size", type=_positive, default=None, help="images per forward pass (default: as many "
                   "as fit a memory budget, at most 8, said on stderr)")
    g.add_argument("--memory", type=_bytes, default=None, metavar="SIZE",
                   help="what the maps of the images in flight may take, e.g. 1GiB or 512M (binary units: 1G = "
                        "1GiB); it sets the batch size (refused when --batch-size does not fit it) and the peak "
                        "does not grow with the number of images (default 2GiB, or a quarter of the free memory "
                        "when that is less)")
    g.add_argument("--workers", type=_positive, default=min(4, os.cpu_count() or 1),
                   help="threads that read and preprocess images (default: up to 4)")
    g.add_argument("--overwrite", action="store_true", help="replace existing outputs instead of skipping them")
    g.add_argument("-q", "--quiet", action="store_true", help="no progress and no summary; errors only")
    g.add_argument("--no-verify", action="store_true",
                   help="do not compare the model with its original implementation (vitviz verify) for the "
                        "manifest's 'verification' (by default one extra forward pass of the original per size)")
    g = p.add_argument_group("compare two models, or a training run (vitviz.core.analyses.compare, vitviz.core.analyses.timeline)")
    g.add_argument("--compare", metavar="CHECKPOINT_B", type=_nonempty("a second model's checkpoint or name"),
                   help="a second model (any family or size): write A's, B's and A - B maps, "
                        "{image}_A_..., {image}_B_... (B's own layer and head matched with A's), {image}_diff_... "
                        "(on the diverging colormap rdbu, centred on 0); layers by relative depth, heads by "
                        "--match-heads, patches by place; the manifest records both models and the matching. "
                        "B is loaded with the same overrides as A")
    g.add_argument("--match-heads", choices=("match", "index"), default="match",
                   help="with --compare: heads matched by a Hungarian assignment on CLS-attention similarity "
                        "(default) or by index")
    g.add_argument("--timeline", metavar="RUN_DIR", type=_nonempty("a folder of checkpoints of one run"),
                   help="a folder of checkpoints of one run (epoch_*.pth, step-*.safetensors, epoch=*-step=*.ckpt, "
                        "checkpoint-*/): one map per checkpoint {image}_{checkpoint}_..., a contact sheet "
                        "{image}_timeline_..., timeline.csv and the figures in the manifest; replaces --model. "
                        "Also the maps played over time, {image}_animation_....png (APNG) and .gif, where Pillow "
                        "can write them")
    g.add_argument("--no-animation", action="store_true",
                   help="with --timeline: no animated APNG / GIF of the maps over time")
    g.add_argument("--box", metavar="L,T,R,B", type=argument_type(_box),
                   help="with --timeline: the share of CLS attention inside this box (fractions 0..1 of the image "
                        "the model saw) per checkpoint and layer")
    _add_intervention_arguments(p)
    _add_engine_arguments(p)
    add_override_arguments(p)
    return p


def _add_intervention_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("interventions (vitviz.core.running.interventions, vitviz.core.analyses.importance)")
    g.add_argument("--ablate", metavar="L.H,L.H[:MODE]", type=argument_type(parse_ablation),
                   help="ablate these heads (layer.head, from 0) in every pass of the export, MODE zero (default), "
                        "mean (each head's mean over the --reference images, else over the export's images: at "
                        "least 2) or resample (its output on the one --reference image); the manifest and every "
                        ".npz say what was done")
    g.add_argument("--reference", metavar="IMAGES",
                   help="the reference images of --ablate / --importance mean (a folder or files, comma-separated) "
                        "or resample (one image)")
    g.add_argument("--importance", nargs="?", const="zero", choices=("zero", "mean", "resample"), metavar="MODE",
                   help="also write importance.png, .csv and .npz: the drop of each image's class probability (or "
                        "the cosine change of the features of a model without a classifier) when each head is "
                        "ablated alone, MODE zero (default), mean or resample, averaged over the export's images; "
                        "one forward pass per head and image, batched")
    g.add_argument("--importance-class", metavar="CLASS",
                   help="with --importance: the class whose probability drops (an index or a label; default each "
                        "image's top class)")
    g.add_argument("--attribution", action="store_true",
                   help="with --importance: attribution patching's first-order estimate beside the exact grid, "
                        "and their correlation (one forward and backward pass per image)")


def _box(text: str) -> tuple[float, float, float, float]:
    from vitviz.core.analyses.timeline import box_mask

    parts = [float(v) for v in text.split(",")]
    if len(parts) != 4:
        raise ValueError(f"{text!r}: expected four fractions L,T,R,B, e.g. 0.2,0.2,0.6,0.7")
    box = (parts[0], parts[1], parts[2], parts[3])
    box_mask(box, (1, 1))   # checks the ranges
    return box


def _add_engine_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("engine (local by default; Ray: pip install \"vitviz[ray]\")")
    g.add_argument("--engine", choices=("local", "ray"), default="local",
                   help="local: this process (default); ray: Ray Data over a cluster, or a Ray started here -- "
                        "decoding in Ray tasks, the model in a pool of actors, the same files")
    g.add_argument("--address", metavar="ADDR",
                   help="the Ray cluster to join (HOST:6379, ray://HOST:10001 or auto; default $RAY_ADDRESS); "
                        "without either Ray starts a local instance")
    g.add_argument("--actors", type=_positive, metavar="N",
                   help="model actors, one model each (default: one per GPU of the cluster, else one per T + 1 "
                        "CPUs, T being torch's thread count here, which each actor runs with)")
    g.add_argument("--gpus-per-actor", type=_amount, metavar="G",
                   help="GPUs each actor reserves, e.g. 1 or 0.5 (default: 1 when the cluster has GPUs and "
                        "--device is not cpu, else 0)")
    g.add_argument("--cpus-per-actor", type=_amount, metavar="C", help="CPUs each actor reserves (default 1)")
    g.add_argument("--ship-model", choices=("path", "store"),
                   help="how the checkpoint reaches the actors: path (every node reads it there; default on a "
                        "local Ray) or store (Ray's object store, with the small files beside it; default on a "
                        "cluster joined by --address / $RAY_ADDRESS)")


def _add_render_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("pictures (defaults are the window's)")
    g.add_argument("--style", choices=("overlay", "heatmap"), default="overlay", help="map over the image, or bare")
    g.add_argument("--cmap", default="viridis", type=checked_argument(colormap),
                   help=f"{', '.join(available_colormaps())} (append _r to reverse)")
    g.add_argument("--opacity", type=_unit, default=0.6, help="heatmap opacity over the image, 0..1 (default 0.6)")
    g.add_argument("--scale", choices=("shared", "own"), default="shared",
                   help="colour range: 0..max over all layers and heads of the map (shared), or each map's own")
    g.add_argument("--colorbar", action="store_true", help="append a colour bar with its range")
    g.add_argument("--colorbar-label", action="store_true",
                   help="name the colour bar with the map and its scale, as the window's exports do")
    g.add_argument("--blocky", action="store_true", help="one flat colour per patch instead of smooth")
    g.add_argument("--size", choices=("input", "original"), default="original",
                   help="original (default, as the window exports): the region of the image the model saw, at the "
                        "original's resolution; input: the model's input image")



def _destination(text: str) -> Path | str:
    """--out: a local folder, or a pyarrow.fs URI kept as text (Path would fold its '//')."""
    return text if is_uri(text) else Path(text)


def _amount(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0.0 or value != value:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a number >= 0, e.g. 1 or 0.5")
    return value


def _nonempty(expected: str) -> Callable[[str], str]:
    """An argparse `type=` refusing an empty (or blank) value: `--compare ''` must not quietly run a plain export."""
    def check(text: str) -> str:
        if not text.strip():
            raise argparse.ArgumentTypeError(f"{text!r}: empty; expected {expected}")
        return text
    return check


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a positive integer")
    return int(text)


def _bytes(text: str) -> int:
    """'1GiB', '1G', '512MiB', '1.5G', '1073741824' -> bytes (K, M, G, T: powers of 1024, with or without 'iB'/'B')."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*", text, re.IGNORECASE)
    n = int(float(m.group(1)) * 1024 ** " KMGT".index(m.group(2).upper() or " ")) if m else 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a memory size such as 1GiB, 512M or 2000000000")
    return n


def _nonnegative(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r}: expected an integer >= 0")
    return int(text)


def _discard(text: str) -> float:
    value = _unit(text)
    if value >= 1.0:
        raise argparse.ArgumentTypeError(f"{text!r}: discarding every patch leaves nothing; expected 0 <= R < 1")
    return value


def _unit(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a number between 0 and 1")
    return value


def _announce_large_pictures(sources: list[Path], maps: int) -> None:
    """Say up front when pictures drawn at the originals' resolution will be huge (slow, and large files)."""
    from PIL import Image

    from vitviz.core.running.images import check_image_path
    from vitviz.core.drawing.render import LARGE_PICTURE_PIXELS

    sizes = []
    for source in sources:
        try:
            check_image_path(source)          # a FIFO or device is never opened
            with Image.open(source) as img:   # the header only; a bad image is reported by the run itself
                sizes.append((img.size[0] * img.size[1], source, img.size))
        except Exception:  # noqa: BLE001 - any unreadable file is reported later with its reason
            continue
    large = [s for s in sizes if s[0] > LARGE_PICTURE_PIXELS]
    if large:
        pixels, source, (w, h) = max(large)
        print(f"vitviz: {len(large)} image(s) are over {LARGE_PICTURE_PIXELS // 1_000_000} megapixels (largest "
              f"{source.name}, {w}x{h}); --size original draws every map ({maps} kind(s)) at that resolution, which "
              "is slow and writes large files; --size input draws them at the model's input size", file=sys.stderr)


def run_export_command(args: argparse.Namespace) -> int:
    """Run `vitviz export` and return its exit code (0, 1, 2 or 130); VitvizErrors mean exit 2."""
    from vitviz.batch.pipeline import Exporter

    start = time.perf_counter()
    if getattr(args, "timeline", None) is None:
        if getattr(args, "box", None) is not None:
            raise VitvizError("--box is for --timeline (the CLS-attention share inside it per checkpoint)")
        if getattr(args, "no_animation", False):
            raise VitvizError("--no-animation is for --timeline (its animated APNG / GIF)")
    intervened = getattr(args, "ablate", None) or getattr(args, "importance", None)
    _check_intervention_options(args)
    if getattr(args, "compare", None) is not None or getattr(args, "timeline", None) is not None:
        if intervened:
            raise VitvizError("--ablate and --importance run with a plain export, not with --compare or --timeline")
        return _export_side(args, start)
    ray = _ray_engine(args)
    out: Path | str = args.out
    if ray:   # listed as the export goes (a list may hold millions): `SourceStream`
        from vitviz.batch.ray_engine import Destination, SourceStream

        sources = SourceStream(args.inputs, out, args.glob)
        pairs: list[tuple[Any, Path]] = []
    else:
        pairs = collect_inputs(args.inputs, out, args.glob)  # type: ignore[arg-type]
    if ray and intervened:
        raise VitvizError("--ablate and --importance run on the local engine only (--engine local)")
    model = _load(args, device="cpu" if ray else None)  # Ray: the actors run it; here it is checked and verified
    ablation = _ablation(args, model, pairs) if intervened else []
    if WINDOWS in capabilities_of(model):  # Swin, SAM / ViTDet: maps of their own (vitviz.batch.windowed)
        return _export_windowed(args, model, pairs, start)
    maps, layers, heads = _resolve(args, model.spec)
    _check_passes(model, maps)
    # only what the maps read kept of each layer as it is computed, where the model hands its layers over
    stream = streamable(maps, args.npz) and callable(getattr(model, "forward_streamed", None))
    if args.batch_size is None:   # as many images per pass as fit the memory budget, and said
        from vitviz.core.running.runtime import available_memory

        args.batch_size, why = auto_batch_size(model.spec, maps, args.half, budget=args.memory,
                                               free=available_memory(), npz=args.npz, stream=stream)
        if not args.quiet:
            print(f"vitviz: {why}", file=sys.stderr)
    check_budget(model.spec, maps, args.half, args.batch_size, args.memory, args.npz, stream)
    verification = None if args.no_verify else _verify(model, args.quiet)
    if any(m.kind in ("rollout", "poolrollout") for m in maps) and heads != ["mean"] and not args.quiet:
        print(f"vitviz: rollout fuses the heads (--fusion {args.fusion}) at every layer, so rollout maps are written "
              "once per layer as H mean; --which-heads applies to the other maps", file=sys.stderr)
    dest = Destination(out) if ray else None
    if dest is not None:
        dest.make()
    else:
        _make_folder(out)  # type: ignore[arg-type]
    pool_heads = resolve_picks(args.which_heads, model.spec.pool_num_heads, "pooling head") \
        if any(m.kind == "pool" for m in maps) else None
    plan = Plan(maps=maps, layers=layers, heads=heads, npz=args.npz, half=args.half, overwrite=args.overwrite,
                batch_size=args.batch_size, workers=args.workers, pool_heads=pool_heads, stream=stream,
                render=RenderOptions(args.style, args.cmap, args.opacity, not args.blocky, args.scale,
                                     args.colorbar, args.size, args.colorbar_label))
    if args.size == "original" and not args.quiet and not ray:  # Ray: no header of every image read here
        _announce_large_pictures([source for source, _ in pairs], len(plan.maps))
    root: Path = dest.root if dest is not None and dest.remote else out  # type: ignore[assignment]
    if dest is not None:    # the Ray engine names its jobs and removes stale temporaries a chunk at a time
        bar = ProgressBar(0, enabled=not args.quiet)
        exporter: Any = _ray_exporter(args, model, plan, sources, root, dest, bar)
    else:
        jobs = plan.jobs(pairs, root, unique_stems(pairs, safe_stem))
        stale = remove_stale_temps([path for job in jobs for path in job.outputs] + [root / MANIFEST])
        if stale and not args.quiet:
            print(f"vitviz: removed {len(stale)} temporary file(s) a killed earlier run left in {out}",
                  file=sys.stderr)
        bar = ProgressBar(len(jobs), enabled=not args.quiet)
        exporter = Exporter(model, plan, jobs, on_progress=lambda job: _report(bar, job))
    interrupted = False
    stopped: VitvizError | None = None
    try:
        with _sigterm_as_interrupt(), (model.intervening(*ablation) if ablation else nullcontext(())) as done:
            exporter.interventions = list(done)   # the manifest's "interventions"
            exporter.run()
            if args.importance:
                exporter.importance = _importance(args, model, exporter.jobs, pairs, root, bar)
    except KeyboardInterrupt:
        interrupted = True
    except VitvizError as e:  # a full disk (said once, naming the output folder), a failed Ray job; exit 2
        if not (ray or isinstance(e, DiskFullError)):
            raise
        stopped = e
    finally:
        bar.close()
    seconds = time.perf_counter() - start
    summary = exporter.summary(out, seconds, interrupted or stopped is not None)
    try:
        _write_manifest(root, args, model, exporter, seconds, interrupted or stopped is not None, verification)
    except OSError as e:
        full = isinstance(stopped, DiskFullError) or e.errno in (errno.ENOSPC, errno.EDQUOT)
        raise DiskFullError(f"{out}: {'the disk is full; ' if full else ''}{MANIFEST} could not be written "
                            f"({e.strerror or e}). {summary}") from None
    if stopped is not None:
        print(summary, file=sys.stderr)
        raise stopped
    if not args.quiet or interrupted:
        print(exporter.summary(out, seconds, interrupted), file=sys.stderr if interrupted else sys.stdout)
    return 130 if interrupted else 1 if exporter.counts["failed"] else 0


def _export_windowed(args: argparse.Namespace, model: Any, pairs: list[tuple[Path, Path]], start: float) -> int:
    """`vitviz export` of a windowed model (Swin, SAM / ViTDet): its received and query maps per block and head,
    through the same pipeline (`vitviz.batch.windowed.WindowedExporter`), names and manifest as any export."""
    from vitviz.batch.windowed import WindowedExporter, windowed_plan

    if getattr(args, "memory", None) is not None:
        raise VitvizError("--memory sets the batch of a plain ViT's export; a windowed model (Swin, SAM) takes "
                          "--batch-size N (default 8)")
    args.batch_size = args.batch_size or 8

    if getattr(args, "engine", "local") != "local":
        raise VitvizError("--engine ray does not run windowed models (Swin, SAM) yet; export them with the local "
                          "engine")
    plan = windowed_plan(args.maps, args.layers, args.which_heads, model.spec, npz=args.npz, half=args.half,
                         overwrite=args.overwrite, batch_size=args.batch_size, workers=args.workers,
                         render=RenderOptions(args.style, args.cmap, args.opacity, not args.blocky, args.scale,
                                              args.colorbar, args.size, args.colorbar_label))
    verification = None if args.no_verify else _verify(model, args.quiet)   # unverified, with the reason
    out: Path = args.out
    _make_folder(out)
    if args.size == "original" and not args.quiet:
        _announce_large_pictures([source for source, _ in pairs], len(plan.maps))
    jobs = plan.jobs(pairs, out, unique_stems(pairs, safe_stem))
    remove_stale_temps([path for job in jobs for path in job.outputs] + [out / MANIFEST])
    bar = ProgressBar(len(jobs), enabled=not args.quiet)
    exporter = WindowedExporter(model, plan, jobs, on_progress=lambda job: _report(bar, job))
    interrupted = False
    try:
        with _sigterm_as_interrupt():
            exporter.run()
    except KeyboardInterrupt:
        interrupted = True
    finally:
        bar.close()
        seconds = time.perf_counter() - start
        _write_manifest(out, args, model, exporter, seconds, interrupted, verification)
    if not args.quiet or interrupted:
        print(exporter.summary(out, seconds, interrupted), file=sys.stderr if interrupted else sys.stdout)
    return 130 if interrupted else 1 if exporter.counts["failed"] else 0


def _export_side(args: argparse.Namespace, start: float) -> int:
    """`--compare B` or `--timeline RUN_DIR` (`vitviz.batch.compare`): the local engine, the export's names,
    pictures, writers and manifest, with the comparison or the run's figures added to it."""
    from vitviz.batch.compare import export_compare, export_timeline
    from vitviz.core.analyses.compare import check_comparable

    if getattr(args, "memory", None) is not None:
        raise VitvizError("--memory is for a plain export; --compare and --timeline take --batch-size N (default 8)")
    args.batch_size = args.batch_size or 8

    if args.compare and args.timeline:
        raise VitvizError("--compare and --timeline cannot be combined; give one")
    if args.engine != "local":
        raise VitvizError(f"--{'compare' if args.compare else 'timeline'} runs on the local engine only")
    pairs = collect_inputs(args.inputs, args.out, args.glob)
    stems = unique_stems(pairs, safe_stem)
    if args.timeline:
        from vitviz.cli.options import overrides_from
        from vitviz.core.analyses.timeline import open_run

        if args.model is not None:
            raise VitvizError("--timeline RUN_DIR gives the model (every checkpoint in it); leave out --model")
        run = open_run(args.timeline, device=args.device, **overrides_from(args))
        model = run.model(0)
        if not args.quiet:
            print(f"vitviz: {len(run)} checkpoints in {args.timeline}, {run.order_note}", file=sys.stderr)
    else:
        model = _load(args)
        model_b = _load(argparse.Namespace(**{**vars(args), "model": args.compare}))
        for side, m in (("A", model), ("B", model_b)):
            check_comparable(m, side)     # a windowed model: refused before any folder or file is made
    maps, layers, heads = _resolve(args, model.spec)
    bad = [m.label for m in maps if m.source != "attention" or m.token is not None]   # a token of one model only
    if bad:
        raise VitvizError(f"--maps {','.join(bad)}: --compare and --timeline draw the attention maps cls, mean, max "
                          "and rollout")
    plan = Plan(maps=maps, layers=layers, heads=heads, npz=args.npz, overwrite=args.overwrite,
                render=RenderOptions(args.style, args.cmap, args.opacity, not args.blocky, args.scale,
                                     args.colorbar, args.size, args.colorbar_label))
    _make_folder(args.out)
    bar = ProgressBar(len(pairs), enabled=not args.quiet)
    try:
        with _sigterm_as_interrupt():      # Ctrl-C / SIGTERM: what is written is recorded (`SideExport.stop`)
            if args.timeline:
                exporter: Any = export_timeline(run, plan, pairs, args.out, stems, args.box,
                                                on_progress=lambda job: _report(bar, job),
                                                animate=not args.no_animation)
            else:
                exporter = export_compare(model, model_b, plan, pairs, args.out, stems, args.match_heads,
                                          on_progress=lambda job: _report(bar, job))
    finally:
        bar.close()
    seconds = time.perf_counter() - start
    interrupted = exporter.interrupted
    _write_manifest(args.out, args, model, exporter, seconds, interrupted, None)
    if not args.quiet or interrupted:
        print(exporter.summary(args.out, seconds, interrupted), file=sys.stderr if interrupted else sys.stdout)
    return 130 if interrupted else 1 if exporter.counts["failed"] else 0


def _report(bar: ProgressBar, job: Job) -> None:
    """One image finished: a failure is named on stderr (also with --quiet), then the bar moves on."""
    if job.status == "failed":
        bar.message(f"vitviz: skipped {job.error}")
    bar.advance()


def _ray_engine(args: argparse.Namespace) -> bool:
    """Whether --engine ray runs the export (Ray Data importable: else the install hint, exit 2); the Ray options
    and URIs without it are refused."""
    given = [flag for flag, value in (("--address", args.address), ("--actors", args.actors),
                                      ("--gpus-per-actor", args.gpus_per_actor),
                                      ("--cpus-per-actor", args.cpus_per_actor), ("--ship-model", args.ship_model))
             if value is not None]
    uris = [str(t) for t in [*args.inputs, args.out] if isinstance(t, str) and is_uri(t)]
    if args.engine != "ray":
        if given:
            raise VitvizError(f"{', '.join(given)}: Ray options, for --engine ray only")
        if uris:
            raise VitvizError(f"{uris[0]}: a pyarrow.fs URI is read and written by --engine ray only "
                              '(pip install "vitviz[ray]"); the local engine takes local paths')
        return False
    from vitviz.batch.ray_engine import require_ray

    require_ray()
    return True


def _ray_exporter(args: argparse.Namespace, model: Any, plan: Plan, sources: Any, root: Path, dest: Any,
                  bar: ProgressBar) -> Any:
    """The Ray engine's exporter: the actors load the checkpoint the driver loaded, with the same overrides; the
    bar's total grows as the inputs are listed."""
    from vitviz.batch.ray_engine import RayExporter, RaySettings
    from vitviz.cli.models import resolve_cli_model
    from vitviz.cli.options import overrides_from, with_remembered

    checkpoint = None if args.model is None else resolve_cli_model(args.model, quiet=True)  # cached by now
    settings = RaySettings(args.address, args.actors, args.gpus_per_actor, args.cpus_per_actor, args.ship_model)
    # the driver's overrides, the window's remembered answers included (said once, by the driver's load)
    overrides = with_remembered(checkpoint, overrides_from(args), quiet=True)
    return RayExporter(checkpoint, overrides, args.device, model.spec, plan, sources, root, dest, settings,
                       on_progress=lambda job: _report(bar, job), on_message=bar.message,
                       on_listed=lambda n: setattr(bar, "total", n), quiet=args.quiet)


def _load(args: argparse.Namespace, device: str | None = None) -> Any:
    """Load the checkpoint (a named model: its cached file, else downloaded with progress on stderr unless
    --quiet) on `device` (default --device); any failure becomes a CheckpointError naming the file (exit 2). The
    manifest keeps --model as given (the name); the file loaded is the spec's `source`."""
    import vitviz
    from vitviz.cli.models import resolve_cli_model
    from vitviz.cli.options import overrides_from, with_remembered

    if args.model is None and getattr(args, "code", None) is None:
        raise VitvizError("export needs --model CHECKPOINT (or --code FILE.py:FACTORY)")
    checkpoint = None if args.model is None else resolve_cli_model(args.model, quiet=args.quiet)  # VitvizError: 2
    try:
        return vitviz.load(checkpoint, device=device or args.device,
                           **with_remembered(checkpoint, overrides_from(args), args.quiet))
    except VitvizError:
        raise
    except Exception as e:  # a loader bug or an exotic file must still exit 2 with the file named
        raise CheckpointError(f"{args.model}: could not be loaded ({type(e).__name__}: {e})") from e


def _verify(model: Any, quiet: bool) -> dict[str, Any]:
    """The model checked against its original implementation once per model (`vitviz.core.analyses.verify`), for the
    manifest: remembered per file content, settings and versions, so a second export of the same model costs
    nothing extra (the manifest's `verification.remembered` says so). The settings it confirmed are 'verified' in
    the manifest's spec. The verdict line goes to stderr unless --quiet. An original that cannot be run is recorded
    as unverified with the reason: the export does not depend on it."""
    import warnings

    from vitviz.core.analyses.verify import UNVERIFIED, Verification, apply_verification, remembered_verify

    remembered = False
    try:
        with warnings.catch_warnings():  # the libraries' own deprecation notes while the original is built
            warnings.simplefilter("ignore")
            check, remembered = remembered_verify(model)
    except VitvizError as e:
        check = Verification(UNVERIFIED, assumptions=tuple(n for n, _ in model.spec.assumptions),
                             reason=f"the original could not be run: {e}")
    apply_verification(model, check)
    if not quiet:
        print(f"vitviz: {check.summary()}" + (" (remembered from an earlier check of this file)" if remembered
                                               else ""), file=sys.stderr)
    return {**check.to_dict(), "remembered": remembered}


def _resolve(args: argparse.Namespace, spec: Any) -> tuple[list[MapKind], list[LayerSel], list[HeadSel]]:
    """The maps with the rollout settings, and the layers and heads, checked against the loaded model
    (layer/head/token ranges, CLS presence, the rollout's start layer)."""
    settings = RolloutParams(args.fusion, args.discard_ratio, args.start_layer, args.residual)
    maps = check_classes(with_rollout(args.maps, settings), spec)
    check_maps(maps, spec)
    layers = resolve_picks(args.layers, spec.depth, "layer")
    heads = resolve_picks(args.which_heads, spec.num_heads, "head")
    check_layers(maps, layers)
    return maps, layers, heads


def _check_intervention_options(args: argparse.Namespace) -> None:
    """Options that only go with others: --reference with a mean or resample ablation, --attribution and
    --importance-class with --importance."""
    ablate, importance = getattr(args, "ablate", None), getattr(args, "importance", None)
    if getattr(args, "attribution", False) and not importance:
        raise VitvizError("--attribution is for --importance (its first-order estimate beside the exact grid)")
    if getattr(args, "importance_class", None) is not None and not importance:
        raise VitvizError("--importance-class is for --importance (the class whose probability drops)")
    modes = {mode for mode in ((ablate[1] if ablate else None), importance) if mode}
    if getattr(args, "reference", None) and not modes & {"mean", "resample"}:
        raise VitvizError("--reference is for a mean or resample ablation (--ablate L.H:mean, --importance mean); "
                          "a zero ablation takes no reference images")


def _reference(args: argparse.Namespace, mode: str, pairs: list[tuple[Any, Path]]) -> Any:
    """The reference images of a mean or resample ablation: --reference (files or folders, comma-separated), else
    for 'mean' the export's own images; a resampling takes exactly one image."""
    if args.reference:
        found = [path for path, _ in collect_inputs([p for p in args.reference.split(",") if p], None, None)]
    elif mode == "mean":
        found = [path for path, _ in pairs]
    else:
        raise VitvizError("a resample ablation needs --reference IMAGE: the one image each ablated head's output is "
                          "taken from")
    if mode == "resample":
        if len(found) != 1:
            raise VitvizError(f"a resample ablation takes one --reference image; {args.reference} holds "
                              f"{len(found)}")
        return found[0]
    return found


def _ablation(args: argparse.Namespace, model: Any, pairs: list[tuple[Any, Path]]) -> list[Any]:
    """The model checked for interventions, and --ablate as an `Ablate` checked against it (layer and head ranges,
    the reference set's size); [] without --ablate."""
    from vitviz.core.running.interventions import Ablate, check, check_model

    check_model(model)   # a windowed model or one run by its own code: refused, saying why
    if not args.ablate:
        return []
    heads, mode = args.ablate
    item = Ablate(heads, mode, _reference(args, mode, pairs) if mode != "zero" else None)
    check([item], model.spec)
    return [item]


def _importance(args: argparse.Namespace, model: Any, jobs: list[Job], pairs: list[tuple[Any, Path]], root: Path,
                bar: ProgressBar) -> dict[str, Any]:
    """The importance scan over the export's images that were read (done, or skipped as done), written as
    importance.png / .csv / .npz into `root`; the manifest's entry. Existing files are kept (the scan skipped) unless
    --overwrite."""
    from vitviz.batch.importance import NAMES, record, write_importance
    from vitviz.core.analyses.importance import head_importance

    paths = [root / name for name in NAMES]
    if not args.overwrite and all(p.exists() for p in paths):
        bar.message(f"vitviz: {', '.join(NAMES)} exist in {root}; --overwrite to scan again")
        return {"files": NAMES, "skipped": True}
    target = class_index(_class_arg(args.importance_class), model.spec) if args.importance_class else None
    reference = _reference(args, args.importance, pairs) if args.importance != "zero" else None
    images = [job.path for job in jobs if job.status in ("done", "skipped")]
    if not images:
        bar.message("vitviz: no image was read, so no importance grid")
        return {}
    spec = model.spec
    total = len(images) * spec.depth * spec.num_heads
    if not args.quiet:
        bar.message(f"vitviz: importance of {spec.depth} x {spec.num_heads} heads over {len(images)} image(s): "
                    f"{total} ablated passes, batched")
    imp = head_importance(model, images, target, mode=args.importance, reference=reference,
                          batch_size=args.batch_size * 2, attribution=args.attribution)
    written = write_importance(imp, root, args.overwrite)
    if not args.quiet:
        bar.message(f"vitviz: {imp!r} -> {', '.join(p.name for p in written)}")
    return record(imp, written, root)


def _class_arg(text: str) -> int | str:
    return int(text) if text.strip().lstrip("-").isdigit() else text


def _check_passes(model: Any, maps: list[MapKind]) -> None:
    """Maps of a class or of the token features run vitviz's reference ViT with hooks of their own; a model run
    from its own code (--code) cannot give them."""
    from vitviz.core.protocol import is_reference

    asked = [m.label for m in maps if "reference" in info(m).needs]   # the table of map kinds says which
    if asked and not is_reference(model):
        raise VitvizError(f"--maps {','.join(asked)}: these maps need vitviz's reference ViT; this model runs from "
                          f"its own code ({type(getattr(model, 'net', model)).__name__}), whose attention "
                          "gradients and block outputs are not exposed")


def _make_folder(out: Path) -> None:
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InputError(f"{out}: cannot create the output folder ({e.strerror or e})") from e


@contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """Treat SIGTERM like Ctrl-C while exporting, so a killed run still finishes the files it is writing."""
    def handler(_signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt

    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _write_manifest(out: Path, args: argparse.Namespace, model: Any, exporter: Any, seconds: float,
                    interrupted: bool, verification: dict[str, Any] | None = None) -> None:
    """`manifest.json`: the parameters, the model's spec and its verification (None with --no-verify), and per
    input its SHA-256, status and outputs (relative to `out`, the folder the outputs are named under). The Ray
    engine's adds 'engine' (the cluster, the actors, their restarts), its device is the actors', and it goes to
    the destination (a URI's too)."""
    import vitviz

    params = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
              if k not in ("command", "func")}
    params["maps"] = [m.label for m in exporter.plan.maps]
    params["prompts"] = prompt_names(exporter.plan.maps)   # {label: prompt}: which files hold which text prompt
    params["layers_resolved"], params["heads_resolved"] = exporter.plan.layers, exporter.plan.heads
    data = {
        "vitviz": vitviz.__version__, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "argv": sys.argv[1:], "parameters": params,
        "model": {"checkpoint": str(args.model), "device": model.device, "spec": model.spec.to_dict(),
                  "verification": verification},
        "summary": {**exporter.counts, "seconds": round(seconds, 3), "interrupted": interrupted},
        "images": exporter.records() if hasattr(exporter, "records") else [job.record(out) for job in exporter.jobs],
    }
    for key in ("interventions", "importance"):   # --ablate: what was done; --importance: its files and top heads
        if getattr(exporter, key, None):
            data[key] = getattr(exporter, key)
    if hasattr(exporter, "record"):  # --compare / --timeline: the second model and the matching, or the run
        data.update(exporter.record())
    if hasattr(exporter, "engine_record"):  # the Ray engine
        data["engine"] = exporter.engine_record()
        data["model"]["device"] = exporter.devices or model.device
        exporter.dest.write_json(MANIFEST, data)
        return
    write_json_atomic(out / MANIFEST, data)
