"""Benchmark: memory of `vitviz export` over many images, and attention storage per image.

Run from the repository root: `python bench/memory.py [--images 200] [--batch-size 8] [--run-large]`.

1. Runs `python -m vitviz export` (ViT-B/16 @224, random weights, default maps) on a folder of JPEGs in a
   subprocess and samples its resident set (/proc/PID/status VmRSS) every 20 ms next to the number of PNGs
   written. Prints the RSS after the first batch, at each quarter of the run, the peak (VmHWM), and the slope of
   RSS against images done after the second batch (a leak shows as KB per image; flat is ~0).
2. Attention storage per image, L * H * T^2 * bytes, for ViT-B/16 @224 and ViT-L/16 @384 in float32 and float16;
   the B/16 figures are also measured from `model.run` (`result.attentions.nbytes`); L/16 is measured only with
   --run-large (about 1.2 GB of weights and a minute on a small CPU).
3. Peak host memory of one capture (`--capture-peak`): ViT-B/16 @384 (T = 577, 192 MiB of maps), each method in
   its own process, VmHWM reset (/proc/self/clear_refs) after a small warm-up run and read after the real one, minus
   the RSS before it. `sink`: vitviz's `forward_captured` (each layer copied into one preallocated array as
   it is computed); `stack`: the common way -- hooks append every layer to a list, then `torch.stack`;
   `rows`: only the CLS row kept, attention only (what `vitviz export --maps cls` does).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from common import ROOT, image_folder, torchvision_vit_b16  # noqa: I001

MB = 1024 * 1024


def _status(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of a process in bytes (empty once it has exited)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) * 1024
    return out


def sample_export(ckpt: Path, images: Path, out: Path, batch_size: int) -> tuple[list[tuple[int, int]], int, float]:
    """Run the export, sampling (pngs written, rss); returns the samples, the peak RSS and the wall time."""
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    cmd = [sys.executable, "-m", "vitviz", "export", "--model", str(ckpt), str(images), "--out", str(out),
           "--quiet", "--device", "cpu", "--batch-size", str(batch_size)]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env)
    samples: list[tuple[int, int]] = []
    peak = 0
    while proc.poll() is None:
        st = _status(proc.pid)
        if st:
            peak = max(peak, st.get("VmHWM", 0))
            files = sum(1 for e in os.scandir(out) if e.name.endswith(".png")) if out.exists() else 0
            samples.append((files, st["VmRSS"]))
        time.sleep(0.02)
    assert proc.returncode == 0, f"vitviz export exited {proc.returncode}"
    return samples, peak, time.perf_counter() - start


def report_rss(samples: list[tuple[int, int]], peak: int, n: int, batch_size: int, seconds: float) -> None:
    files = np.array([s[0] for s in samples])
    rss = np.array([s[1] for s in samples], dtype=np.float64)
    first = rss[files >= batch_size][0] if (files >= batch_size).any() else float("nan")
    print(f"vitviz export, ViT-B/16 @224, {n} images, batch {batch_size}: {seconds:.1f} s, {len(samples)} samples")
    print(f"  RSS after the first batch ({batch_size} images): {first / MB:8.1f} MiB")
    for q in (0.25, 0.5, 0.75, 1.0):
        sel = rss[files >= int(q * n)]
        if sel.size:
            print(f"  RSS at {int(q * 100):3d}% ({int(q * n):4d} images):     {sel[0] / MB:8.1f} MiB")
    print(f"  peak RSS (VmHWM):                  {peak / MB:8.1f} MiB")
    late = files >= 2 * batch_size
    if late.sum() > 10 and np.ptp(files[late]) > 0:
        slope = np.polyfit(files[late], rss[late], 1)[0]
        print(f"  RSS slope after the second batch:  {slope / 1024:+8.1f} KB per image "
              f"(x {n} images = {slope * n / MB:+.1f} MiB)")


def storage_table(run_b16: Path | None, run_large: bool) -> None:
    print("attention storage per image (L * H * T^2 * bytes):")
    configs = [("ViT-B/16 @224", 12, 12, 197), ("ViT-L/16 @384", 24, 16, 577)]
    measured = _measure(run_b16, run_large)
    for name, layers, heads, tokens in configs:
        for dtype, size in (("float32", 4), ("float16", 2)):
            nbytes = layers * heads * tokens * tokens * size
            got = measured.get((name, dtype))
            extra = f"   measured {got / MB:8.1f} MiB" if got else "   (computed)"
            print(f"  {name}  L={layers:2d} H={heads:2d} T={tokens}  {dtype}: {nbytes / MB:8.1f} MiB{extra}")


def _measure(b16: Path | None, run_large: bool) -> dict[tuple[str, str], int]:
    import torch

    import vitviz

    out: dict[tuple[str, str], int] = {}
    if b16 is not None:
        model = vitviz.load(b16, device="cpu")
        x = torch.randn(1, 3, 224, 224)
        out[("ViT-B/16 @224", "float32")] = model.run(x).attentions.nbytes
        out[("ViT-B/16 @224", "float16")] = model.run(x, half=True).attentions.nbytes
    if run_large:
        import torchvision

        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "vit_l_16_384.pth"
            torch.save(torchvision.models.vit_l_16(image_size=384).state_dict(), path)
            model = vitviz.load(path, device="cpu", heads=16, image_size=384)
            x = torch.randn(1, 3, 384, 384)
            out[("ViT-L/16 @384", "float16")] = model.run(x, half=True).attentions.nbytes
            out[("ViT-L/16 @384", "float32")] = model.run(x).attentions.nbytes
    return out


def capture_peak_child(method: str, size: int) -> None:
    """In a fresh process: the extra peak RSS (bytes) of one capture by `method`, printed as a number."""
    import ctypes
    import gc

    import torch
    import torchvision

    import vitviz
    from vitviz.core.running.capture import capture_attention

    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "vit_b_16_384.pth"
        torch.save(torchvision.models.vit_b_16(image_size=size).state_dict(), path)
        model = vitviz.load(path, device="cpu", image_size=size)

    def stack(x: torch.Tensor) -> np.ndarray:
        keep: list[torch.Tensor] = []
        with torch.inference_mode(), capture_attention(model.net, keep):
            model.net(x)
        return torch.stack(keep, dim=1).numpy()

    def sink(x: torch.Tensor) -> np.ndarray:
        return model.forward_captured(x)[0]

    def rows(x: torch.Tensor) -> np.ndarray:  # what `vitviz export --maps cls` keeps
        return model.forward_captured(x, logits=False, rows=[0])[0]

    run = {"stack": stack, "sink": sink, "rows": rows}[method]
    run(torch.randn(1, 3, 64, 64))  # warm-up (lazy inits) at a size whose freed memory the real run cannot reuse
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)  # hand memory freed while loading back, or the run would reuse it
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
    before = _status(os.getpid())["VmRSS"]
    maps = run(torch.randn(1, 3, size, size))
    print(_status(os.getpid())["VmHWM"] - before, maps.nbytes)


def capture_peak(size: int = 384, rounds: int = 3) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    got: dict[str, list[int]] = {"stack": [], "sink": [], "rows": []}
    nbytes = 0
    for r in range(rounds):
        for method in (("stack", "sink", "rows") if r % 2 == 0 else ("rows", "sink", "stack")):
            out = subprocess.run([sys.executable, __file__, "--capture-child", method, "--size", str(size)],
                                 env=env, capture_output=True, text=True, check=True).stdout.split()
            got[method].append(int(out[0]))
            nbytes = max(nbytes, int(out[1]))
    med = {m: float(np.median(v)) for m, v in got.items()}
    print(f"peak host memory of one capture, ViT-B/16 @{size} ({nbytes / MB:.0f} MiB of maps), median of {rounds}:")
    for m in ("stack", "sink", "rows"):
        print(f"  {m:<5} +{med[m] / MB:7.1f} MiB  (runs: {', '.join(f'{v / MB:.0f}' for v in got[m])})")
    print(f"  sink / stack = {med['sink'] / med['stack']:.2f}x; rows / stack = {med['rows'] / med['stack']:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--capture-peak", action="store_true", help="only the peak-memory-per-capture comparison")
    parser.add_argument("--capture-child", choices=("stack", "sink", "rows"), help=argparse.SUPPRESS)
    parser.add_argument("--size", type=int, default=384, help=argparse.SUPPRESS)
    parser.add_argument("--images", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--run-large", action="store_true", help="also measure ViT-L/16 @384 (slow, ~3 GB)")
    args = parser.parse_args()
    if args.capture_child:
        capture_peak_child(args.capture_child, args.size)
        return
    if args.capture_peak:
        capture_peak(args.size)
        return
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        _, ckpt = torchvision_vit_b16(folder)
        images = image_folder(folder / "images", args.images)
        samples, peak, seconds = sample_export(ckpt, images, folder / "out", args.batch_size)
        report_rss(samples, peak, args.images, args.batch_size, seconds)
        storage_table(ckpt, args.run_large)
    capture_peak(args.size)


if __name__ == "__main__":
    main()
