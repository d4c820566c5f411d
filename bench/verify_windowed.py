"""Benchmark: what `vitviz verify` costs for a windowed model, against one captured forward of it.

Run from the repository root: `python bench/verify_windowed.py [--threads N]`.

timm `swin_tiny_patch4_window7_224` (224 px) and `samvit_base_patch16` (built at 512 px), random weights, saved as
timm hub folders; `verify(model)` builds timm's original from config.json with the file's weights and runs both at
the native size and native + 2 patches per side, every block compared as both compute it. Printed: verify's time,
one `forward_captured` at the native size (the second of two), and their ratio.
"""
from __future__ import annotations

import argparse
import tempfile
import time
import warnings
from pathlib import Path

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    warnings.simplefilter("ignore")
    import timm
    from timm.models import save_for_hf

    import vitviz

    for arch, kw in (("swin_tiny_patch4_window7_224", {}), ("samvit_base_patch16", {"img_size": 512})):
        folder = Path(tempfile.mkdtemp())
        save_for_hf(timm.create_model(arch, pretrained=False, **kw), str(folder), safe_serialization=True,
                    model_args=kw)
        model = vitviz.load(folder, device="cpu")
        x = torch.randn(1, 3, *model.spec.image_size)
        model.forward_captured(x)
        start = time.perf_counter()
        model.forward_captured(x)
        forward = time.perf_counter() - start
        start = time.perf_counter()
        check = vitviz.verify(model)
        took = time.perf_counter() - start
        print(f"{arch} at {model.spec.image_size}: verify {took:.2f} s ({check.summary()}; sizes {check.sizes}), "
              f"one captured forward {forward:.2f} s: {took / forward:.1f}x")


if __name__ == "__main__":
    main()
