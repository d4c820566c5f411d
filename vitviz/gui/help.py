"""The Help menu's dialogs: the keyboard and mouse shortcuts, and About (what runs here, with versions).

The texts are plain functions (`shortcuts_html`, `versions`) so tests read them without opening a dialog. Nothing
here imports torch: its version comes from the worker's device probe when it has answered (`Probed`, with the
build suffix such as '+cu124'), else from the installed package's metadata.
"""
from __future__ import annotations

import html
import platform
import sys
from importlib import metadata
from typing import Iterable

from PySide6.QtCore import Qt, qVersion
from PySide6.QtGui import QAction
from PySide6.QtWidgets import QApplication, QDialog, QDialogButtonBox, QTextBrowser, QVBoxLayout, QWidget

from vitviz.gui.session import Session

MOUSE = (
    ("Click a patch", "make it the query token everywhere (click it again to clear)"),
    ("Hover the image", "row, column, token and value of the patch in the status bar; the position "
                        "embedding follows"),
    ("Click an overview tile", "select that layer and head"),
    ("Click a matrix row (Shift+click: column)", "make that token the query"),
    ("Click a head-statistics point", "select that layer and head"),
    ("Drop files or folders", "images are added; a checkpoint file or folder loads that model"),
    ("Drop text such as hf:ORG/NAME", "load that model by name (Models › Open by name…)"),
    ("Delete in the image list", "remove the selected images (right-click for more)"),
)


def _package_version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def versions(session: Session) -> list[tuple[str, str]]:
    """(what, version or description) for the About box: vitviz and what it runs on, and the device."""
    import numpy
    import pyqtgraph
    import PySide6

    import vitviz

    probed = session.probed
    torch_version = probed.torch_version if probed is not None and probed.torch_version else \
        _package_version("torch")
    rows = [("vitviz", vitviz.__version__), ("torch", torch_version),
            ("torchvision", _package_version("torchvision")), ("Qt", qVersion()), ("PySide6", PySide6.__version__),
            ("pyqtgraph", pyqtgraph.__version__), ("NumPy", numpy.__version__),
            ("Python", f"{platform.python_version()} ({sys.platform})")]
    return rows + [("device", device_text(session))]


def device_text(session: Session) -> str:
    """Where the model runs and what else is there, e.g. 'cuda (NVIDIA H200); also available: cpu'."""
    probed = session.probed
    names = dict(probed.names) if probed is not None else {}
    if session.model.device:
        now = f"{session.model.device} ({names[session.model.device]})" if session.model.device in names else session.model.device
        others = [d for d in (probed.devices if probed else ()) if d != session.model.device]
        return now + (f"; also available: {', '.join(others)}" if others else "")
    if probed is None:
        return "not known yet (the inference engine is starting)"
    return "no model loaded; available: " + ", ".join(f"{d} ({names[d]})" if d in names else d
                                                      for d in probed.devices)


def about_html(session: Session) -> str:
    rows = "".join(f"<tr><td>{html.escape(k)}</td><td><b>{html.escape(v)}</b></td></tr>" for k, v in versions(session))
    return ("<h3>vitviz</h3><p>See what a Vision Transformer attends to: every layer's and head's attention, "
            "rollout, the position embedding and head statistics, for the ViT checkpoints you already have.</p>"
            f"<table cellspacing='0' cellpadding='3'>{rows}</table>")


def shortcuts_html(actions: Iterable[QAction]) -> str:
    """Every action with a shortcut (as the menus show it), then what the mouse does."""
    keys = [(a.shortcut().toString(), a.text().replace("&", "").rstrip("…").rstrip(".")) for a in actions
            if not a.shortcut().isEmpty()]
    key_rows = "".join(f"<tr><td><b>{html.escape(k)}</b></td><td>{html.escape(t)}</td></tr>" for k, t in keys)
    mouse_rows = "".join(f"<tr><td><b>{html.escape(k)}</b></td><td>{html.escape(t)}</td></tr>" for k, t in MOUSE)
    return (f"<h3>Keyboard</h3><table cellspacing='0' cellpadding='3'>{key_rows}</table>"
            f"<h3>Mouse</h3><table cellspacing='0' cellpadding='3'>{mouse_rows}</table>")


def text_dialog(parent: QWidget, title: str, body: str, name: str) -> QDialog:
    """A non-modal dialog showing HTML, closed with its button or Escape (deleted on close)."""
    dialog = QDialog(parent)
    dialog.setObjectName(name)
    dialog.setWindowTitle(title)
    dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose, True)
    browser = QTextBrowser()
    browser.setOpenExternalLinks(True)
    browser.setHtml(body)
    buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
    buttons.rejected.connect(dialog.close)
    layout = QVBoxLayout(dialog)
    layout.addWidget(browser)
    layout.addWidget(buttons)
    dialog.resize(*text_dialog_size(browser, parent))
    dialog.show()
    return dialog


def text_dialog_size(browser: QTextBrowser, parent: QWidget | None, width: int = 640) -> tuple[int, int]:
    """A text dialog `width` px wide and as tall as its text laid out at that width (the shortcuts needed
    scrolling in a fixed 480 px), at most 85 % of the screen's height, at least 240 px."""
    doc = browser.document().clone()
    doc.setTextWidth(width - 40)                       # the browser's frame, margins and a scroll bar's room
    screen = (parent.screen() if parent is not None else None) or QApplication.primaryScreen()
    limit = int(screen.availableGeometry().height() * 0.85) if screen is not None else 800
    return width, max(240, min(limit, int(doc.size().height() * 1.1) + 90))   # + the button row and the frame
