"""Dialogs at the GUI boundary: errors with expandable details, the overwrite question, how many heads a model has
when its file does not say (`HeadsDialog`), and whether to run a file's code (`confirm_code`)."""
from __future__ import annotations

import html
from pathlib import Path
from typing import Callable

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (QCheckBox, QComboBox, QDialog, QDialogButtonBox, QLabel, QMessageBox, QVBoxLayout,
                               QWidget)

from vitviz.core.spec import ModelSpec

MAX_HEADS = 128     # the head counts offered: divisors of the attention width up to this


def error_box(parent: QWidget, title: str, summary: str, details: str) -> QMessageBox:
    """Open a window-modal, non-blocking message box: a one-line summary, the traceback under 'Show Details'."""
    box = QMessageBox(parent)
    box.setObjectName("errorBox")
    box.setIcon(QMessageBox.Icon.Warning)
    box.setWindowTitle(title)
    box.setText(summary)
    box.setInformativeText("Everything already loaded is still available.")
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
    """Why a value is a guess, from its provenance ('guess: width 32 / head_dim 32 (...)' -> 'width 32 / ...')."""
    return spec.source_of(name).removeprefix("guess:").strip()


class HeadsDialog(QDialog):
    """Asks how many attention heads a model has when its file does not say (`ModelSpec.heads_guessed`): the
    divisors of the attention width, the guess (or `default`) chosen, and "Remember for this file".

    Opened window-modal and non-blocking (`open()`); `accepted` / `rejected` say what the user did, `heads()` and
    `remember()` what they chose. Cancel keeps the guess.
    """

    def __init__(self, parent: QWidget, spec: ModelSpec, name: str, default: int | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("headsDialog")
        self.setWindowTitle("How many attention heads?")
        self.setWindowModality(Qt.WindowModality.WindowModal)
        width = spec.attn_width
        layout = QVBoxLayout(self)
        text = QLabel(f"<b>{html.escape(name)}</b> does not say how many attention heads its layers have: the "
                      "number is in no tensor's shape, and no config beside the file gives it.<br><br>"
                      f"vitviz guessed <b>{spec.num_heads}</b>: {html.escape(guess_reason(spec))}. Every per-head "
                      "map depends on it, so choose the number the model was built with. It divides the "
                      f"attention width {width}. Nothing runs until you answer.")
        text.setWordWrap(True)
        text.setObjectName("headsText")
        layout.addWidget(text)
        self.combo = QComboBox()
        self.combo.setObjectName("headsCombo")
        for h in divisors(width):
            self.combo.addItem(f"{h} head{'s' if h > 1 else ''} of {width // h} dims"
                               + ("   (the guess)" if h == spec.num_heads else ""), h)
        chosen = default if default in divisors(width) else spec.num_heads
        self.combo.setCurrentIndex(max(0, self.combo.findData(chosen)))
        layout.addWidget(self.combo)
        self.remember_check = QCheckBox("Remember for this file")
        self.remember_check.setObjectName("rememberHeads")
        self.remember_check.setToolTip("Open this file with this head count from now on (change it in the Controls "
                                       "panel's Model settings)")
        self.remember_check.setChecked(True)
        layout.addWidget(self.remember_check)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        buttons.button(QDialogButtonBox.StandardButton.Ok).setText("Use these heads")
        buttons.button(QDialogButtonBox.StandardButton.Cancel).setText("Keep the guess")
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        layout.addWidget(buttons)
        self.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose, True)

    def heads(self) -> int:
        return int(self.combo.currentData())

    def remember(self) -> bool:
        return self.remember_check.isChecked()


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
