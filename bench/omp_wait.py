"""Benchmark: torch's idle CPU threads spinning (OpenMP's ACTIVE wait; libgomp's default: a bounded spin) or
sleeping (PASSIVE, what `vitviz` sets for the window: `vitviz.cli.window.quiet_idle_threads`), side by side in one
run, each case in its own process (libgomp reads the policy once, when torch is imported):

- the window's ablate click on the demo model with torch's default thread count (`bench/interventions.py --only
  window --threads N`): wall p50 / p95, the GUI thread's and the process's CPU per click;
- one forward of a random-weight ViT-B/16 @224 and ViT-Ti/16 (vitviz's reference ViT), median of `--repeats`.

    python bench/omp_wait.py [--threads N] [--repeats 15] [--clicks 40] [--rounds 2]

The rounds alternate the policies (unset -- libgomp's default, what the window ran with before it set one --, ACTIVE,
PASSIVE, unset, ...) so that a drift of the machine's load hits them alike. On few cores a spinning thread takes the core the window's thread needs to paint; on many cores
it costs little but CPU time.
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# each case's environment: unset is libgomp's own default (a bounded spin: GOMP_SPINCOUNT 300000), the window before
POLICIES = {"unset": {}, "ACTIVE": {"OMP_WAIT_POLICY": "ACTIVE"}, "PASSIVE": {"OMP_WAIT_POLICY": "PASSIVE"},
            "spin 10k": {"GOMP_SPINCOUNT": "10000"}}

FORWARD = r"""
import statistics, sys, time, torch
from vitviz.core.spec import ModelSpec
from vitviz.core.running.model import ReferenceViT
torch.set_num_threads(int(sys.argv[1]))
repeats = int(sys.argv[2])
for name, width, depth, heads in (("ViT-B/16", 768, 12, 12), ("ViT-Ti/16", 192, 12, 3)):
    net = ReferenceViT(ModelSpec(family="bench", source="random", image_size=(224, 224), patch_size=16,
                                 embed_dim=width, depth=depth, num_heads=heads, mlp_hidden=4 * width,
                                 num_classes=1000)).eval()
    x = torch.randn(1, 3, 224, 224)
    with torch.inference_mode():
        for _ in range(3):
            net(x)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            net(x)
            times.append(time.perf_counter() - start)
    print(f"FORWARD {name} {statistics.median(times) * 1e3:.2f}", flush=True)
"""

CLICK = re.compile(r"p50 ([\d.]+) ms, p95 ([\d.]+) ms over \d+ clicks \(GUI-thread CPU p50 ([\d.]+) ms.*?process CPU "
                   r"p50 ([\d.]+) ms")


def _run(policy: str, argv: list[str]) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env.update(QT_QPA_PLATFORM=env.get("QT_QPA_PLATFORM", "offscreen"), PYTHONPATH=str(ROOT), **POLICIES[policy])
    done = subprocess.run([sys.executable, *argv], env=env, capture_output=True, text=True, cwd=ROOT, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"{policy}: {' '.join(argv[:2])} failed:\n{done.stderr[-2000:]}")
    return done.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads (default: torch's own default, as the window runs)")
    parser.add_argument("--repeats", type=int, default=15, help="forwards per model")
    parser.add_argument("--clicks", type=int, default=40, help="ablate clicks per window run")
    parser.add_argument("--rounds", type=int, default=2, help="runs per policy, alternating")
    args = parser.parse_args()
    if args.threads is None:      # what torch chooses by itself (physical cores), asked of a fresh process
        args.threads = int(_run("unset", ["-c", "import torch; print(torch.get_num_threads())"]).split()[-1])
    clicks: dict[str, list[tuple[float, ...]]] = {p: [] for p in POLICIES}
    forwards: dict[str, dict[str, list[float]]] = {p: {} for p in POLICIES}
    for _ in range(args.rounds):
        for policy in POLICIES:
            out = _run(policy, [str(ROOT / "bench" / "interventions.py"), "--only", "window", "--threads",
                                str(args.threads), "--repeats", str(args.clicks)])
            found = CLICK.search(out)
            if found is None:
                raise SystemExit(f"no click figures in:\n{out}")
            clicks[policy].append(tuple(float(v) for v in found.groups()))
            for line in _run(policy, ["-c", FORWARD, str(args.threads), str(args.repeats)]).splitlines():
                if line.startswith("FORWARD "):
                    _, name, ms = line.split(" ", 2)
                    forwards[policy].setdefault(name, []).append(float(ms))
    print(f"torch threads {args.threads}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}; medians of "
          f"{args.rounds} runs per policy, alternating")
    for policy in POLICIES:
        p50, p95, gui, proc = (statistics.median(c[i] for c in clicks[policy]) for i in range(4))
        models = ", ".join(f"{name} forward {statistics.median(ms):.1f} ms" for name, ms in forwards[policy].items())
        print(f"{policy:8s} ablate click p50 {p50:.1f} ms, p95 {p95:.1f} ms; CPU per click: GUI "
              f"thread {gui:.1f} ms, process {proc:.1f} ms; {models}")
    base = statistics.median(c[1] for c in clicks["unset"])
    for policy in list(POLICIES)[1:]:
        p95 = statistics.median(c[1] for c in clicks[policy])
        print(f"{policy} / unset: click p95 {p95 / base:.2f}; " + ", ".join(
            f"{name} forward {statistics.median(forwards[policy][name]) / statistics.median(ms):.2f}"
            for name, ms in forwards["unset"].items()))

if __name__ == "__main__":
    main()
