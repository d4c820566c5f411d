"""The window as a newcomer meets it, round 4: what a first look at the real window showed clipped, overflowing or
saying something untrue (screenshots of each problem were taken under a virtual display)."""
from __future__ import annotations

from pathlib import Path

from _gui import HEADS, wait_idle
from PySide6.QtCore import QPoint, QRect
from PySide6.QtWidgets import QApplication


def _small_screen(window) -> tuple[int, int]:  # noqa: ANN001
    """Lay `window` out as on a 1280 x 800 screen; its size there."""
    from vitviz.gui.window import default_size

    size = default_size(QRect(0, 0, 1280, 800))
    window.use_size(size)
    return size.width(), size.height()


def test_unfolded_model_settings_scroll_instead_of_making_the_window_taller_than_the_screen(
        qtbot, window, tiny_ckpt: Path, images) -> None:  # noqa: ANN001
    """On a 1280 x 800 screen the Controls panel with Model settings unfolded (as a model with assumptions opens
    it) is taller than the screen: it scrolls, the window keeps its size (it grew to 977 px), and the panel is
    not cut at the side (its minimum width follows Model settings)."""
    width, height = _small_screen(window)
    with qtbot.waitSignal(window.session.model_loaded, timeout=20000):
        window.load_model(str(tiny_ckpt), heads=HEADS)
    window.session.add_images([str(p) for p in images])
    wait_idle(qtbot, window)
    window.controls.model_settings.unfold(True)
    for _ in range(5):
        QApplication.processEvents()
    assert window.minimumSizeHint().height() <= height
    assert window.height() <= height and window.width() <= width
    button = window.controls.apply_size                  # the rightmost control of the panel's widest row
    dock = window.dock("controlsDock")
    right = button.mapTo(dock, QPoint(button.width(), 0)).x()
    assert right <= dock.width(), (right, dock.width())
