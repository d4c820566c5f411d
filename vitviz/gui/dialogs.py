"""Dialogs at the GUI boundary: errors with expandable details, the overwrite question, what a model's file does
not say (`AssumptionsDialog`: heads, norm order, activation, attention scale), and whether to run a file's code
(`confirm_code`)."""
from __future__ import annotations

import html
from pathlib import Path
from typing import Any, Callable

from PySide6.QtCore import Qt
from PySide6.QtGui import QShowEvent
from PySide6.QtWidgets import (QCheckBox, QComboBox, QDialog, QDialogButtonBox, QFormLayout, QHBoxLayout, QLabel,
                               QMessageBox, QVBoxLayout, QWidget)

from vitviz.core.spec import ModelSpec
from vitviz.gui import assumptions

MAX_HEADS = 128     # the head counts offered: divisors of the attention width up to this
COMBO_NAMES = {"num_heads": "headsCombo", "block_norm": "normCombo", "mlp_kind": "actCombo",
               "attn_scale": "scaleCombo"}
GUESSED, ASSUMED_TAG = "the guess", "assumed"     # how the assumed choice is marked
CHOOSE = "choose…"                               # a head count guessed from the width: nothing preselected
KNOWN_TEXT = "I know this"                       # the per-setting confirmation beside each choice
KNOWN_TIP = ("Tick when you know the value shown is the model's: it is then used as yours (given), no longer "
             "assumed. Changing the choice ticks it; unticking puts the assumption back")
REASON_STYLE = "color: #5f6368;"          # the grey of the reason under each choice


def error_box(parent: QWidget, title: str, summary: str, details: str,
              informative: str | None = None) -> QMessageBox:
    """Open a window-modal, non-blocking message box: a one-line summary, the traceback under 'Show Details'."""
    box = QMessageBox(parent)
    box.setObjectName("errorBox")
    box.setIcon(QMessageBox.Icon.Warning)
    box.setWindowTitle(title)
    box.setText(summary)
    box.setInformativeText(informative or "Everything already loaded is still available.")
    box.setDetailedText(details)
    box.setStandardButtons(QMessageBox.StandardButton.Ok)
    box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose, True)
    box.open()
    return box


def confirm_overwrite(parent: QWidget, paths: list[Path]) -> bool:
    """Ask before replacing existing files; True when there is nothing to replace or the user agrees."""
    existing = [p for p in paths if p.exists()]
    if not existing:
        return True
    names = "\n".join(str(p) for p in existing[:8]) + ("\n…" if len(existing) > 8 else "")
    answer = QMessageBox.question(
        parent, "Replace files?", f"{len(existing)} file(s) already exist:\n{names}\n\nReplace them?",
        QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.No, QMessageBox.StandardButton.No)
    return answer == QMessageBox.StandardButton.Yes


def divisors(width: int, limit: int = MAX_HEADS) -> list[int]:
    """The head counts a width of `width` allows: its divisors up to `limit` (`width` itself at most)."""
    return [h for h in range(1, min(width, limit) + 1) if width % h == 0]


def guess_reason(spec: ModelSpec, name: str = "num_heads") -> str:
    """Why a value is assumed, from its provenance ('guess: width 32 / head_dim 32 (...)' -> 'width 32 / ...')."""
    return assumptions.reason(spec.source_of(name))


class AssumptionsDialog(QDialog):
    """"What the file does not say": every assumed setting that changes attention (`assumptions.asked`: the head
    count, the norm order, the activation, the attention scale), each with the assumption preselected (a head count
    guessed from the width alone is not: "choose…", the guess marked in the list), the reason under it and an
    "I know this" box beside it; the other assumptions listed; "Remember for this file", off until ticked.

    A setting becomes the user's word (a `vitviz.load` override, no longer assumed) only when they change it (which
    ticks its box) or tick its box: "Use my answers" (the default button) passes those alone, so pressing Enter
    never turns a guess into a given value; an unchanged, unticked setting stays assumed and flagged. Unticking a
    box puts the assumption back. "Keep the assumptions" (cancel) leaves every one as it is.

    Opened window-modal and non-blocking (`open()`); `accepted` / `rejected` say what the user did, `values()`
    and `remember()` what they chose. `prompted`: it opened by itself and nothing runs until it is answered (else
    it was asked for, "Review assumptions…", and an answer that changes something loads the model again).
    """

    def __init__(self, parent: QWidget, spec: ModelSpec, name: str, described: dict[str, str] | None = None,
                 prompted: bool = True, can_remember: bool = True) -> None:
        super().__init__(parent)
        self.setObjectName("assumptionsDialog")
        self.setWindowTitle("What the file does not say")
        self.setWindowModality(Qt.WindowModality.WindowModal)
        self.spec = spec
        self.fields = assumptions.asked(spec)
        described = described or {}
        layout = QVBoxLayout(self)
        intro = QLabel(f"<b>{html.escape(name)}</b> does not say everything its attention depends on, so vitviz "
                       "assumed the settings below (why, under each). Choose the ones the model was built with, or "
                       "tick <i>I know this</i> where the assumption is right: only those become yours; the others "
                       "stay assumed and marked."
                       + (" Nothing runs until you answer." if prompted else
                          " Changing them loads the model again and runs the images again."))
        intro.setWordWrap(True)
        intro.setObjectName("assumptionsText")
        layout.addWidget(intro)
        form = QFormLayout()
        form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)
        self.combos: dict[str, QComboBox] = {}
        self.confirms: dict[str, QCheckBox] = {}
        self.reasons: dict[str, QLabel] = {}
        self._assumed: dict[str, int] = {}        # the index each combo opened at (-1: nothing chosen)
        for field in self.fields:
            combo = self._combo(field)
            confirm = QCheckBox(KNOWN_TEXT)
            confirm.setObjectName(f"{field}Confirm")
            confirm.setToolTip(KNOWN_TIP)
            confirm.setEnabled(combo.currentIndex() >= 0)
            why = QLabel(f"<small>{html.escape(self._why(field))}</small>")
            why.setObjectName(f"{field}Reason")
            why.setWordWrap(True)
            why.setStyleSheet(REASON_STYLE)
            row = QHBoxLayout()
            row.addWidget(combo, 1)
            row.addWidget(confirm)
            column = QVBoxLayout()
            column.setSpacing(2)
            column.addLayout(row)
            column.addWidget(why)
            label = QLabel(f"<b>{assumptions.LABELS[field]}</b>")
            label.setToolTip(spec.source_of(field))
            form.addRow(label, column)
            self.combos[field], self.confirms[field], self.reasons[field] = combo, confirm, why
            self._assumed[field] = combo.currentIndex()
            combo.currentIndexChanged.connect(lambda _i, f=field: self._chosen(f))
            confirm.toggled.connect(lambda on, f=field: self._confirmed(f, on))
        layout.addLayout(form)
        others = [(f, src) for f, src in spec.assumptions if f not in self.fields]
        self.others = QLabel(self._others_html(others))
        self.others.setToolTip("\n".join(described[f] for f, _src in others if f in described))
        self.others.setObjectName("otherAssumptions")
        self.others.setWordWrap(True)
        self.others.setVisible(bool(others))
        layout.addWidget(self.others)
        self.remember_check = QCheckBox("Remember for this file")
        self.remember_check.setObjectName("rememberSettings")
        self.remember_check.setToolTip("Open this file with your answers from now on, in the window and on the command "
                                       "line, where they are said as remembered (forget them in the Controls "
                                       "panel's Model settings, or with vitviz info FILE --forget)")
        self.remember_check.setChecked(False)     # opted into: an answer is remembered only when asked to
        self.remember_check.setEnabled(can_remember)
        layout.addWidget(self.remember_check)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        use = buttons.button(QDialogButtonBox.StandardButton.Ok)
        use.setText("Use my answers")
        use.setObjectName("useAnswers")
        use.setToolTip("Use the settings you changed or ticked as yours; the others stay assumed")
        buttons.button(QDialogButtonBox.StandardButton.Cancel).setText("Keep the assumptions")
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        layout.addWidget(buttons)
        self.setMinimumWidth(640)
        self.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose, True)

    def showEvent(self, event: QShowEvent) -> None:  # noqa: N802 - Qt override
        """Tall enough for its wrapped text at the width it opens with: a dialog is sized by its layout's size hint,
        which ignores how high wrapped labels are at that width, and the Heads reason (two lines) got the height of
        one, its second line cut in half."""
        super().showEvent(event)
        need = self.layout().totalHeightForWidth(self.width())
        if need > self.height():
            self.resize(self.width(), need)

    def _combo(self, field: str) -> QComboBox:
        """The choices for one setting, the assumed value marked; preselected unless it is a head count guessed
        from the width alone (`ModelSpec.heads_guessed`), which shows "choose…" so that Enter cannot take it."""
        spec = self.spec
        combo = QComboBox()
        combo.setObjectName(COMBO_NAMES[field])
        # as wide as the row leaves it (its box beside it), not as its longest choice: that squeezed the labels
        combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        combo.setMinimumContentsLength(24)
        if field == "num_heads":
            width = spec.attn_width
            choices: list[tuple[Any, str]] = [(h, f"{h} head{'s' if h > 1 else ''} of {width // h} dims")
                                              for h in divisors(width)]
            current: Any = spec.num_heads
        elif field == "block_norm":
            choices, current = list(assumptions.NORM_ORDERS.items()), spec.block_norm
        elif field == "mlp_kind":
            choices, current = list(assumptions.ACTIVATIONS.items()), spec.mlp_kind
        else:
            choices, current = assumptions.scale_choices(spec), float(spec.attn_scale)
        for value, text in choices:
            combo.addItem(text + (f"   ({GUESSED if field == 'num_heads' else ASSUMED_TAG})" if value == current
                                  else ""), value)
        if field == "num_heads" and spec.heads_guessed:
            combo.setPlaceholderText(CHOOSE)
            combo.setCurrentIndex(-1)
        else:
            combo.setCurrentIndex(max(0, combo.findData(current)))
        return combo

    def _chosen(self, field: str) -> None:
        """A choice was made: a value other than the assumption (or any value where none was preselected) is the
        user's, its box ticked."""
        combo, confirm = self.combos[field], self.confirms[field]
        confirm.setEnabled(combo.currentIndex() >= 0)
        if combo.currentIndex() != self._assumed[field]:
            confirm.setChecked(True)

    def _confirmed(self, field: str, on: bool) -> None:
        """Unticking "I know this" puts the assumption back (what is shown is what is used)."""
        if on:
            return
        combo = self.combos[field]
        blocked = combo.blockSignals(True)
        combo.setCurrentIndex(self._assumed[field])
        combo.blockSignals(blocked)
        self.confirms[field].setEnabled(combo.currentIndex() >= 0)

    def _why(self, field: str) -> str:
        spec = self.spec
        why = guess_reason(spec, field)
        if field == "num_heads":
            return (f"vitviz guessed {spec.num_heads}: {why}. Every per-head map depends on it; the number divides "
                    f"the attention width {spec.attn_width}.")
        return f"Assumed: {why}."

    def _others_html(self, others: list[tuple[str, str]]) -> str:
        """The assumptions not asked here, one line each: 'eps = 1e-05: nn.LayerNorm's default (...)'."""
        if not others:
            return ""
        items = "".join(f"<li><b>{html.escape(assumptions.setting_text(self.spec, f))}</b>: "
                        f"{html.escape(assumptions.reason(src))}</li>" for f, src in others)
        return ("<small>Also assumed (Controls › Model settings, or the command line, change them):"
                f"<ul style='margin-left:-20px'>{items}</ul></small>")

    @property
    def combo(self) -> QComboBox | None:
        """The head-count choice (None when the head count is not asked)."""
        return self.combos.get("num_heads")

    def choose(self, field: str, value: Any) -> None:
        """Select `value` for `field` (as a user would: a value other than the assumption ticks its box)."""
        combo = self.combos[field]
        combo.setCurrentIndex(combo.findData(value))

    def confirm(self, field: str, known: bool = True) -> None:
        """Tick (or untick) `field`'s "I know this" (as a user would)."""
        self.confirms[field].setChecked(known)

    def values(self) -> dict[str, Any]:
        """The settings the user changed or ticked, as `vitviz.load` overrides ({'heads': 4, 'block_norm': 'post'});
        an unchanged, unticked one is left out: it stays assumed."""
        out: dict[str, Any] = {}
        for field, combo in self.combos.items():
            if not self.confirms[field].isChecked() or combo.currentIndex() < 0:
                continue
            value = combo.currentData()
            out[assumptions.ASKED[field]] = (int(value) if field == "num_heads" else float(value)
                                             if field == "attn_scale" else str(value))
        return out

    def heads(self) -> int:
        """The head count chosen (the loaded one when it is not asked or not answered)."""
        return int(self.values().get("heads", self.spec.num_heads))

    def remember(self) -> bool:
        return self.remember_check.isChecked() and self.remember_check.isEnabled()


def confirm_code(parent: QWidget, code: str, weights: str | None, on_run: Callable[[], None]) -> QMessageBox:
    """Ask before running the code of FILE.py:FACTORY (window-modal, non-blocking); `on_run` is called only when
    the user chooses to run it."""
    file, _sep, factory = code.rpartition(":")
    box = QMessageBox(parent)
    box.setObjectName("codeConfirmBox")
    box.setIcon(QMessageBox.Icon.Warning)
    box.setWindowTitle("Run this file's code?")
    box.setText(f"Build the model by running {Path(file).name}'s {factory}()?")
    box.setInformativeText(
        f"vitviz will import {file} and call {factory}() to build the model"
        + (f", then load the weights from {weights} into it (read as data, never executed)" if weights else "")
        + ". Importing a Python file runs its code with your permissions: only continue if you trust it.")
    run = box.addButton("Run the code", QMessageBox.ButtonRole.AcceptRole)
    box.addButton(QMessageBox.StandardButton.Cancel)
    box.setDefaultButton(QMessageBox.StandardButton.Cancel)
    run.setObjectName("runCodeButton")
    run.clicked.connect(on_run)
    box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose, True)
    box.open()
    return box
