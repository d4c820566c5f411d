"""Guesses stay guesses until answered (issue 30): the "what the file does not say" dialog makes a setting the
user's (given) only when they change it or tick its "I know this"; its default button ("Use my answers", Enter) keeps
every other one assumed; "Remember for this file" is off until ticked; a head count guessed from the width alone is
not preselected. (The window around it: test_assumptions_window.py.)"""
from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
from _gui import wait_idle
from PySide6.QtCore import Qt
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QApplication, QWidget

from vitviz.core.spec import ModelSpec
from vitviz.gui.dialogs import CHOOSE, AssumptionsDialog


@pytest.fixture(scope="module")
def guessed_spec(tiny_ckpt: Path) -> ModelSpec:
    """A bare timm-layout state dict 32 wide: its head count is a guess from the width (1), its norm order,
    activation and attention scale are timm's conventions, assumed."""
    import vitviz

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return vitviz.load(tiny_ckpt, device="cpu").spec


@pytest.fixture
def parent(qtbot) -> QWidget:  # noqa: ANN001
    """The window the dialog is modal to (held here: a parentless widget is deleted with its last reference)."""
    widget = QWidget()
    qtbot.addWidget(widget)
    widget.show()
    return widget


def _dialog(qtbot, parent: QWidget, spec: ModelSpec, **kw: Any) -> AssumptionsDialog:  # noqa: ANN001
    dialog = AssumptionsDialog(parent, spec, "tiny.pth", **kw)
    dialog.open()
    qtbot.waitUntil(dialog.isVisible, timeout=5000)
    return dialog


def _enter(qtbot, dialog: AssumptionsDialog) -> dict[str, Any]:  # noqa: ANN001
    """Press Enter (the default button) and return what the dialog answered as it closed."""
    answered: dict[str, Any] = {}
    dialog.accepted.connect(lambda: answered.update(values=dialog.values(), remember=dialog.remember()))
    with qtbot.waitSignal(dialog.accepted, timeout=5000):
        QTest.keyClick(dialog, Qt.Key.Key_Return)
    return answered


def test_enter_with_nothing_changed_gives_no_setting(qtbot, parent: QWidget,  # noqa: ANN001
                                                     guessed_spec: ModelSpec) -> None:
    dialog = _dialog(qtbot, parent, guessed_spec)
    assert dialog.fields == ["num_heads", "block_norm", "mlp_kind", "attn_scale"]
    assert dialog.combos["block_norm"].currentData() == "pre"                # the assumption, preselected
    assert not any(box.isChecked() for box in dialog.confirms.values())
    assert dialog.findChild(QWidget, "useAnswers").text() == "Use my answers"
    assert _enter(qtbot, dialog) == {"values": {}, "remember": False}       # nothing became the user's word


def test_remember_is_off_until_ticked(qtbot, parent: QWidget, guessed_spec: ModelSpec) -> None:  # noqa: ANN001
    dialog = _dialog(qtbot, parent, guessed_spec)
    assert not dialog.remember_check.isChecked() and dialog.remember_check.isEnabled() and not dialog.remember()
    dialog.remember_check.setChecked(True)
    assert dialog.remember()
    dialog.reject()
    code = _dialog(qtbot, parent, guessed_spec, can_remember=False)   # a model built by code: nothing to key
    assert not code.remember_check.isChecked() and not code.remember_check.isEnabled()
    code.reject()


def test_changing_a_choice_makes_that_one_setting_given(qtbot, parent: QWidget,  # noqa: ANN001
                                                        guessed_spec: ModelSpec) -> None:
    dialog = _dialog(qtbot, parent, guessed_spec)
    dialog.choose("block_norm", "post")
    assert dialog.confirms["block_norm"].isChecked()                           # ticked by the change
    assert [f for f, box in dialog.confirms.items() if box.isChecked()] == ["block_norm"]
    assert dialog.values() == {"block_norm": "post"}
    dialog.confirm("block_norm", False)                                         # unticked: the assumption is back
    assert dialog.combos["block_norm"].currentData() == "pre" and dialog.values() == {}
    dialog.choose("mlp_kind", "relu")
    assert _enter(qtbot, dialog)["values"] == {"act": "relu"}


def test_i_know_this_confirms_the_assumed_value(qtbot, parent: QWidget,  # noqa: ANN001
                                                guessed_spec: ModelSpec) -> None:
    dialog = _dialog(qtbot, parent, guessed_spec)
    dialog.confirm("attn_scale")
    assert dialog.combos["attn_scale"].currentData() == 0.0                     # unchanged: confirmed as it is
    assert dialog.values() == {"attn_scale": 0.0}
    assert _enter(qtbot, dialog)["values"] == {"attn_scale": 0.0}


def test_a_head_count_guessed_from_the_width_is_not_preselected(qtbot, parent: QWidget,  # noqa: ANN001
                                                                guessed_spec: ModelSpec) -> None:
    assert guessed_spec.source_of("num_heads").startswith("guess: width 32")
    dialog = _dialog(qtbot, parent, guessed_spec)
    combo, box = dialog.combos["num_heads"], dialog.confirms["num_heads"]
    assert combo.currentIndex() == -1 and combo.placeholderText() == CHOOSE
    assert combo.itemText(combo.findData(guessed_spec.num_heads)).endswith("(the guess)")
    assert not box.isEnabled() and "heads" not in dialog.values()              # nothing to confirm yet
    dialog.choose("num_heads", 1)                                               # the guess, chosen: the user's word
    assert box.isChecked() and dialog.values() == {"heads": 1}
    dialog.confirm("num_heads", False)
    assert combo.currentIndex() == -1 and not box.isEnabled() and dialog.values() == {}
    dialog.choose("num_heads", 2)
    assert _enter(qtbot, dialog)["values"] == {"heads": 2}


def test_a_head_count_from_a_registered_size_table_is_preselected(qtbot, parent: QWidget) -> None:  # noqa: ANN001
    """A registered family's size table ('table: embed_dim 192', assumed while nothing names the model) is a
    convention, not a guess from the width: shown preselected, still only given when confirmed."""
    spec = ModelSpec(family="timm", source="x", image_size=(32, 32), patch_size=8, embed_dim=192, depth=1,
                     num_heads=3, provenance=(("num_heads", "table: embed_dim 192"),))
    dialog = _dialog(qtbot, parent, spec)
    combo = dialog.combos["num_heads"]
    assert combo.currentData() == 3 and combo.currentText().endswith("(the guess)")
    assert dialog.confirms["num_heads"].isEnabled() and dialog.values() == {}
    dialog.confirm("num_heads")
    assert dialog.values() == {"heads": 3}
    dialog.reject()


def test_the_assumptions_dialog_shows_each_reason_whole(qtbot, window, tmp_path: Path) -> None:  # noqa: ANN001
    """The 'what the file does not say' dialog gave the Heads reason (two lines: 'vitviz guessed 2: width 128 /
    head_dim 64 ... ') the height of about one: its second line was cut in half."""
    import torch
    from timm.models.vision_transformer import VisionTransformer

    torch.manual_seed(1)
    path = tmp_path / "mid_vit.pth"                           # 128 wide: the head count is a guess, so it asks
    torch.save(VisionTransformer(img_size=32, patch_size=8, embed_dim=128, depth=1, num_heads=4,
                                 num_classes=3).state_dict(), path)
    window.load_model(str(path))
    qtbot.waitUntil(lambda: window.assumptions_dialog is not None and window.assumptions_dialog.isVisible(),
                    timeout=20000)
    dialog = window.assumptions_dialog
    for _ in range(5):
        QApplication.processEvents()
    assert "num_heads" in dialog.reasons
    for field, label in dialog.reasons.items():
        need = label.heightForWidth(label.width())
        assert label.height() >= need, (field, label.height(), need, label.text())
    dialog.reject()
    wait_idle(qtbot, window)
