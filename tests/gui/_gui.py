"""Helpers the window tests share (plain functions; the fixtures are in conftest.py): parsing the window's
command line, a random result, images, waiting for the window to be idle, docks, hovering, the "what the file does
not say" question."""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from _tiny import HEADS  # noqa: F401 - the head count the tiny checkpoints load with, for the tests
from PIL import Image
from PySide6.QtCore import QRect
from PySide6.QtWidgets import QApplication

from vitviz.cli.window import add_window_arguments, window_overrides
from vitviz.core.spec import AttentionResult, ModelSpec


def parse(*argv: str) -> argparse.Namespace:
    """The window's command line (`vitviz ...`) parsed as `vitviz` parses it."""
    parser = argparse.ArgumentParser()
    add_window_arguments(parser)
    args = parser.parse_args(list(argv))
    args.overrides = window_overrides(args)   # as run_window passes them on
    return args


def random_result(depth: int = 3, heads: int = 4, grid: tuple[int, int] = (3, 5), reg: int = 0,
                  cls: bool = True, seed: int = 0) -> AttentionResult:
    """A result with random row-stochastic attention (no model needed)."""
    spec = ModelSpec(family="test", source="x", image_size=(grid[0] * 8, grid[1] * 8), patch_size=8, embed_dim=32,
                     depth=depth, num_heads=heads, cls_token=cls, reg_tokens=reg)
    t = spec.num_tokens
    logits = np.random.default_rng(seed).normal(size=(depth, heads, t, t)).astype(np.float32)
    attn = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    image = np.zeros((*spec.image_size, 3), np.uint8)
    return AttentionResult(attn, np.zeros(5, np.float32), np.zeros((3, *spec.image_size), np.float32), image, spec,
                           source="/tmp/some image.png")


def make_image(path: Path, seed: int, size: tuple[int, int] = (48, 64)) -> Path:
    rng = np.random.default_rng(seed)
    Image.fromarray((rng.random((*size, 3)) * 255).astype(np.uint8)).save(path)
    return path


def wait_idle(qtbot, window, timeout: int = 20000) -> None:  # noqa: ANN001
    """Wait until the worker has nothing queued or running."""
    qtbot.waitUntil(window.is_idle, timeout=timeout)


def show_dock(qtbot, window, name: str):  # noqa: ANN001, ANN201
    """Raise a tabbed dock so its panel is visible (hidden panels skip redraws) and return the panel."""
    dock = window.dock(name)
    dock.raise_()
    qtbot.waitUntil(dock.widget().isVisible, timeout=5000)
    return dock.widget()


def viewport_pos(widget, view, x: float, y: float):  # noqa: ANN001, ANN201
    """The viewport position of view coordinates (x, y) in a pyqtgraph GraphicsLayoutWidget."""
    return widget.mapFromScene(view.mapViewToScene(__import__("PySide6.QtCore", fromlist=["QPointF"]).QPointF(x, y)))


def hover(viewport, pos) -> None:  # noqa: ANN001
    """A plain mouse move (no button) sent straight to a viewport: QTest's move needs a real cursor. pyqtgraph drops
    moves that follow another within its rate limit, so the limit's clock is reset first."""
    from PySide6.QtCore import QEvent, QPointF, Qt
    from PySide6.QtGui import QMouseEvent
    from PySide6.QtWidgets import QApplication

    event = QMouseEvent(QEvent.Type.MouseMove, QPointF(pos), viewport.mapToGlobal(QPointF(pos)),
                        Qt.MouseButton.NoButton, Qt.MouseButton.NoButton, Qt.KeyboardModifier.NoModifier)
    scene = viewport.parent().scene()
    if hasattr(scene, "_lastMoveEventTime"):
        scene._lastMoveEventTime = 0
    QApplication.sendEvent(viewport, event)


def answer_heads(qtbot, window, heads: int | None, remember: bool = False) -> None:  # noqa: ANN001
    """Answer the window's "what the file does not say" question (open now or soon) with a head count, the other
    settings as assumed: `heads`, or None to keep the assumptions; an answer reloads the model with it (waited
    for)."""
    answer_assumptions(qtbot, window, None if heads is None else {"num_heads": heads}, remember)


def answer_assumptions(qtbot, window, choices: dict | None, remember: bool = False) -> None:  # noqa: ANN001
    """Answer the open (or soon open) assumptions dialog: `choices` {field: value} ('num_heads', 'block_norm',
    'mlp_kind', 'attn_scale'), each chosen and ticked "I know this" (the rest stay assumed), or None to keep the
    assumptions. "Use my answers" reloads the model with the chosen values as overrides; this waits until it has
    loaded."""
    qtbot.waitUntil(lambda: window.assumptions_dialog is not None and window.assumptions_dialog.isVisible(),
                    timeout=20000)
    dialog = window.assumptions_dialog
    dialog.remember_check.setChecked(remember)
    if choices is None:
        dialog.reject()
        return
    for field, value in choices.items():
        dialog.choose(field, value)
        dialog.confirm(field)
    with qtbot.waitSignal(window.session.model.model_loaded, timeout=20000):
        dialog.accept()


def load_model(qtbot, window, path, images) -> None:  # noqa: ANN001
    """Load `path` (2 heads) in the window, add `images` and wait until everything ran."""
    with qtbot.waitSignal(window.session.model.model_loaded, timeout=20000):
        window.load_model(str(path), heads=HEADS)
    window.session.add_images([str(p) for p in images])
    wait_idle(qtbot, window)


SCREENS = {"1600x1000": (1600, 1000), "1280x800": (1280, 800)}     # the two screens the layout tests lay out for


def settle() -> None:
    """Let Qt run its queued layout and paint events (a few turns of the event loop)."""
    for _ in range(5):
        QApplication.processEvents()


def open_at(qtbot, window, screen: tuple[int, int], model: Path, image: Path, **load) -> None:  # noqa: ANN001
    """Lay the window out for `screen`, load `model` and run `image`."""
    from vitviz.gui.window import default_size

    window.use_size(default_size(QRect(0, 0, *screen)))
    with qtbot.waitSignal(window.session.model.model_loaded, timeout=60000):
        window.load_model(str(model), **load)
    window.session.add_images([str(image)])
    qtbot.waitUntil(window.is_idle, timeout=60000)
    assert window.reporter.box is None or not window.reporter.box.isVisible(), window.reporter.box.text()
