"""The Models menu: the bundled demo, Open by name… (a Hugging Face, timm or torchvision name), the ViT checkpoints
already on this computer, and torchvision's named models.

The listing comes from `vitviz.catalog.scan`, which the session runs in the worker thread (identifying a torchvision
file name reads torchvision's weights tables, which imports torch): on the first show of the menu, again on the next
show after a model was loaded or downloaded, and on Refresh. Until an answer arrives the menu shows what it had.
Folders the scan could not read (`ScanResult.skipped`) are named in a disabled item under the entries, with the
reasons in its tooltip, instead of failing the scan.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from PySide6.QtCore import QObject, QSettings, Signal
from PySide6.QtGui import QAction
from PySide6.QtWidgets import QMenu

from vitviz import catalog
from vitviz.gui import bundled, settings as st
from vitviz.gui.session import Session
from vitviz.gui.protocol import Cataloged, NamedRow

SKIPPED_TIP_LINES = 20                        # unreadable folders listed in the tooltip; the rest are counted


class ModelsMenu(QObject):
    """Fills `menu` from the session's latest listing; choosing an entry calls `choose(path or name)`, the demo
    entry `load_demo()`."""

    scanned = Signal()            # the menu now shows a fresh scan (or its failure)
    open_by_name = Signal()       # "Open by name…" was chosen (the window asks for the name)

    def __init__(self, session: Session, menu: QMenu, settings: QSettings, choose: Callable[[str], object],
                 load_demo: Callable[[], object], parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.session, self.menu, self.settings = session, menu, settings
        self._choose, self._load_demo = choose, load_demo
        self.entries: list[catalog.CatalogEntry] = []
        self.named: list[NamedRow] = []
        self.skipped: list[catalog.Skipped] = []      # what the latest scan could not read
        self.scanning = False
        self.stale = True
        self.failed = False
        self.listed = False           # a scan has answered at least once
        self.named_menu = QMenu("&Named models (torchvision)", menu)      # kept across refills
        self.named_menu.setObjectName("namedModelsMenu")
        self.named_menu.setToolTipsVisible(True)
        menu.setToolTipsVisible(True)
        self.refresh_action = QAction("&Refresh", self)
        self.refresh_action.setObjectName("refresh_models")
        self.refresh_action.setStatusTip("Look again for checkpoints in the torch hub and Hugging Face caches")
        self.refresh_action.triggered.connect(lambda _checked=False: self.refresh())
        self.by_name_action = QAction("Open by na&me…", self)
        self.by_name_action.setObjectName("open_by_name")
        self.by_name_action.setShortcut("Ctrl+Shift+N")
        self.by_name_action.setStatusTip("Load hf:ORG/NAME[@REVISION], timm:NAME[.TAG] or torchvision:ARCH[:WEIGHTS] "
                                         "from the cache, or download it")
        self.by_name_action.setToolTip("e.g. hf:facebook/dinov2-small, timm:vit_small_patch14_reg4_dinov2.lvd142m "
                                       "(only weights and config files are downloaded, never code); dropping such "
                                       "text on the window does the same")
        self.by_name_action.triggered.connect(lambda _checked=False: self.open_by_name.emit())
        self.extra: list[QAction] = []   # the window's own entries (Compare with…, Open training run…)
        menu.aboutToShow.connect(self._about_to_show)
        session.catalog_ready.connect(self._on_cataloged)
        session.catalog_failed.connect(self._on_failed)
        self.fill()

    def add_extra(self, actions: list[QAction]) -> None:
        """Entries of the window's own, kept after the demo and Open by name… through every refill."""
        self.extra = list(actions)
        self.fill()

    def refresh(self) -> None:
        """Scan again in the worker (ahead of queued runs); the menu keeps its entries until the answer."""
        if self.scanning:
            return
        self.scanning, self.failed = True, False
        self.session.list_models([p for p in st.recent_models(self.settings) if not bundled.is_demo(p)])
        self.fill()

    def mark_stale(self) -> None:
        """Scan again the next time the menu opens (a model was loaded: the recent list or the cache changed)."""
        self.stale = True

    def _about_to_show(self) -> None:
        if self.stale:
            self.stale = False
            self.refresh()

    def _on_cataloged(self, answer: Cataloged) -> None:
        self.entries, self.named = list(answer.entries), list(answer.named)
        self.skipped = list(getattr(answer.entries, "skipped", ()))   # a ScanResult; a plain list skips nothing
        self.scanning, self.listed = False, True
        self.fill()
        self.scanned.emit()

    def _on_failed(self) -> None:
        """The listing failed (the session shows the error)."""
        self.scanning, self.failed, self.stale = False, True, True
        self.fill()
        self.scanned.emit()

    # ---------------------------------------------------------------------------------------------- building

    def fill(self) -> None:
        menu = self.menu
        menu.clear()
        self._add_demo(menu)
        menu.addAction(self.by_name_action)
        if self.extra:
            menu.addSeparator()
            menu.addActions(self.extra)
        menu.addSeparator()
        self._note(menu, "On this computer (torch hub cache, Hugging Face cache, recent files):")
        for entry in self.entries:
            self._add_entry(menu, entry)
        if not self.entries:
            self._note(menu, self._empty_text())
        if self.skipped:
            self._add_skipped(menu)
        menu.addSeparator()
        self._add_named(self.named_menu)
        menu.addMenu(self.named_menu)
        menu.addSeparator()
        self.refresh_action.setEnabled(not self.scanning)
        menu.addAction(self.refresh_action)

    def _empty_text(self) -> str:
        if self.scanning or not self.listed:
            return "    Looking for checkpoints…"
        if self.failed:
            return "    Could not list the checkpoints (see the error)"
        return f"    None found in {_home(catalog.torch_hub_dir())} or {_home(catalog.hf_hub_dir())}"

    def _add_demo(self, menu: QMenu) -> None:
        demo = bundled.demo_model()
        action = menu.addAction(f"&Demo model ({bundled.DEMO_NAME})" if demo else "Demo model (not installed)")
        action.setObjectName("demo_model")
        action.setEnabled(demo is not None)
        action.setStatusTip("The small ViT vitviz ships, on its generated shapes images")
        action.triggered.connect(lambda _checked=False: self._load_demo())

    def _add_entry(self, menu: QMenu, entry: catalog.CatalogEntry) -> None:
        action = menu.addAction(f"{entry.name}\t{entry.family_text} · {entry.size_text} · {entry.source}")
        action.setData(str(entry.path))
        action.setToolTip("\n".join(x for x in (str(entry.path), entry.detail) if x))
        action.setStatusTip(str(entry.path))
        action.triggered.connect(lambda _checked=False, p=str(entry.path): self._choose(p))

    def _add_skipped(self, menu: QMenu) -> None:
        """One disabled item saying how many folders could not be read; its tooltip lists them with why."""
        n = len(self.skipped)
        action = menu.addAction(f"    Skipped {n} unreadable folder{'s' if n != 1 else ''} (hover for details)")
        action.setObjectName("skipped_folders")
        action.setEnabled(False)
        lines = [f"{_home(s.path)}: {s.reason}" for s in self.skipped[:SKIPPED_TIP_LINES]]
        if n > SKIPPED_TIP_LINES:
            lines.append(f"… and {n - SKIPPED_TIP_LINES} more")
        action.setToolTip("Could not read (left out of the list):\n" + "\n".join(lines))
        action.setStatusTip(f"{n} folder{'s' if n != 1 else ''} could not be read; hover for the list")

    def _add_named(self, sub: QMenu) -> None:
        sub.clear()
        if not self.named:
            self._note(sub, "Looking for named models…" if self.scanning or not self.listed else "None available")
        for name, cached, nbytes in self.named:
            arch, weights = name[len(catalog.NAMED_PREFIX):].split(":")
            where = "cached" if cached else f"download {catalog.format_size(nbytes)}"
            action = sub.addAction(f"{arch} · {weights}\t{where}")
            action.setData(name)
            action.setToolTip(cached or f"{name}: not downloaded yet; choosing it downloads it into "
                              f"{_home(catalog.torch_hub_dir())}")
            action.triggered.connect(lambda _checked=False, n=name: self._choose(n))

    @staticmethod
    def _note(menu: QMenu, text: str) -> None:
        action = menu.addAction(text)
        action.setEnabled(False)

    def actions_for(self) -> dict[str, QAction]:
        """The entries' actions by what they load (paths and named models); tests choose from these."""
        out = {}
        for action in self.menu.actions() + self.named_menu.actions():
            if action.data():
                out[str(action.data())] = action
        return out


def _home(path: Path) -> str:
    """A path with the home folder written as ~."""
    try:
        return "~/" + str(path.relative_to(Path.home()))
    except ValueError:
        return str(path)
