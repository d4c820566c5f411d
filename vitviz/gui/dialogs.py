"""Dialogs at the GUI boundary: errors with expandable details, and the overwrite question."""
from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QMessageBox, QWidget


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
