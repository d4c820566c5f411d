"""Benchmark: Ctrl+Q to the end of the `vitviz` process, phase by phase, in the situations a user quits from.

    python bench/quit.py [--repeats 3] [--only idle,busy,compare,timeline]

Each round starts `vitviz` (offscreen, throw-away settings) in a fresh process with a ViT-B/16-shaped checkpoint
of random weights and three generated images, brings it to the situation, triggers the Quit action (what Ctrl+Q
does) and records, in the child, the wall-clock time of:

- `quit`: the action is triggered;
- `closed`: the window's closeEvent has returned (settings saved, worker stopped);
- `atexit`: the last atexit handler (registered first) runs: the event loop has ended, the window is gone and
  the other atexit handlers have run (the parked-worker wait, the exit-time `gc.freeze`);
and, in this process, when the child has ended (`end`): after `atexit` only the interpreter's teardown of every
module and object remains, which `vitviz` skips once its window has closed (`vitviz.gui.app.QUICK_EXIT`, run
both ways here, interleaved: `quick` as shipped, `full` with the teardown). Situations:

- `idle`: every image run, nothing running;
- `busy`: Quit while the worker runs a forward pass (the images just added);
- `compare`: a second ViT-B/16 opened in Compare (its maps shown);
- `timeline`: a 6-checkpoint training run (ViT-S-shaped) opened in the Timeline dock.

Printed: per situation the median of each phase over `--repeats` rounds and the total (quit to end).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

CHILD = r"""
import atexit, sys, time
atexit.register(lambda: print("atexit", time.time(), flush=True))   # registered first: runs last
situation, folder, mode = sys.argv.pop(1), sys.argv.pop(1), sys.argv.pop(1)
from pathlib import Path
from PySide6.QtCore import QTimer
import vitviz.gui.app as app_module
app_module.QUICK_EXIT = mode == "quick"
from vitviz.gui.window import MainWindow
close_event = MainWindow.closeEvent
def closing(self, event):
    close_event(self, event)
    print("closed", time.time(), flush=True)
MainWindow.closeEvent = closing
def done(win):
    return (win.session.model.spec is not None and win.is_idle()
            and all(win.session.result(p) for p in win.session.image_list.paths))
def quit_now(win):
    print("quit", time.time(), flush=True)
    win.menus.actions["quit"].trigger()
def when(condition, then):
    if condition():
        then()
    else:
        QTimer.singleShot(50, lambda: when(condition, then))
def start(win):
    if situation == "busy":
        images = sorted(str(p) for p in Path(folder).glob("img*.png"))
        win.session.add_images(images[3:])
        when(lambda: not win.is_idle(), lambda: QTimer.singleShot(30, lambda: quit_now(win)))
    elif situation == "compare":
        win.compare_with(str(Path(folder) / "b.pth"), heads=12)
        when(lambda: done(win) and win.compare.active, lambda: QTimer.singleShot(500, lambda: quit_now(win)))
    elif situation == "timeline":
        win.open_run(str(Path(folder) / "run"), heads=6)
        when(lambda: done(win) and win.timeline.store is not None,
             lambda: QTimer.singleShot(2000, lambda: when(lambda: done(win), lambda: quit_now(win))))
    else:
        QTimer.singleShot(300, lambda: quit_now(win))
apply_args = app_module.apply_args
def apply_then_quit(win, args):
    apply_args(win, args)
    when(lambda: done(win), lambda: start(win))
app_module.apply_args = apply_then_quit
from vitviz.cli import main
sys.exit(main())
"""
PHASES = ("closed", "atexit", "end")
MODES = ("quick", "full")


def make_inputs(folder: Path) -> None:
    """The checkpoints and images the rounds use (random weights, generated images)."""
    import numpy as np
    from _tiny import write_tiny_checkpoint
    from PIL import Image

    for name, seed in (("a.pth", 0), ("b.pth", 1)):
        write_tiny_checkpoint(folder / name, embed_dim=768, depth=12, patch=16, grid=(14, 14), num_classes=1000,
                              seed=seed)
    (folder / "run").mkdir()
    for i, step in enumerate((100, 200, 300, 400, 500, 600)):
        write_tiny_checkpoint(folder / "run" / f"checkpoint-{step}.pth", embed_dim=384, depth=12, patch=16,
                              grid=(14, 14), num_classes=1000, seed=10 + i)
    for i in range(6):
        pixels = np.random.default_rng(i).integers(0, 256, (224, 224, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(folder / f"img{i}.png")


def one_round(situation: str, mode: str, folder: Path) -> dict[str, float]:
    """Seconds from `quit` to each phase, for one fresh process."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), QT_QPA_PLATFORM=os.environ.get("QT_QPA_PLATFORM", "offscreen"),
               VITVIZ_SETTINGS=str(Path(tempfile.mkdtemp()) / "quit.ini"))
    images = sorted(str(p) for p in folder.glob("img*.png"))[:3]
    proc = subprocess.Popen([sys.executable, "-c", CHILD, situation, str(folder), mode, *images, "--model",
                             str(folder / "a.pth"), "--heads", "12"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    out, _ = proc.communicate(timeout=600)
    end = time.time()
    stamps = {line.split()[0]: float(line.split()[1]) for line in out.splitlines()
              if line.split() and line.split()[0] in ("quit", *PHASES)}
    stamps["end"] = end
    missing = [p for p in ("quit", *PHASES) if p not in stamps]
    if missing:
        raise RuntimeError(f"{situation}: the child printed no {missing} (exit {proc.returncode}):\n{out}")
    return {phase: stamps[phase] - stamps["quit"] for phase in PHASES}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", default="idle,busy,compare,timeline", help="situations, comma-separated")
    args = parser.parse_args()
    situations = [s for s in args.only.split(",") if s]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        make_inputs(folder)
        results: dict[tuple[str, str], list[dict[str, float]]] = {(s, m): [] for s in situations for m in MODES}
        for _ in range(args.repeats):
            for key in results:          # interleaved: drift of a loaded machine hits every situation and mode
                results[key].append(one_round(*key, folder))
                print(f"{key[0]} ({key[1]}): {results[key][-1]['end']:.2f} s", file=sys.stderr, flush=True)
    print(f"Ctrl+Q to process end, median of {args.repeats} (s from the Quit action; phases cumulative):")
    print(f"{'situation':<20} " + " ".join(f"{p:>9}" for p in PHASES))
    for (situation, mode), rounds in results.items():
        medians = [statistics.median(r[p] for r in rounds) for p in PHASES]
        totals = ", ".join(f"{r['end']:.2f}" for r in rounds)
        print(f"{situation + ' (' + mode + ')':<20} " + " ".join(f"{m:9.2f}" for m in medians)
              + f"   (totals: {totals})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
