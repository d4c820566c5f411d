"""A training run as a timeline in the window: the request classes that open a run folder and compute one
checkpoint's result in the worker, and the small session part that keeps the slider responsive.

The run's `vitviz.core.analyses.timeline.TimelineStore` is made in the worker and kept in its `slots` (`STORE_SLOT`); the GUI
thread holds the same object and asks it only what is held (`peek`, `series`, `missing`, `failed`: dictionary reads
under the store's lock, never a load or a forward pass). It draws a held result's maps itself (`ResultMaps.stack`,
which guards its caches with a lock of its own, as the worker measures the held results for the memory budget). `TimelineSession.show(k)` answers at once from `peek` when checkpoint
k's result is held; otherwise it asks the worker (`TimelineResult`), cancelling every superseded request so the
newest position wins, and then queues the neighbours and the checkpoints whose figures are still missing
(`missing(image, around=k)`), so the plots fill in and scrubbing back and forth finds results held.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from PySide6.QtCore import QFileSystemWatcher, QObject, Signal
from PySide6.QtWidgets import QFileDialog, QWidget

from vitviz.core.analyses.maps import ResultMaps
from vitviz.gui.docks import SideDock, action, ask_then, panel_of, register
from vitviz.gui.protocol import Context, Independent, LetGo, Request, _image_name, held, let_go

STORE_SLOT = "timeline"          # ctx.slots[STORE_SLOT] = (generation, TimelineStore)
PREFETCH = 2                     # neighbours on each side asked for ahead of the rest

# An answer holds what the work computed; what was asked (image, checkpoint, generation) is its request's, which
# the answer's handler is given beside it (`Session.route`).


@dataclass(frozen=True, eq=False)
class RunOpened:
    """The asked run folder opened as a timeline (nothing loaded yet): its store (read-only on the GUI thread)."""

    store: Any


@dataclass(frozen=True, eq=False)
class CheckpointRan:
    """The asked image's result at the asked checkpoint."""

    maps: ResultMaps


def _store(ctx: Context, generation: int) -> Any:
    return held(ctx, STORE_SLOT, generation, "this training run is not open any more")


@dataclass(eq=False)
class OpenRun(Independent):
    """Open a folder of checkpoints of one run (`TimelineStore`, memory budget `budget_bytes`); the checkpoints load
    on demand, with `overrides` (heads=, ...) for every one."""

    folder: str = ""
    budget_bytes: int = 1 << 30
    overrides: dict[str, Any] = field(default_factory=dict)
    generation: int = 0

    title = "Could not open the training run"

    def describe(self) -> str:
        return f"Opening the training run {Path(self.folder).name}…"

    def __call__(self, ctx: Context) -> RunOpened:
        from vitviz.core.analyses.timeline import TimelineStore, open_run

        let_go(ctx, STORE_SLOT)
        run = open_run(self.folder, **{k: v for k, v in self.overrides.items() if v is not None})
        store = TimelineStore(run, budget_bytes=self.budget_bytes)
        ctx.slots[STORE_SLOT] = (self.generation, store)
        return RunOpened(store)


@dataclass(eq=False)
class TimelineResult(Independent):
    """Image `image` at checkpoint `k` (loads the checkpoint if it is not held, runs the image): a `ResultMaps`."""

    k: int = 0
    image: str = ""
    generation: int = 0

    title = "Could not run the checkpoint"

    def describe(self) -> str:
        return f"Checkpoint {self.k} on {_image_name(self.image)}…"

    def __call__(self, ctx: Context) -> CheckpointRan:
        store = _store(ctx, self.generation)
        if self.image not in store.images:
            store.add_image(self.image, self.image)
        return CheckpointRan(store.result(self.k, self.image))


@dataclass(frozen=True)
class RunClosed:
    """The run's store was let go."""


@dataclass(eq=False)
class CloseRun(LetGo):
    """Let the run's store (its models and results) go."""

    answer = RunClosed
    slots = (STORE_SLOT,)

    def describe(self) -> str:
        return "Closing the training run…"


REQUESTS = (OpenRun, TimelineResult, CloseRun)


class TimelineSession(QObject):
    """The open run, the checkpoint shown and the requests behind it (see the module docstring).

    Signals:
        opened(): a run opened (or closed: `store` None).
        shown(k): checkpoint k of the current image is held now (`maps(k)` gives it) or failed (`failures`).
        figures(): more checkpoints of the current image are measured (the plots redraw).
        failed(title, summary): opening the run failed.
    """

    opened = Signal()
    shown = Signal(int)
    figures = Signal()
    failed = Signal(str, str)

    def __init__(self, session: Any, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.session = session
        self.client = session.client
        self.generation = 0
        self.store: Any = None
        self.folder = ""
        self.k = 0
        self.error = ""
        self.opening = False
        self.budget_bytes = 1 << 30
        self.overrides: dict[str, Any] = {}
        self.new_checkpoints = 0        # checkpoints written into the run's folder since it was opened
        self._watcher = QFileSystemWatcher(self)
        self._watcher.directoryChanged.connect(self._on_folder_changed)
        for kind, answer in ((OpenRun, self._on_opened), (TimelineResult, self._on_ran),
                             (CloseRun, lambda _r, _a: None)):
            session.route(kind, answer, self._on_failed)
        session.image_list.current_changed.connect(lambda _maps: self._on_current())
        session.image_list.images_removed.connect(self._on_removed)
        session.client.restarted.connect(self._on_restarted)

    # ------------------------------------------------------------------------------------------ intents
    def open(self, folder: str, keep_k: bool = False, **overrides: Any) -> None:
        """Open `folder` (checkpoints of one run) as a timeline; `overrides` (heads=...) go to every load;
        `keep_k`: stay at the checkpoint shown (a reload of the same run)."""
        self._forget()
        self.folder, self.opening, self.error = str(folder), True, ""
        self.k = self.k if keep_k else 0
        self._watch(str(folder))
        self.overrides = dict(overrides)
        self.client.submit(OpenRun, first=True, folder=str(folder), budget_bytes=self.budget_bytes,
                           overrides=dict(overrides), generation=self.generation)
        self.opened.emit()

    def close(self) -> None:
        if self.store is None and not self.opening:
            return
        self._forget()
        self.folder, self.opening, self.error = "", False, ""
        self._watch("")
        self.client.submit(CloseRun, first=True)
        self.opened.emit()

    def reload(self) -> None:
        """Open the same run again (its folder gained checkpoints), at the checkpoint shown."""
        if self.folder:
            self.open(self.folder, keep_k=True, **self.overrides)

    def _watch(self, folder: str) -> None:
        """Watch the run's folder (only it: a training run adds checkpoints there) for checkpoints added later."""
        self.new_checkpoints = 0
        if self._watcher.directories():
            self._watcher.removePaths(self._watcher.directories())
        if folder and Path(folder).is_dir():
            self._watcher.addPath(folder)

    def _on_folder_changed(self, _path: str) -> None:
        """The folder changed: count its checkpoints (a directory listing, no file read) against the run's; more
        of them are offered as a reload in the dock (reloading drops the results held, so the user chooses)."""
        if self.store is None:
            return
        from vitviz.core.analyses.timeline import find_checkpoints

        try:
            found, _order = find_checkpoints(self.folder)
        except Exception:  # noqa: BLE001 - the folder went away or became unreadable: nothing new to offer
            return
        held = {c.path for c in self.store.run.checkpoints}
        new = sum(1 for c in found if c.path not in held)
        if new != self.new_checkpoints:
            self.new_checkpoints = new
            self.opened.emit()

    def _forget(self) -> None:
        self.generation += 1
        self.client.cancel(lambda r: type(r) in (OpenRun, TimelineResult))
        self.store = None

    @property
    def image(self) -> str:
        return self.session.image_list.current

    def maps(self, k: int | None = None) -> ResultMaps | None:
        """The current image's result at checkpoint k (default: the one shown) if held; never computes."""
        if self.store is None or not self.image:
            return None
        return self.store.peek(self.k if k is None else k, self.image)

    def show(self, k: int) -> ResultMaps | None:
        """Show checkpoint k: its result when held (returned, and `shown(k)`), else asked of the worker, the
        newest request winning (superseded ones are cancelled), then the neighbours and the missing figures
        queued behind it. Never blocks."""
        store = self.store
        self.k = int(k)
        if store is None or not self.image:
            return None
        image, gen = self.image, self.generation
        if image not in store.images:
            store.add_image(image, image)          # a dictionary entry under the store's lock: nothing runs
        failed = store.failed
        held = store.peek(self.k, image)
        want = (self.k, image)
        self.client.cancel(lambda r: type(r) is TimelineResult and (r.k, r.image) != want)   # the newest wins
        self._shown_image = image
        if held is not None or self.k in failed:
            self.shown.emit(self.k)
        elif not any((r.k, r.image) == want for r in self.client.pending(TimelineResult)):  # type: ignore
            self.client.submit(TimelineResult, first=True, k=self.k, image=image, generation=gen)
        self._prefetch(image)
        return held

    def _prefetch(self, image: str) -> None:
        """Queue (behind everything else) the neighbours of the shown checkpoint not held, then the checkpoints whose
        figures are missing, nearest first."""
        store, k = self.store, self.k
        n = len(store)
        failed = store.failed
        near = [j for d in range(1, PREFETCH + 1) for j in (k + d, k - d) if 0 <= j < n]
        todo = [j for j in near if j not in failed and store.peek(j, image) is None]
        todo += [j for j in store.missing(image, around=k) if j not in todo and j != k]
        for j in todo:
            self.client.submit(TimelineResult, k=j, image=image, generation=self.generation)

    # ------------------------------------------------------------------------------------------ answers
    def _on_opened(self, request: OpenRun, answer: RunOpened) -> None:
        if request.generation != self.generation:
            return
        self.store, self.opening = answer.store, False
        if self.image:
            self.store.add_image(self.image, self.image)
        self.opened.emit()
        self.show(min(self.k, len(self.store) - 1))     # 0 for a new run; a reload stays where it was

    def _on_ran(self, request: TimelineResult, _answer: CheckpointRan) -> None:
        if request.generation != self.generation:
            return
        if request.image == self.image:
            self.figures.emit()
            if request.k == self.k:
                self.shown.emit(request.k)

    def _on_failed(self, request: Request, summary: str, _details: str) -> None:
        if isinstance(request, OpenRun):
            if request.generation == self.generation:
                self.opening, self.error = False, summary
                self.failed.emit(request.title, summary)
                self.opened.emit()
            return
        if isinstance(request, TimelineResult) and request.generation == self.generation:
            if request.image == self.image:        # the store has recorded why (`failed`): the dock names it
                self.figures.emit()
                if request.k == self.k:
                    self.shown.emit(request.k)

    _shown_image = ""

    def _on_restarted(self) -> None:
        """A fresh worker (Stop waiting) holds no open run: the timeline closes, and the status bar says so."""
        if self.store is None and not self.opening:
            return
        name = Path(self.folder).name or self.folder
        self.close()       # its CloseRun finds nothing to let go in the fresh worker
        self.session.note.emit(f"The training run {name} was closed: the worker was started afresh (Stop waiting) "
                               "and its checkpoints went with it — Models › Open training run… opens it again")

    def _on_current(self) -> None:
        """Another current image: show it at the same checkpoint."""
        if self.store is not None and self.image and self.image != self._shown_image:
            self.show(self.k)

    def _on_removed(self, paths: list[str]) -> None:
        if self.store is not None:
            for path in paths:
                self.store.remove_image(path)


def _ask_for_run(window: QWidget) -> str:
    """A training run's folder, asked for with a folder dialog ('' when cancelled)."""
    return QFileDialog.getExistingDirectory(window, "Open a training run (a folder of checkpoints)")


register(SideDock(
    "timelineDock", "Timeline", "Training run timeline",
    "a run's checkpoints on the current image, with plots against step (Models › Open training run…)",
    attribute="timeline", part=lambda window: TimelineSession(window.session, window),
    panel=panel_of("vitviz.gui.panels.timeline:TimelinePanel"), order=20,
    work=lambda part: bool(part.folder), work_changed="opened",
    actions=lambda window, _part: [action(
        window, "Open &training run…", "open_training_run", "Open a folder of checkpoints of one training run as a "
        "timeline", ask_then(window, _ask_for_run, window.open_run))]))
