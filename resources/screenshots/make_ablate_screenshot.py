"""The README's screenshot of the window's interventions: the demo model at 1280 x 800 on its triangle sample, the
importance scan of that image (beside the overview's tiles), its two most important heads ablated, and head L1.H0's
attention patched from the cross sample: the toolbar's banner, every panel showing the intervened run (titles
marked, the ablated tiles and the Head selector outlined in amber), the image list's top-5 clean -> intervened, the
Interventions dock's table.

Run from the repository root: `xvfb-run -a -s "-screen 0 1280x800x24" python
resources/screenshots/make_ablate_screenshot.py` (or QT_QPA_PLATFORM=offscreen); writes
resources/screenshots/window_ablate.png. The window is driven as a user would (scan, ablate, patch); the work runs
in its worker, and the picture is taken once the worker is idle.
"""
from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from PySide6.QtCore import QSettings, QSize

from vitviz.gui.app import ensure_app
from vitviz.gui.window import MainWindow

OUT = Path(__file__).resolve().parent / "window_ablate.png"


def main() -> None:
    app = ensure_app()
    folder = tempfile.mkdtemp()
    window = MainWindow(QSettings(str(Path(folder) / "vitviz.ini"), QSettings.Format.IniFormat))
    window.persist_settings = False
    window.use_size(QSize(1280, 800))
    window.show()

    def idle(ticks: int = 5, timeout: float = 600.0) -> None:
        n, start = 0, time.time()
        while n < ticks and time.time() - start < timeout:
            app.processEvents()
            time.sleep(0.1)
            n = n + 1 if window.is_idle() else 0

    app.processEvents()
    window.load_demo()
    idle()
    images = window.session.image_list.paths
    triangle = next(p for p in images if p.endswith("triangle.png"))
    cross = next(p for p in images if p.endswith("cross.png"))
    window.session.set_current(triangle)
    idle()
    iv = window.interventions
    iv.scan()
    idle()
    for layer, head, _drop in iv.current_importance().top(2):
        iv.toggle(layer, head)
    iv.patch_attention(1, 0, cross)
    idle()
    window.state.update(layer=iv.heads[0][0], head=iv.heads[0][1])
    idle()
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else OUT
    window.grab().save(str(out))
    print(f"wrote {out}")
    window.close()


if __name__ == "__main__":
    main()
