"""Benchmark: peak memory and time at scale, side by side: the original's forward, vitviz's capture, verify, export.

Run from the repository root: `python bench/scale.py [--large] [--size 224] [--images 2] [--only verify,export]`.

Each model is timm's architecture with random weights, saved as a timm hub folder (config.json +
model.safetensors) that names it: ViT-B/16 @224 (`vit_base_patch16_224`; `--size N`: built for N px instead) by
default; `--large` adds ViT-L/14 @518 (`vit_large_patch14_dinov2`, T = 1370: 24 x 16 maps of 1370 x 1370, 2.7 GiB
float32 per image; minutes on a loaded CPU). Every measurement runs in a fresh Python process (this file, `--child`), so its peak RSS
(`ru_maxrss`) is its own:
- timm forward: `timm.create_model` from the folder, the file's weights, one forward of one image as timm runs it
  by default (fused attention: no maps kept; what a user pays without vitviz);
- capture (full): `vitviz.load(folder)` and `forward_captured(x)`: every layer's (H, T, T) maps;
- capture (rows): the same with `rows=[0]` (the CLS query row only);
- verify: `vitviz.load(folder)` and `verify(model)` (timm builds the original, both run at the native size and at
  native + 2 patches per side, every layer compared);
- export: `vitviz export --model FOLDER IMAGES --maps cls,rollout` of `--images` JPEGs (verification included).
Time is the measured step alone (not the imports, not the load), in seconds; peak RSS is the whole process's, and
'before step' its peak once imported and loaded (what the step itself added is the difference).
Printed against the floor: the weights plus one image's L·H·T²·4 bytes of float32 attention.
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODELS = {"ViT-B/16 @224": ("vit_base_patch16_224", 224), "ViT-L/14 @518": ("vit_large_patch14_dinov2", 518)}
METHODS = ("timm forward", "capture (full)", "capture (rows)", "verify", "export")


def make_folder(arch: str, size: int, folder: Path) -> dict[str, int]:
    """timm `arch` at `size` px with random weights saved as a hub folder; its weights' bytes and attention shape."""
    import timm
    import torch

    torch.manual_seed(0)
    model = timm.create_model(arch, pretrained=False, img_size=size).eval()
    timm.models._hub.save_for_hf(model, str(folder), safe_serialization=True, model_args={"img_size": size})
    tokens = model.patch_embed.num_patches + model.num_prefix_tokens
    return {"weights": sum(p.numel() * 4 for p in model.parameters()), "layers": len(model.blocks),
            "heads": model.blocks[0].attn.num_heads, "tokens": tokens}


def child(method: str, folder: Path, size: int, images: Path) -> dict[str, float]:
    """One measurement in this (fresh) process: seconds of the step, and the process's peak RSS in bytes."""
    import torch

    x = torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(0))
    if method == "timm forward":
        import timm

        net = timm.create_model(f"local-dir:{folder}", pretrained=True).eval()
        before, start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, time.perf_counter()
        with torch.inference_mode():
            net(x)
    elif method == "export":
        from vitviz.cli import main as vitviz_main

        out = Path(tempfile.mkdtemp(prefix="scale-export-"))
        before, start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, time.perf_counter()
        code = vitviz_main(["export", "--model", str(folder), str(images), "--out", str(out), "--quiet",
                            "--maps", "cls,rollout"])
        assert code == 0, f"vitviz export exited {code}"
    else:
        import vitviz
        from vitviz.core.analyses.verify import verify

        model = vitviz.load(folder)
        before, start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, time.perf_counter()
        if method == "verify":
            check = verify(model)
            assert check.verified, check.summary()
        else:
            model.forward_captured(x, rows=[0] if method == "capture (rows)" else None)
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"seconds": seconds, "before": before * 1024, "peak": peak * 1024}


def measure(method: str, folder: Path, size: int, images: Path) -> dict[str, float]:
    done = subprocess.run([sys.executable, __file__, "--child", method, str(folder), str(size), str(images)],
                          capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"{method} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--large", action="store_true", help="also ViT-L/14 @518 (minutes, GiBs)")
    parser.add_argument("--size", type=int, default=224, help="the ViT-B/16's input size (default 224)")
    parser.add_argument("--images", type=int, default=2, help="images the export writes")
    parser.add_argument("--only", default="", help="comma-separated methods to run (default all)")
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        method, folder, size, images = args.child
        print(json.dumps(child(method, Path(folder), int(size), Path(images))))
        return
    sys.path.insert(0, str(Path(__file__).parent))
    from common import image_folder

    methods = [m for m in METHODS if not args.only or m in args.only.split(",")]
    gib = 1024 ** 3
    with tempfile.TemporaryDirectory() as tmp:
        images = image_folder(Path(tmp) / "images", args.images)
        for label, (arch, size) in MODELS.items():
            if label != "ViT-B/16 @224" and not args.large:
                continue
            if label == "ViT-B/16 @224" and args.size != size:
                label, size = f"ViT-B/16 @{args.size}", args.size
            folder = Path(tmp) / arch
            facts = make_folder(arch, size, folder)
            maps = facts["layers"] * facts["heads"] * facts["tokens"] ** 2 * 4
            floor = facts["weights"] + maps
            print(f"{label}: {facts['layers']} layers x {facts['heads']} heads, T = {facts['tokens']}; weights "
                  f"{facts['weights'] / gib:.2f} GiB, one image's maps {maps / gib:.2f} GiB, floor "
                  f"{floor / gib:.2f} GiB")
            print(f"  {'':<16} {'peak RSS':>10} {'/ floor':>8} {'before step':>12} {'seconds':>9}")
            for method in methods:
                m = measure(method, folder, size, images)
                print(f"  {method:<16} {m['peak'] / gib:8.2f} GiB {m['peak'] / floor:7.2f}x "
                      f"{m['before'] / gib:8.2f} GiB {m['seconds']:9.2f}",
                      flush=True)


if __name__ == "__main__":
    main()
