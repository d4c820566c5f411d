"""The verdict line tells the truth at every moment (issue 30, item 3).

While the check against the original runs, the line says "Checking against timm…" with the check's own progress,
never "Not verified" (which the check was about to contradict); the images run first and the check after them, so
the run's progress never waits behind it; a model that differs names the first differing layer and the settings
that could explain it, and offers to load it with the check's suggestion; Verify against… checks the model against
a library architecture (the candidates listed in the worker) or the user's own code, remembered for the file.
"""
from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
from _gui import HEADS, wait_idle
from _tiny import tiny_state_dict

from vitviz.gui import settings as st
from vitviz.gui.protocol import Run, Verify
from vitviz.gui.window import DIFFERS

NOT_VERIFIED_STYLE = "#b06000"        # the orange of "Not verified"


@pytest.fixture(scope="module")
def named_tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny timm-layout ViT (2 layers, 2 heads of 16, 4x4 patches of 8 px) as a timm hub folder whose
    config.json names its architecture: nothing assumed, and timm can build its original (verified in ~2 s)."""
    from safetensors.torch import save_file

    folder = tmp_path_factory.mktemp("named") / "vit-tiny-named"
    folder.mkdir()
    save_file({k: v.contiguous() for k, v in tiny_state_dict().items()}, str(folder / "model.safetensors"))
    args = dict(img_size=32, patch_size=8, depth=2, embed_dim=32, num_heads=2, mlp_ratio=2.0)
    cfg = {"architecture": "vit_tiny_patch16_224", "num_classes": 5, "num_features": 32, "global_pool": "token",
           "model_args": args,
           "pretrained_cfg": {"input_size": [3, 32, 32], "fixed_input_size": True, "interpolation": "bicubic",
                              "crop_pct": 0.9, "crop_mode": "center", "mean": [0.5] * 3, "std": [0.5] * 3,
                              "num_classes": 5, "first_conv": "patch_embed.proj", "classifier": "head"}}
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


class FakeVerification:
    """Stands in for `vitviz.core.analyses.verify.Verification`: verdict, summary(), first_differing_layer, to_dict(), and
    `causes` / `suggested` for a model that differs, `confirmed` (what `apply_verification` marks verified)."""

    def __init__(self, verdict: str, summary: str, layer: int | None = None,
                 causes: tuple[tuple[str, str], ...] = (), suggested: dict[str, Any] | None = None) -> None:
        self.verdict, self._summary, self.first_differing_layer = verdict, summary, layer
        self.causes, self.suggested = causes, dict(suggested or {})
        self.confirmed: tuple[str, ...] = ()     # the settings a real check confirmed (none here)

    def summary(self) -> str:
        return self._summary

    def to_dict(self) -> dict:
        return {"verdict": self.verdict, "first_differing_layer": self.first_differing_layer}


VERIFIED = FakeVerification("verified", "Verified against timm 1.0.31 (max 2e-7)")


class Lines:
    """Every verdict line the status bar showed, in order (read after the window has drawn each)."""

    def __init__(self, window) -> None:  # noqa: ANN001
        self.window, self.seen = window, []
        window.session.model.verification_changed.connect(self.record)

    def record(self) -> None:
        label = self.window.status.verdict_label
        entry = (label.text(), self.window.status.verdict.level, label.styleSheet())
        if not self.seen or self.seen[-1] != entry:
            self.seen.append(entry)

    def texts(self) -> list[str]:
        return [text for text, _level, _style in self.seen]


def _load(qtbot, window, path: Path, **overrides: Any) -> None:  # noqa: ANN001
    with qtbot.waitSignal(window.session.model.model_loaded, timeout=20000):
        window.load_model(str(path), **overrides)


def test_the_line_says_checking_with_its_progress_never_not_verified(qtbot, window, named_tiny, images,  # noqa: ANN001
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The check reports its progress from the worker thread; the line says "Checking against timm: comparing at
    32x32 (1/2)…" in a neutral colour until the verdict, and never "Not verified" from the moment the check is
    due."""
    import vitviz.core.analyses.verify as core_verify

    release, reported = threading.Event(), threading.Event()

    def fake_verify(model, against="auto", code=None, progress=None):  # noqa: ANN001, ANN202
        assert threading.current_thread() is not threading.main_thread()
        progress(0.5, "Comparing at 32x32 (1/2)…")
        reported.set()
        release.wait(20)
        return VERIFIED

    monkeypatch.setattr(core_verify, "verify", fake_verify)
    lines = Lines(window)
    _load(qtbot, window, named_tiny)
    s, label = window.session, window.status.verdict_label
    window.session.add_images([str(p) for p in images])
    checking = "Checking against timm: comparing at 32x32 (1/2)…"
    qtbot.waitUntil(lambda: label.text() == checking, timeout=20000)
    assert reported.is_set() and s.verifying and window.status.verdict.level == "checking"
    assert NOT_VERIFIED_STYLE not in label.styleSheet() and label.styleSheet()
    assert window.status.bar.currentMessage() == "Checking against timm…"   # the status bar says what runs
    release.set()
    qtbot.waitUntil(lambda: label.text() == VERIFIED.summary(), timeout=20000)
    texts = lines.texts()
    due = next(i for i, text in enumerate(texts) if text.startswith("Checking"))
    assert not [t for t in texts[due:] if t.startswith("Not verified")], texts
    assert "Checking against timm… after the images" in texts         # while the images run first


def test_every_queued_run_is_answered_before_the_check_starts(qtbot, window, tiny_ckpt, tmp_path,  # noqa: ANN001
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Images queued when the model's first picture arrives all run before the check (it used to jump the queue
    after the first: the run's progress bar sat at 1/4 while it ran)."""
    from _gui import make_image

    order: list[str] = []
    counts: list[tuple[int, int]] = []
    run = Run.__call__

    def recording_run(self, ctx):  # noqa: ANN001, ANN202
        order.append(f"run {Path(self.image).name}")
        return run(self, ctx)

    def fake_verify(self, ctx):  # noqa: ANN001, ANN202
        order.append("verify")
        from vitviz.gui.protocol import Verified

        return Verified(FakeVerification("unverified", "Not verified — nothing names the model"))

    monkeypatch.setattr(Run, "__call__", recording_run)
    monkeypatch.setattr(Verify, "__call__", fake_verify)
    s = window.session
    s.client.status.connect(lambda text: text.startswith("Checking") and counts.append(s.run_counts()))
    _load(qtbot, window, tiny_ckpt, heads=HEADS)
    paths = [str(make_image(tmp_path / f"q{i}.png", i)) for i in range(4)]
    s.add_images(paths)
    wait_idle(qtbot, window)
    assert order == [f"run q{i}.png" for i in range(4)] + ["verify"], order
    assert counts and all(done == total for done, total in counts)      # no run waits while the check runs
    assert s.model.verification is not None


def test_a_model_that_differs_names_its_layer_and_causes_and_offers_the_fix(qtbot, window, tiny_ckpt,  # noqa: ANN001
                                                                           images,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Differs: the box names the first differing layer and the setting that could explain it (not "Everything
    already loaded is still available"); "Use 4 heads" reloads the model with the suggestion through the
    assumptions' route and checks it again."""
    from PySide6.QtWidgets import QPushButton

    from vitviz.gui.protocol import Verified

    def fake_verify(self, ctx):  # noqa: ANN001, ANN202
        if ctx.model.spec.num_heads == 4:
            return Verified(VERIFIED)
        return Verified(FakeVerification("differs", "Differs from the original from layer 1 (max 0.62)", 1,
                                         causes=(("num_heads", "4 heads"),), suggested=(("heads", 4),)))

    monkeypatch.setattr(Verify, "__call__", fake_verify)
    s = window.session
    _load(qtbot, window, tiny_ckpt, heads=HEADS)
    s.add_images([str(images[0])])
    qtbot.waitUntil(lambda: window.reporter.box is not None and window.reporter.box.isVisible(), timeout=20000)
    box = window.reporter.box
    assert window.reporter.errors[-1] == (DIFFERS, "tiny.pth: Differs from the original — from layer 1")
    info = box.informativeText()
    assert "Everything already loaded" not in info and "not the original model's" in info
    assert "from layer 1" in info and "num_heads (the original has 4 heads)" in info
    assert "num_heads (the original has 4 heads)" in window.status.verdict_label.toolTip()
    fix = [b for b in box.findChildren(QPushButton) if b.text() == "Use 4 heads"]
    assert len(fix) == 1
    with qtbot.waitSignal(s.model.model_loaded, timeout=20000):
        fix[0].click()
    assert s.model.spec.num_heads == 4 and s.model.load_overrides.get("heads") == 4
    qtbot.waitUntil(lambda: window.status.verdict_label.text() == VERIFIED.summary(), timeout=20000)


def test_a_model_that_differs_without_a_suggestion_offers_review(qtbot, window, tiny_ckpt, images,  # noqa: ANN001
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """No cause named (an older check, or none found): the box says so and offers Review assumptions…."""
    from PySide6.QtWidgets import QPushButton

    from vitviz.gui.protocol import Verified

    monkeypatch.setattr(Verify, "__call__", lambda self, ctx: Verified(
        FakeVerification("differs", "Differs from the original from layer 0 (max 0.9)", 0)))
    _load(qtbot, window, tiny_ckpt, heads=HEADS)
    window.session.add_images([str(images[0])])
    qtbot.waitUntil(lambda: window.reporter.box is not None and window.reporter.box.isVisible(), timeout=20000)
    box = window.reporter.box
    assert "Everything already loaded" not in box.informativeText()
    assert "names no setting" in box.informativeText() and "from layer 0" in box.informativeText()
    review = [b for b in box.findChildren(QPushButton) if b.text() == "Review assumptions…"]
    assert len(review) == 1
    review[0].click()
    qtbot.waitUntil(lambda: window.assumptions_dialog is not None and window.assumptions_dialog.isVisible(),
                    timeout=5000)
    window.assumptions_dialog.reject()


@pytest.fixture
def identify(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """A `vitviz.core.reading.identify` whose `candidate_names` says which thread called it (the names it returns)."""
    from vitviz.core.reading import identify as core_identify
    threads: list[str] = []

    def candidate_names(model: Any, progress: Any = None) -> list[str]:
        threads.append(threading.current_thread().name)
        return ["timm:vit_tiny_patch16_224", "timm:vit_small_patch16_224"]

    monkeypatch.setattr(core_identify, "candidate_names", candidate_names)
    return threads


def _recording_verify(monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    import vitviz.core.analyses.verify as core_verify

    calls: list[dict] = []

    def fake_verify(model, against="auto", code=None, progress=None):  # noqa: ANN001, ANN202
        calls.append({"against": against, "code": code})
        return VERIFIED

    monkeypatch.setattr(core_verify, "verify", fake_verify)
    return calls


def test_verify_against_a_library_architecture(qtbot, window, settings, named_tiny, identify,  # noqa: ANN001
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Models › Verify against…: the candidates are listed in the worker, the chosen one is what the check
    builds, and it is remembered for the file (the next load's automatic check uses it)."""
    calls = _recording_verify(monkeypatch)
    _load(qtbot, window, named_tiny)
    assert window.status.verify_button.isVisibleTo(window.statusBar()) and window.verify_action.isEnabled()
    window.verify_action.trigger()
    dialog = window.verifier.dialog
    qtbot.waitUntil(lambda: dialog.arch_combo.count() == 2, timeout=20000)
    assert identify and identify[0] != threading.main_thread().name          # not on the GUI thread
    assert dialog.library_radio.isChecked() and "2 architectures" in dialog.arch_note.text()
    dialog.arch_combo.setCurrentIndex(1)
    with qtbot.waitSignal(window.session.model.verification_changed, timeout=20000,
                          check_params_cb=lambda *a: window.session.model.verification is not None):
        dialog.accept()
    assert calls == [{"against": "timm:vit_small_patch16_224", "code": None}]
    assert st.remembered_original(settings, str(named_tiny)) == ("timm:vit_small_patch16_224", "")
    _load(qtbot, window, named_tiny)
    assert window.session.model.verify_against == "timm:vit_small_patch16_224"


def test_verify_against_without_a_candidate_list_takes_a_typed_name(qtbot, window, named_tiny,  # noqa: ANN001
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """When the architectures cannot be listed (the file cannot be read again) the dialog says so; a typed
    LIBRARY:ARCH is checked against, and the line names its library while the check runs."""
    from vitviz.core.reading import identify as core_identify
    from vitviz.errors import VitvizError

    calls = _recording_verify(monkeypatch)

    def unreadable(model, progress=None):  # noqa: ANN001, ANN202
        raise VitvizError("the file is gone")
    monkeypatch.setattr(core_identify, "candidate_names", unreadable)
    _load(qtbot, window, named_tiny)
    dialog = window.verifier.open_dialog()
    qtbot.waitUntil(lambda: "cannot list" in dialog.arch_note.text(), timeout=20000)
    for wrong in ("nonsense", "timm:", "transformers:google/vit-base-patch16-224"):   # not what the check takes
        dialog.arch_combo.setEditText(wrong)
        assert not dialog.verify_button.isEnabled(), wrong
    dialog.arch_combo.setEditText("torchvision:vit_b_16")
    assert dialog.verify_button.isEnabled()
    dialog.remember_check.setChecked(False)
    dialog.accept()
    assert window.status.verdict_label.text().startswith("Checking against torchvision…")
    qtbot.waitUntil(lambda: window.session.model.verification is not None, timeout=20000)
    assert calls == [{"against": "torchvision:vit_b_16", "code": None}]


def test_verify_against_my_own_code_asks_first_and_is_remembered(qtbot, window, settings, named_tiny,  # noqa: ANN001
                                                                 identify, tmp_path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """My own code: FILE.py and a factory; nothing runs until the user agrees (the confirm box), then the check
    compares with it; the choice is preselected when the dialog opens again for the file."""
    calls = _recording_verify(monkeypatch)
    code_file = tmp_path / "my_vit.py"
    code_file.write_text("def build():\n    raise NotImplementedError\n")
    _load(qtbot, window, named_tiny)
    dialog = window.verifier.open_dialog()
    dialog.code_radio.setChecked(True)
    assert not dialog.verify_button.isEnabled()
    dialog.file_edit.setText(str(code_file))
    dialog.factory_edit.setText("build")
    assert dialog.verify_button.isEnabled()
    dialog.accept()
    qtbot.waitUntil(lambda: window.code_box is not None and window.code_box.isVisible(), timeout=5000)
    assert calls == [] and not window.session.verifying                   # asked first
    run = window.code_box.findChild(type(window.code_box.buttons()[0]), "runCodeButton")
    with qtbot.waitSignal(window.session.model.verification_changed, timeout=20000,
                          check_params_cb=lambda *a: window.session.model.verification is not None):
        run.click()
    code = f"{code_file}:build"
    assert calls == [{"against": "auto", "code": code}]
    assert st.remembered_original(settings, str(named_tiny)) == ("auto", code)
    again = window.verifier.open_dialog()
    assert again.code_radio.isChecked() and again.file_edit.text() == str(code_file)
    assert again.factory_edit.text() == "build"
    again.reject()


def test_a_real_check_against_timm_says_checking_then_verified(qtbot, window, named_tiny, images) -> None:  # noqa: ANN001
    """End to end with timm: the line goes from "Checking against timm…" to "Verified against timm …", never
    through "Not verified"."""
    pytest.importorskip("timm")
    lines = Lines(window)
    _load(qtbot, window, named_tiny)
    s = window.session
    with qtbot.waitSignal(s.model.verification_changed, timeout=60000,
                          check_params_cb=lambda *a: s.model.verification is not None or bool(s.model.verify_failure)):
        s.add_images([str(images[0])])
    assert s.model.verify_failure == "" and s.model.verification.verdict == "verified"
    texts = lines.texts()
    assert texts[-1].startswith("Verified against timm") and any(t.startswith("Checking against timm") for t in texts)
    due = next(i for i, text in enumerate(texts) if text.startswith("Checking"))
    assert not [t for t in texts[due:] if t.startswith("Not verified")], texts


def test_the_candidates_come_from_the_core_identification(qtbot, window, named_tiny) -> None:  # noqa: ANN001
    """With the installed `vitviz.core.reading.identify` (no stand-in): what names the model is offered first, then the
    architectures whose shapes fit; the list is made in the worker."""
    pytest.importorskip("timm")
    _load(qtbot, window, named_tiny)
    dialog = window.verifier.open_dialog()
    qtbot.waitUntil(lambda: not dialog.arch_note.text().startswith("Looking"), timeout=120000)
    assert dialog.arch_combo.count() >= 1 and dialog.arch_combo.itemText(0) == "timm:vit_tiny_patch16_224"
    assert dialog.verify_button.isEnabled()
    dialog.reject()


def test_a_bare_timm_file_gets_a_verdict_and_its_checked_settings_lose_their_marks(qtbot, window, images,  # noqa: ANN001
                                                                                   tmp_path: Path, capsys) -> None:
    """`torch.save(model.state_dict())` of a timm deit_tiny_patch16_224 opened in the window: nothing names it, so
    its head count and norm settings are assumed (marked `?`) until the check finds the timm architectures whose
    shapes fit it and matches one; then the line says so and those settings are verified, no longer marked — the
    image preprocessing, which no probe reaches, stays marked."""
    import torch

    timm = pytest.importorskip("timm")
    torch.manual_seed(0)
    path = tmp_path / "my_deit.pth"
    torch.save(timm.create_model("deit_tiny_patch16_224", pretrained=False).state_dict(), path)
    _load(qtbot, window, path)
    panel, s = window.controls.model_settings, window.session
    assert {"heads", "block_norm", "act"} <= panel.guessed() and s.model.spec.kind_of("num_heads") == "assumed"
    s.add_images([str(images[0])])
    qtbot.waitUntil(lambda: window.status.verdict_label.text().startswith("Matches timm "), timeout=60000)
    assert s.model.spec.kind_of("num_heads") == "verified" and s.model.spec.kind_of("block_norm") == "verified"
    assert [name for name, _ in s.model.spec.assumptions] == ["preprocess"]
    assert not {"heads", "block_norm", "act", "attn_scale"} & panel.guessed() and {"mean", "std"} <= panel.guessed()
    # the command line agrees: `vitviz info` shows the verdict the window's check remembered, and the same kinds
    import json

    from vitviz.cli import main

    capsys.readouterr()
    assert main(["info", str(path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["verification"]["summary"] == window.status.verdict_label.text()
    assert data["provenance_kinds"] == s.model.spec.kinds()


TIMM_CODE = '''import timm


def build():
    return timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, embed_dim=32,
                             depth=2, num_heads=2, num_classes=0)
'''


@pytest.mark.parametrize("shown", ["as computed", "heads swapped"])
def test_a_live_timm_model_gets_its_own_code_verdict(qtbot, window, images, tmp_path: Path,  # noqa: ANN001
                                                    monkeypatch: pytest.MonkeyPatch, shown: str) -> None:
    """A timm model built by the user's code runs live (nothing converted), and verify compares what vitviz records
    of it with timm's own record of its attention: the window asks for that verdict after the images, the line says
    "Checking against timm…", then verified; with the maps vitviz records changed (heads in another order), differs
    from layer 0, reported once; never the live line (`LIVE_LINE`, for a module verify cannot check) once due."""
    pytest.importorskip("timm")
    from vitviz.core.running.live.model import LiveModel
    from vitviz.gui.assumptions import LIVE_LINE

    if shown == "heads swapped":
        streamed = LiveModel.forward_streamed
        monkeypatch.setattr(LiveModel, "forward_streamed",
                            lambda self, x, each: streamed(self, x, lambda layer: each(layer.flip(1))))
    code_file = tmp_path / "my_timm.py"
    code_file.write_text(TIMM_CODE)
    window.trust_code = True
    lines, s = Lines(window), window.session
    with qtbot.waitSignal(s.model.model_loaded, timeout=60000):
        window.load_code(f"{code_file}:build")
    assert s.model.runs_own_code and s.model.own_original == "timm" and s.model.verify_due
    with qtbot.waitSignal(s.model.verification_changed, timeout=60000,
                          check_params_cb=lambda *a: s.model.verification is not None or bool(s.model.verify_failure)):
        s.add_images([str(images[0])])
    assert s.model.verify_failure == ""
    texts = [text for text, _level, _style in lines.seen]
    assert any(t.startswith("Checking against timm") for t in texts) and LIVE_LINE not in texts[-1:]
    label = window.status.verdict_label
    if shown == "as computed":
        assert s.model.verification.verdict == "verified" and label.text().startswith("Verified against timm")
        assert window.status.verdict.level == "verified" and window.reporter.errors == []
    else:
        assert s.model.verification.verdict == "differs" and s.model.verification.first_differing_layer == 0
        assert label.text() == "Differs from the original — from layer 0"
        assert [title for title, _ in window.reporter.errors] == [DIFFERS]
        window.reporter.box.close()
    assert s.verify_against() is None                     # nothing converted: no other original to choose
    wait_idle(qtbot, window)
