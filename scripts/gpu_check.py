"""One-shot GPU check of the device path (issue 36, item 5): maps leave the device through `HostCopy` --
asynchronous copies through pinned staging buffers, float16 cast on the device, one wait before any read.

    PYTHONPATH=. python scripts/gpu_check.py [--json FILE] [--repeats N]

On one CUDA device (about 2 minutes on an H100), with random-weight timm ViT-S/16 and ViT-B/16 saved as hub folders
and loaded by vitviz on cuda and on the cpu:
- capture (full, query rows, float16; batch 8 @224 and, transfer-bound, ViT-B/16 batch 4 @448): the maps on cuda
  against the cpu run (max |diff|), the pinned/async path against the old synchronous one (`VITVIZ_PINNED=0`) side
  by side: median time, peak device memory over the weights (`torch.cuda.max_memory_allocated`), peak host RSS
  growth, the pinned memory torch's host allocator holds (`torch.cuda.host_memory_stats`);
- one layer's maps (ViT-B/16 @224, ViT-L/14 @518) copied to the host: `HostCopy`, a reused pinned buffer, the
  old pageable copy (`bench/capture.py --only transfer`), GB/s;
- class relevance (Chefer, gradient rollout, attention x gradient) on cuda against the cpu;
- `vitviz.verify` on cuda (verdict, time, peak device memory);
- `vitviz export` of 4 images on cuda, streamed (cls,rollout) and full (.npz), against the cpu's files (PNG pixels,
  .npz attentions), each with both copy paths; and the same on Ray (one actor, one GPU) when ray is installed.
TF32 is turned off so that cuda and cpu compute the same float32 maps. Exits 2 with a message when no CUDA device
is present, 1 when a check fails, 0 otherwise.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time
import traceback
import unittest.mock
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

TOL = {"float32": 1e-4, "float16": 1.5e-3}   # cuda vs cpu; float16: one rounding apart (2^-10 near 1)
PATHS = {"pinned": "1", "pageable": "0"}      # VITVIZ_PINNED: the new path, the old synchronous one
MODELS = (("vit_small_patch16_224", 224), ("vit_base_patch16_224", 224), ("vit_base_patch16_224", 448))
CAPTURE_CASES = (("vit_small_patch16_224", 224, 8), ("vit_base_patch16_224", 224, 8), ("vit_base_patch16_224", 448, 4))
BASE = "vit_base_patch16_224_224"             # relevance, verify and export run this one
results: dict[str, Any] = {"checks": [], "failed": []}


def no_cuda() -> None:
    import torch

    print(f"gpu_check: FAILED -- no CUDA device here (torch.cuda.is_available() is False; torch {torch.__version__}, "
          f"built for CUDA {torch.version.cuda}). This check measures the GPU path; run it on a machine with a GPU. "
          "The CPU proof of the same code is tests/core/running/test_host_copy.py.", file=sys.stderr)
    sys.exit(2)


def check(name: str, ok: bool, detail: str) -> None:
    line = f"{'ok  ' if ok else 'FAIL'} {name}: {detail}"
    print(line, flush=True)
    results["checks"].append({"name": name, "ok": ok, "detail": detail})
    if not ok:
        results["failed"].append(name)


def section(name: str, body: Callable[[], None]) -> None:
    """Run one part; an exception fails it (with its traceback) and the others still run."""
    print(f"\n== {name}", flush=True)
    start = time.perf_counter()
    try:
        body()
    except Exception:   # noqa: BLE001 -- a one-shot report: say what broke and go on
        traceback.print_exc()
        check(name, False, "raised (traceback above)")
    print(f"   ({time.perf_counter() - start:.1f} s)", flush=True)


@contextlib.contextmanager
def copies(path: str) -> Any:
    """The copy path `HostCopy` takes inside: 'pinned' (asynchronous) or 'pageable' (the old synchronous one)."""
    with unittest.mock.patch.dict(os.environ, {"VITVIZ_PINNED": PATHS[path]}):   # restored as it was after
        yield


def rss(field: str) -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        return next((int(line.split()[1]) * 1024 for line in f if line.startswith(field)), 0)


def reset_host_peak() -> int | None:
    """Reset VmHWM to the current RSS (Linux); the RSS now, or None where that cannot be done."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return None
    return rss("VmRSS:")


def timm_folder(tmp: Path, arch: str, size: int) -> Path:
    import timm
    import torch

    torch.manual_seed(0)
    args = {"img_size": size}
    model = timm.create_model(arch, pretrained=False, **args)
    out = tmp / f"{arch}_{size}"
    timm.models._hub.save_for_hf(model, str(out), model_args=args, safe_serialization=True)
    return out


def measure(run: Callable[[], Any], repeats: int) -> dict[str, Any]:
    """Median seconds of `run` (its result read on the host: it has waited), peak device memory over what was
    allocated before, peak host RSS growth; the last result."""
    import torch

    out = run()   # warm-up (kernels, the pinned cache)
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        out = run()
        times.append(time.perf_counter() - start)
    del out
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    host = reset_host_peak()
    out = run()
    return {"s": statistics.median(times), "device_peak": torch.cuda.max_memory_allocated() - base,
            "host_peak": None if host is None else rss("VmHWM:") - host, "out": out,
            "pinned": torch.cuda.host_memory_stats().get("allocated_bytes.current")}


def mib(n: float | None) -> str:
    return "n/a" if n is None else f"{n / 2**20:.0f} MiB"


def transfer_part(repeats: int) -> None:
    sys.path.insert(0, str(ROOT / "bench"))
    from capture import _transfer_report

    _transfer_report(argparse.Namespace(repeats=4 * repeats))


def capture_part(folders: dict[str, Path], repeats: int) -> None:
    import torch

    for arch, size, batch in CAPTURE_CASES:
        capture_case(folders[f"{arch}_{size}"], f"{arch} @{size} batch {batch}", size, batch, repeats)
        torch.cuda.empty_cache()   # this case's models are gone


def capture_case(folder: Path, name: str, size: int, batch: int, repeats: int) -> None:
    """Full, rows and float16 captures of one model and input size, on cuda both ways and on the cpu."""
    import functools

    import torch

    import vitviz

    modes = {"full": {}, "rows [0]": {"rows": [0]}, "float16": {"half": True}}
    gpu, cpu = vitviz.load(folder, device="cuda"), vitviz.load(folder, device="cpu")
    x = torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(0))
    for mode, kw in modes.items():
        label = f"capture {name} {mode}"
        ref, _ = cpu.forward_captured(x, **kw)
        row = {}
        for path in PATHS:
            with copies(path):
                row[path] = measure(functools.partial(maps_of, gpu, x, kw), repeats)
        a, b = row["pinned"]["out"], row["pageable"]["out"]
        diff = float(np.abs(a.astype(np.float32) - ref.astype(np.float32)).max())
        tol = TOL["float16" if kw.get("half") else "float32"]
        staged = torch.from_numpy(a).is_pinned()   # the array is ordinary memory: only the staging is pinned
        check(label, diff <= tol and np.array_equal(a, b) and a.dtype == ref.dtype and not staged,
              f"max|cuda-cpu| {diff:.2e} (tol {tol:g}); pinned == pageable bitwise: {np.array_equal(a, b)}; "
              f"array in pinned memory: {staged}; {a.nbytes / 2**20:.0f} MiB of maps")
        for path, m in row.items():
            print(f"     {path:<9} {m['s'] * 1e3:8.1f} ms  device peak over weights {mib(m['device_peak'])}  "
                  f"host peak growth {mib(m['host_peak'])}  pinned held by torch {mib(m['pinned'])}")
        print(f"     pinned / pageable time: {row['pinned']['s'] / row['pageable']['s']:.2f}x")
        results.setdefault("capture", []).append({
            "case": label, "max_abs_diff": diff, "bytes": int(a.nbytes),
            **{f"{p}_{k}": m[k] for p, m in row.items() for k in ("s", "device_peak", "host_peak", "pinned")}})


def maps_of(model: Any, x: Any, kw: dict[str, Any]) -> np.ndarray:
    return model.forward_captured(x, **kw)[0]


def relevance_part(folder: Path) -> None:
    import torch

    import vitviz
    from vitviz.core.analyses.relevance import class_relevance

    gpu, cpu = vitviz.load(folder, device="cuda"), vitviz.load(folder, device="cpu")
    x = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(1))
    torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    r_gpu = class_relevance(gpu, x, 3)
    took = time.perf_counter() - start
    r_cpu = class_relevance(cpu, x, 3)
    diffs = {k: float(np.abs(getattr(r_gpu, k) - getattr(r_cpu, k)).max() / max(np.abs(getattr(r_cpu, k)).max(),
                                                                                  1e-12))
             for k in ("chefer", "grad_rollout", "attn_grad")}
    check(f"relevance {folder.name} class 3", all(d <= 1e-3 for d in diffs.values()),
          "max|cuda-cpu| / max|cpu|: " + ", ".join(f"{k} {d:.1e}" for k, d in diffs.items())
          + f" (tol 1e-3); {took * 1e3:.0f} ms on cuda (first call), device peak "
          f"{mib(torch.cuda.max_memory_allocated())}")


def verify_part(folder: Path) -> None:
    import torch

    import vitviz

    gpu = vitviz.load(folder, device="cuda")
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    verdict = vitviz.verify(gpu)
    took = time.perf_counter() - start
    check(f"verify {folder.name} on cuda", bool(verdict.verified),
          f"{verdict.summary()}; {took:.1f} s, device peak over the weights "
          f"{mib(torch.cuda.max_memory_allocated() - base)}")


def pictures(out: Path) -> dict[str, np.ndarray]:
    from PIL import Image

    return {str(p.relative_to(out)): np.asarray(Image.open(p)) for p in sorted(out.rglob("*.png"))}


def export_part(folder: Path, tmp: Path, engine: str) -> None:
    from vitviz.cli import main as vitviz_main

    sys.path.insert(0, str(ROOT / "bench"))
    from common import image_folder

    images = image_folder(tmp / "images", 4)
    runs = {"streamed": ["--maps", "cls,rollout"],
            "full": ["--maps", "cls,rollout", "--npz", "--layers", "all"]}
    extra = ["--engine", "ray", "--actors", "1", "--gpus-per-actor", "1"] if engine == "ray" else []
    for kind, maps in runs.items():
        outs: dict[str, Path] = {}
        timing = {}
        # on Ray only the new path (each run starts Ray: ~20 s); the local engine's cpu files are the reference
        for device, path in (("cpu", "pinned"), ("cuda", "pinned"), ("cuda", "pageable")):
            if engine == "ray" and (device, path) != ("cuda", "pinned"):
                continue
            out = tmp / f"{engine}-{kind}-{device}-{path}"
            argv = ["export", "--model", str(folder), str(images), "--out", str(out), "--quiet", "--no-verify",
                    "--device", device, "--workers", "2", "--batch-size", "2", *maps,
                    *(extra if device == "cuda" else [])]
            label = "cpu" if device == "cpu" else f"{device} {path}"
            with copies(path):
                start = time.perf_counter()
                code = vitviz_main(argv)
                timing[label] = time.perf_counter() - start
            if code != 0:
                check(f"export {engine} {kind} {label}", False, f"exit code {code}")
                return
            outs[label] = out
        ref_dir = tmp / f"local-{kind}-cpu-pinned"
        ref = pictures(ref_dir)
        for key in outs:
            if key == "cpu":
                continue
            got = pictures(outs[key])
            worst = max((int(np.abs(got[k].astype(int) - ref[k].astype(int)).max()) for k in ref if k in got),
                        default=-1)
            npz = ""
            if kind == "full":
                diffs = []
                for f in sorted(ref_dir.rglob("*.npz")):
                    with np.load(f) as a, np.load(outs[key] / f.relative_to(ref_dir)) as b:
                        diffs.append(float(np.abs(a["attentions"] - b["attentions"]).max()))
                npz = f"; .npz attentions max|cuda-cpu| {max(diffs, default=float('nan')):.1e} over {len(diffs)} files"
                ok_npz = bool(diffs) and max(diffs) <= TOL["float32"]
            else:
                ok_npz = True
            check(f"export {engine} {kind} {key}", set(got) == set(ref) and 0 <= worst <= 2 and ok_npz,
                  f"{len(got)} PNGs (cpu {len(ref)}), max pixel |cuda-cpu| {worst} (tol 2){npz}")
        print("     " + ", ".join(f"{k} {t:.1f} s" for k, t in timing.items()))
        results.setdefault("export", []).append({"engine": engine, "kind": kind, **timing})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per capture case (median)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        no_cuda()
    torch.backends.cuda.matmul.allow_tf32 = False   # cuda and cpu compute the same float32 maps
    torch.backends.cudnn.allow_tf32 = False
    warnings.simplefilter("ignore")
    print(f"gpu_check: {torch.cuda.get_device_name()}, torch {torch.__version__}, CUDA {torch.version.cuda}, "
          f"{os.cpu_count()} CPUs", flush=True)
    results["device"] = torch.cuda.get_device_name()
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        folders = {f"{a}_{s}": timm_folder(tmp, a, s) for a, s in MODELS}
        base = folders[BASE]
        section("transfer of one layer (bench/capture.py --only transfer)", lambda: transfer_part(args.repeats))
        section("capture", lambda: capture_part(folders, args.repeats))
        section("relevance", lambda: relevance_part(base))
        section("verify", lambda: verify_part(base))
        section("export (local engine)", lambda: export_part(base, tmp, "local"))
        if importlib.util.find_spec("ray") is not None:
            section("export (Ray, one GPU actor)", lambda: export_part(base, tmp, "ray"))
        else:
            print("\n== export (Ray): skipped, ray is not installed")
    results["seconds"] = time.perf_counter() - start
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=str))
    failed = results["failed"]
    print(f"\ngpu_check: {len(results['checks']) - len(failed)} of {len(results['checks'])} checks passed in "
          f"{results['seconds']:.0f} s" + (f"; FAILED: {', '.join(failed)}" if failed else ""))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
