"""Shared helpers for the benchmarks: interleaved timing, random-weight checkpoints, a folder of test images.

Nothing here downloads: every model has random weights and every image is generated.
"""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # run as a script from anywhere


# Python source for a measuring subprocess: `rss(field)` reads /proc/self/status, VmHWM is reset to the current RSS,
# and `before` holds that RSS; the peak of what follows is `rss("VmHWM:") - before`.
PEAK_RSS_PRELUDE = r"""
def rss(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) * 1024
    return 0

open("/proc/self/clear_refs", "w").write("5")   # reset VmHWM to the current RSS
before = rss("VmRSS:")
"""


def interleaved(methods: dict[str, Callable[[], object]], repeats: int, warmup: int = 1) -> dict[str, float]:
    """Median seconds per method, running them in turn (order rotated every round) so drift hits all alike."""
    names = list(methods)
    for _ in range(warmup):
        for name in names:
            methods[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(repeats):
        order = names[r % len(names):] + names[: r % len(names)]
        for name in order:
            start = time.perf_counter()
            methods[name]()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(ts) for name, ts in times.items()}


def torchvision_vit_b16(folder: Path, seed: int = 0) -> tuple[object, Path]:
    """A torchvision `vit_b_16` with random weights (eval) and its state dict saved as `vit_b_16.pth`."""
    import torch
    import torchvision

    torch.manual_seed(seed)
    model = torchvision.models.vit_b_16().eval()
    path = folder / "vit_b_16.pth"
    torch.save(model.state_dict(), path)
    return model, path


def timm_vit_b16(folder: Path, seed: int = 0) -> tuple[object, Path]:
    """timm `vit_base_patch16_224` with random weights, fused attention off, saved as a timm state dict."""
    import timm
    import torch

    torch.manual_seed(seed)
    model = timm.create_model("vit_base_patch16_224", pretrained=False).eval()
    for block in model.blocks:
        block.attn.fused_attn = False
    path = folder / "vit_base_patch16_224.pth"
    torch.save(model.state_dict(), path)
    return model, path


def image_folder(folder: Path, count: int, seed: int = 0) -> Path:
    """`count` JPEGs of ImageNet-like sizes (375..500 x 333..500), smooth blobs plus noise, in `folder`."""
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for i in range(count):
        h, w = int(rng.integers(333, 501)), int(rng.integers(375, 501))
        yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
        base = np.stack([np.sin(xx / rng.uniform(10, 60) + c) * np.cos(yy / rng.uniform(10, 60)) for c in range(3)], -1)
        img = (base * 90 + 128 + rng.normal(0, 12, (h, w, 3))).clip(0, 255).astype(np.uint8)
        Image.fromarray(img).save(folder / f"img{i:04d}.jpg", quality=90)
    return folder


def ratio_line(label: str, num: float, den: float, target: str = "") -> str:
    """'label: 123.4 ms / 112.0 ms = 1.10x  (target ...)'."""
    return f"{label:<46} {num * 1e3:9.1f} ms / {den * 1e3:9.1f} ms = {num / den:5.2f}x  {target}"


# Python source for a measuring subprocess: vitviz.load(argv[1]) and the peak resident set it added (MB).
LOAD_PEAK_SCRIPT = r"""
import sys, warnings
warnings.simplefilter("ignore")
import torch, transformers, vitviz

""" + PEAK_RSS_PRELUDE + r"""model = vitviz.load(sys.argv[1], device="cpu")
print(model.spec.num_params, (rss("VmHWM:") - before) / 2**20)
"""


def report_load_peak(folder: Path, tower: str, lm_mb: int) -> None:
    """Open `folder` with `vitviz.load` in a fresh process and print its peak resident set over the baseline (torch,
    transformers and vitviz imported) beside the tower's size in float32 (`tower` describes it)."""
    import subprocess

    out = subprocess.run([sys.executable, "-c", LOAD_PEAK_SCRIPT, str(folder)], capture_output=True, text=True,
                         cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, check=True)
    params, peak = out.stdout.strip().splitlines()[-1].split()
    fp32 = int(params) * 4 / 2**20
    print(f"{tower}: {int(params):,} parameters = {fp32:.0f} MB in float32; fake language model {lm_mb} MB beside it")
    print(f"vitviz.load(folder) peak RSS over the baseline: {float(peak):.0f} MB = {float(peak) / fp32:.2f}x "
          "the tower in float32")
