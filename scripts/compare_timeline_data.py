"""Make the data behind the README's Compare and Timeline pictures, and export them with the CLI.

    python scripts/compare_timeline_data.py --out /tmp/vitviz_readme            # ~20 min on two cores

1. `python -m vitviz.demo.finetune`: a copy of the demo model fine-tuned for 300 steps on light / dark (~1 min);
2. `vitviz export --model resources/demo --compare FINETUNED` on the shipped shapes images: A, B and A − B maps;
3. `python -m vitviz.demo.train --save-every 400`: the demo model's own training (8000 steps, ~18 min), a
   checkpoint every 400 steps in OUT/train/run/checkpoint-*/;
4. `vitviz export --timeline OUT/train/run` on the same images: a map per checkpoint, the contact sheet, the APNG
   and GIF, timeline.csv.

`--train-steps` / `--save-every` / `--finetune-steps` make a quick run for trying the script (the pictures then
show an untrained model). Nothing is downloaded.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(*argv: str) -> None:
    print("+", " ".join(argv), file=sys.stderr, flush=True)
    subprocess.run([sys.executable, *argv], check=True, cwd=ROOT)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--finetune-steps", type=int, default=300)
    parser.add_argument("--train-steps", type=int, default=8000)
    parser.add_argument("--save-every", type=int, default=400)
    parser.add_argument("--skip-train", action="store_true", help="only the fine-tune and the comparison")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from vitviz.demo import demo_checkpoint, demo_images

    out = args.out.resolve()
    images = [str(p) for p in demo_images()]
    if not images:
        raise SystemExit("no demo images in resources/samples (shapes_*.png)")
    tuned = out / "finetuned"
    _run("-m", "vitviz.demo.finetune", "--out", str(tuned), "--steps", str(args.finetune_steps))
    _run("-m", "vitviz", "export", "--model", str(demo_checkpoint()), "--compare", str(tuned), *images,
         "--out", str(out / "compare"), "--layers", "all", "--which-heads", "mean", "--colorbar", "--overwrite",
         "--quiet")
    if not args.skip_train:
        _run("-m", "vitviz.demo.train", "--out", str(out / "train"), "--steps", str(args.train_steps),
             "--save-every", str(args.save_every))
        _run("-m", "vitviz", "export", "--timeline", str(out / "train" / "run"), *images, "--out",
             str(out / "timeline"), "--layers", "-1", "--which-heads", "mean", "--overwrite", "--quiet")
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
