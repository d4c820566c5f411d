"""A windowed model (Swin, SAM / ViTDet) is not asked the plain ViT's questions: the "what the file does not say"
dialog is a plain ViT's (its head choices read `attn_width`, which a `WindowedSpec` lacks: it raised), and its answer
(block_norm=, attn_scale=) reloads the model with overrides a windowed model does not take (refused)."""
from __future__ import annotations

import warnings

import pytest
import torch

import vitviz
from tests.core.test_options_table import _tiny_sam


def test_a_windowed_model_with_a_guessed_head_count_is_not_asked(qtbot, tmp_path) -> None:  # noqa: ANN001
    timm = pytest.importorskip("timm")
    from vitviz.gui.assumptions import asked, asks_unprompted
    from vitviz.gui.protocol import Load
    from vitviz.gui.session import Session

    torch.save(_tiny_sam(timm).state_dict(), tmp_path / "sam.pth")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        spec = vitviz.load(tmp_path / "sam.pth", device="cpu", window=2, global_blocks=(1,)).spec
    assert "heads" in dict(spec.guesses)            # the window would have asked (heads_guessed)
    assert asked(spec) == [] and not asks_unprompted(spec, library_layout=True)
    session = Session()
    try:
        session.model.ask_assumptions = True               # as the window sets it
        asked_specs: list = []
        session.model.assumptions_asked.connect(asked_specs.append)
        with qtbot.waitSignal(session.model.model_loaded, timeout=20000):
            session.load_model(str(tmp_path / "sam.pth"), device="cpu", window=2, global_blocks=(1,))
        assert session.model.spec.windowed and not session.model.awaiting_answers and not asked_specs
        assert not session.client.pending(Load)
    finally:
        session.shutdown()
