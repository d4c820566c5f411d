"""The image panel's and the Overview's share of an ablate click (issue 37), measured alone: on the demo model in
the window at 1280 × 800 (offscreen), the panels are told the current result changed, alternately the clean run
and an ablated run of the same image (what a click and its undo do), and each panel's redraw (`refresh`: its items
set) and paint are timed with `time.perf_counter` (the paint's CPU too: `time.thread_time`), p50 and p95 over
`--repeats` changes: the paint the change asks for (Qt's paint event of the regions it marked dirty, as in a
click) and, apart, a synchronous repaint of the whole viewport.

    PYTHONPATH=$PWD python bench/paint_panels.py --repeats 100
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import pyqtgraph as pg


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=100)
    args = parser.parse_args()
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtCore import QEventLoop, QSettings, QSize

    from vitviz.gui.app import ensure_app
    from vitviz.gui.window import MainWindow

    app = ensure_app()
    painted: list[tuple[object, float, float, tuple[int, int]]] = []   # (view, seconds, CPU seconds, region size)
    plain_paint = pg.GraphicsView.paintEvent

    def timed_paint(view, event) -> None:
        start, start_cpu = time.perf_counter(), time.thread_time()
        plain_paint(view, event)
        rect = event.region().boundingRect()
        seconds, cpu = time.perf_counter() - start, time.thread_time() - start_cpu
        painted.append((view, seconds, cpu, (rect.width(), rect.height())))

    pg.GraphicsView.paintEvent = timed_paint       # before any view is made: PySide looks overrides up then
    window = MainWindow(QSettings(str(Path(tempfile.mkdtemp()) / "vitviz.ini"), QSettings.Format.IniFormat))
    window.persist_settings = False
    window.use_size(QSize(1280, 800))
    window.show()

    def wait(done, timeout: float = 120.0) -> None:
        start = time.perf_counter()
        while not done() and time.perf_counter() - start < timeout:
            app.processEvents(QEventLoop.ProcessEventsFlag.AllEvents, 50)

    window.load_demo()
    images = window.session.image_list
    wait(lambda: images.current_maps is not None and window.is_idle())
    clean = images.current_maps
    iv = window.interventions
    iv.toggle(0, 0)
    wait(lambda: iv.current() is not None and images.current_maps is iv.current().maps and window.is_idle())
    ablated = images.current_maps
    for _ in range(20):
        app.processEvents()
    panels = {"image": (window.panel, window.panel.view_widget), "overview": (window.overview, window.overview.widget)}
    for name, (panel, view) in panels.items():
        redraw, paint, paint_cpu, whole = [], [], [], []
        regions: set[tuple[int, int]] = set()
        for i in range(2 * args.repeats):
            maps = (clean, ablated)[i % 2]
            start = time.perf_counter()
            panel._on_current_changed(maps)
            redraw.append(time.perf_counter() - start)
            if i % 4 < 2:       # the paint the change asks for (the regions it marked dirty), as in a click
                painted.clear()
                app.sendPostedEvents(None, 0)
                app.processEvents()
                ours = [(seconds, cpu, size) for v, seconds, cpu, size in painted if v is view]
                paint.append(sum(seconds for seconds, _cpu, _size in ours))
                paint_cpu.append(sum(cpu for _seconds, cpu, _size in ours))
                regions.update(size for _seconds, _cpu, size in ours)
            else:               # the whole viewport painted at once
                start = time.perf_counter()
                view.viewport().repaint()
                whole.append(time.perf_counter() - start)
        size = view.viewport().size()
        line = " · ".join(f"{what} p50 {statistics.median(ts) * 1e3:.2f} ms, p95 {np.percentile(ts, 95) * 1e3:.2f}"
                          for what, ts in (("redraw", redraw), ("its paint", paint), ("its paint's CPU", paint_cpu),
                                          ("whole viewport", whole)))
        print(f"{name} panel ({size.width()}×{size.height()} px): {line} over {args.repeats} changes each (painted "
              f"regions {sorted(regions)}); load {os.getloadavg()[0]:.1f}", flush=True)
    window.close()


if __name__ == "__main__":
    main()
