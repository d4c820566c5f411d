"""Head ablation and importance in the window: right-click a head's tile in the overview -> Ablate; the
Interventions dock shows the ablated run's top-5 beside the clean run's (Δ probability), undo, and the importance
grid of the current image (click a cell to ablate that head).

The work runs in the worker through the two request classes here (`Intervene`: one run of the current image with
the heads ablated; `HeadScan`: `vitviz.core.analyses.importance.head_importance`, batched, with progress), their
answers routed by `Session.route`; nothing here runs the model on the GUI thread. `InterventionSession` keeps the
ablated heads (in the order they were ablated, for undo) and the answers per image; the overview marks the
ablated tiles and the dock draws from it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtGui import QImage, QPixmap
from PySide6.QtWidgets import (QHBoxLayout, QLabel, QMenu, QPushButton, QScrollArea, QTableWidget,
                               QTableWidgetItem, QVBoxLayout, QWidget)

from vitviz.core.analyses.maps import ResultMaps
from vitviz.gui.protocol import Context, Request, _image_name

Head = tuple[int, int]


@dataclass(frozen=True, eq=False)
class Intervened:
    """The image run with `heads` ablated (zero): its maps, and what the result says was done."""

    image: str
    heads: tuple[Head, ...]
    maps: ResultMaps


@dataclass(frozen=True, eq=False)
class Scanned:
    """The current image's head importance (`HeadImportance`)."""

    image: str
    importance: Any


@dataclass(eq=False)
class Intervene(Request):
    """Run `image` with `heads` zero-ablated (`model.run(intervene=Ablate(heads))`); its maps are built when a
    panel asks for them (the dock reads only the probabilities)."""

    image: str = ""
    image_size: tuple[int, int] | None = None   # type: ignore[assignment]
    heads: tuple[Head, ...] = ()

    answer = Intervened
    title = "Could not ablate the heads"

    def describe(self) -> str:
        return f"Ablating {', '.join(f'L{l_}.H{h}' for l_, h in self.heads)} on {_image_name(self.image)}…"

    def __call__(self, ctx: Context) -> Intervened:
        from vitviz.core.running.interventions import Ablate

        model = self.model_of(ctx)
        result = model.run(self.image, image_size=self.image_size, intervene=Ablate(self.heads))
        return Intervened(self.image, self.heads, ResultMaps(result))


@dataclass(eq=False)
class HeadScan(Request):
    """Each head of the model ablated alone on `image` (zero; batched, progress reported): the importance grid."""

    image: str = ""
    image_size: tuple[int, int] | None = None   # type: ignore[assignment]

    answer = Scanned
    title = "Could not compute the head importance"

    def describe(self) -> str:
        return f"Head importance of {_image_name(self.image)}…"

    def __call__(self, ctx: Context) -> Scanned:
        from PySide6.QtCore import QThread

        from vitviz.core.analyses.importance import head_importance

        model = self.model_of(ctx)
        name = _image_name(self.image)

        def progress(done: int, total: int) -> None:
            ctx.report(f"Head importance of {name}: {done}/{total} heads ablated…", done / total)

        imp = head_importance(model, self.image, image_size=self.image_size, progress=progress,
                              cancel=QThread.currentThread().isInterruptionRequested)
        return Scanned(self.image, imp)


def _top(maps: ResultMaps | None, k: int = 5) -> list[tuple[int, str, float]]:
    return [] if maps is None else maps.result.top_k(k)


def _probability(maps: ResultMaps, index: int) -> float:
    z = maps.result.logits.astype(np.float64)
    p = np.exp(z - z.max())
    return float(p[index] / p.sum())


class InterventionSession(QObject):
    """The ablated heads and the worker's answers about them, per image; `changed` when either changes."""

    changed = Signal()
    wanted = Signal()     # a head was ablated or the importance asked for: the dock should be seen

    def __init__(self, session: Any, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.session = session
        self.heads: list[Head] = []                    # in the order they were ablated (undo pops the last)
        self.ablated: dict[str, Intervened] = {}       # image -> the latest answer for the current heads
        self.importance: dict[str, Scanned] = {}       # image -> its importance grid
        self.failure = ""
        session.route(Intervene, self._on_intervened, self._on_failed)
        session.route(HeadScan, self._on_scanned, self._on_failed)
        session.current_changed.connect(lambda _maps: self._ask())
        session.model_loaded.connect(lambda *_a: self.clear())

    @property
    def available(self) -> bool:
        """Whether the loaded model takes interventions: vitviz's reference ViT ('reference' capability)."""
        from vitviz.core.protocol import REFERENCE

        return self.session.spec is not None and REFERENCE in self.session.capabilities

    def toggle(self, layer: int, head: int) -> None:
        """Ablate (layer, head), or restore it when it is ablated."""
        pair = (int(layer), int(head))
        if pair in self.heads:
            self.heads.remove(pair)
        else:
            self.heads.append(pair)
            self.wanted.emit()
        self._changed_heads()

    def undo(self) -> None:
        """Restore the last head ablated."""
        if self.heads:
            self.heads.pop()
            self._changed_heads()

    def clear(self) -> None:
        """Restore every head (and forget the answers: a new model)."""
        self.heads, self.ablated, self.importance, self.failure = [], {}, {}, ""
        self.changed.emit()

    def scan(self) -> None:
        """Ask for the current image's importance grid."""
        path = self.session.current
        if path and self.available:
            self.wanted.emit()
            self.session.client.cancel(lambda r: r.kind is HeadScan)
            self.session.client.submit(HeadScan, image=path, image_size=self.session.image_size)

    def current(self) -> Intervened | None:
        """The ablated run of the current image for the current heads, when it has answered."""
        answer = self.ablated.get(self.session.current or "")
        return answer if answer is not None and list(answer.heads) == self.heads else None

    def current_importance(self) -> Any:
        answer = self.importance.get(self.session.current or "")
        return None if answer is None else answer.importance

    def _changed_heads(self) -> None:
        self.failure = ""
        self.changed.emit()
        self._ask()

    def _ask(self) -> None:
        path = self.session.current
        if not self.heads or not path or self.current() is not None or not self.available:
            self.changed.emit()
            return
        self.session.client.cancel(lambda r: r.kind is Intervene)
        self.session.client.submit(Intervene, first=True, image=path, image_size=self.session.image_size,
                                   heads=tuple(self.heads))

    def _on_intervened(self, _request: Request, answer: Intervened) -> None:
        self.ablated[answer.image] = answer
        self.changed.emit()

    def _on_scanned(self, _request: Request, answer: Scanned) -> None:
        self.importance[answer.image] = answer
        self.changed.emit()

    def _on_failed(self, _request: Request, summary: str, _details: str) -> None:
        self.failure = summary
        self.changed.emit()

    def menu(self, parent: QWidget, layer: int, head: int | str | None) -> QMenu | None:
        """The overview tile's context menu: Ablate / Restore this head, Undo, Restore all, the importance scan;
        None where there is nothing to ablate (a mean / max column, a model without the hook points)."""
        if not self.available or not isinstance(head, int) or not isinstance(layer, int):
            return None
        menu = QMenu(parent)
        ablated = (layer, head) in self.heads
        act = menu.addAction(f"{'Restore' if ablated else 'Ablate'} layer {layer}, head {head}")
        act.triggered.connect(lambda: self.toggle(layer, head))
        undo = menu.addAction("Undo last ablation")
        undo.setEnabled(bool(self.heads))
        undo.triggered.connect(self.undo)
        every = menu.addAction("Restore all heads")
        every.setEnabled(bool(self.heads))
        every.triggered.connect(self.clear_heads)
        menu.addSeparator()
        menu.addAction("Importance of every head").triggered.connect(self.scan)
        return menu

    def clear_heads(self) -> None:
        """Restore every head (the answers stay, for another ablation of the same heads)."""
        self.heads = []
        self._changed_heads()


class InterventionsPanel(QWidget):
    """The Interventions dock: the ablated heads with Undo, the clean and the ablated top-5 with Δ, and the
    importance grid of the current image (click a cell to ablate that head)."""

    def __init__(self, interventions: InterventionSession, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("interventionsPanel")
        self.iv = interventions
        self.heads_label = QLabel()
        self.heads_label.setWordWrap(True)
        self.undo_button = QPushButton("Undo")
        self.undo_button.clicked.connect(interventions.undo)
        self.clear_button = QPushButton("Restore all")
        self.clear_button.clicked.connect(interventions.clear_heads)
        self.table = QTableWidget(0, 4)
        self.table.setHorizontalHeaderLabels(["class", "clean", "ablated", "Δ"])
        self.table.verticalHeader().setVisible(False)
        self.table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        self.table.verticalHeader().setDefaultSectionSize(20)
        self.table.setMinimumWidth(260)
        self.scan_button = QPushButton("Importance of every head")
        self.scan_button.setToolTip("ablate each head alone on the current image (one forward per head, batched, "
                                    "in the worker): the drop of the top class's probability")
        self.scan_button.clicked.connect(interventions.scan)
        self.grid = QLabel()
        self.grid.setAlignment(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignTop)
        self.grid.mousePressEvent = self._grid_clicked   # type: ignore[method-assign]
        scroll = QScrollArea()
        scroll.setWidget(self.grid)
        scroll.setWidgetResizable(True)
        bar = QHBoxLayout()
        bar.addWidget(self.undo_button)
        bar.addWidget(self.clear_button)
        left = QVBoxLayout()      # below the image the dock is wide and short: the grid beside the table
        left.addWidget(self.heads_label)
        left.addLayout(bar)
        left.addWidget(self.table, 1)
        left.addWidget(self.scan_button)
        layout = QHBoxLayout(self)
        layout.addLayout(left)
        layout.addWidget(scroll, 1)
        self._imp: Any = None
        interventions.changed.connect(self.refresh)
        interventions.session.current_changed.connect(lambda _m: self.refresh())
        self.refresh()

    def refresh(self) -> None:
        iv = self.iv
        heads = ", ".join(f"L{l_}.H{h}" for l_, h in iv.heads)
        if not iv.available:
            text = "Interventions need vitviz's reference ViT (not a windowed model or a model run by its own code)"
        elif not iv.heads:
            text = "No head ablated: right-click a head's tile in the Overview → Ablate"
        elif iv.failure:
            text = f"Ablated {heads}: {iv.failure}"
        elif iv.current() is None:
            text = f"Ablating {heads}…"
        else:
            text = f"Ablated (zero): {heads}"
        self.heads_label.setText(text)
        self.undo_button.setEnabled(bool(iv.heads))
        self.clear_button.setEnabled(bool(iv.heads))
        self.scan_button.setEnabled(iv.available and bool(iv.session.current))
        self._fill_table()
        self._show_grid(iv.current_importance())

    def _fill_table(self) -> None:
        clean = self.iv.session.current_maps
        answer = self.iv.current()
        rows = _top(clean)
        self.table.setRowCount(len(rows))
        for i, (index, label, p) in enumerate(rows):
            after = _probability(answer.maps, index) if answer is not None else None
            cells = [label, f"{p:.3f}", "" if after is None else f"{after:.3f}",
                     "" if after is None else f"{after - p:+.3f}"]
            for j, text in enumerate(cells):
                self.table.setItem(i, j, QTableWidgetItem(text))
        self.table.resizeColumnsToContents()

    def _show_grid(self, imp: Any) -> None:
        if imp is self._imp:
            return
        self._imp = imp
        if imp is None:
            self.grid.setPixmap(QPixmap())
            self.grid.setText("")
            return
        from vitviz.core.drawing.importance import draw_importance

        rgb = np.ascontiguousarray(draw_importance(imp))
        image = QImage(rgb.data, rgb.shape[1], rgb.shape[0], 3 * rgb.shape[1], QImage.Format.Format_RGB888).copy()
        self.grid.setPixmap(QPixmap.fromImage(image))
        self.grid.setToolTip("click a cell of the exact grid to ablate (or restore) that head")

    def _grid_clicked(self, event: Any) -> None:
        from vitviz.core.drawing.importance import cell_at

        if self._imp is None:
            return
        cell = cell_at(self._imp, int(event.position().x()), int(event.position().y()))
        if cell is not None:
            self.iv.toggle(*cell)
