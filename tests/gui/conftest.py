"""Fixtures for the window tests: a tiny checkpoint, images, isolated settings and a window per test.

Every test here fails on Qt warnings (except the offscreen plugin's note about size hints) and never touches
the user's settings: QSettings paths point into a temporary folder and `VITVIZ_SETTINGS` names a scratch file.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # tests/_tiny.py

from _tiny import write_tiny_checkpoint  # noqa: E402

HEADS = 2


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.qt_log_level_fail("WARNING"))
            item.add_marker(pytest.mark.qt_log_ignore("propagateSizeHints"))


@pytest.fixture(autouse=True)
def isolated_settings(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point every QSettings location at a temporary folder."""
    from PySide6.QtCore import QSettings

    folder = tmp_path_factory.mktemp("settings")
    for fmt in (QSettings.Format.IniFormat, QSettings.Format.NativeFormat):
        for scope in (QSettings.Scope.UserScope, QSettings.Scope.SystemScope):
            QSettings.setPath(fmt, scope, str(folder))
    monkeypatch.setenv("VITVIZ_SETTINGS", str(folder / "env.ini"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(folder))
    return folder


@pytest.fixture(scope="session")
def tiny_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer, 2-head ViT with a 4x4 grid of 8-px patches (32x32 input), 5 classes."""
    return write_tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny.pth")


@pytest.fixture(scope="session")
def tiny_ckpt_b(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Another tiny ViT with a different grid (3x3) and 2 register tokens."""
    return write_tiny_checkpoint(tmp_path_factory.mktemp("ckpt_b") / "tiny_b.safetensors", grid=(3, 3),
                                 reg_tokens=2, seed=1)


def make_image(path: Path, seed: int, size: tuple[int, int] = (48, 64)) -> Path:
    rng = np.random.default_rng(seed)
    Image.fromarray((rng.random((*size, 3)) * 255).astype(np.uint8)).save(path)
    return path


@pytest.fixture
def images(tmp_path: Path) -> list[Path]:
    folder = tmp_path / "images"
    folder.mkdir()
    return [make_image(folder / f"img{i}.png", i) for i in range(3)]


@pytest.fixture
def settings(tmp_path: Path):  # noqa: ANN201
    from PySide6.QtCore import QSettings

    return QSettings(str(tmp_path / "vitviz-test.ini"), QSettings.Format.IniFormat)


@pytest.fixture
def window(qtbot, settings):  # noqa: ANN001, ANN201
    from vitviz.gui.window import MainWindow

    win = MainWindow(settings)
    qtbot.addWidget(win)
    win.show()
    yield win
    if win.error_box is not None:
        win.error_box.close()
    win.persist_settings = False
    win.close()
    win.session.shutdown()


def wait_idle(qtbot, window, timeout: int = 20000) -> None:  # noqa: ANN001
    """Wait until the worker has nothing queued or running."""
    qtbot.waitUntil(window.is_idle, timeout=timeout)


@pytest.fixture
def loaded(qtbot, window, tiny_ckpt, images):  # noqa: ANN001, ANN201
    """A window with the tiny model loaded and the three images run."""
    with qtbot.waitSignal(window.session.model_loaded, timeout=20000):
        window.load_model(str(tiny_ckpt), heads=HEADS)
    window.add_images([str(p) for p in images])
    wait_idle(qtbot, window)
    assert window.session.result(str(images[0])) is not None
    return window
