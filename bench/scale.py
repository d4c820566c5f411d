"""Benchmark: peak memory and time at scale, side by side: the original's forward, vitviz's capture, verify, export.

Run from the repository root: `python bench/scale.py [--large] [--giant] [--large-only] [--window] [--size 224]
[--images 2,6] [--only verify,...] [--format transformers]`.

Each model is timm's architecture with random weights, saved as a timm hub folder (config.json +
model.safetensors) that names it (`--format transformers`: transformers' instead, saved by `save_pretrained`:
`ViTForImageClassification` for ViT-B/16, `Dinov2Model` for the /14 ones, their config.json naming them; verify
then builds transformers' original): ViT-B/16 @224 (`vit_base_patch16_224`; `--size N`: built for N px instead) by
default; `--large` adds ViT-L/14 @518 (`vit_large_patch14_dinov2`, T = 1370: 24 x 16 maps of 1370 x 1370, 2.7 GiB
float32 per image; minutes on a loaded CPU), `--giant` ViT-g/14 @518 (`vit_giant_patch14_dinov2`, 7.2 GiB of
maps per image; `--giant-only` alone). A step the free memory cannot hold as it starts is skipped, and said
(`need`: the weights once per copy held at once, and the maps the step keeps). Every measurement runs in a fresh Python
process (this file, `--child`), so its memory is its own:
- original forward: `timm.create_model` from the folder, the file's weights, one forward of one image as timm runs
  it by default (fused attention: no maps kept; what a user pays without vitviz); for `--format transformers`
  `from_pretrained` of the folder's architecture, run as transformers runs it by default (SDPA);
- capture (full): `vitviz.load(folder)` and `forward_captured(x)`: every layer's (H, T, T) maps;
- capture (warm): the same after a forward that keeps only the CLS rows (the first forward's one-off costs --
  prepacked weights, oneDNN's caches, thread arenas -- paid before it): what a capture itself holds;
- capture (f16): the same stored as float16 (`half=True`);
- capture (rows): the same with `rows=[0]` (the CLS query row only);
- verify: `vitviz.load(folder)` and `verify(model)` (timm and transformers imported before the clock: a one-off of
  the process, not of a size; timm builds the original; both run in step at the bench's size
  and at that + 2 patches per side -- `--one-size`: the bench's size only -- every layer compared as it is
  computed);
- export N: `vitviz export --model FOLDER IMAGES --maps cls,rollout` of N JPEGs, verification included (a fresh
  verdict store: nothing remembered), once per count in `--images`; `export N nv`: the same with `--no-verify`;
  `--memory SIZE` is given to each export (its budget for the maps in flight).
Columns: 'peak' is the process's peak RSS (`ru_maxrss`: imports, load and step); 'x capture' that over capture
(full)'s; 'step adds' what the step itself added to the RSS it started from (VmHWM reset before the step); the
time is the step alone (not the imports, not the load), and 'x capture' that over capture (full)'s -- for verify
over capture's times the sizes compared (the target: at most 2x one captured forward per size).
With `--window` the window is measured instead (run it with QT_QPA_PLATFORM=offscreen): the seconds from asking it to
open the model until one image's first picture is drawn, the p50 / p95 of a layer or head change with every panel
redrawn, and with the attention-matrix view raised, of a layer / head change and a query click (target p95 16 ms).
Printed against the floor: the weights plus one image's L·H·T²·4 bytes of float32 attention; and for the captures
what the maps cost over the weights: the step's addition less the prepacked weight copies made on the first
forward (`vitviz.core.running.packed`), over L·H·T²·4 (the target: at most 1.2).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

MODELS = {"ViT-B/16 @224": ("vit_base_patch16_224", 224), "ViT-L/14 @518": ("vit_large_patch14_dinov2", 518),
          "ViT-g/14 @518": ("vit_giant_patch14_dinov2", 518)}
MEMORY = os.environ.get("VITVIZ_SCALE_MEMORY", "")   # `--memory`, as the children get it
ONE_SIZE = os.environ.get("VITVIZ_SCALE_ONE_SIZE") == "1"   # `--one-size`, as the children get it
METHODS = ("original forward", "capture (full)", "capture (warm)", "capture (f16)", "capture (rows)", "verify",
           "export")


# transformers' equivalents of MODELS' timm architectures (--format transformers): class and config arguments
HF_MODELS = {"vit_base_patch16_224": ("ViTForImageClassification", "ViTConfig", {"num_labels": 1000}),
             "vit_large_patch14_dinov2": ("Dinov2Model", "Dinov2Config", dict(
                 hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, patch_size=14)),
             "vit_giant_patch14_dinov2": ("Dinov2Model", "Dinov2Config", dict(
                 hidden_size=1536, num_hidden_layers=40, num_attention_heads=24, patch_size=14, use_swiglu_ffn=True))}


def make_folder(arch: str, size: int, folder: Path, hf: bool = False) -> dict[str, int]:
    """timm `arch` at `size` px with random weights saved as a hub folder (`hf`: transformers' equivalent saved by
    `save_pretrained`); its weights' bytes and attention shape."""
    import timm
    import torch

    torch.manual_seed(0)
    if hf:
        import transformers

        cls, config_cls, kwargs = HF_MODELS[arch]
        config = getattr(transformers, config_cls)(image_size=size, **kwargs)
        model = getattr(transformers, cls)(config).eval()
        model.save_pretrained(folder)
        tokens = (size // config.patch_size) ** 2 + 1
        return {"weights": sum(p.numel() * 4 for p in model.parameters()), "layers": config.num_hidden_layers,
                "heads": config.num_attention_heads, "tokens": tokens}
    model = timm.create_model(arch, pretrained=False, img_size=size).eval()
    timm.models._hub.save_for_hf(model, str(folder), safe_serialization=True, model_args={"img_size": size})
    tokens = model.patch_embed.num_patches + model.num_prefix_tokens
    return {"weights": sum(p.numel() * 4 for p in model.parameters()), "layers": len(model.blocks),
            "heads": model.blocks[0].attn.num_heads, "tokens": tokens}


def need(method: str, weights: int, maps: int, images: int) -> int:
    """Bytes a step is expected to need at its peak (the weights counted once per copy held at once: vitviz's
    model, the packed copies its first forward makes, the original's; maps by what the step keeps), so a step the
    free memory cannot hold is skipped and said instead of ending in the kernel's OOM killer."""
    if method == "window":                    # the full maps, and the verdict it asks for: the original besides
        return 3 * weights + maps
    if method == "original forward":
        return 2 * weights                    # timm builds the model, then the file's tensors are copied in
    if method in ("capture (full)", "capture (warm)"):
        return 2 * weights + maps
    if method == "capture (f16)":
        return 2 * weights + maps // 2
    if method == "capture (rows)":
        return 2 * weights
    if method == "verify" or (method.startswith("export") and not method.endswith(" nv")):
        return 3 * weights + 4 * maps // 24   # both models, the original's build, a few layers in flight
    return 2 * weights + 2 * maps // 24 * min(images, 2)   # export --no-verify: streamed query rows


def fits(label: str, method: str, weights: int, maps: int, images: int) -> bool:
    """Whether the free memory (now, as the step starts) holds `method`'s peak; said when it does not."""
    from vitviz.core.running.runtime import available_memory

    needed, free = need(method, weights, maps, images), available_memory()
    if free is not None and free < needed:
        print(f"  {method:<16} skipped: {free / 1024 ** 3:.1f} GiB free of the {needed / 1024 ** 3:.1f} GiB "
              f"it needs ({label})", flush=True)
        return False
    return True


def _status(field: str) -> int:
    """A field of /proc/self/status in bytes (VmRSS, VmHWM)."""
    with open("/proc/self/status", encoding="ascii") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field))


def child(method: str, folder: Path, size: int, images: Path) -> dict[str, float]:
    """One measurement in this (fresh) process: seconds of the step, the process's peak RSS, the RSS the step
    started from and its own peak (VmHWM reset to the RSS when it starts), in bytes."""
    import torch

    x = torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(0))
    extra: dict[str, float] = {}
    model = None
    if method == "window":
        return window(folder)
    if method == "original forward" and "model_type" in json.loads((folder / "config.json").read_text()):
        import transformers

        config = transformers.AutoConfig.from_pretrained(folder)
        net = getattr(transformers, config.architectures[0]).from_pretrained(folder).eval()

        def step() -> None:
            with torch.inference_mode():
                net(pixel_values=x)
    elif method == "original forward":
        import timm

        net = timm.create_model(f"local-dir:{folder}", pretrained=True).eval()

        def step() -> None:
            with torch.inference_mode():
                net(x)
    elif method.startswith("export"):
        from vitviz.cli import main as vitviz_main

        out = Path(tempfile.mkdtemp(prefix="scale-export-"))
        flags = (["--no-verify"] if method.endswith(" nv") else []) + (["--memory", MEMORY] if MEMORY else [])

        def step() -> None:
            code = vitviz_main(["export", "--model", str(folder), str(images), "--out", str(out), "--quiet",
                                "--maps", "cls,rollout", *flags])
            assert code == 0, f"vitviz export exited {code}"
    else:
        import vitviz
        from vitviz.core.analyses.verify import verify

        model = vitviz.load(folder)
        if method == "verify":
            # the original's library imported before the clock: a one-off of the process (seconds), not of a size
            import timm  # noqa: F401
            import transformers  # noqa: F401

            def step() -> None:
                # at the bench's size and 2 patches more per side (verify's default around the native size; a
                # transformers DINOv2's config states 518 px, but vitviz takes its processor's 224 as native)
                check = verify(model, sizes=[size] if ONE_SIZE else [size, size + 2 * model.spec.patch_size])
                assert check.verified, check.summary()
                extra["sizes"] = len(check.sizes)
        else:
            if method == "capture (warm)":   # the one-off costs of a first forward paid before: packing, oneDNN
                model.forward_captured(x, rows=[0])
            step = lambda: model.forward_captured(x, half=method == "capture (f16)",  # noqa: E731
                                                  rows=[0] if method == "capture (rows)" else None)
    open("/proc/self/clear_refs", "w").write("5")   # VmHWM := VmRSS: the step's own peak from here
    before, start = _status("VmRSS:"), time.perf_counter()
    step()
    seconds = time.perf_counter() - start
    if model is not None and method != "capture (warm)":   # the prepacked Linear weights its first forward made
        extra["packed"] = sum(m._packed[0].numel() * 4 for m in model.net.modules()
                              if getattr(m, "_packed", None) is not None)
    return {"seconds": seconds, "peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "before": before, "step_peak": _status("VmHWM:"), **extra}


def window(folder: Path, steps: int = 40) -> dict[str, float]:
    """The window (offscreen) with the model in `folder`: seconds from asking it to open the model until the
    first picture of one image is drawn (load and run in the worker) and until the verdict the window then asks
    for is in, then p50 / p95 of a layer or head change
    (every visible panel redrawn), and with the attention-matrix dock raised of a layer / head change and a query
    click (its (T, T) matrix redrawn); the process's peak RSS."""
    import numpy as np
    from PIL import Image
    from PySide6.QtCore import QSettings

    from vitviz.gui.app import ensure_app
    from vitviz.gui.window import MainWindow

    def wait(condition: Callable[[], bool]) -> None:
        while not condition():
            app.processEvents()
            time.sleep(0.005)

    def timed(changes: list[dict[str, Any]]) -> list[float]:
        out = []
        for change in changes:
            t0 = time.perf_counter()
            win.state.update(**change)
            app.processEvents()   # paints every widget the change touched, once
            out.append(time.perf_counter() - t0)
        return out

    image = Path(tempfile.mkdtemp()) / "window.png"
    Image.fromarray((np.random.default_rng(0).random((600, 800, 3)) * 255).astype(np.uint8)).save(image)
    app = ensure_app()
    win = MainWindow(QSettings(tempfile.mktemp(suffix=".ini"), QSettings.Format.IniFormat))
    win.persist_settings = False
    win.show()
    wait(lambda: "torch" in sys.modules and not win.session.busy and win._probed)
    start = time.perf_counter()
    win.load_model(str(folder))
    wait(lambda: win.session.model.spec is not None and win.is_idle())
    loaded = time.perf_counter() - start
    win.session.add_images([str(image)])
    wait(lambda: win.session.result(str(image)) is not None and win.panel.values is not None)
    app.processEvents()
    first = time.perf_counter() - start
    model = win.session.model   # the verdict the window asks for after the pictures
    wait(lambda: win.is_idle() and (model.verification is not None or bool(model.verify_failure)))
    verdict = time.perf_counter() - start
    spec = win.session.model.spec
    rng = np.random.default_rng(1)
    layer_head = [{"layer": int(rng.integers(spec.depth))} if i % 2 else {"head": int(rng.integers(spec.num_heads))}
                  for i in range(steps)]
    layers = timed(layer_head)
    win.dock("matrixDock").raise_()
    app.processEvents()
    matrix = timed(layer_head)
    clicks = timed([{"query": int(1 + (i * 37) % (spec.num_tokens - 1))} for i in range(steps)])
    win.close()

    def pct(values: list[float]) -> list[float]:
        return [float(v) for v in np.percentile(values, [50, 95]) * 1000]

    return {"seconds": first, "loaded": loaded, "verdict": verdict, "verified": win.session.verdict_line().text,
            "tokens": spec.num_tokens, "layer": pct(layers), "matrix": pct(matrix), "query": pct(clicks),
            "peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}


def measure(method: str, folder: Path, size: int, images: Path) -> dict[str, float]:
    env = {**os.environ, "VITVIZ_CACHE": tempfile.mkdtemp(prefix="scale-cache-")}   # no remembered verdict
    done = subprocess.run([sys.executable, __file__, "--child", method, str(folder), str(size), str(images)],
                          capture_output=True, text=True, check=False, env=env)
    if done.returncode:
        raise SystemExit(f"{method} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--large", action="store_true", help="also ViT-L/14 @518 (minutes, GiBs)")
    parser.add_argument("--size", type=int, default=224, help="the ViT-B/16's input size (default 224)")
    parser.add_argument("--images", default="2,6", help="image counts the exports write (default 2,6)")
    parser.add_argument("--only", default="", help="comma-separated methods to run (default all; "
                        "'export nv': the exports without verification alone)")
    parser.add_argument("--giant", action="store_true", help="also ViT-g/14 @518 (1.1 B parameters, 7.2 GiB of "
                        "maps per image), skipped and said when the free memory cannot hold it")
    parser.add_argument("--large-only", action="store_true", help="leave out ViT-B/16")
    parser.add_argument("--giant-only", action="store_true", help="ViT-g/14 @518 alone")
    parser.add_argument("--one-size", action="store_true", help="verify at the bench's size only (not also at "
                        "+2 patches per side): halves a giant's verify, said in its notes")
    parser.add_argument("--window", action="store_true", help="the window instead (offscreen): first picture, "
                        "layer change and the attention matrix's view, each model in a fresh process")
    parser.add_argument("--memory", default="", help="the exports' --memory budget (default: export's own)")
    parser.add_argument("--format", choices=("timm", "transformers"), default="timm",
                        help="the models' file format, and so the library verify builds the original with")
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    parser.add_argument("--make", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.make:   # in a child of its own, so the parent does not keep the built model's memory
        arch, size, folder, hf = args.make
        print(json.dumps(make_folder(arch, int(size), Path(folder), hf=hf == "1")))
        return
    if args.child:
        method, folder, size, images = args.child
        print(json.dumps(child(method, Path(folder), int(size), Path(images))))
        return
    os.environ["VITVIZ_SCALE_MEMORY"] = args.memory   # the exports' children read it
    os.environ["VITVIZ_SCALE_ONE_SIZE"] = "1" if args.one_size else ""
    sys.path.insert(0, str(Path(__file__).parent))
    from common import image_folder

    counts = [int(n) for n in args.images.split(",")]
    methods = ["window"] if args.window else []
    only = args.only.replace("timm forward", "original forward").split(",") if args.only else []
    for m in () if args.window else METHODS:
        if m == "export" and "export nv" in only:   # the exports without verification alone
            methods += [f"export {n} nv" for n in counts]
        elif not only or m in only:
            methods += [f"export {n}" for n in counts] + [f"export {n} nv" for n in counts] if m == "export" else [m]
    gib = 1024 ** 3
    with tempfile.TemporaryDirectory() as tmp:
        for label, (arch, size) in MODELS.items():
            if args.giant_only and label != "ViT-g/14 @518":
                continue
            if (label == "ViT-L/14 @518" and not (args.large or args.large_only)) or (
                    label == "ViT-g/14 @518" and not (args.giant or args.giant_only)) or (
                    label == "ViT-B/16 @224" and args.large_only):
                continue
            if label == "ViT-B/16 @224" and args.size != size:
                label, size = f"ViT-B/16 @{args.size}", args.size
            folder = Path(tmp) / arch
            made = subprocess.run([sys.executable, __file__, "--make", arch, str(size), str(folder),
                                   "1" if args.format == "transformers" else "0"],
                                  capture_output=True, text=True, check=True)
            facts = json.loads(made.stdout.strip().splitlines()[-1])
            maps = facts["layers"] * facts["heads"] * facts["tokens"] ** 2 * 4
            floor = facts["weights"] + maps
            print(f"{label} ({args.format}): {facts['layers']} layers x {facts['heads']} heads, "
                  f"T = {facts['tokens']}; weights {facts['weights'] / gib:.2f} GiB, one image's maps "
                  f"{maps / gib:.3f} GiB, floor {floor / gib:.2f} GiB")
            if args.window:
                if not fits(label, "window", facts["weights"], maps, 1):
                    continue
                m = measure("window", folder, size, Path(tmp))
                print(f"  window (offscreen), T = {int(m['tokens'])}: first picture {m['seconds']:.1f} s (the model "
                      f"loaded in {m['loaded']:.1f} s), verdict at {m['verdict']:.1f} s ({m['verified']}); then "
                      f"layer/head change p50 {m['layer'][0]:.1f} ms, p95 "
                      f"{m['layer'][1]:.1f} ms; matrix view raised: layer/head change p50 {m['matrix'][0]:.1f} ms, "
                      f"p95 {m['matrix'][1]:.1f} ms, query click p50 {m['query'][0]:.1f} ms, p95 "
                      f"{m['query'][1]:.1f} ms (target p95 16 ms); peak {m['peak'] / gib:.2f} GiB", flush=True)
                continue
            print(f"  {'':<16} {'peak':>9} {'x capture':>9} {'step adds':>10} {'seconds':>9} {'x capture':>9}  notes")
            measured = {}
            for method in methods:
                n = int(method.split()[1]) if method.startswith("export") else 0
                if not fits(label, method, facts["weights"], maps, n):
                    continue
                images = image_folder(Path(tmp) / f"images{n}", n) if n else Path(tmp)
                print(f"  ({method}…)", file=sys.stderr, flush=True)
                measured[method] = measure(method, folder, size, images)
            base = measured.get("capture (full)")
            for method, m in measured.items():
                adds = m["step_peak"] - m["before"]
                notes = ""
                if method.startswith("capture"):
                    kept = adds - m.get("packed", 0)
                    notes = (f"maps over the weights {kept / gib:.3f} GiB = {kept / maps:.2f} x L·H·T²·4 "
                             f"(packed copies {m.get('packed', 0) / gib:.2f} GiB)")
                per = m["seconds"] / base["seconds"] if base else float("nan")
                if method == "verify" and base:
                    per = m["seconds"] / (base["seconds"] * m["sizes"])
                    notes = f"{int(m['sizes'])} sizes; time: per size over one captured forward"
                ratio = m["peak"] / base["peak"] if base else float("nan")
                print(f"  {method:<16} {m['peak'] / gib:5.2f} GiB {ratio:8.2f}x {adds / gib:6.2f} GiB "
                      f"{m['seconds']:9.2f} {per:8.2f}x  {notes}", flush=True)

if __name__ == "__main__":
    main()
