"""`vitviz --code FILE.py:FACTORY` in the window (issue 11 §3): nothing of the file runs before the user agrees in
a dialog naming the file and the factory; then the worker builds the model with that code and its attention shows
like any other, Model info says which mechanism found which layer, and a forward pass stops between the user's
blocks (or, for a module with neither blocks nor attention modules, the window says it cannot)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from _gui import parse, show_dock, wait_idle
from PySide6.QtWidgets import QMessageBox

from vitviz.gui import worker as worker_mod
from vitviz.gui.app import apply_args
from vitviz.gui.protocol import Features, Load
from vitviz.gui.worker import InterruptHooks, is_interruption

CODE = '''
import torch
from torch import nn

RAN = []          # the test reads this: the file's code ran


class Block(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, h, batch_first=True)

    def forward(self, x):
        y = self.norm(x)
        return x + self.attn(y, y, y, need_weights=False)[0]


class TinyViT(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.patch = nn.Conv2d(3, 32, 8, 8)
        self.cls = nn.Parameter(torch.randn(1, 1, 32) * 0.2)
        self.pos = nn.Parameter(torch.randn(1, 17, 32) * 0.2)
        self.blocks = nn.ModuleList([Block(32, 2) for _ in range(2)])
        self.head = nn.Linear(32, 5)

    def forward(self, x):
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(len(x), -1, -1), x], 1) + self.pos
        for block in self.blocks:
            x = block(x)
        return self.head(x[:, 0])


class Flat(nn.Module):
    """Attention written in the top-level forward: no blocks, no attention module."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.patch = nn.Conv2d(3, 32, 8, 8)
        self.qkv = nn.Linear(32, 96)
        self.head = nn.Linear(32, 5)

    def forward(self, x):
        x = self.patch(x).flatten(2).transpose(1, 2)
        for _ in range(2):
            q, k, v = self.qkv(x).reshape(len(x), -1, 3, 2, 16).permute(2, 0, 3, 1, 4)
            a = (q @ k.transpose(-2, -1) * 16 ** -0.5).softmax(-1)
            x = x + (a @ v).transpose(1, 2).reshape(len(x), -1, 32)
        return self.head(x.mean(1))


def build():
    RAN.append("build")
    return TinyViT()


def flat():
    return Flat()
'''


@pytest.fixture
def user_code(tmp_path: Path) -> Path:
    path = tmp_path / "my_vit.py"
    path.write_text(CODE)
    return path


def _box(qtbot, window) -> QMessageBox:  # noqa: ANN001
    qtbot.waitUntil(lambda: window.code_box is not None and window.code_box.isVisible(), timeout=5000)
    return window.code_box


def test_the_window_asks_before_running_the_files_code(qtbot, window, user_code, images) -> None:  # noqa: ANN001
    ref = f"{user_code}:build"
    apply_args(window, parse(str(images[0]), "--code", ref))
    box = _box(qtbot, window)
    assert "my_vit.py" in box.text() and "build()" in box.text() and str(user_code) in box.informativeText()
    assert "only continue if you trust it" in box.informativeText()
    assert window.session.client.pending(Load) == [] and window.session.model.spec is None   # nothing ran yet
    assert "my_vit" not in " ".join(__import__("sys").modules)
    box.button(QMessageBox.StandardButton.Cancel).click()                       # no: nothing is loaded at all
    qtbot.waitUntil(lambda: window.code_box is None, timeout=5000)
    assert window.session.client.pending(Load) == [] and window.session.model.spec is None
    assert window.session.model.loading == "" and window.demo_instead_of_model is False
    window.load_code(ref)                                                       # asked again
    box = _box(qtbot, window)
    with qtbot.waitSignal(window.session.model.model_loaded, timeout=30000):
        box.findChild(type(box.button(QMessageBox.StandardButton.Cancel)), "runCodeButton").click()
    wait_idle(qtbot, window)
    s = window.session
    assert s.model.spec.family == "live" and s.model.model_code == ref and s.model.model_path == ref
    assert s.model.live_layers == (("blocks.0.attn", "nn.MultiheadAttention"), ("blocks.1.attn", "nn.MultiheadAttention"))
    result = s.result(str(images[0])).result
    assert result.attentions.shape == (2, 2, 17, 17)
    np.testing.assert_allclose(result.attentions.sum(-1), 1.0, atol=1e-5)
    assert np.asarray(window.panel.overlay_item.image).ndim == 2                 # shown like any other model
    info = window.info.text()
    assert "Attention capture" in info and "blocks.1.attn" in info and "nn.MultiheadAttention" in info
    assert window.controls.source_combo.findData("relevance") < 0              # its gradients are not exposed
    assert not window.controls.model_settings.heads_combo.isEnabled()          # its own code decides its heads
    assert ref not in __import__("vitviz.gui.settings", fromlist=["x"]).recent_models(window.settings)
    features = show_dock(qtbot, window, "featuresDock")                        # said there, not in an error box
    qtbot.waitUntil(lambda: "reference ViT" in features.status.text(), timeout=5000)
    assert window.reporter.errors == [] and s.client.pending(Features) == []
    window.load_code(ref)                                                       # agreed before: not asked again
    assert window.code_box is None and s.client.pending(Load)
    wait_idle(qtbot, window)
    assert window.reporter.errors == []


def test_screenshot_mode_takes_the_flag_as_the_answer(qtbot, window, user_code, images) -> None:  # noqa: ANN001
    window.trust_code = True                                                    # what --screenshot sets
    with qtbot.waitSignal(window.session.model.model_loaded, timeout=30000):
        apply_args(window, parse(str(images[0]), "--code", f"{user_code}:build"))
    assert window.code_box is None and window.session.model.spec.family == "live"


def test_a_live_forward_stops_between_the_users_blocks(qtbot, user_code, images, monkeypatch) -> None:  # noqa: ANN001
    import vitviz

    model = vitviz.load(None, code=f"{user_code}:build", device="cpu")
    assert model.hook_points() == list(model.net.blocks)

    class Asked:                       # the worker thread's interruption, as QThread reports it
        @staticmethod
        def currentThread():  # noqa: ANN205, N802 - Qt's name
            return Asked()

        def isInterruptionRequested(self) -> bool:  # noqa: N802 - Qt's name
            return True

    monkeypatch.setattr(worker_mod, "QThread", Asked)
    hooks = InterruptHooks(model)
    with pytest.raises(Exception) as caught, hooks:
        model.run(str(images[0]))
    assert hooks.fired and is_interruption(caught.value)
    assert all(not block._forward_pre_hooks for block in model.net.blocks)     # removed again
    flat = vitviz.load(None, code=f"{user_code}:flat", device="cpu")
    assert flat.hook_points() == [] and flat.layers == [("(top level)", "softmax")] * 2


def test_a_module_that_cannot_be_stopped_is_said(qtbot, window, user_code, images) -> None:  # noqa: ANN001
    window.trust_code = True
    with qtbot.waitSignal(window.session.model.model_loaded, timeout=30000):
        window.load_code(f"{user_code}:flat")
    window.session.add_images([str(images[0])])
    wait_idle(qtbot, window)
    assert not window.session.model.interruptible
    assert any("no blocks or attention modules vitviz can stop between" in n for n in window.notes)
    assert window.session.result(str(images[0])) is not None and window.reporter.errors == []
