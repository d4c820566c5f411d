"""Benchmark: what `vitviz verify` costs, side by side with a plain load and one forward pass.

Run from the repository root: `python bench/verify.py [--repeats N] [--device cpu]`.

A ViT-S/16 (timm `vit_small_patch16_224`, random weights) saved as a timm hub folder (config.json +
model.safetensors), medians of repeats interleaving four methods:
- `vitviz.load(folder)`: the plain load;
- `vitviz.load(folder)` then `verify(model)`: the load with the check the export manifest (and the window) adds;
- `verify(model)` of a loaded model: timm builds the original from config.json, the file's weights go into it, and
  both run at 224 px and 256 px (native + 2 patches per side), every layer's attention compared;
- `model.forward_captured(x)` at 224 px: one forward pass with every layer's attention captured.
Printed: (load + verify) / load, and verify / one forward.

`--identify S,B,L` measures instead what a file nothing names costs (issue 30): a bare `torch.save(state_dict)` of
timm `vit_small_patch16_224` / `vit_base_patch16_224` / `vit_large_patch16_224` (and `clip`: vit_base_patch16_clip_224,
whose QuickGELU twin fits too; `tv`: torchvision vit_b_16), side by side with the same weights saved as a timm hub
folder that names the model: the search for fitting architectures once with an empty shapes cache (what a first
use pays) and with it filled, identify + verify of the bare file, verify of the named folder, and one captured
forward at the native size. Printed per file: the number of fitting architectures and of distinct kinds compared,
(identify + verify) - (named verify) in captured forwards, and the first search's time with the signatures vitviz
ships and with none (a library version it ships none for).
"""
from __future__ import annotations

import argparse
import tempfile
import warnings
from pathlib import Path
from typing import Callable

import torch

from common import interleaved, ratio_line  # noqa: I001

import vitviz
from vitviz.core.analyses.verify import verify


def vit_s16_folder(folder: Path, seed: int = 0) -> Path:
    """timm `vit_small_patch16_224` with random weights, saved as a hub folder (config.json + model.safetensors)."""
    import timm

    torch.manual_seed(seed)
    model = timm.create_model("vit_small_patch16_224", pretrained=False).eval()
    timm.models._hub.save_for_hf(model, str(folder), safe_serialization=True)
    return folder


def methods(folder: Path, device: str) -> dict[str, Callable[[], object]]:
    model = vitviz.load(folder, device=device)
    check = verify(model)
    assert check.verdict == "verified", check.summary()
    x = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(0))

    def load_and_verify() -> None:
        verify(vitviz.load(folder, device=device))

    return {"load": lambda: vitviz.load(folder, device=device), "load + verify": load_and_verify,
            "verify": lambda: verify(model), "one forward": lambda: model.forward_captured(x)}


IDENTIFY_ARCHS = {"S": "vit_small_patch16_224", "B": "vit_base_patch16_224", "L": "vit_large_patch16_224",
                  "clip": "vit_base_patch16_clip_224", "tv": "torchvision:vit_b_16"}


def identify_rows(which: list[str], repeats: int, device: str) -> None:
    """The identify + verify cost of bare files against the named route (see the module's docstring)."""
    import os
    import time

    import timm
    import torchvision

    from vitviz.core.reading import identify
    from vitviz.core.files import CACHE_ENV

    for key in which:
        arch = IDENTIFY_ARCHS[key]
        with tempfile.TemporaryDirectory() as tmp:
            torch.manual_seed(0)
            if arch.startswith("torchvision:"):
                net = torchvision.models.get_model(arch.split(":")[1], weights=None).eval()
                named = Path(tmp) / "vit_b_16-c867db91.pth"   # torchvision's own file name names it
                torch.save(net.state_dict(), named)
            else:
                net = timm.create_model(arch, pretrained=False).eval()
                named = Path(tmp) / arch
                timm.models._hub.save_for_hf(net, str(named), safe_serialization=True)
            bare = Path(tmp) / "mine.pth"
            torch.save(net.state_dict(), bare)
            del net
            os.environ[CACHE_ENV] = str(Path(tmp) / "cache")
            sd = torch.load(bare, weights_only=True)
            start = time.perf_counter()
            found = identify.candidates(sd)
            shipped = time.perf_counter() - start
            os.environ[CACHE_ENV] = str(Path(tmp) / "cache-cold")
            shipped_path = identify.bundled
            identify.bundled = lambda library, version: Path(tmp) / "none.json"   # a version vitviz ships none for
            start = time.perf_counter()
            identify.candidates(sd)
            cold = time.perf_counter() - start
            identify.bundled = shipped_path
            del sd
            bare_model = vitviz.load(bare, device=device)
            named_model = vitviz.load(named, device=device)
            check = verify(bare_model)
            named_check = verify(named_model)
            x = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(0))
            times = interleaved({"identify + verify (bare file)": lambda m=bare_model: verify(m),
                                 "verify (named folder)": lambda m=named_model: verify(m),
                                 "one forward (224 px, captured)": lambda m=bare_model: m.forward_captured(x)},
                                repeats, warmup=0)
            print(f"{arch}: {len(found)} fitting ({', '.join(identify.names(found))}); {check.summary()}; named: "
                  f"{named_check.summary()}")
            for name, t in times.items():
                print(f"  {name:<34} {t:8.2f} s")
            extra = (times["identify + verify (bare file)"] - times["verify (named folder)"]) / \
                times["one forward (224 px, captured)"]
            print(f"  first search, shipped signatures   {shipped:8.2f} s")
            print(f"  first search, nothing shipped      {cold:8.2f} s   (another library "
                  "version: every architecture built on the meta device once)")
            print(f"  identify's extra cost: {extra:.1f} captured forwards ({len(check.matches)} matching of "
                  f"{len(found)} fitting)")
            del bare_model, named_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--identify", default="", help="S,B,L,clip,tv: measure bare files (see above) instead")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's choice)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    warnings.simplefilter("ignore")  # timm's and the random model's notes; the verdict is checked above
    if args.identify:
        identify_rows([k for k in args.identify.split(",") if k], args.repeats, args.device)
        return
    with tempfile.TemporaryDirectory() as tmp:
        folder = vit_s16_folder(Path(tmp) / "vit_small_patch16_224")
        found = methods(folder, args.device)
        check = verify(vitviz.load(folder, device=args.device))
        times = interleaved(found, args.repeats)
    print(f"ViT-S/16 timm hub folder, {args.device}, torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"median of {args.repeats} interleaved repeats; {check.summary()} at "
          f"{', '.join(f'{h}x{w}' for h, w in check.sizes)}")
    for name, t in times.items():
        print(f"  {name:<28} {t * 1e3:8.1f} ms")
    print(ratio_line("(load + verify) / load", times["load + verify"], times["load"]))
    print(ratio_line("verify / one forward (224 px, captured)", times["verify"], times["one forward"],
                     "(verify: build the original, 2 sizes x 2 models)"))


if __name__ == "__main__":
    main()
