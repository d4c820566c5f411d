"""The session: the one owner of what the window works on, composed of small parts -- the loaded model
(`model`, a `ModelSlot`: spec, device, what it was loaded with, its verdict, input size, position embedding), the
images (`image_list`, an `ImageList`: order, current image, failed runs, run progress), their results (`results`, a
`ResultCache`, and the per-image head statistics) and the on-demand passes (`PassStore`s).

The session itself is intents and answers: it turns user intents (load this checkpoint, run these images, show
this one, move to CUDA, use another input size) into worker requests, routes each answer to the part it changes
and says so by that part's signals (napari's `viewer.layers` / `viewer.dims`): what is about the model is said by
`model` (`model_loaded`, `loading_changed`, `verification_changed`, `size_changed`, `pos_embed_ready`, ...), what is
about the images and their runs by `image_list` (`images_added`, `current_changed`: what the current image shows
changed, `result_ready`, `run_failed`, ...); the session's own signals are the worker's (status, busy, progress,
stuck), errors, notes, the devices and the catalog. Panels subscribe to the part they show the way they subscribe to
`ViewState`, and a panel that needs no more is built from that part alone. The parts are its surface: read them
where they are defined (`session.model.spec`, `session.image_list.paths`), never through forwarded names. No widgets
here.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from PySide6.QtCore import QCoreApplication, QObject, Signal

from vitviz.core.analyses.maps import ResultMaps
from vitviz.gui import assumptions
from vitviz.gui.analyses import FeatureAnalyses
from vitviz.gui.cache import ResultCache
from vitviz.gui.client import WorkerClient
from vitviz.gui.images import ImageList
from vitviz.gui.model_slot import ModelSlot
from vitviz.gui.passes import PassStore
from vitviz.gui.protocol import (Catalog, Cataloged, Features, Load, Loaded, Move, Moved, PassRequest, PosEmbed,
                                 PosEmbedded, Probe, Probed, Ran, Relevance, Request, Run, Text, Verified, Verify)

DEFAULT_CACHE_BYTES = 2 * 1024 ** 3
STOP_WAITING_S = 30.0    # after this long a request running the user's own code offers Stop waiting (settings)
LOAD_FAILED = Load.title                 # the error title of a failed load (`--screenshot` exits 2 for it)
DEVICE_FAILED = "Device not available"   # a load's device was refused; the model runs on the CPU (exit 2 too)

HeadStats = tuple[np.ndarray, np.ndarray, np.ndarray]   # (L, H) distance, (L, H) entropy, (L, H, P + 1) by token kind


class Session(QObject):
    """Owns the worker client and the parts -- `model` (ModelSlot), `image_list` (ImageList), `results`
    (ResultCache), the pass stores -- and turns intents into requests and answers into the parts and their signals
    (emitted in the order the panels need: a new model's `current_changed(None)` before its `model_loaded`). Its own
    signals are about the session itself, never a part's."""

    error = Signal(str, str, str)           # dialog title, summary, details
    note = Signal(str)                      # something to tell the user that is not an error
    devices_found = Signal(object)          # list of device names
    catalog_ready = Signal(object)          # Cataloged: the models on this computer and the named ones
    catalog_failed = Signal()               # listing them failed (the error is shown like any other)
    status = Signal(str)                    # what the worker is doing (the status bar), 'Ready' when idle
    busy_changed = Signal(bool)             # the worker started (True) or ran out of (False) requests (a quiet
                                            # one, `Request.quiet`, said only when it runs long)
    progress = Signal(str, float)           # what the running request is doing, fraction done (-1: unknown)
    stuck = Signal(str)                     # the user's code has run `stop_waiting_after` s unanswered: what it
                                            # is doing ('' once it has answered or was given up on)

    def __init__(self, cache_bytes: int = DEFAULT_CACHE_BYTES, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.client = WorkerClient(self)
        self.model = ModelSlot(self)                # the loaded model, how it loads, its size and verdict
        self.image_list = ImageList(parent=self)    # the images, the current one, failed runs, run progress
        self.probed: Probed | None = None           # the devices found and the torch running them (Help › About)
        self.results = ResultCache(cache_bytes)   # image path -> its ResultMaps, within a memory budget
        self.intervened: dict[str, ResultMaps] = {}   # image path -> its intervened run, shown instead of `results`
                                                      # (`vitviz.gui.interventions`: every panel shows it)
        self.half_maps = False                    # runs keep their maps as float16 (`set_half_maps`)
        self.precompute: tuple[Any, ...] = ()      # map kinds runs make in the worker too (the view's: `Run.also`)
        self.head_stats: dict[str, HeadStats] = {}   # every image run at this model and size (outlives the cache)
        # the on-demand passes of a cached result (`ready` / `failed` signals, `request`, `pending`, `failures`)
        self.relevance_pass = PassStore(self, Relevance)   # keyed by class (None: the top class)
        self.text_pass = PassStore(self, Text)             # keyed by prompt
        self.features_pass = PassStore(self, Features)     # no key (None)
        self.passes: dict[type, PassStore] = {Relevance: self.relevance_pass, Text: self.text_pass,
                                              Features: self.features_pass}
        c = self.client
        c.user_code = self.runs_user_code
        c.stop_waiting_after = STOP_WAITING_S
        c.stuck.connect(self._on_stuck)
        c.status.connect(self.status)
        c.busy_changed.connect(self.busy_changed)
        c.progressed.connect(self._on_progressed)
        c.unstuck.connect(lambda: self.stuck.emit(""))
        self._routes: dict[type, Any] = {
            Probe: self._on_probed, Load: self._on_loaded, Run: self._on_ran, PosEmbed: self._on_posembedded,
            Catalog: self._on_cataloged, Move: self._on_moved, Verify: self._on_verified,
            **{kind: store.answer for kind, store in self.passes.items()}}
        self._failure_routes: dict[type, Any] = {
            Probe: self._probe_failed, Load: self._load_failed, Run: self._run_failed,
            PosEmbed: self._posembed_failed, Catalog: self._catalog_failed, Move: self._move_failed,
            Verify: self._verify_failed, **{kind: self._pass_failed for kind in self.passes}}
        self._waiting_shown = False               # the verdict line says the check waits for the images
        self.analyses = FeatureAnalyses(self)       # the Features dock's PCA, similarity and share (routed there)
        c.answered.connect(self._on_answered)
        c.failed.connect(self._on_failed)
        c.dropped.connect(self._on_dropped)
        app = QCoreApplication.instance()
        if app is not None:
            app.aboutToQuit.connect(self.shutdown)   # never leave the worker thread running at exit

    # ------------------------------------------------------------------------------------------ reading

    @property
    def busy(self) -> bool:
        return self.client.busy

    def _pending_load(self) -> str:
        """The path or name of the last load queued or running ('' when none is): what `model.loading` says."""
        loads = self.client.pending(Load)
        return str(loads[-1].path or loads[-1].code or "") if loads else ""

    def run_counts(self) -> tuple[int, int]:
        """(answered, in all) of the runs since the run queue was last empty."""
        return self.image_list.counts(len(self.client.pending(Run)))

    def show_current(self) -> None:
        """Tell the panels what the current image shows now (`current_changed`, which the image list keeps as its
        `current_maps`): its intervened run while there is one, else its cached result, or None."""
        path = self.image_list.current
        self.image_list.current_changed.emit(self.shown(path) if path else None)

    def shown(self, path: str) -> ResultMaps | None:
        """What the panels show of an image: its intervened run (`intervened`), else its cached result (marked
        as recently used), or None."""
        return self.intervened.get(path) or self.results.use(path)

    def cached(self, path: str) -> ResultMaps | None:
        """The cached result of an image, or None (without marking it as recently used)."""
        return self.results.get(path)

    def result(self, path: str) -> ResultMaps | None:
        """The cached result of an image (marked as recently used), or None."""
        return self.results.use(path)

    @property
    def cache_bytes(self) -> int:
        """The memory budget of the cached results."""
        return self.results.budget

    @cache_bytes.setter
    def cache_bytes(self, budget: int) -> None:
        self.results.budget = int(budget)

    @property
    def cache_nbytes(self) -> int:
        """Memory held by the cached results (attention, the passes added and the maps derived from them)."""
        return self.results.nbytes

    def cached_paths(self) -> list[str]:
        return self.results.paths()

    @property
    def stop_waiting_after(self) -> float | None:
        """Seconds a request running the user's own code may run before Stop waiting is offered (None: never)."""
        return self.client.stop_waiting_after

    @stop_waiting_after.setter
    def stop_waiting_after(self, seconds: float | None) -> None:
        self.client.stop_waiting_after = seconds

    def runs_user_code(self, request: Request) -> bool:
        """Whether `request` runs the user's own code: a load with code=, or anything run by a model built from
        it (the live path)."""
        if isinstance(request, Load):
            return bool(request.code)
        return bool(request.user_code) and self.model.built_by_code

    # ------------------------------------------------------------------------------------------ intents

    def cancel_download(self) -> None:
        """Stop the named model's download that is running (the model loaded before stays)."""
        self.client.cancel_download()

    def stop_waiting(self) -> None:
        """Give up on the user's code that has not finished: its worker is abandoned (it may still run in the
        background until its code returns), a fresh worker starts and the model loaded before is loaded again;
        an image whose run was given up on is marked failed and not run again for this model. The status says
        what happened (`note`)."""
        request = self.client.restart()
        self.stuck.emit("")
        if request is None:
            return
        seconds = self.stop_waiting_after or 0.0
        what = _doing(request)
        previous = self.model.model_path
        if request.kind is Load:
            self.model.set_loading(self._pending_load())
        elif request.kind is Run:
            path = str(request.image)
            why = (f"stopped waiting after {seconds:g} s: the model's own code did not finish running "
                   f"{Path(path).name}")
            self.image_list.give_up(path, why, previous)
            if path == self.image_list.current:
                self.image_list.current_changed.emit(None)
            self._report_runs()
        elif isinstance(request, PassRequest):
            self.passes[request.kind].remember(request, "stopped waiting: the model's own code did not finish")
        elif request.kind is Verify:
            self.model.verify_failure = "stopped waiting: the model's own code did not finish"
            self.model.verify_progress = None
            self.model.verification_changed.emit()
        if self.model.spec is None:
            self.note.emit(f"Stopped waiting for {what} after {seconds:g} s (its code may still run in the "
                           "background); no model was loaded before")
            return
        self.note.emit(f"Stopped waiting for {what} after {seconds:g} s (its code may still run in the "
                       f"background); loading {Path(previous).name or previous} again in a fresh worker")
        self.reload()

    # ------------------------------------------------------------------------------------------ intents (models)

    def probe_devices(self) -> None:
        """Ask the worker which devices exist (this is also what first imports torch, off the GUI thread)."""
        self.client.submit(Probe)

    def load_model(self, path: str | None, device: str | None = None, **overrides: Any) -> Request:
        """Load a checkpoint on `device` (else `device_preference`); what is loaded now stays until the new model
        has loaded successfully. `code='FILE.py:FACTORY'` builds the model by running that file's code (the
        window asks the user first), `path` then being its weights file or None."""
        request = self.client.submit(Load, path=str(path) if path else "",
                                     device=device or self.model.device_preference, **overrides)
        self.model.set_loading(self._pending_load())
        return request

    def reload(self, **changes: Any) -> Request | None:
        """Load the current model again with its overrides and `changes` (heads=, image_size=, mean=, std=,
        resize=, crop_mode=; None removes one); None when no model is loaded."""
        if self.model.spec is None:
            return None
        path, overrides = self.model.reload_args(changes)
        return self.load_model(path, device=self.model.device or None, **overrides)

    def answer_assumptions(self, changes: dict[str, Any] | None) -> None:
        """The user's answer to `assumptions_asked`: `changes` (overrides such as heads=, block_norm=, act=,
        attn_scale=) reload the model with them, now the user's word, not assumed; None (keep the assumptions)
        lets the images run as loaded. Either way the model is not asked about again when it reloads."""
        if not self.model.awaiting_answers or self.model.spec is None:
            return
        self.model.kept.add(self.model.model_path)
        if self.model.changes_anything(changes):
            self.reload(**changes)                 # answered when it has loaded
            return
        self.model.awaiting_answers = False
        self.ensure_all()

    @property
    def verifying(self) -> bool:
        """Whether the check of the loaded model against its original is on its way."""
        return bool(self.client.pending(Verify))

    @property
    def verify_waiting(self) -> bool:
        """Whether the check is due and waits for the images queued before it (`_verify`)."""
        return self.model.verify_due and bool(self.client.pending(Run)) and not self.client.pending(Load)

    def verdict_line(self) -> assumptions.VerdictLine:
        """The loaded model's verdict line as the status bar and Model info show it: the check's answer, "Checking
        against timm… 1/2 sizes" while it is on its way (or waits for the images), else what is assumed."""
        m = self.model
        waiting = self.verify_waiting
        progress = assumptions.progress_text(*m.verify_progress) if m.verify_progress else ""
        return assumptions.verdict_line(self.model.spec, self.model.verification, self.model.verify_failure,
                                        self.verifying or waiting, m.original_name(), progress,
                                        waiting and not self.verifying)

    def verify_against(self, against: str = "auto", code: str | None = None) -> Request | None:
        """Check the loaded model against another original now (Verify against…): a library architecture
        ('timm:vit_small_patch16_224', or a library: 'timm') or the user's code ('FILE.py:FACTORY'; the window has
        asked before running it). The verdict before is withdrawn, a check on its way is dropped; None without a
        model, or for a model that runs from its own code (it is the original)."""
        if self.model.spec is None or self.model.runs_own_code:
            return None
        m = self.model
        self.client.cancel(lambda r: r.kind is Verify)
        m.verify_against, m.verify_code = (against or "auto", str(code or ""))
        m.verification, m.verify_failure, m.verify_progress, m.verify_asked = None, "", None, True
        against_, code_ = m.checks_against
        request = self.client.submit(Verify, code=code_ or None, against=against_)
        self.model.verification_changed.emit()
        return request

    def set_device(self, device: str) -> None:
        if self.model.spec is not None and device != self.model.device:
            self.client.submit(Move, device=device)

    def list_models(self, recent: list[str]) -> None:
        """Look for the models on this computer (and `recent` files), ahead of queued runs; answered by
        `catalog_ready` or `catalog_failed`."""
        self.client.submit(Catalog, first=True, recent=recent)

    def add_images(self, paths: list[str], show: bool = False) -> list[str]:
        """Add images not already listed and run them (the current one first); the first added becomes current
        when none is, and with `show` (the user opened or dropped them) the first of `paths` becomes current
        whether it was listed already or not. Returns the paths added."""
        added, current = self.image_list.add(paths, show)    # says `images_added`
        if current is not None:
            self.set_current(current)
        self.ensure_all()
        return added

    def remove_images(self, paths: list[str]) -> list[str]:
        """Take images out of the list with their results, failures and statistics; their queued runs are
        dropped (a running one is answered stale). When the current image goes, the next one in the list (else
        the previous one) becomes current. Returns the paths removed."""
        gone, current = self.image_list.remove(paths)
        if not gone:
            return []
        drop = set(gone)
        self.client.cancel(lambda r: r.kind is Run and r.image in drop)
        for path in gone:
            self.results.pop(path)
            self.head_stats.pop(path, None)
        self.image_list.images_removed.emit(gone)
        if current is not None:
            self.set_current(current)
        self._report_runs()
        if self.results or self.image_list.failed:
            self._verify()          # the check waited for runs that are gone
        else:
            self._verdict_may_change()
        return gone

    def clear_images(self) -> list[str]:
        """Remove every image."""
        return self.remove_images(list(self.image_list.paths))

    def set_current(self, path: str) -> None:
        """Show another image (its run jumps the queue)."""
        if path == self.image_list.current:
            return
        self.image_list.current = path
        self.ensure(path, first=True)
        self.show_current()

    def set_image_size(self, size: tuple[int, int] | None) -> None:
        """Run every image at (h, w) (None: the model's native size), rounded down to whole patches of the loaded
        model (a note says so); results at the previous size are dropped. Without a model the size waits for the
        next one to load."""
        if self.model.spec is None:
            self.model.pending_size = None if size is None else (int(size[0]), int(size[1]))
            return
        shown = self.whole_patches(size) if size is not None else self.model.spec.image_size
        self.model.size_changed.emit(shown)
        size = None if shown == tuple(self.model.spec.image_size) else shown
        if size == self.model.image_size:
            return
        self.model.image_size = size
        self.client.cancel(lambda r: r.kind in (Run, PosEmbed))
        self._forget_results()
        self.ensure_all()
        self.request_pos_embed()          # ahead of the runs: the position-embedding dock follows the size at once
        self.image_list.current_changed.emit(None)

    def set_half_maps(self, on: bool) -> None:
        """Keep each image's maps as float16 (half the memory; each value within 2.4e-4 of float32's) or as
        float32; the images run again."""
        if bool(on) == self.half_maps:
            return
        self.half_maps = bool(on)
        if self.model.spec is None:
            return
        self.client.cancel(lambda r: r.kind is Run)
        self._forget_results()
        self.ensure_all()
        self.image_list.current_changed.emit(None)

    def set_image_size_after_load(self, size: tuple[int, int] | None) -> None:
        """The input size for the model being loaded (the command line's --size), applied once it has loaded."""
        self.model.pending_size = None if size is None else (int(size[0]), int(size[1]))

    def whole_patches(self, size: tuple[int, int]) -> tuple[int, int]:
        """`size` rounded down to whole patches of the loaded model (at least one), as the model runs it; a note
        says so when that changes the size."""
        used, note = self.model.whole_patches(size)
        if note:
            self.note.emit(note)
        return used

    def request_pos_embed(self) -> None:
        """Ask the worker for the position embedding at the current input size, ahead of queued runs (answered by
        pos_embed_ready)."""
        if self.model.spec is None or not self.model.traits.pos_table:
            return      # a windowed model without an absolute table (Swin): its positions are inside the windows
        size, p = self.model.run_size(), self.model.spec.patch_size
        self.client.cancel(lambda r: r.kind is PosEmbed)
        self.client.submit(PosEmbed, first=True, grid=(size[0] // p, size[1] // p))

    def ensure(self, path: str, first: bool = False) -> None:
        """Request a run of `path` unless it is cached, failed or already on its way (or what the file does not say
        is being asked); `first` jumps the queue."""
        if self.model.spec is None or self.model.awaiting_answers or not path or path in self.results or path in self.image_list.failed:
            return
        pending = [r for r in self.client.pending(Run)
                   if r.image == path and r.image_size == self.model.image_size]
        if pending:
            if first:
                self.client.prioritize(lambda r: r in pending)
            return
        if not self.client.pending(Run):
            self.image_list.begin_runs()     # a new run of images begins
        self.client.submit(Run, first=first, image=path, image_size=self.model.image_size, also=self.precompute,
                           half=self.half_maps)
        self.image_list.run_started.emit(path)
        self._verdict_may_change()

    def ensure_all(self) -> None:
        """Run the current image first, then every other image without a result."""
        self.ensure(self.image_list.current, first=True)
        for path in self.image_list.paths:
            self.ensure(path)

    def shutdown(self) -> bool:
        """Stop the worker (waits a bounded time; see `WorkerClient.shutdown`); True once its thread has
        finished."""
        return self.client.shutdown()

    # ------------------------------------------------------------------------------------------ answers

    def route(self, kind: type[Request], on_answer: Any, on_failure: Any = None) -> None:
        """Send the answers of requests of class `kind` to `on_answer(request, answer)` and, with `on_failure`, their
        failures to `on_failure(request, summary, details)` instead of an error dialog: how a part of the window
        (a comparison, a timeline) adds a kind of work without editing the session."""
        self._routes[kind] = on_answer
        if on_failure is not None:
            self._failure_routes[kind] = on_failure

    def _on_answered(self, request: Request, answer: Any) -> None:
        """Every answer, routed by the class of the request it answers."""
        self._routes[request.kind](request, answer)

    def _on_stuck(self, request: Request, seconds: float) -> None:
        self.stuck.emit(f"{_doing(request)[0].upper()}{_doing(request)[1:]} has run {seconds:g} s without finishing")

    def _on_probed(self, _request: Request, answer: Probed) -> None:
        self.probed = answer
        self.devices_found.emit(list(answer.devices))

    def _on_loaded(self, request: Request, answer: Loaded) -> None:
        self.model.set_loading(self._pending_load())
        if answer.refused:
            self._refuse_device(str(request.device), answer.refused)
        spec = answer.spec
        self.model.loaded(request, answer)            # at its native size, asked about or not, not verified yet
        self._waiting_shown = False
        self._forget_results()
        self.image_list.restore_given_up(self.model.model_path)   # given up on before: not run again for this model
        pending = self.model.take_pending_size()
        if pending is not None:
            size = self.whole_patches(pending)
            self.model.image_size = None if size == tuple(spec.image_size) else size
        self.request_pos_embed()
        # the panels drop the old model's result before the view follows the new one
        self.image_list.current_changed.emit(None)
        self.model.model_loaded.emit(spec, answer.device)
        if not answer.interruptible:
            self.note.emit("This model's own code has no blocks or attention modules vitviz can stop between: a "
                           "running image always finishes (closing the window waits for it)")
        self.model.verification_changed.emit()
        if self.model.awaiting_answers:
            self.model.assumptions_asked.emit(spec)    # the images run once the user has answered (answer_assumptions)
        else:
            self.ensure_all()

    def _refuse_device(self, device: str, summary: str) -> None:
        """--device named a device that is not here: the model runs on the CPU and later loads go there too."""
        self.model.device_preference = None
        self.error.emit(DEVICE_FAILED, f"{summary} — running on the CPU instead", f"--device {device}: {summary}\n"
                        "The model was loaded on the CPU. Pick a device in the Controls panel once one is available.")

    def _on_ran(self, request: Request, answer: Ran) -> None:
        if request.image_size != self.model.image_size:
            return   # belongs to a size that is no longer selected
        path, maps = request.image, answer.maps
        self.results.put(path, maps)
        self.head_stats[path] = maps.head_stats()
        self.image_list.answered()
        self.image_list.result_ready.emit(path)
        if path == self.image_list.current:
            self.show_current()
        self._report_runs()
        self._verify()

    def _verify(self) -> None:
        """Once a model's images have run (no run waiting), check it against its original in the worker
        (`verification_changed` when answered; `ModelSlot.verify_due`): the pictures come first, and the run's
        progress never waits behind the check. A model run from its own code is the original: nothing to check.
        A model built by the user's code and converted is checked against that code; what the user chose to check
        it against (Verify against…) is used instead."""
        if not self.model.verify_due or self.client.pending(Run) or self.client.pending(Load):
            self._verdict_may_change()
            return
        m = self.model
        m.verify_asked, m.verify_progress = True, None
        against, code = m.checks_against
        self.client.submit(Verify, code=code or None, against=against)
        self._waiting_shown = False
        self.model.verification_changed.emit()

    def _verdict_may_change(self) -> None:
        """Say so when the verdict line's "after the images" comes or goes (runs queued or answered)."""
        waiting = self.verify_waiting
        if waiting != self._waiting_shown:
            self._waiting_shown = waiting
            self.model.verification_changed.emit()

    def _on_verified(self, _request: Request, answer: Verified) -> None:
        """The check's answer (one for an older model is dropped by the client: a load makes it stale)."""
        self.model.verification, self.model.verify_failure = answer.verification, ""
        if getattr(answer, "spec", None) is not None and self.model.spec is not None:
            self.model.spec = answer.spec    # the settings it confirmed are verified now (the same model's spec)
        self.model.verify_progress = None
        self.model.verification_changed.emit()

    def _on_progressed(self, request: Request, text: str, fraction: float) -> None:
        """The running request's progress: the check's goes to the verdict line as well, said as a check."""
        if request.kind is Verify:
            self.model.verify_progress = (fraction, text)
            self.model.verification_changed.emit()
            # the verdict line carries the check's own words; the status message says only what runs (the two
            # side by side repeated one long line, cut in the middle at 1280 px)
            text = assumptions.checking_text(self.model.original_name())
        self.progress.emit(text, fraction)

    def _report_runs(self) -> None:
        """Say how far the current run of images has got: answered, in all, and an estimate of the seconds left
        (NaN until one has been answered)."""
        self.image_list.run_progress.emit(*self.image_list.progress(len(self.client.pending(Run))))

    def _on_dropped(self, request: Request | None) -> None:
        """A stale or cancelled request: a load that was replaced ends the loading state when it was the last."""
        if request is not None and request.kind is Load and not self._pending_load():
            self.model.set_loading("")
        elif request is not None and request.kind is Run:
            self._report_runs()
            self._verify()
        elif request is not None and request.kind is Verify and not self.verifying:
            self.model.verify_progress = None

    def _on_posembedded(self, _request: Request, answer: PosEmbedded) -> None:
        self.model.position(answer)    # says `pos_embed_ready`

    def _on_cataloged(self, _request: Request, answer: Cataloged) -> None:
        self.catalog_ready.emit(answer)

    def _on_moved(self, _request: Request, answer: Moved) -> None:
        self.model.device = answer.device
        self.model.device_changed.emit(answer.device)

    def _on_failed(self, request: Request, summary: str, details: str) -> None:
        """Every failure, routed by the class of the request like the answers (the session's own kinds and the
        parts' through one table, `route`); a kind nobody routes is an error dialog."""
        route = self._failure_routes.get(request.kind)
        if route is None:
            self.error.emit(request.title, summary, details)
        else:
            route(request, summary, details)

    def _report(self, request: Request, summary: str, details: str) -> None:
        self.error.emit(request.title, summary, details)

    def _verify_failed(self, _request: Request, summary: str, _details: str) -> None:
        """Not an error of the model: it stays unverified, and says why."""
        self.model.verify_failure, self.model.verify_progress = summary, None
        self.model.verification_changed.emit()

    def _run_failed(self, request: Request, summary: str, details: str) -> None:
        path = request.image
        self.image_list.fail(path, summary)
        self.image_list.run_failed.emit(path, summary, details)
        if path == self.image_list.current:
            self.image_list.current_changed.emit(None)
        self._report_runs()
        self._verify()

    def _pass_failed(self, request: Request, summary: str, details: str) -> None:
        self.passes[request.kind].fail(request, summary)
        self._report(request, summary, details)

    def _load_failed(self, request: Request, summary: str, details: str) -> None:
        self.model.set_loading(self._pending_load())
        if not self.model.loading:
            self.model.awaiting_answers = False      # the answers' reload failed: the model loaded before runs
        self._report(request, summary, details)
        self.ensure_all()   # the load made queued runs stale; the previous model is still there

    def _probe_failed(self, request: Request, summary: str, details: str) -> None:
        self.devices_found.emit(["cpu"])
        self._report(request, summary, details)

    def _posembed_failed(self, request: Request, summary: str, details: str) -> None:
        self.model.forget_position()
        self._report(request, summary, details)

    def _move_failed(self, request: Request, summary: str, details: str) -> None:
        self._report(request, summary, details)
        self.model.device_changed.emit(self.model.device)

    def _catalog_failed(self, request: Request, summary: str, details: str) -> None:
        self._report(request, summary, details)
        self.catalog_failed.emit()

    def _forget_results(self) -> None:
        """A new model or input size: no result, failure or head statistic of the old one holds."""
        self.results.clear()
        self.intervened.clear()
        self.image_list.forget_failures()
        self.head_stats.clear()
        for store in self.passes.values():
            store.forget()

    def evict(self, keep: str) -> None:
        """Drop the least recently used results until the cache fits `cache_bytes` (never `keep`)."""
        self.results.evict(keep)


def _doing(request: Request) -> str:
    """What a request running the user's code is doing, for the status bar ('the code of my_vit.py:build')."""
    if request.kind is Load:
        return f"the code of {Path(str(request.code or '')).name}"
    if request.kind is Run:
        return f"the model's own code on {Path(str(request.image)).name}"
    text = request.describe().rstrip("…")
    return text[:1].lower() + text[1:]
