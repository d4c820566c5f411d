"""The images the window works on: their order, the current one, the runs that failed or were given up on, and how
far the current run of images has got.

State and its ordering rules (which image an addition shows, which becomes current when the current one is
removed, which given-up runs hold for a reloaded model, the seconds left), and the signals that say what changed
about the images and their runs: no worker, no model, no widgets, testable alone (a QObject for its signals; no
application is needed to emit them). The session (`vitviz.gui.session`) owns one, asks the worker for the runs and
emits the signals a run's answer makes (`add` says `images_added` itself); a panel that shows only the list is
built from this part.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, Iterable

from PySide6.QtCore import QObject, Signal

from vitviz.core.analyses.maps import ResultMaps


class ImageList(QObject):
    """The listed images (`paths`, in order), the `current` one ('' for none) and the failed runs (`failed`: path ->
    why), with the signals about them and their runs. `clock` gives the seconds the run estimate counts
    (`time.monotonic`)."""

    images_added = Signal(list)             # paths new in `paths`, in order
    images_removed = Signal(list)           # paths no longer in `paths`
    current_changed = Signal(object)        # the current image's ResultMaps as shown, or None (none, not run yet,
                                            # failed); also when what it shows changed (an intervention)
    run_started = Signal(str)               # image path
    result_ready = Signal(str)              # image path whose result (and head statistics) is now cached
    run_failed = Signal(str, str, str)      # image path, summary, details (the window shows the error)
    run_progress = Signal(int, int, float)  # runs answered and in all since the queue was last empty, seconds left

    def __init__(self, clock: Callable[[], float] = time.monotonic, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.paths: list[str] = []
        self.current = ""
        self.failed: dict[str, str] = {}
        self.given_up: dict[str, str] = {}   # images whose run was given up on (Stop waiting) -> why,
        self.given_up_model = ""             # for this model (they are not run again when it reloads)
        self.batch_done = 0                  # runs answered since the run queue was last empty
        self.batch_start = 0.0
        self.clock = clock
        self.current_maps: ResultMaps | None = None   # what `current_changed` last said (kept by the first slot)
        self.current_changed.connect(self._keep_current)

    def _keep_current(self, maps: ResultMaps | None) -> None:
        """Keep what the current image shows, so that a panel built later (or reading it between signals) needs
        only the image list; connected first, so every other slot of `current_changed` already sees it."""
        self.current_maps = maps

    # ------------------------------------------------------------------------------------------ the list

    def add(self, paths: Iterable[str], show: bool = False) -> tuple[list[str], str | None]:
        """Add the paths not listed yet, in order (`images_added`); returns them and the image to make current (None:
        it stays). The first added becomes current when none is; with `show` (the user opened or dropped them) the
        first of `paths`, whether it was listed already or not."""
        known = set(self.paths)
        named = list(dict.fromkeys(str(Path(p)) for p in paths))
        added = [p for p in named if p not in known]
        self.paths.extend(added)
        if added:
            self.images_added.emit(added)
        if named and (show or not self.current) and (added or show):
            return added, named[0] if show else added[0]
        return added, None

    def remove(self, paths: Iterable[str]) -> tuple[list[str], str | None]:
        """Take the listed ones of `paths` out with their failures; returns them and the image to make current
        (None: it stays): when the current one goes, the next one in the list, else the previous one, else ''."""
        gone = [p for p in dict.fromkeys(str(Path(p)) for p in paths) if p in self.paths]
        if not gone:
            return [], None
        drop = set(gone)
        order = self.paths
        self.paths = [p for p in order if p not in drop]
        for path in gone:
            self.failed.pop(path, None)
        if self.current not in drop:
            return gone, None
        i = order.index(self.current)
        after = [p for p in order[i + 1:] if p not in drop]
        before = [p for p in order[:i] if p not in drop]
        return gone, after[0] if after else before[-1] if before else ""

    def failed_paths(self) -> list[str]:
        """The listed images whose run failed, in order."""
        return [p for p in self.paths if p in self.failed]

    # ------------------------------------------------------------------------------------------ runs

    def begin_runs(self) -> None:
        """A new run of images begins (the run queue was empty): the counts and the estimate start again."""
        self.batch_done, self.batch_start = 0, self.clock()

    def answered(self) -> None:
        """A run was answered with its result."""
        self.batch_done += 1

    def fail(self, path: str, why: str) -> None:
        """A run failed: the image is not run again until the model or the size changes."""
        self.failed[path] = why
        self.batch_done += 1

    def give_up(self, path: str, why: str, model: str) -> None:
        """The run of `path` was given up on (Stop waiting) while `model` was loaded: it failed, and it stays
        failed when that model loads again (`restore_given_up`)."""
        if self.given_up_model != model:
            self.given_up, self.given_up_model = {}, model
        self.given_up[path] = why
        self.fail(path, why)

    def forget_failures(self) -> None:
        """Another model or input size: no failure holds (the given-up runs are remembered for their model)."""
        self.failed.clear()

    def restore_given_up(self, model: str) -> None:
        """`model` has loaded: the runs given up on for it are failed again (not run again, they would hang
        again); those of another model are dropped."""
        if self.given_up_model == model:
            self.failed.update(self.given_up)
        else:
            self.given_up, self.given_up_model = {}, ""

    def counts(self, pending: int) -> tuple[int, int]:
        """(answered, in all) of the runs since the run queue was last empty, `pending` still queued or running."""
        return self.batch_done, self.batch_done + pending

    def progress(self, pending: int) -> tuple[int, int, float]:
        """How far the current run of images has got: answered, in all, and an estimate of the seconds left (NaN
        until one has been answered). Once all are answered the count starts again."""
        done, total = self.counts(pending)
        elapsed = self.clock() - self.batch_start
        left = elapsed / done * (total - done) if done else float("nan")
        if done == total:
            self.batch_done = 0
        return done, total, left
