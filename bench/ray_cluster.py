"""Benchmark: `vitviz export --engine ray` on a two-node Ray cluster started with `ray start`, beside the local engine.

Run from the repository root: `python bench/ray_cluster.py [--images 64] [--rounds 2] [--cpus 1]`.

What a user does on two machines, here on one: `ray start --head --port P` (one node), `ray start --address
HEAD:P` (a second node, its own raylet and object store), then `vitviz export --engine ray --address HEAD:P ...`
(a driver joining by address: the model travels through the object store). Each `ray start --block` runs in a
process group of its own, with a temporary folder of its own, and is stopped by signalling that group (never
`ray stop`, which stops every Ray of the user on the machine). Both engines run as a fresh `python -m vitviz
export` process each time (interpreter, imports, model loading included), interleaved; the model is timm
`vit_tiny_patch16_224` with random weights. Prints images/s of each and the ratio, and what the cluster had.
"""
from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, image_folder  # noqa: I001

from ray_progress import tiny_checkpoint


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_node(args: list[str], temp: Path, log: Path) -> subprocess.Popen:
    """`ray start ARGS --block` in a new process group, its output into `log`."""
    return subprocess.Popen([sys.executable, "-m", "ray.scripts.scripts", "start", *args, "--block",
                             f"--temp-dir={temp}"],
                            stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)


def stop_node(proc: subprocess.Popen) -> None:
    """Signal the node's own process group (its raylet, store, workers), then wait for it."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def nodes(address: str) -> tuple[int, float]:
    """(alive nodes, CPUs) of the cluster, asked by a short-lived driver."""
    code = ("import ray; ray.init(address=%r, log_to_driver=False, logging_level='ERROR'); "
            "print(sum(n['Alive'] for n in ray.nodes()), ray.cluster_resources().get('CPU', 0))" % address)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120).stdout.split()
    return (int(out[0]), float(out[1])) if len(out) == 2 else (0, 0.0)


def export(ckpt: Path, images: Path, out: Path, extra: list[str]) -> float:
    """Seconds for one `python -m vitviz export` process."""
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "vitviz", "export", "--model", str(ckpt), "--heads", "3",
                           str(images), "--out", str(out), "--no-verify", "--quiet", *extra], cwd=ROOT,
                          capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    seconds = time.perf_counter() - start
    assert proc.returncode == 0, proc.stderr[-2000:]
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--cpus", type=int, default=1, help="CPUs each of the two nodes offers (default 1)")
    args = parser.parse_args()
    # Ray >= 2.5x starts a cluster with token authentication when ~/.ray/auth_token exists; every process that joins
    # it (the second node, the drivers) must then send the token too, which RAY_AUTH_MODE=token asks for.
    os.environ.setdefault("RAY_AUTH_MODE", "token")
    with tempfile.TemporaryDirectory(prefix="vitviz-bench-") as tmp:
        folder = Path(tmp)
        ckpt = tiny_checkpoint(folder)
        images = image_folder(folder / "images", args.images)
        port = free_port()
        head = start_node(["--head", f"--port={port}", f"--num-cpus={args.cpus}", "--include-dashboard=false"],
                          folder / "ray", folder / "head.log")
        worker = None
        try:
            address = f"127.0.0.1:{port}"
            deadline = time.monotonic() + 120
            while nodes(address)[0] < 1 and time.monotonic() < deadline:
                time.sleep(1)
            worker = start_node([f"--address={address}", f"--num-cpus={args.cpus}"], folder / "ray",
                                folder / "worker.log")
            while (count := nodes(address))[0] < 2 and time.monotonic() < deadline:
                time.sleep(1)
            assert count[0] == 2, f"the second node did not join: {(folder / 'worker.log').read_text()[-2000:]}"
            runs = {"local engine": [], "ray, 2 nodes": []}
            extras = {"local engine": [], "ray, 2 nodes": ["--engine", "ray", "--address", address]}
            for r in range(args.rounds):
                for name in list(runs)[:: 1 if r % 2 == 0 else -1]:
                    runs[name].append(export(ckpt, images, folder / f"out{r}{name[0]}", extras[name]))
        finally:
            for proc in (worker, head):
                if proc is not None:
                    stop_node(proc)
    print(f"vit_tiny_patch16_224 @224 (random weights), {args.images} JPEGs; cluster: 2 nodes started with "
          f"`ray start` ({args.cpus} CPU each, {count[1]:g} in all) on this {os.cpu_count()}-core computer; each run "
          f"a fresh process (imports, model loading, joining included); {args.rounds} interleaved round(s), medians")
    med = {name: statistics.median(ts) for name, ts in runs.items()}
    for name, t in med.items():
        print(f"  {name:<14} {t:7.2f} s  {args.images / t:6.2f} images/s   (runs: "
              f"{', '.join(f'{s:.2f}' for s in runs[name])})")
    print(f"ray on 2 nodes / local engine, images/s = {med['local engine'] / med['ray, 2 nodes']:.2f}x")


if __name__ == "__main__":
    main()
