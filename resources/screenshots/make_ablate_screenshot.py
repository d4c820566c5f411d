"""The README's screenshot of the window's interventions: the demo model at 1280 x 800 on its square sample, head L2.H1
(the head the squares need most: see the README's figure) ablated from the overview (its tile outlined), the
Interventions dock with the clean and ablated top-5 and the importance grid of that image.

Run from the repository root: `xvfb-run -a -s "-screen 0 1280x800x24" python
resources/screenshots/make_ablate_screenshot.py` (or QT_QPA_PLATFORM=offscreen); writes
resources/screenshots/window_ablate.png. The window is driven as a user would (ablate, then ask for the
importance); the work runs in its worker, and the picture is taken once the worker is idle.
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
    square = next(p for p in window.session.images if p.endswith("square.png"))   # the class L2.H1 matters for
    window.session.set_current(square)
    idle()
    window.interventions.toggle(2, 1)
    idle()
    window.interventions.scan()
    idle()
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else OUT
    window.grab().save(str(out))
    print(f"wrote {out}")
    window.close()


if __name__ == "__main__":
    main()
