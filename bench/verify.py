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
from vitviz.core.verify import verify


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's choice)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    warnings.simplefilter("ignore")  # timm's and the random model's notes; the verdict is checked above
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
