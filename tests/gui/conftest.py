"""Fixtures for the window tests: a tiny checkpoint, images, isolated settings and a window per test.

Every test here fails on Qt warnings (except the offscreen plugin's note about size hints) and never touches
the user's settings: QSettings paths point into a temporary folder and `VITVIZ_SETTINGS` names a scratch file.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from _gui import HEADS, make_image, wait_idle   # the helpers the tests share (tests/gui/_gui.py)
from _tiny import write_tiny_checkpoint


# The waits below are hang guards, not measurements: a worker that has finished answers at once, and a machine
# shared by other work (CI, a laptop compiling) must not fail a test whose answer is merely late. Every
# qtbot.waitUntil / waitSignal timeout is stretched by this factor ($VITVIZ_TEST_WAIT_SCALE, default 4).
WAIT_SCALE = float(os.environ.get("VITVIZ_TEST_WAIT_SCALE", "4"))


def _stretch_qtbot_waits() -> None:
    from pytestqt.qtbot import QtBot

    def stretched(method):  # noqa: ANN001, ANN202
        def wait(self, *args, timeout: int = 5000, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
            return method(self, *args, timeout=int(timeout * WAIT_SCALE) if timeout and timeout > 0 else timeout,
                          **kwargs)
        wait.__doc__, wait.stretched = method.__doc__, True
        return wait

    for name in ("waitUntil", "waitSignal", "waitSignals", "waitCallback"):
        method = getattr(QtBot, name)
        if not getattr(method, "stretched", False):
            setattr(QtBot, name, stretched(method))


_stretch_qtbot_waits()


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


@pytest.fixture
def fake_demo(monkeypatch: pytest.MonkeyPatch, tiny_ckpt: Path, images: list[Path]) -> tuple[Path, list[Path]]:
    """The tiny checkpoint and test images stand in for the bundled demo (the wiring, whatever the shipped model)."""
    from vitviz.gui import bundled

    monkeypatch.setattr(bundled, "demo_checkpoint", lambda: tiny_ckpt)
    monkeypatch.setattr(bundled, "demo_images", lambda: list(images))
    return tiny_ckpt, images


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
def session(qtbot):  # noqa: ANN001, ANN201
    """A session of its own (no window), shut down afterwards."""
    from vitviz.gui.session import Session

    s = Session()
    yield s
    s.shutdown()


SCREEN = (1600, 1000)        # the tests' window is laid out as on a screen of this size (offscreen's is 800 x 600)


@pytest.fixture
def window(qtbot, settings):  # noqa: ANN001, ANN201
    from PySide6.QtCore import QRect

    from vitviz.gui.window import MainWindow, default_size

    win = MainWindow(settings)
    win.use_size(default_size(QRect(0, 0, *SCREEN)))
    qtbot.addWidget(win)
    win.show()
    yield win
    if win.reporter.box is not None:
        win.reporter.box.close()
    win.persist_settings = False
    win.close()
    win.session.shutdown()


@pytest.fixture
def loaded(qtbot, window, tiny_ckpt, images):  # noqa: ANN001, ANN201
    """A window with the tiny model loaded and the three images run."""
    with qtbot.waitSignal(window.session.model.model_loaded, timeout=20000):
        window.load_model(str(tiny_ckpt), heads=HEADS)
    window.session.add_images([str(p) for p in images])
    wait_idle(qtbot, window)
    assert window.session.result(str(images[0])) is not None
    return window


@pytest.fixture(scope="session")
def variant_ckpts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tiny checkpoints without CLS, with no_embed_class position embeddings, and without position embedding."""
    import torch
    from _tiny import tiny_state_dict

    folder = tmp_path_factory.mktemp("variants")
    out = {"no_cls": write_tiny_checkpoint(folder / "no_cls.pth", class_token=False)}
    sd = tiny_state_dict()
    sd["pos_embed"] = sd["pos_embed"][:, 1:]           # timm no_embed_class: no row for the CLS token
    torch.save(sd, folder / "no_embed_class.pth")
    sd = tiny_state_dict()
    del sd["pos_embed"]
    torch.save(sd, folder / "no_pos.pth")
    out.update(no_embed_class=folder / "no_embed_class.pth", no_pos=folder / "no_pos.pth")
    return out


# Swin's last stage has 24 heads (swin_tiny: 3, 6, 12, 24): here 2 stages of 2 blocks, 2 then 24 heads, 64 px
SWIN24_ARGS = dict(img_size=64, embed_dim=24, depths=(2, 2), num_heads=(2, 24), window_size=4, num_classes=5)


@pytest.fixture(scope="session")
def swin24(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny timm Swin hub folder whose second stage has 24 heads (many heads in few blocks)."""
    import warnings

    import torch

    timm = pytest.importorskip("timm")
    from timm.models import save_for_hf

    torch.manual_seed(0)
    model = timm.create_model("swin_tiny_patch4_window7_224", pretrained=False, **SWIN24_ARGS)
    folder = tmp_path_factory.mktemp("swin24")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        save_for_hf(model, str(folder), safe_serialization=True, model_args=SWIN24_ARGS)
    return folder
