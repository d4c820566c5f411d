"""Benchmark: start-up time of `vitviz models` over caches that hold checkpoints, and whether it imports torch.

Run from the repository root: `python bench/startup.py [--repeats 5]`.

A temporary torch hub cache (`TORCH_HOME`) gets three small fake checkpoint files whose names the family hints
know (`vit_b_16-c867db91.pth`, `deit_small_patch16_224-cd65a155.pth`, `cait_s24_224.pth`), and a temporary
Hugging Face cache (`HF_HOME`) one snapshot `models--google--vit-base-patch16-224/snapshots/abc/` with a
`config.json` (`{"model_type": "vit"}`) and a `model.safetensors`. Nothing reads the files' contents: the listing
guesses families from names and `config.json`.

Printed, each the median wall time of `--repeats` fresh interpreters (rounds interleaved):
- `python -m vitviz models` over those caches (its output is checked to list the four entries);
- `python -c "import torch"`, for comparison (what `vitviz models` costs when it imports torch);
- `python -c "pass"`, the interpreter's own start;
and whether `vitviz.cli.main(['models'])` left `torch` in `sys.modules`, run in a fresh interpreter. To time an
older checkout, copy this file into its bench/ and run it there (it imports the vitviz beside it).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

TORCH_FILES = ("vit_b_16-c867db91.pth", "deit_small_patch16_224-cd65a155.pth", "cait_s24_224.pth")
HF_REPO = "models--google--vit-base-patch16-224"

PROBE = """
import sys
from vitviz.cli import main
code = main(['models', '--json'])
print('TORCH_IMPORTED=' + str('torch' in sys.modules), file=sys.stderr)
sys.exit(code)
"""


def fake_caches(tmp: Path) -> dict[str, str]:
    """Write the fake caches under `tmp`; the environment that points vitviz at them."""
    hub = tmp / "torch" / "hub" / "checkpoints"
    hub.mkdir(parents=True)
    for name in TORCH_FILES:
        (hub / name).write_bytes(b"not a real checkpoint")
    snap = tmp / "hf" / "hub" / HF_REPO / "snapshots" / "abc"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text(json.dumps({"model_type": "vit"}))
    (snap / "model.safetensors").write_bytes(b"not real weights")
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_CACHE", "XDG_CACHE_HOME")}
    env.update(TORCH_HOME=str(tmp / "torch"), HF_HOME=str(tmp / "hf"), HF_HUB_OFFLINE="1",
               PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    return env


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, subprocess.CompletedProcess]:
    start = time.perf_counter()
    done = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return seconds, done


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as t:
        env = fake_caches(Path(t))
        commands = {
            "vitviz models": [sys.executable, "-m", "vitviz", "models"],
            "import torch": [sys.executable, "-c", "import torch"],
            "python (empty)": [sys.executable, "-c", "pass"],
        }
        for cmd in commands.values():   # warm the file cache (and .pyc files) once
            timed(cmd, env)
        times: dict[str, list[float]] = {name: [] for name in commands}
        names = list(commands)
        for r in range(args.repeats):
            for name in names[r % len(names):] + names[: r % len(names)]:
                seconds, done = timed(commands[name], env)
                times[name].append(seconds)
                if name == "vitviz models":
                    listed = done.stdout
        _, probe = timed([sys.executable, "-c", PROBE], env)
        rows = json.loads(probe.stdout)
    missing = [n for n in (*TORCH_FILES, "vit-base-patch16-224") if not any(n in line for line in listed.splitlines())]
    if missing:   # an older checkout may not know every name: say so, time it all the same
        print(f"WARNING: `vitviz models` did not list {missing}")
    imported = "TORCH_IMPORTED=True" in probe.stderr
    print(f"python {sys.version.split()[0]}, {args.repeats} runs each, median (min-max) seconds:")
    for name, ts in times.items():
        print(f"  {name:<16} {statistics.median(ts):6.3f}  ({min(ts):.3f}-{max(ts):.3f})")
    print("families listed: " + ", ".join(f"{r['name']}={r['family']}" for r in rows))
    print(f"torch imported by vitviz.cli.main(['models']): {'YES' if imported else 'no'}")


if __name__ == "__main__":
    main()
