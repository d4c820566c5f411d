"""Never silently wrong, in the window (issue 18): what a file does not say is asked, marked and verified.

A hand-written layout whose norm order, activation or attention scale is assumed opens the "what the file does
not say" dialog before anything runs, each assumption preselected with its reason; an answer reloads the model with
it as an override in the worker, and can be remembered for the file. Model settings mark every assumed value with
a '?'. The status bar and Model info say whether the model was verified against its original, is not verified
(with its assumptions), or differs from it (an error); the check runs in the worker after the first picture, and
an answer about a model that is no longer loaded is dropped.
"""
from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from _gui import HEADS, SCREENS, answer_assumptions, open_at, show_dock, wait_idle
from _hostile import DEMO
from PySide6.QtWidgets import QLabel

import vitviz
from vitviz.gui import settings as st
from vitviz.gui.assumptions import asked
from vitviz.gui.protocol import Load, Run, Verified, Verify
from vitviz.gui.window import DIFFERS


@pytest.fixture(scope="module")
def hand_written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A from-scratch tutorial ViT's state dict (one Linear per head: 3 heads read from the shapes; 2 layers of
    width 48, 4x4 patches of 8 px, 5 classes): its norm order, activation and attention scale are not in it."""
    from tutorial_refs import PerHeadViT

    torch.manual_seed(0)
    model = PerHeadViT()
    with torch.no_grad():
        for p in model.parameters():          # LayerNorms away from 1/0, so the norm order matters
            p.add_(torch.randn_like(p) * 0.3)
    path = tmp_path_factory.mktemp("hand") / "my_vit.pt"
    torch.save(model.state_dict(), path)
    return path


@pytest.fixture(scope="module")
def timm_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A timm hub folder as `push_to_hub` writes it: config.json (architecture, num_classes, model_args,
    pretrained_cfg) beside model.safetensors."""
    timm = pytest.importorskip("timm")
    from safetensors.torch import save_file

    folder = tmp_path_factory.mktemp("hub") / "vit-tiny-test"
    folder.mkdir()
    args = dict(img_size=32, patch_size=8, depth=2)
    model = timm.create_model("vit_tiny_patch16_224", num_classes=5, **args)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(folder / "model.safetensors"))
    cfg = {"architecture": "vit_tiny_patch16_224", "num_classes": 5, "num_features": 192, "global_pool": "token",
           "model_args": args,
           "pretrained_cfg": {"tag": "", "custom_load": False, "input_size": [3, 32, 32], "fixed_input_size": True,
                              "interpolation": "bicubic", "crop_pct": 0.9, "crop_mode": "center",
                              "mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5], "num_classes": 5, "pool_size": None,
                              "first_conv": "patch_embed.proj", "classifier": "head"}}
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


class FakeVerification:
    """Stands in for `vitviz.core.analyses.verify.Verification` (its contract: verdict, summary(), first_differing_layer,
    to_dict())."""

    def __init__(self, verdict: str, summary: str, layer: int | None = None) -> None:
        self.verdict, self._summary, self.first_differing_layer = verdict, summary, layer

    def summary(self) -> str:
        return self._summary

    def to_dict(self) -> dict:
        return {"verdict": self.verdict, "first_differing_layer": self.first_differing_layer}


def _ask(qtbot, window, path: Path, images: list[Path]):  # noqa: ANN001, ANN202
    """Load `path` with images waiting; the dialog opens by itself."""
    window.session.add_images([str(p) for p in images])
    with qtbot.waitSignal(window.session.model.assumptions_asked, timeout=20000):
        window.load_model(str(path))
    qtbot.waitUntil(lambda: window.assumptions_dialog is not None and window.assumptions_dialog.isVisible(),
                    timeout=5000)
    return window.assumptions_dialog


def _second_window(qtbot, settings):  # noqa: ANN001, ANN202
    from PySide6.QtCore import QRect

    from vitviz.gui.window import MainWindow, default_size

    win = MainWindow(settings)
    win.use_size(default_size(QRect(0, 0, 1600, 1000)))
    qtbot.addWidget(win)
    win.persist_settings = False
    win.show()
    return win


def test_a_hand_written_layout_asks_its_assumptions_before_anything_runs(qtbot, window, hand_written,  # noqa: ANN001
                                                                        images) -> None:
    dialog = _ask(qtbot, window, hand_written, images[:1])
    s = window.session
    assert not s.model.library_layout and not s.model.spec.heads_guessed           # heads from the per-head Linears
    assert s.model.awaiting_answers and s.client.pending(Run) == [] and s.result(str(images[0])) is None
    assert dialog.fields == ["block_norm", "mlp_kind", "attn_scale"] == asked(s.model.spec)   # heads: not asked
    assert dialog.combos["block_norm"].currentData() == "pre"                          # the assumption, said so
    assert dialog.combos["block_norm"].currentText().endswith("(assumed)")
    assert "Assumed: pre-norm" in dialog.reasons["block_norm"].text()
    assert dialog.combos["mlp_kind"].currentData() == "gelu" and dialog.combos["attn_scale"].currentData() == 0.0
    assert not any(c.isChecked() for c in dialog.confirms.values()) and not dialog.remember_check.isChecked()
    assert "my_vit.pt" in dialog.findChild(QLabel, "assumptionsText").text()
    assert "eps" in dialog.others.text() and dialog.others.isVisibleTo(dialog)     # not asked, but listed
    panel = window.controls.model_settings
    assert panel.marks["block_norm"].isVisibleTo(panel) and not panel.marks["heads"].isVisibleTo(panel)
    assert "Assumed: pre-norm" in panel.marks["block_norm"].toolTip()

    answer_assumptions(qtbot, window, {"block_norm": "post"})                 # reloads with block_norm='post'
    spec = s.model.spec
    assert spec.block_norm == "post" and spec.source_of("block_norm") == "override"
    # the one setting answered is the user's; the ones left as they were are still assumptions
    assert spec.kind_of("block_norm") == "given" and spec.kind_of("mlp_kind") == "assumed"
    assert s.model.load_overrides == {"block_norm": "post"}
    assert not s.model.awaiting_answers and window.assumptions_dialog is None
    assert not panel.marks["block_norm"].isVisibleTo(panel) and panel.marks["mean"].isVisibleTo(panel)   # still assumed
    assert panel.marks["act"].isVisibleTo(panel) and panel.marks["attn_scale"].isVisibleTo(panel)
    assert panel.norm_combo.currentData() == "post"
    wait_idle(qtbot, window)
    shown = s.result(str(images[0])).result.attentions
    post = vitviz.load(hand_written, device="cpu", block_norm="post").run(str(images[0])).attentions
    pre = vitviz.load(hand_written, device="cpu").run(str(images[0])).attentions
    np.testing.assert_allclose(shown, post, atol=1e-6)
    assert not np.allclose(shown, pre, atol=1e-3)                             # the answer changed the maps


def test_remembered_answers_open_the_file_unasked(qtbot, window, settings, hand_written,  # noqa: ANN001
                                                  tiny_ckpt, images) -> None:
    _ask(qtbot, window, hand_written, images[:1])
    # two changed, the scale confirmed as assumed ("I know this"): all three answered, remembered
    answer_assumptions(qtbot, window, {"block_norm": "post", "mlp_kind": "relu", "attn_scale": 0.0}, remember=True)
    assert st.remembered_settings(settings, str(hand_written)) == {"block_norm": "post", "act": "relu",
                                                                   "attn_scale": 0.0}
    assert window.session.model.spec.source_of("block_norm").startswith("remembered: you answered post")
    with qtbot.waitSignal(window.session.model.model_loaded, timeout=20000):   # another model, then this one again
        window.load_model(str(tiny_ckpt), heads=HEADS)
    other = _second_window(qtbot, settings)                               # a new window: nothing kept in memory
    try:
        asked_: list[object] = []
        other.session.model.assumptions_asked.connect(asked_.append)
        with qtbot.waitSignal(other.session.model.model_loaded, timeout=20000):
            other.load_model(str(hand_written))
        spec = other.session.model.spec
        assert asked_ == [] and other.assumptions_dialog is None
        assert spec.block_norm == "post" and spec.mlp_kind == "relu" and spec.kind_of("block_norm") == "given"
        assert spec.source_of("block_norm").startswith("remembered: you answered post in the window")
        assert spec.source_of("attn_scale").startswith("remembered: you answered 0 (head_dim^-0.5)")
        assert any("post-norm blocks, activation relu" in n and "my_vit.pt" in n for n in other.notes)
        # a change in Model settings is the newest choice
        panel = other.controls.model_settings
        panel.norm_combo.setCurrentIndex(panel.norm_combo.findData("pre"))
        panel.norm_combo.activated.emit(panel.norm_combo.currentIndex())
        with qtbot.waitSignal(other.session.model.model_loaded, timeout=20000):
            panel.apply()
        assert other.session.model.spec.block_norm == "pre"
        assert st.remembered_settings(settings, str(hand_written))["block_norm"] == "pre"
        assert other.session.model.spec.source_of("block_norm").startswith("remembered: you answered pre")
    finally:
        other.close()
        other.session.shutdown()


def test_without_remembering_a_new_window_asks_again(qtbot, window, settings, hand_written,  # noqa: ANN001
                                                     images) -> None:
    _ask(qtbot, window, hand_written, images[:1])
    answer_assumptions(qtbot, window, {"block_norm": "post"}, remember=False)
    assert st.remembered_settings(settings, str(hand_written)) == {}
    other = _second_window(qtbot, settings)
    try:
        with qtbot.waitSignal(other.session.model.assumptions_asked, timeout=20000):
            other.load_model(str(hand_written))
        assert other.session.model.spec.block_norm == "pre"
    finally:
        other.assumptions_dialog.reject()
        other.close()
        other.session.shutdown()


def test_keeping_the_assumptions_runs_them_and_review_answers_later(qtbot, window, hand_written,  # noqa: ANN001
                                                                    images) -> None:
    _ask(qtbot, window, hand_written, images[:1])
    answer_assumptions(qtbot, window, None)
    wait_idle(qtbot, window)
    s = window.session
    assert s.result(str(images[0])) is not None and s.model.spec.kind_of("block_norm") == "assumed"
    status = window.status
    n = len(s.model.spec.assumptions)
    assert n >= 4 and status.verdict_label.text() == f"Not verified — {n} assumptions"
    assert all(name in status.verdict_label.toolTip() for name, _src in s.model.spec.assumptions)
    assert status.review_button.isVisibleTo(window.statusBar())
    status.review_button.click()                                            # the same question, on request
    dialog = window.assumptions_dialog
    assert dialog is not None and dialog.isVisible() and "runs the images again" in \
        dialog.findChild(QLabel, "assumptionsText").text()
    answer_assumptions(qtbot, window, {"attn_scale": 1.0})
    assert s.model.spec.attn_scale == 1.0 and s.model.spec.source_of("attn_scale") == "override"
    assert asked(s.model.spec) == ["block_norm", "mlp_kind"] and status.review_button.isVisibleTo(window.statusBar())
    status.review_button.click()                                            # the others, each confirmed
    answer_assumptions(qtbot, window, {"block_norm": "pre", "mlp_kind": "gelu"})
    assert s.model.spec.kind_of("block_norm") == "given" and s.model.spec.kind_of("mlp_kind") == "given"
    assert not asked(s.model.spec) and not status.review_button.isVisibleTo(window.statusBar())   # nothing left to ask
    wait_idle(qtbot, window)
    assert s.result(str(images[0])) is not None
    assert status.verdict_label.text() == f"Not verified — {len(s.model.spec.assumptions)} assumptions"


def test_a_bare_state_dict_is_not_verified_and_says_its_assumptions(qtbot, window, tiny_ckpt,  # noqa: ANN001
                                                                    images) -> None:
    """A library layout (timm keys) with assumptions is not asked about; the line says what is assumed, the
    dialog is one click away."""
    asked_: list[object] = []
    window.session.model.assumptions_asked.connect(asked_.append)
    with qtbot.waitSignal(window.session.model.model_loaded, timeout=20000):
        window.load_model(str(tiny_ckpt), heads=HEADS)
    s, status = window.session, window.status
    n = len(s.model.spec.assumptions)
    assert n >= 4 and status.verdict_label.text() == f"Not verified — {n} assumptions"   # before any verdict
    window.session.add_images([str(images[0])])
    wait_idle(qtbot, window)
    assert asked_ == [] and window.assumptions_dialog is None and s.result(str(images[0])) is not None
    assert status.verdict_label.text() == f"Not verified — {n} assumptions"            # after the check too
    assert "block_norm" in status.verdict_label.toolTip() and status.review_button.isVisibleTo(window.statusBar())
    info = show_dock(qtbot, window, "infoDock")
    text = info.text()
    assert f"Not verified — {n} assumptions" in text and "Review assumptions…" in text
    assert "block_norm" in text and "pre-norm blocks" in text


def test_a_timm_hub_folder_is_verified_against_timm(qtbot, window, timm_folder, images) -> None:  # noqa: ANN001
    pytest.importorskip("vitviz.core.analyses.verify")
    with qtbot.waitSignal(window.session.model.model_loaded, timeout=20000):
        window.load_model(str(timm_folder))
    s = window.session
    assert s.model.spec.assumptions == () and window.status.verdict_label.text() == "Not verified"
    with qtbot.waitSignal(s.model.verification_changed, timeout=60000,
                          check_params_cb=lambda *a: s.model.verification is not None or bool(s.model.verify_failure)):
        s.add_images([str(images[0])])
    assert s.model.verify_failure == "" and s.model.verification.verdict == "verified"
    text = window.status.verdict_label.text()
    assert text.startswith("Verified against timm") and "max" in text
    assert "#188038" in window.status.verdict_label.styleSheet()
    assert not window.status.review_button.isVisibleTo(window.statusBar())
    assert text in show_dock(qtbot, window, "infoDock").text()


def test_a_model_that_differs_is_an_error_and_stale_verdicts_are_dropped(qtbot, window, tiny_ckpt,  # noqa: ANN001
                                                                         tiny_ckpt_b, images,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The first model's check is held in the worker while another model loads: its 'differs' belongs to a model
    that is gone and is dropped; the second model's own check says it differs, shown as an error."""
    release = threading.Event()
    calls: list[str] = []

    def fake_verify(self, ctx):  # noqa: ANN001, ANN202 - the work of a Verify request
        calls.append(ctx.model.spec.source)
        if len(calls) == 1:
            release.wait(20)
            return Verified(FakeVerification("differs", "Differs from the original from layer 0 (max 0.9)", 0))
        return Verified(FakeVerification("differs", "Differs from the original from layer 1 (max 0.62)", 1))

    monkeypatch.setattr(Verify, "__call__", fake_verify)
    s = window.session
    with qtbot.waitSignal(s.model.model_loaded, timeout=20000):
        window.load_model(str(tiny_ckpt), heads=HEADS)
    s.add_images([str(images[0])])
    qtbot.waitUntil(lambda: len(calls) == 1, timeout=20000)                   # the check of the first model runs
    assert s.verifying and "Checking against the original" in window.status.verdict_label.toolTip()
    window.load_model(str(tiny_ckpt_b), heads=HEADS)                         # ... when another model is asked for
    release.set()
    qtbot.waitUntil(lambda: s.model.model_path == str(tiny_ckpt_b) and len(calls) == 2 and s.model.verification is not None,
                    timeout=20000)
    assert s.model.verification.first_differing_layer == 1                         # the first model's answer: dropped
    label = window.status.verdict_label
    assert label.text() == "Differs from the original — from layer 1" and "#d93025" in label.styleSheet()
    assert [e for e in window.reporter.errors if e[0] == DIFFERS] == \
        [(DIFFERS, "tiny_b.safetensors: Differs from the original — from layer 1")]
    assert "layer 1 (max 0.62)" in label.toolTip()
    assert "Differs from the original — from layer 1" in show_dock(qtbot, window, "infoDock").text()


def test_a_live_model_is_not_verified(qtbot, session) -> None:  # noqa: ANN001
    """The live path runs the user's own module: nothing converted, nothing to verify."""
    from vitviz.core.spec import ModelSpec
    from vitviz.gui.assumptions import LIVE_LINE, verdict_line

    spec = ModelSpec(family="live", source="x", image_size=(32, 32), patch_size=8, embed_dim=32, depth=2,
                     num_heads=2)
    session.model.spec = spec
    session._verify()
    assert session.client.pending(Verify) == [] and not session.model.verify_asked
    assert verdict_line(spec).text == LIVE_LINE and asked(spec) == []


def test_the_command_line_states_what_the_file_does_not(qtbot, window, hand_written, images) -> None:  # noqa: ANN001
    """`vitviz --model FILE --block-norm post --act gelu --attn-scale S` answers the question up front, as for info
    and export: nothing left to ask, and each value is the user's (given)."""
    from _gui import parse

    from vitviz.gui.app import apply_args

    scale = 16 ** -0.5
    with qtbot.waitSignal(window.session.model.model_loaded, timeout=20000):
        apply_args(window, parse(str(images[0]), "--model", str(hand_written), "--block-norm", "post", "--act",
                                 "gelu", "--attn-scale", str(scale)))
    spec = window.session.model.spec
    assert spec.block_norm == "post" and spec.kind_of("block_norm") == "given"
    assert spec.kind_of("mlp_kind") == "given" and spec.attn_scale == pytest.approx(scale)
    assert window.assumptions_dialog is None or not window.assumptions_dialog.isVisible()


def test_enter_on_the_question_keeps_every_guess_a_guess(qtbot, window, settings, tiny_ckpt,  # noqa: ANN001
                                                         images) -> None:
    """Issue 30: the default button with nothing changed turned every preselected guess into a given value and
    remembered it. Now it runs the model as loaded: nothing reloads, nothing becomes given, nothing is stored, and
    the question stays one click away."""
    from PySide6.QtCore import Qt
    from PySide6.QtTest import QTest

    from vitviz.catalog import answers

    loads: list[object] = []
    window.session.add_images([str(images[0])])
    with qtbot.waitSignal(window.session.model.assumptions_asked, timeout=20000):
        window.load_model(str(tiny_ckpt))
    qtbot.waitUntil(lambda: window.assumptions_dialog is not None and window.assumptions_dialog.isVisible(),
                    timeout=5000)
    s = window.session
    spec, assumed = s.model.spec, s.model.spec.assumptions
    s.model.model_loaded.connect(lambda *_a: loads.append(1))
    dialog = window.assumptions_dialog
    assert not dialog.remember_check.isChecked()
    QTest.keyClick(dialog, Qt.Key.Key_Return)                               # "Use my answers", nothing answered
    qtbot.waitUntil(lambda: window.assumptions_dialog is None, timeout=5000)
    wait_idle(qtbot, window)
    assert loads == [] and s.model.spec is spec and s.model.load_overrides == {} and s.model.spec.assumptions == assumed
    assert s.model.spec.heads_guessed and s.result(str(images[0])) is not None and not s.model.awaiting_answers
    assert answers.read_all() == {} and st.remembered_settings(settings, str(tiny_ckpt)) == {}
    assert window.status.verdict_label.text() == f"Not verified — {len(assumed)} assumptions"
    assert window.status.review_button.isVisibleTo(window.statusBar())
    panel = window.controls.model_settings
    assert panel.marks["heads"].isVisibleTo(panel) and panel.marks["block_norm"].isVisibleTo(panel)
    dialog = window.review_assumptions()                                    # asked for: Enter changes nothing
    dialog.remember_check.setChecked(True)                                  # even remembering: nothing to keep
    QTest.keyClick(dialog, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: window.assumptions_dialog is None, timeout=5000)
    assert s.client.pending(Load) == [] and loads == [] and s.model.spec is spec and answers.read_all() == {}


def test_forgetting_remembered_answers_in_the_window(qtbot, window, settings, tiny_ckpt,  # noqa: ANN001
                                                     images) -> None:
    """A remembered answer is said as remembered (Model settings, Model info), and "Forget remembered answers"
    drops it from the store and loads the model again with those settings assumed (and marked) again."""
    st.remember_settings(settings, str(tiny_ckpt), {"heads": 4, "block_norm": "post"})
    window.session.add_images([str(images[0])])
    with qtbot.waitSignal(window.session.model.model_loaded, timeout=20000):
        window.load_model(str(tiny_ckpt))
    s = window.session
    assert s.model.spec.num_heads == 4 and s.model.spec.kind_of("num_heads") == "given" and s.model.remembered == {"heads",
                                                                                                  "block_norm"}
    assert s.model.spec.source_of("num_heads").startswith("remembered: you answered 4 in the window for this file")
    assert s.model.load_overrides == {"heads": 4, "block_norm": "post"}
    panel = window.controls.model_settings
    assert panel.forget_button.isVisibleTo(panel) and panel.remembered() == ["heads", "block_norm"]
    assert "remembered: you answered 4" in panel.marks["heads"].toolTip()
    assert not panel.marks["heads"].isVisibleTo(panel)                      # given: no '?'
    wait_idle(qtbot, window)
    assert "remembered: you answered 4" in show_dock(qtbot, window, "infoDock").text()
    with qtbot.waitSignal(s.model.model_loaded, timeout=20000):
        panel.forget_button.click()
    assert st.remembered_settings(settings, str(tiny_ckpt)) == {} and s.model.remembered == frozenset()
    assert s.model.spec.num_heads == 1 and s.model.spec.heads_guessed and s.model.spec.kind_of("block_norm") == "assumed"
    assert s.model.load_overrides == {} and "remembered" not in s.model.spec.to_json()
    assert not panel.forget_button.isVisibleTo(panel) and panel.marks["heads"].isVisibleTo(panel)
    assert window.assumptions_dialog is None                                # asked for: not asked by itself
    assert any("Forgot 4 attention heads, post-norm blocks for tiny.pth" in n for n in window.notes)
    wait_idle(qtbot, window)
    assert s.result(str(images[0])) is not None


def test_an_answer_remembered_now_is_said_as_remembered_and_a_changed_one_is_not(qtbot, window,  # noqa: ANN001
                                                                                  settings, hand_written,
                                                                                  images) -> None:
    """Answered with "Remember for this file": said as remembered at once; a value changed later in Model settings
    without anything remembered for the file is the user's word (override), not a remembered one."""
    _ask(qtbot, window, hand_written, images[:1])
    answer_assumptions(qtbot, window, {"attn_scale": 1.0}, remember=True)
    s = window.session
    assert s.model.spec.source_of("attn_scale").startswith("remembered: you answered 1 in the window")
    assert s.model.remembered == {"attn_scale"} and s.model.spec.kind_of("block_norm") == "assumed"
    st.forget_settings(settings, str(hand_written))                          # forgotten elsewhere (the CLI)
    panel = window.controls.model_settings
    panel.scale_edit.setText("0.5")
    panel.scale_edit.textEdited.emit("0.5")
    with qtbot.waitSignal(s.model.model_loaded, timeout=20000):
        panel.apply()
    assert s.model.spec.source_of("attn_scale") == "override" and s.model.remembered == frozenset()
    assert st.remembered_settings(settings, str(hand_written)) == {}


def test_what_the_window_was_told_is_used_by_the_command_line(qtbot, window, tiny_ckpt, images,  # noqa: ANN001
                                                              capsys) -> None:  # noqa: ANN001
    """One store of answers: a head count and norm order remembered in the window ("remember for this file") are
    what `vitviz info` and `vitviz export` use for that file, said on stderr; a flag still wins."""
    import json

    from vitviz.catalog import answers
    from vitviz.cli import main

    st.remember_settings(window.settings, str(tiny_ckpt), {"heads": 4, "block_norm": "post"})
    assert answers.answers_for(str(tiny_ckpt)) == {"heads": 4, "block_norm": "post"}
    assert st.remembered_settings(window.settings, str(tiny_ckpt)) == {"heads": 4, "block_norm": "post"}
    assert main(["info", str(tiny_ckpt), "--json"]) == 0
    captured = capsys.readouterr()
    data = json.loads(captured.out)
    assert data["num_heads"] == 4 and data["block_norm"] == "post"
    assert "using what you told the window" in captured.err and "heads 4" in captured.err
    assert main(["info", str(tiny_ckpt), "--json", "--heads", "2"]) == 0
    assert json.loads(capsys.readouterr().out)["num_heads"] == 2
    with qtbot.waitSignal(window.session.model.model_loaded, timeout=20000):
        window.load_model(str(tiny_ckpt))                  # the window reads the same store
    assert window.session.model.spec.num_heads == 4 and window.session.model.spec.block_norm == "post"


def test_old_remembered_answers_move_into_the_shared_store(settings, tiny_ckpt) -> None:  # noqa: ANN001
    """What earlier versions kept in the window's own settings is still read, and moves to the store (where the
    command line finds it) on the next answer."""
    import json

    from vitviz.catalog import answers

    settings.setValue(st.LEGACY_HEADS_KEY, json.dumps({str(tiny_ckpt): 2}))
    assert st.remembered_settings(settings, str(tiny_ckpt)) == {"heads": 2}
    st.remember_settings(settings, str(tiny_ckpt), {"act": "relu"})
    assert answers.answers_for(str(tiny_ckpt)) == {"heads": 2, "act": "relu"}
    assert settings.value(st.LEGACY_HEADS_KEY) is None


# ------------------------------------------------------------------------------- an unreadable answers store (issue 34)

def test_an_answers_store_nested_too_deeply_does_not_stop_a_load(qtbot, window, images, tmp_path: Path,  # noqa: ANN001
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The store cannot be read: the model loads without remembered settings, and the error box says why."""
    import shutil

    store = tmp_path / "answers.json"
    store.write_text("{" * 1 + '"a": ' + "[" * 200_000 + "]" * 200_000 + "}")
    monkeypatch.setenv("VITVIZ_ANSWERS", str(store))
    model = shutil.copytree(DEMO, tmp_path / "my_model")   # not the bundled demo, whose answers are never read
    with qtbot.waitSignal(window.session.model.model_loaded, timeout=30000):
        window.load_model(str(model))
    window.session.add_images([str(p) for p in images])
    wait_idle(qtbot, window)
    assert window.session.model.spec is not None                   # the app goes on: the model is loaded and shown
    [(title, summary)] = window.reporter.errors             # said to the user, naming the file and what is wrong
    assert title == "Remembered settings not read"
    assert str(store) in summary and "nested too deeply" in summary and "VITVIZ_ANSWERS" in summary


def test_a_tutorial_vits_assumptions_under_screenshot_name_the_command_lines_flags(
        qtbot, window, images, tmp_path: Path) -> None:  # noqa: ANN001
    """Second pass: a hand-written tutorial ViT (nn.TransformerEncoder, a bare state dict) under --screenshot (no
    one to ask) said "pass block_norm='pre'|'post'|'res_post' (CLI --block-norm …)" in the status bar: Python and
    the flag at once. It now says the command line's way, as the head-count note beside it does."""
    import torch.nn as nn

    class TutorialViT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.patch_embed = nn.Conv2d(3, 32, 8, 8)
            self.cls_token = nn.Parameter(torch.zeros(1, 1, 32))
            self.pos_embedding = nn.Parameter(torch.randn(1, 17, 32) * 0.02)
            layer = nn.TransformerEncoderLayer(32, 2, 64, batch_first=True, norm_first=True)
            self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
            self.norm = nn.LayerNorm(32)
            self.head = nn.Linear(32, 5)

    torch.manual_seed(0)
    path = tmp_path / "my_vit.pth"
    torch.save(TutorialViT().state_dict(), path)
    window.session.model.ask_assumptions = False
    open_at(qtbot, window, SCREENS["1280x800"], path, images[0])
    said = " ".join(window.notes)
    assert "--block-norm pre|post|res_post" in said and "--act " in said, said
    assert "block_norm='pre'" not in said and "act='" not in said and "(CLI " not in said, said
