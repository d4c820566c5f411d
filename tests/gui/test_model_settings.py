"""What a checkpoint does not say (issue 11 §2 in the window): a guessed head count is asked for in a dialog (the
divisors of the attention width, none preselected, "remember for this file" when ticked) before anything runs; the
Controls dock shows heads, norm order, activation, attention scale, image size, channels and mean/std with
assumptions marked, and a change reloads the model with those overrides in the worker. (The other assumed
settings in the same dialog: test_assumptions_window.py.)"""
from __future__ import annotations

import numpy as np
from _gui import HEADS, answer_heads, wait_idle
from PySide6.QtWidgets import QLabel

from vitviz.gui import settings as st
from vitviz.gui.dialogs import divisors
from vitviz.gui.protocol import Run


def _load_unsaid(qtbot, window, path, images):  # noqa: ANN001, ANN202
    """Load a file that holds no head count, with images waiting to run."""
    window.session.add_images([str(p) for p in images])
    with qtbot.waitSignal(window.session.model.assumptions_asked, timeout=20000):
        window.load_model(str(path))
    return window.assumptions_dialog


def test_a_guessed_head_count_is_asked_before_anything_runs(qtbot, window, tiny_ckpt, images) -> None:  # noqa: ANN001
    dialog = _load_unsaid(qtbot, window, tiny_ckpt, images[:2])
    s = window.session
    assert s.model.spec.heads_guessed and s.model.awaiting_answers and dialog.isVisible()
    assert s.client.pending(Run) == [] and s.result(str(images[0])) is None        # nothing ran on a guess
    offered = [dialog.combo.itemData(i) for i in range(dialog.combo.count())]
    assert offered == divisors(32) == [1, 2, 4, 8, 16, 32]
    # a head count from the width alone is not preselected (Enter cannot take it); the guess is marked in the list
    assert dialog.combo.currentIndex() == -1 and dialog.combo.placeholderText() == "choose…"
    assert "(the guess)" in dialog.combo.itemText(dialog.combo.findData(1)) and s.model.spec.num_heads == 1
    assert dialog.values() == {} and not dialog.confirms["num_heads"].isEnabled()
    assert "tiny.pth" in dialog.findChild(QLabel, "assumptionsText").text()
    assert "width 32" in dialog.findChild(QLabel, "num_headsReason").text()
    answer_heads(qtbot, window, HEADS, remember=True)                                 # reloads with heads=2
    assert s.model.spec.num_heads == HEADS and s.model.spec.source_of("num_heads").startswith("remembered")
    # the head count chosen is the user's word now; the settings left as preselected are still assumed
    assert not s.model.awaiting_answers and s.model.load_overrides == {"heads": HEADS}
    assert s.model.spec.kind_of("block_norm") == "assumed" and window.assumptions_dialog is None
    wait_idle(qtbot, window)
    result = s.result(str(images[0])).result
    assert result.attentions.shape[1] == HEADS
    assert st.remembered_heads(window.settings, str(tiny_ckpt)) == HEADS


def test_a_remembered_head_count_opens_the_file_unasked(qtbot, window, tiny_ckpt, images) -> None:  # noqa: ANN001
    st.remember_heads(window.settings, str(tiny_ckpt), 4)
    asked: list[object] = []
    window.session.model.assumptions_asked.connect(asked.append)
    with qtbot.waitSignal(window.session.model.model_loaded, timeout=20000):
        window.load_model(str(tiny_ckpt))
    window.session.add_images([str(images[0])])
    wait_idle(qtbot, window)
    assert asked == [] and window.assumptions_dialog is None
    assert window.session.model.spec.num_heads == 4 and window.session.result(str(images[0])) is not None
    assert any("4 attention heads, as chosen for tiny.pth" in n for n in window.notes)


def test_keeping_the_guess_runs_the_images_with_it(qtbot, window, tiny_ckpt, images) -> None:  # noqa: ANN001
    _load_unsaid(qtbot, window, tiny_ckpt, images[:1])
    answer_heads(qtbot, window, None)
    wait_idle(qtbot, window)
    s = window.session
    assert s.model.spec.num_heads == 1 and s.result(str(images[0])) is not None and not s.model.awaiting_answers
    assert st.remembered_heads(window.settings, str(tiny_ckpt)) is None
    panel = window.controls.model_settings
    assert panel.marks["heads"].isVisibleTo(panel)                                      # still a guess
    panel.mean_edit.setText("0.25")
    panel.mean_edit.textEdited.emit("0.25")
    with qtbot.waitSignal(s.model.model_loaded, timeout=20000):                               # kept: not asked again
        panel.apply()
    assert not s.model.awaiting_answers and window.assumptions_dialog is None and s.model.spec.preprocess.mean == (0.25,)
    wait_idle(qtbot, window)
    assert s.result(str(images[0])) is not None


def test_without_asking_the_guess_is_said(qtbot, window, tiny_ckpt, images) -> None:  # noqa: ANN001
    """--screenshot has nobody to ask: the guess is used and said (on stderr), as the CLI says it."""
    window.session.model.ask_assumptions = False
    with qtbot.waitSignal(window.session.model.model_loaded, timeout=20000):
        window.load_model(str(tiny_ckpt))
    window.session.add_images([str(images[0])])
    wait_idle(qtbot, window)
    assert window.assumptions_dialog is None and window.session.result(str(images[0])) is not None
    note = next(n for n in window.notes if "num_heads = 1 is a guess" in n)
    assert "--heads N" in note and "1, 2, 4, 8, 16, 32" in note


def test_controls_show_the_model_settings_with_guesses_marked(qtbot, loaded) -> None:  # noqa: ANN001
    w = loaded
    panel = w.controls.model_settings
    spec = w.session.model.spec
    assert panel.isEnabled() and panel.body.isVisible()                   # a guess unfolds them
    assert panel.heads_combo.currentData() == HEADS
    assert panel.size_edit.text() == "32" and panel.channels_label.text() == "3"
    assert panel.mean_edit.text() == "0" and panel.std_edit.text() == "1"
    # preprocessing guessed, heads given; a bare timm state dict names no model: timm's conventions are assumed
    assert panel.guessed() == {"mean", "std", "resize", "crop_mode", "block_norm", "act", "attn_scale"}
    assert not panel.marks["heads"].isVisible() and panel.marks["mean"].isVisible()
    assert "Assumed:" in panel.marks["mean"].toolTip() and "not an ImageNet model" in panel.marks["mean"].toolTip()
    assert panel.norm_combo.currentData() == "pre" and panel.act_combo.currentData() == "gelu"
    assert panel.scale_edit.text() == "" and panel.scale_edit.placeholderText() == "head_dim^-0.5 = 0.25"
    assert panel.marks["heads"].parentWidget().toolTip() == f"From: {spec.source_of('num_heads')}"
    assert not panel.apply_button.isEnabled()                             # nothing changed yet


def test_editing_the_settings_reloads_with_the_overrides(qtbot, loaded, images) -> None:  # noqa: ANN001
    w = loaded
    panel = w.controls.model_settings
    before = w.session.result(str(images[0])).result.input.copy()
    panel.mean_edit.setText("0.5")
    panel.mean_edit.textEdited.emit("0.5")
    panel.std_edit.setText("0.25, 0.25, 0.25")
    panel.std_edit.textEdited.emit("0.25, 0.25, 0.25")
    assert panel.changes() == {"mean": (0.5,), "std": (0.25, 0.25, 0.25)} and panel.apply_button.isEnabled()
    with qtbot.waitSignal(w.session.model.model_loaded, timeout=20000):
        panel.apply_button.click()
    s = w.session
    assert s.model.spec.preprocess.mean == (0.5,) and s.model.spec.preprocess.std == (0.25, 0.25, 0.25)
    assert s.model.load_overrides == {"heads": HEADS, "mean": (0.5,), "std": (0.25, 0.25, 0.25)}   # heads kept
    assert s.model.spec.source_of("preprocess").startswith("override") and not panel.marks["mean"].isVisible()
    wait_idle(qtbot, w)
    after = s.result(str(images[0])).result.input
    np.testing.assert_allclose(after, (before - 0.5) / 0.25, rtol=1e-5, atol=1e-5)      # re-run with them
    panel.heads_combo.setCurrentIndex(panel.heads_combo.findData(4))
    panel.heads_combo.activated.emit(panel.heads_combo.currentIndex())
    with qtbot.waitSignal(w.session.model.model_loaded, timeout=20000):
        panel.apply()
    assert s.model.spec.num_heads == 4 and s.model.load_overrides["heads"] == 4 and s.model.spec.preprocess.mean == (0.5,)


def test_a_bad_value_is_explained_and_not_applied(qtbot, loaded) -> None:  # noqa: ANN001
    panel = loaded.controls.model_settings
    panel.std_edit.setText("0.2, 0")
    panel.std_edit.textEdited.emit("0.2, 0")
    assert "Std" in panel.problem.text() and panel.problem.isVisible() and not panel.apply_button.isEnabled()
    panel.std_edit.setText("0, 1")
    panel.std_edit.textEdited.emit("0, 1")
    assert "expected 1 or 3 values" in panel.problem.text()
    panel.size_edit.setText("big")
    panel.size_edit.textEdited.emit("big")
    assert panel.problem.text().startswith("Image size")
    panel.reset()
    assert not panel.problem.isVisible() and panel.std_edit.text() == "1"
    requests: list[object] = []
    panel.overrides_requested.connect(requests.append)
    panel.apply()
    assert requests == []


def test_the_settings_rows_are_the_option_records() -> None:
    """Model settings' rows are keyed by the overrides they edit, each showing its record's provenance field and
    label (`Option.setting`); the dialog asks exactly the remembered records."""
    from vitviz.core.options import OPTION, REMEMBERABLE, setting_fields
    from vitviz.gui import assumptions
    from vitviz.gui.panels.model_settings import FIELD_SOURCES, LABELS

    assert {k: v for k, v in FIELD_SOURCES.items() if k != "in_chans"} == setting_fields()
    assert all(LABELS[name] == OPTION[name].setting for name in setting_fields())
    assert tuple(assumptions.ASKED.values()) == REMEMBERABLE
    assert all(OPTION[name].provenance_field == field for field, name in assumptions.ASKED.items())
    assert set(assumptions.SETTINGS_LABELS) == set(setting_fields()) - set(REMEMBERABLE)
