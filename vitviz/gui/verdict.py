"""Verify against…: check the loaded model against an original the user names -- a library architecture (the ones
whose shapes fit the model first, listed in the worker by `vitviz.core.reading.identify.candidate_names`) or their own code
(FILE.py:FACTORY, run only once they have agreed) -- remembered for the model file.

`VerifyAgainstDialog` is the question (no worker, no settings); `Verifier` is the window's part that asks for the
candidates (an `Identify` request: it reads the model with torch, so never on the GUI thread), opens the dialog,
remembers the answer for the file and turns it into a check (`Session.verify_against`). A remembered library
architecture is what the automatic check of that file compares with; remembered code is, once the user has agreed
to run it this session.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Callable

from PySide6.QtCore import QObject, QSettings
from PySide6.QtWidgets import (QButtonGroup, QCheckBox, QComboBox, QDialog, QDialogButtonBox, QFileDialog,
                               QGridLayout, QHBoxLayout, QLabel, QLineEdit, QPushButton, QRadioButton, QVBoxLayout,
                               QWidget)

from vitviz.gui import settings as st
from vitviz.gui.protocol import Candidates, Identify, Request
from vitviz.gui.session import Session

NOTE_STYLE = "color: #5f6368;"
ARCH_EXAMPLE = "timm:vit_small_patch16_224"
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
LIBRARIES = ("timm", "transformers", "open_clip", "torchvision")   # what the check takes alone ('auto' within it)
BY_ARCH = ("timm", "torchvision")        # the libraries it builds one named architecture of ('timm:NAME')

# confirm(code, weights, run): run the user's code only once they have agreed (the window's `confirm_code` route)
ConfirmCode = Callable[[str, "str | None", Callable[[], None]], None]


def valid_against(text: str) -> bool:
    """Whether `text` is what the check takes (`vitviz.core.analyses.verify.verify(against=)`): a library ('timm', 'open_clip')
    or an architecture of one that builds it by name ('timm:vit_small_patch16_224', 'torchvision:vit_b_16')."""
    library, sep, arch = text.strip().partition(":")
    return library in BY_ARCH and bool(arch.strip()) if sep else library in LIBRARIES


def code_of(file: str, factory: str) -> str:
    """'FILE.py:FACTORY' of a chosen file and factory; '' unless the file is a .py and the factory a name."""
    file, factory = file.strip(), factory.strip()
    return f"{file}:{factory}" if file.endswith(".py") and _IDENTIFIER.match(factory) else ""


class VerifyAgainstDialog(QDialog):
    """Which original to check the model `name` against: a library architecture (typed, or one of the candidates
    once `set_candidates` has them) or a file's factory; preselected with what was chosen for the file before."""

    def __init__(self, parent: QWidget | None, name: str, against: str = "auto", code: str = "") -> None:
        super().__init__(parent)
        self.setObjectName("verifyAgainstDialog")
        self.setWindowTitle("Verify against…")
        self.setMinimumWidth(520)
        layout = QVBoxLayout(self)
        intro = QLabel(f"Check {name} against an original implementation: vitviz runs it with the file's own "
                       "weights on a probe input and compares every layer's attention.")
        intro.setWordWrap(True)
        layout.addWidget(intro)
        self.library_radio = QRadioButton("A library's architecture")
        self.library_radio.setObjectName("verifyLibraryRadio")
        self.code_radio = QRadioButton("My own code (a .py file and the function that builds the model)")
        self.code_radio.setObjectName("verifyCodeRadio")
        group = QButtonGroup(self)
        group.addButton(self.library_radio)
        group.addButton(self.code_radio)
        layout.addWidget(self.library_radio)
        self.arch_combo = QComboBox()
        self.arch_combo.setObjectName("verifyArchCombo")
        self.arch_combo.setEditable(True)
        self.arch_combo.setMinimumContentsLength(34)
        self.arch_combo.lineEdit().setPlaceholderText(f"timm:NAME or torchvision:ARCH, e.g. {ARCH_EXAMPLE}")
        self.arch_note = QLabel("Looking for the architectures whose shapes fit this model…")
        self.arch_note.setObjectName("verifyArchNote")
        self.arch_note.setStyleSheet(NOTE_STYLE)
        self.arch_note.setWordWrap(True)
        indented = QGridLayout()
        indented.setContentsMargins(24, 0, 0, 0)
        indented.addWidget(self.arch_combo, 0, 0, 1, 2)
        indented.addWidget(self.arch_note, 1, 0, 1, 2)
        layout.addLayout(indented)
        layout.addWidget(self.code_radio)
        self.file_edit = QLineEdit()
        self.file_edit.setObjectName("verifyCodeFile")
        self.file_edit.setPlaceholderText("my_vit.py")
        browse = QPushButton("Browse…")
        browse.setObjectName("verifyCodeBrowse")
        browse.clicked.connect(self._browse)
        self.factory_edit = QLineEdit()
        self.factory_edit.setObjectName("verifyCodeFactory")
        self.factory_edit.setPlaceholderText("build_model")
        row = QHBoxLayout()
        row.addWidget(self.file_edit, 1)
        row.addWidget(browse)
        code_grid = QGridLayout()
        code_grid.setContentsMargins(24, 0, 0, 0)
        code_grid.addWidget(QLabel("File"), 0, 0)
        code_grid.addLayout(row, 0, 1)
        code_grid.addWidget(QLabel("Factory"), 1, 0)
        code_grid.addWidget(self.factory_edit, 1, 1)
        code_note = QLabel("vitviz asks before it runs the file's code; the file's weights are loaded into the "
                           "model the factory builds.")
        code_note.setStyleSheet(NOTE_STYLE)
        code_note.setWordWrap(True)
        code_grid.addWidget(code_note, 2, 0, 1, 2)
        layout.addLayout(code_grid)
        self.remember_check = QCheckBox("Remember for this model file")
        self.remember_check.setObjectName("verifyRemember")
        self.remember_check.setChecked(True)
        layout.addWidget(self.remember_check)
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        self.verify_button = self.buttons.button(QDialogButtonBox.StandardButton.Ok)
        self.verify_button.setText("Verify")
        self.verify_button.setObjectName("verifyButton")
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)
        layout.addWidget(self.buttons)
        file, _sep, factory = code.rpartition(":") if code else ("", "", "")
        self.file_edit.setText(file)
        self.factory_edit.setText(factory)
        if against and against != "auto":
            self.arch_combo.setEditText(against)
        (self.code_radio if code else self.library_radio).setChecked(True)
        for signal in (self.library_radio.toggled, self.arch_combo.editTextChanged, self.file_edit.textChanged,
                       self.factory_edit.textChanged):
            signal.connect(self._update)
        self._update()

    def set_candidates(self, names: list[str], available: bool = True, why: str = "") -> None:
        """The architectures that could be the model, best first (the first preselected unless a name was typed
        or remembered); `available` False: this vitviz cannot list them, a name is typed; `why`: listing failed."""
        typed = self.arch_combo.currentText()
        self.arch_combo.blockSignals(True)
        self.arch_combo.clear()
        self.arch_combo.addItems(names)
        self.arch_combo.setEditText(typed or (names[0] if names else ""))
        self.arch_combo.blockSignals(False)
        if why:
            self.arch_note.setText(f"Could not list the architectures ({why}): type one as timm:NAME.")
        elif not available:
            self.arch_note.setText(f"This vitviz cannot list architectures: type one as timm:NAME (e.g. "
                                   f"{ARCH_EXAMPLE}).")
        elif names:
            self.arch_note.setText(f"{len(names)} architecture{'s' if len(names) != 1 else ''} to choose from (what "
                                   "names the model first, then those whose shapes fit it); or type another as "
                                   "timm:NAME.")
        else:
            self.arch_note.setText("No library architecture fits this model's shapes: type one as timm:NAME, "
                                   "or check it against your own code.")
        self._update()
        self.adjustSize()             # the note may have grown a line

    def choice(self) -> tuple[str, str]:
        """(against, code): ('timm:vit_small_patch16_224', '') or ('auto', 'my_vit.py:build')."""
        if self.code_radio.isChecked():
            return "auto", code_of(self.file_edit.text(), self.factory_edit.text())
        return self.arch_combo.currentText().strip(), ""

    def remember(self) -> bool:
        return self.remember_check.isChecked()

    def _update(self) -> None:
        against, code = self.choice()
        self.verify_button.setEnabled(bool(code) if self.code_radio.isChecked() else valid_against(against))

    def _browse(self) -> None:
        file, _filter = QFileDialog.getOpenFileName(self, "The file that builds the model", "", "Python (*.py)")
        if file:
            self.file_edit.setText(file)
            self.code_radio.setChecked(True)


class Verifier(QObject):
    """The window's Verify against…: asks the worker for the candidates, opens the dialog, remembers the answer for
    the model file and starts the check. `confirm(code, weights, run)` calls `run` once the user has agreed to run
    `code` (the window's route for a file's code)."""

    def __init__(self, session: Session, settings: QSettings, parent: QWidget, confirm: ConfirmCode) -> None:
        super().__init__(parent)
        self.session, self.settings, self.parent_widget, self.confirm = session, settings, parent, confirm
        self.dialog: VerifyAgainstDialog | None = None
        self._asked: Request | None = None            # the Identify request the open dialog waits for
        session.route(Identify, self._on_candidates, self._on_candidates_failed)

    def open_dialog(self) -> VerifyAgainstDialog | None:
        """Verify against…: the dialog (None without a converted model: a model run from its own code is its own
        original), preselected with what was chosen for the file; the candidates come from the worker."""
        s = self.session
        if s.model.spec is None or s.model.runs_own_code:
            return None
        if self.dialog is not None:
            self.dialog.raise_()
            return self.dialog
        path = s.model.model_path
        against, code = st.remembered_original(self.settings, path)
        if against == "auto" and not code:
            against, code = s.model.verify_against, s.model.verify_code
        self.dialog = dialog = VerifyAgainstDialog(self.parent_widget, Path(path).name or path, against, code)
        dialog.accepted.connect(lambda: self._chosen(dialog, path))
        dialog.finished.connect(lambda _r: self._closed(dialog))
        self._asked = s.client.submit(Identify, first=True)
        dialog.open()
        return dialog

    def use_remembered(self) -> None:
        """A model has loaded: what the user chose to verify its file against is what the automatic check
        compares with (their code once they have agreed to run it: `trusted`)."""
        s = self.session
        if s.model.spec is None or not s.model.model_path:
            return
        against, code = st.remembered_original(self.settings, s.model.model_path)
        if not code:          # remembered code is preselected in the dialog: running it is never automatic
            s.model.verify_against = against

    def _chosen(self, dialog: VerifyAgainstDialog, path: str) -> None:
        s = self.session
        if path != s.model.model_path:
            return                          # another model has loaded meanwhile: the choice was about the old one
        against, code = dialog.choice()
        if dialog.remember():
            st.remember_original(self.settings, path, against, code)
        if code:
            self.confirm(code, path, lambda: s.verify_against(code=code) if path == s.model.model_path else None)
        else:
            s.verify_against(against)

    def _closed(self, dialog: VerifyAgainstDialog) -> None:
        if self.dialog is dialog:
            self.dialog, self._asked = None, None

    def _on_candidates(self, request: Request, answer: Candidates) -> None:
        if self.dialog is not None and request is self._asked:
            self.dialog.set_candidates(list(answer.names), answer.available)

    def _on_candidates_failed(self, request: Request, summary: str, _details: str) -> None:
        if self.dialog is not None and request is self._asked:
            self.dialog.set_candidates([], True, why=summary)
