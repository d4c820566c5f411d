"""The README's Compare and Timeline pictures of the window: `window_compare.png` and `window_timeline.png`.

    python -m vitviz.demo.finetune --out /tmp/shots/finetuned                       # ~1 min
    python -m vitviz.demo.train --out /tmp/shots/train --steps 1500 --save-every 100  # a short run, ~4 min
    xvfb-run -a -s "-screen 0 1600x1200x24" python resources/screenshots/make_compare_screenshots.py \\
        --finetuned /tmp/shots/finetuned --run /tmp/shots/train/run

The window at 1500 × 1100 with the bundled demo model on the shipped shapes images, driven through its own calls
(Models › Compare with… is `compare_with`, Models › Open training run… is `open_run`): the demo against its copy
fine-tuned by `vitviz.demo.finetune`, and the demo model's own training saved with `--save-every`. Pictures over
`MAX_BYTES` are stored with a 256-colour palette.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
MAX_BYTES = 400_000


def _wait(app, condition, timeout: float = 600.0) -> None:  # noqa: ANN001
    end = time.time() + timeout
    while not condition():
        if time.time() > end:
            raise TimeoutError("the window did not finish in time")
        app.processEvents()
        time.sleep(0.01)


def _settle(app, seconds: float = 0.6) -> None:  # noqa: ANN001
    end = time.time() + seconds
    while time.time() < end:
        app.processEvents()
        time.sleep(0.01)


def _save(widget, path: Path) -> None:  # noqa: ANN001
    from PIL import Image

    widget.grab().save(str(path))
    if path.stat().st_size > MAX_BYTES:
        Image.open(path).convert("RGB").quantize(256, method=Image.Quantize.MEDIANCUT).save(path, optimize=True)
    print("wrote", path, path.stat().st_size, "bytes")


def _window(app, size: tuple[int, int] = (1500, 1100)):  # noqa: ANN001, ANN202
    from PySide6.QtCore import QSettings, QSize

    from vitviz.gui.bundled import demo_model, images_for
    from vitviz.gui.window import MainWindow

    win = MainWindow(QSettings(str(Path(tempfile.mkdtemp()) / "s.ini"), QSettings.Format.IniFormat))
    win.persist_settings = False
    win.use_size(QSize(*size))
    win.show()
    images = images_for(demo_model())
    win.load_demo()
    _wait(app, lambda: win.is_idle() and all(win.session.result(p) is not None for p in images))
    return win


def _tall(win, name: str, height: int = 600) -> None:  # noqa: ANN001
    from PySide6.QtCore import Qt

    dock = win.dock(name)
    dock.raise_()
    win.resizeDocks([dock], [height], Qt.Orientation.Vertical)


def compare_shot(app, finetuned: Path, out: Path) -> None:  # noqa: ANN001
    win = _window(app)
    win.compare_with(str(finetuned))
    _wait(app, lambda: win.compare.view is not None and win.is_idle())
    _tall(win, "compareDock")
    win.state.update(source="cls", layer=win.session.model.spec.depth - 1, head="mean", colormap="inferno", opacity=0.6)
    _settle(app)
    _save(win, out)
    win.close()


def timeline_shot(app, run: Path, out: Path) -> None:  # noqa: ANN001
    win = _window(app)
    win.open_run(str(run))
    _wait(app, lambda: win.timeline.store is not None)
    store = win.timeline.store
    _wait(app, lambda: not store.missing(win.session.image_list.current) and win.is_idle())
    _tall(win, "timelineDock", 520)
    win.state.update(source="cls", layer=win.session.model.spec.depth - 1, head="mean", colormap="inferno", opacity=0.6)
    panel = win.timeline_panel
    panel.set_checkpoint(len(store) // 3)
    _wait(app, lambda: panel.shown_k == len(store) // 3)
    panel.box_check.setChecked(True)
    _settle(app)
    _save(win, out)
    win.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--finetuned", type=Path, help="the demo fine-tuned by vitviz.demo.finetune (--out)")
    parser.add_argument("--run", type=Path, help="the demo's training saved with vitviz.demo.train --save-every")
    parser.add_argument("--out", type=Path, default=HERE)
    args = parser.parse_args()
    from vitviz.gui.app import ensure_app

    app = ensure_app()
    if args.finetuned:
        compare_shot(app, args.finetuned, args.out / "window_compare.png")
    if args.run:
        timeline_shot(app, args.run, args.out / "window_timeline.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
