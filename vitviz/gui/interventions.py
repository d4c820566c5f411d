"""Interventions in the window: ablate heads and patch activations from another image, and see every panel follow.

Right-click a head (its overview tile, or the Head selector) -> *Ablate* (to zero, to its mean over the images of
the list, or resampled from another of them), *Patch this head's attention from* an
image of the list, or *Patch block L's output from* one. Each is a `Step`; the steps, in the order they were made,
are the intervention (`InterventionSession.steps`: undo pops the last, *Back to clean* drops them all). The worker
runs the current image with them (`Intervene`: `model.run(intervene=...)` of `vitviz.core.running.interventions`),
and the session then shows that run instead of the clean one (`Session.intervened`): every panel's maps come from
the intervened forward (the attention of later layers changes when an earlier head is ablated), their titles start
with what was done (`IntervenedMaps`), and a banner in the toolbar (`InterventionBanner`) says so with Undo and
Back to clean. The other images of the list then run intervened too, after the current one, for their top-5 beside
the clean one (`ImageListPanel.set_predictions`); the Interventions dock lists the steps and the current image's
top-5, clean, intervened and Δ. The importance grid (`HeadScan`) is drawn in the Overview dock
(`vitviz.gui.importance_view`).

Only vitviz's reference ViT has the hook points: for a model run by its own code or a windowed model the entries
are greyed out with the reason as their tooltip (`vitviz.core.protocol.refusal`). The passes of their own (class
relevance, a prompt's map, the token features) run under the intervention too (`Under`).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
from PySide6.QtCore import QCoreApplication, QEvent, QObject, QPoint, Qt, QTimer, Signal
from PySide6.QtGui import QAction
from PySide6.QtWidgets import (QDockWidget, QHBoxLayout, QLabel, QMenu, QSizePolicy, QTableWidget, QTableWidgetItem,
                               QToolBar, QToolButton, QVBoxLayout, QWidget)

from vitviz.core.analyses.maps import MapKind, MapStack, ResultMaps
from vitviz.gui import docks, importance_view
from vitviz.gui.importance_view import MARK
from vitviz.gui.panels.base import push_button, relay, wrapped_label
from vitviz.gui.protocol import Context, PassRequest, Request, _image_name

Head = tuple[int, int]
ASK_OTHERS = QEvent.Type(QEvent.registerEventType())   # `InterventionSession._after_redraws`
KEEP_MAPS = 4      # the intervened runs whose maps are kept (the images shown last); the others keep their logits


@dataclass(frozen=True)
class Step:
    """One intervention made in the window: 'ablate' (layer, head) -- `mode` 'zero', 'mean' (its output averaged
    over the images `reference`) or 'resample' (its output on the image `source`) -- or patch from the image
    `source` either 'attention' (the pattern of (layer, head)) or 'residual' (block `layer`'s output at every
    token)."""

    kind: str
    layer: int
    head: int | None = None
    source: str = ""
    mode: str = "zero"
    reference: tuple[str, ...] = ()

    def how(self) -> str:
        """An ablation's mode as the library says it: 'zero', 'mean over 3 images', 'resampled from b.png'."""
        if self.mode == "mean":
            return f"mean over {len(self.reference)} images"
        return f"resampled from {_image_name(self.source)}" if self.mode == "resample" else "zero"

    def text(self) -> str:
        """Short, for titles: 'L1.H0', 'L2.H1 attention from b.png', 'block 3 from b.png'."""
        if self.kind == "ablate":
            return f"L{self.layer}.H{self.head}"
        if self.kind == "attention":
            return f"L{self.layer}.H{self.head} attention from {_image_name(self.source)}"
        return f"block {self.layer} from {_image_name(self.source)}"

    def intervention(self) -> Any:
        """The library's intervention of a patch (ablations are joined into one `Ablate` a mode: `interventions`)."""
        from vitviz.core.running.interventions import PatchAttention, PatchResidual

        if self.kind == "attention":
            return PatchAttention(self.layer, self.head, self.source)
        return PatchResidual(self.layer, self.source)


def _ablations(steps: tuple[Step, ...] | list[Step]) -> dict[tuple[str, str, tuple[str, ...]], list[Step]]:
    """The ablation steps by (mode, resampling source, mean reference set), in the order first made."""
    groups: dict[tuple[str, str, tuple[str, ...]], list[Step]] = {}
    for step in steps:
        if step.kind == "ablate":
            groups.setdefault((step.mode, step.source, step.reference), []).append(step)
    return groups


def interventions(steps: tuple[Step, ...]) -> list[Any]:
    """The library's interventions of the steps: one `Ablate` per mode (and reference) of the ablated heads, then
    the patches."""
    from vitviz.core.running.interventions import Ablate

    ablate = [Ablate([(s.layer, int(s.head)) for s in group], mode,   # type: ignore[arg-type]
                     None if mode == "zero" else list(reference) if mode == "mean" else source)
              for (mode, source, reference), group in _ablations(steps).items()]
    return ablate + [s.intervention() for s in steps if s.kind != "ablate"]


def describe(steps: tuple[Step, ...] | list[Step]) -> str:
    """'ablated L1.H0, L2.H3 (zero) · ablated L0.H2 (mean over 3 images) · patched L0.H1 attention from b.png':
    what the titles and the banner say."""
    heads = [f"ablated {', '.join(s.text() for s in group)} ({group[0].how()})"
             for group in _ablations(steps).values()]
    return " · ".join(heads + [f"patched {s.text()}" for s in steps if s.kind != "ablate"])


def short(steps: tuple[Step, ...] | list[Step]) -> str:
    """What the map titles start with: `describe` without the patches' source images and the zero mode (the
    banner and the dock name them), e.g. 'ablated L1.H3, L2.H3 · ablated L0.H1 (mean) · patched L1.H0 attention'."""
    heads = [f"ablated {', '.join(s.text() for s in group)}" + ("" if mode == "zero" else f" ({mode})")
             for (mode, _s, _r), group in _ablations(steps).items()]
    patches = [f"L{s.layer}.H{s.head} attention" if s.kind == "attention" else f"block {s.layer} output"
               for s in steps if s.kind != "ablate"]
    return " · ".join(heads + [f"patched {p}" for p in patches])


class IntervenedMaps(ResultMaps):
    """The maps of an intervened run: every stack's title starts with what was done. The maps that need a pass of
    their own (class relevance, a text prompt's map, the token features) are made under the same intervention
    (`under`: `model.intervening(...)` around the pass, the library's exact hooks), and kept here, not in the clean
    run's result."""

    def __init__(self, result: Any, what: str, title: str, intervention: tuple[Any, ...] = ()) -> None:
        super().__init__(result)
        self.what = what            # `describe` of the steps
        self.title = title          # `short` of the steps: what every stack's title starts with
        self.intervention = intervention   # the library's interventions of the run (`interventions(steps)`)
        self.prepared = False              # `Finish` has made what the panels not on show would draw

    def _stack(self, kind: MapKind) -> MapStack:
        stack = super()._stack(kind)
        if not stack.title.startswith(self.title):
            stack = dataclasses.replace(stack, title=f"{self.title} · {stack.title}")
            self._stacks[kind] = stack
        return stack

    def under(self, request: PassRequest) -> Under:
        """`request` (a pass over this image) made under this run's intervention, its answer kept here."""
        return Under(inner=request, intervened=self)


@dataclass(eq=False)
class Under(PassRequest):
    """A pass (`Relevance`, `Text`, `Features`) of an intervened run: the same request run inside
    `model.intervening(...)` of the run's interventions, so its backward pass and captured features are the
    intervened model's; answered and kept like the clean pass (its `kind` is the inner request's), into the
    intervened run's maps (`vitviz.gui.passes.PassStore.answer`)."""

    inner: PassRequest | None = None
    intervened: IntervenedMaps | None = None     # type: ignore[misc]  # an instance's value of PassRequest's slot

    @property
    def kind(self) -> type[Request]:
        return self.inner.kind

    @property
    def image(self) -> str:  # type: ignore[override]
        return self.inner.image

    @property
    def image_size(self) -> tuple[int, int] | None:
        return self.inner.image_size

    @property
    def key(self) -> Any:
        return self.inner.key

    @property
    def redraws(self) -> bool:  # type: ignore[override]
        return self.inner.redraws

    @property
    def title(self) -> str:  # type: ignore[override]
        return self.inner.title

    def describe(self) -> str:
        return f"{self.inner.describe().rstrip('…')} ({self.intervened.what})…"

    def keep(self, maps: ResultMaps, answer: Any) -> None:
        self.inner.keep(maps, answer)

    def __call__(self, ctx: Context) -> Any:
        with self.model_of(ctx).intervening(*self.intervened.intervention):
            return self.inner(ctx)


@dataclass(frozen=True, eq=False)
class Intervened:
    """One image run with `steps`: its logits, and its maps where asked (`Intervene.maps`)."""

    image: str
    steps: tuple[Step, ...]
    logits: np.ndarray
    maps: IntervenedMaps | None


@dataclass(frozen=True, eq=False)
class Scanned:
    """The current image's head importance (`HeadImportance`)."""

    image: str
    importance: Any


@dataclass(eq=False)
class Intervene(Request):
    """Run `image` with `steps` (`model.run(intervene=...)`); with `maps` its maps (and the kinds `also`) are made
    here, off the GUI thread, for the panels; without, only its logits are kept (an image of the list not shown)."""

    image: str = ""
    image_size: tuple[int, int] | None = None
    steps: tuple[Step, ...] = ()
    maps: bool = True
    clean: Any = None            # the image's clean run (`AttentionResult`): its input again, not decoded again
    also: tuple[Any, ...] = ()   # the map kinds on show (the view's), made here for the panels that draw them
    stats: bool = False          # the head statistics too (their panel is on show)

    title = "Could not run the intervention"
    quiet = True    # the current image's run is said by the banner and the Interventions dock, the others' by the
                    # image list's top-5; the status bar hears of them when they run long (many images, a large model)

    def describe(self) -> str:
        return f"Running {_image_name(self.image)} with {describe(self.steps)}…"

    def __call__(self, ctx: Context) -> Intervened:
        result = self.model_of(ctx).run(self.image if self.clean is None else self.clean, image_size=self.image_size,
                                        intervene=interventions(self.steps))
        if not self.maps:
            return Intervened(self.image, self.steps, result.logits, None)
        maps = IntervenedMaps(result, describe(self.steps), short(self.steps), tuple(interventions(self.steps)))
        for kind in self.also:     # what the click's answer is drawn from; the rest after it is shown (`Finish`)
            if kind.source == "attention" and maps.has(kind):
                maps.view(kind)
        if self.stats:
            maps.head_stats()
        return Intervened(self.image, self.steps, result.logits, maps)


@dataclass(eq=False)
class Finish(Request):
    """What the panels not on show would draw of an intervened run (`ResultMaps.precompute`: the CLS and rollout
    stacks, the head statistics), made in the worker once the click's answer is painted, so that showing such a
    panel later does not make it on the GUI thread."""

    maps: IntervenedMaps | None = None

    title = "Could not prepare the intervened run's maps"
    quiet = True        # nothing to say: nothing on show changes
    user_code = False   # numpy on the captured maps; no model runs

    def describe(self) -> str:
        return f"Preparing the maps of {_image_name(self.maps.result.source)} ({self.maps.what})…"

    def __call__(self, _ctx: Context) -> None:
        self.maps.precompute()
        self.maps.prepared = True


@dataclass(eq=False)
class HeadScan(Request):
    """Each head of the model ablated alone on `image` (zero; batched, progress reported): the importance grid."""

    image: str = ""
    image_size: tuple[int, int] | None = None

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


def probabilities(logits: np.ndarray) -> np.ndarray | None:
    """The softmax of a logit vector, in float64; None for a headless model's (0,) logits."""
    z = np.asarray(logits, np.float64)
    if z.size == 0:
        return None
    p = np.exp(z - z.max())
    return p / p.sum()


class InterventionSession(QObject):
    """The steps made, the worker's runs of the images with them, and the importance grids; `changed` when any
    changes. The current image's intervened maps go to `Session.intervened`, which the panels then show."""

    changed = Signal()
    wanted = Signal()     # a step was made or the importance asked for: the dock should be seen
    scan_asked = Signal()   # the importance grid of the current image was asked for

    def __init__(self, session: Any, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.session = session
        self.steps: list[Step] = []                    # in the order they were made (undo pops the last)
        self.answers: dict[str, Intervened] = {}       # image -> its run with the current steps
        self.importance: dict[str, Scanned] = {}       # image -> its importance grid
        self.failure = ""
        self._probabilities: dict[str, tuple[Intervened, np.ndarray | None]] = {}   # image -> (answer, its softmax)
        session.route(Intervene, self._on_intervened, self._on_failed)
        session.route(HeadScan, self._on_scanned, self._on_failed)
        session.route(Finish, lambda _request, _answer: None, self._on_failed)
        self.stats_shown: Callable[[], bool] = lambda: False   # the head statistics' panel is on show (the window's)
        session.image_list.current_changed.connect(lambda _maps: self._ask())
        session.image_list.result_ready.connect(lambda _path: self._ask())
        session.model.model_loaded.connect(lambda *_a: self.clear())
        session.model.size_changed.connect(lambda _size: self._forget_runs())
        relay().hold_while(self.running_current)   # the panels' redraws of a click wait for its forward

    # ---------------------------------------------------------------------------------------------- reading

    @property
    def why_not(self) -> str | None:
        """Why the loaded model cannot take interventions (None: it can, or there is no model)."""
        from vitviz.core.protocol import refusal

        spec = self.session.model.spec
        return None if spec is None else refusal(self.session.model.capabilities, getattr(spec, "family", ""))

    @property
    def available(self) -> bool:
        """Whether the loaded model takes interventions: vitviz's reference ViT ('reference' capability)."""
        return self.session.model.spec is not None and self.why_not is None

    @property
    def heads(self) -> list[Head]:
        """The ablated (layer, head)s, in the order they were ablated."""
        return [(s.layer, int(s.head)) for s in self.steps if s.kind == "ablate"]   # type: ignore[arg-type]

    def describe(self) -> str:
        return describe(self.steps)

    def current(self) -> Intervened | None:
        """The current image's intervened run (with maps) for the current steps, when it has answered."""
        answer = self.answers.get(self.session.image_list.current or "")
        return answer if answer is not None and answer.maps is not None and self.steps else None

    def scanning(self, path: str) -> bool:
        """Whether the importance scan of `path` is on its way."""
        return any(r.image == path for r in self.session.client.pending(HeadScan))

    def running_current(self) -> bool:
        """Whether the worker is running (or about to run) the current image's intervened forward with maps."""
        current = self.session.image_list.current
        return bool(self.steps) and any(r.image == current and r.maps for r in self.session.client.pending(Intervene))

    def current_importance(self) -> Any:
        answer = self.importance.get(self.session.image_list.current or "")
        return None if answer is None else answer.importance

    def probabilities(self, path: str) -> np.ndarray | None:
        """The class probabilities of `path`'s intervened run (None: no steps, or not answered yet)."""
        answer = self.answers.get(path)
        if answer is None or not self.steps:
            return None
        if self._probabilities.get(path, (None,))[0] is not answer:   # once per answer (the list asks every click)
            self._probabilities[path] = (answer, probabilities(answer.logits))
        return self._probabilities[path][1]

    # ---------------------------------------------------------------------------------------------- steps

    def toggle(self, layer: int, head: int) -> None:
        """Ablate (layer, head) to zero, or restore it when it is ablated (in any mode)."""
        ablated = [s for s in self.steps if s.kind == "ablate" and (s.layer, s.head) == (int(layer), int(head))]
        if ablated:
            self.steps.remove(ablated[0])
            self._changed_steps()
        else:
            self._ablate(Step("ablate", int(layer), int(head)))

    def mean_reference(self) -> tuple[str, ...]:
        """The images a mean ablation averages over: every image of the list that ran (not failed)."""
        listed = self.session.image_list
        return tuple(p for p in listed.paths if p not in listed.failed)

    def why_not_mean(self) -> str | None:
        """Why a mean ablation cannot be made now (None: it can): the model, or too few images in the list."""
        from vitviz.core.running.interventions import MEAN_MIN_IMAGES

        count = len(self.mean_reference())
        if self.why_not is not None:
            return f"Not for this model: {self.why_not}"
        if count < MEAN_MIN_IMAGES:
            return (f"a mean ablation averages the head's output over the images of the list: it needs at least "
                    f"{MEAN_MIN_IMAGES}, the list has {count}")
        return None

    def ablate_mean(self, layer: int, head: int) -> None:
        """Replace (layer, head)'s output by its mean over the images of the list (`mean_reference`)."""
        self._ablate(Step("ablate", int(layer), int(head), mode="mean", reference=self.mean_reference()))

    def ablate_resample(self, layer: int, head: int, source: str) -> None:
        """Replace (layer, head)'s output by its output on the image `source`."""
        self._ablate(Step("ablate", int(layer), int(head), source, mode="resample"))

    def _ablate(self, step: Step) -> None:
        """Make `step` the one ablation of its head (another mode of it is replaced)."""
        self.steps = [s for s in self.steps if not (s.kind == "ablate" and (s.layer, s.head) == (step.layer,
                                                                                                  step.head))]
        self.steps.append(step)
        self.wanted.emit()
        self._changed_steps()

    def patch_attention(self, layer: int, head: int, source: str) -> None:
        """Run with `source`'s attention pattern in (layer, head)."""
        self._add(Step("attention", int(layer), int(head), source))

    def patch_residual(self, layer: int, source: str) -> None:
        """Run with `source`'s block `layer` output (every token)."""
        self._add(Step("residual", int(layer), None, source))

    def undo(self) -> None:
        """Take back the last step."""
        if self.steps:
            self.steps.pop()
            self._changed_steps()

    def clear_heads(self) -> None:
        """Back to the clean run: every step taken back."""
        if self.steps:
            self.steps = []
            self._changed_steps()

    def clear(self) -> None:
        """A new model: no step, answer or grid of the old one holds."""
        self.steps, self.answers, self.importance, self.failure = [], {}, {}, ""
        self.session.intervened.clear()
        self.changed.emit()

    def scan(self) -> None:
        """Ask for the current image's importance grid."""
        path = self.session.image_list.current
        if path and self.available:
            self.wanted.emit()
            self.session.client.cancel(lambda r: r.kind is HeadScan)
            self.session.client.submit(HeadScan, image=path, image_size=self.session.model.image_size)
            self.scan_asked.emit()

    def _add(self, step: Step) -> None:
        if step not in self.steps:
            self.steps.append(step)
            self.wanted.emit()
            self._changed_steps()

    def _forget_runs(self) -> None:
        """Another input size: the runs (and grids) of the old one do not hold."""
        self.answers, self.importance = {}, {}
        self.session.intervened.clear()
        self.changed.emit()

    def _changed_steps(self) -> None:
        """Drop the runs of the old steps; back to clean at once, else the old run stays on show (its titles say
        what it is) until the new one answers."""
        self.failure = ""
        self.answers = {}
        self.session.client.cancel(lambda r: r.kind in (Intervene, Finish) or isinstance(r, Under))  # the old run's
        if not self.steps and self.session.intervened:
            self.session.intervened.clear()
            self.session.show_current()
        self.changed.emit()
        self._ask()   # last: the click's own marks are made before the worker's forward shares Python's lock with them

    def _ask(self) -> None:
        """The current image's run with maps first; once it is shown, the other images' logits (for the list's
        top-5): asked after the panels' redraws of the answer (`relay`, which holds them while the current image's
        forward runs) and the paint events those post (`_ask_others`), so that their forwards do not compete for
        the CPU and Python's lock with the window drawing the click's answer."""
        s = self.session
        if not self.steps or not self.available:
            return
        current, steps = s.image_list.current, tuple(self.steps)
        if current and s.cached(current) is not None and self.current() is None:
            if not any(r.image == current and r.maps and r.steps == steps for r in s.client.pending(Intervene)):
                s.client.submit(Intervene, first=True, image=current, image_size=s.model.image_size, steps=steps,
                                clean=s.cached(current).result, also=s.precompute, stats=self.stats_shown())
            return
        relay().later(self._after_redraws)

    def _after_redraws(self) -> None:
        """Ask for the other images' runs once the paint the redraws asked for is done: an event posted below the
        window's paint request (`UpdateRequest`, a low-priority posted event) is handled after it. (A zero timer
        ran first when the redraws were made while posted events were handled: the next image's forward then
        shared the CPU and Python's lock with the click's paint.)"""
        QCoreApplication.postEvent(self, QEvent(ASK_OTHERS), Qt.EventPriority.LowEventPriority.value - 1)

    def event(self, event: QEvent) -> bool:
        if event.type() == ASK_OTHERS:
            self._ask_others()
            return True
        return super().event(event)

    def _ask_others(self) -> None:
        """The other images' runs with the current steps (logits only, for the list's top-5), those not answered
        nor on their way."""
        s = self.session
        if not self.steps or not self.available:
            return
        steps = tuple(self.steps)
        answer = self.current()
        if answer is not None and not answer.maps.prepared and \
                not any(r.maps is answer.maps for r in s.client.pending(Finish)):
            s.client.submit(Finish, maps=answer.maps)       # first: a hidden panel shown next finds its maps
        pending = {(r.image, r.maps) for r in s.client.pending(Intervene) if r.steps == steps}
        for path in s.image_list.paths:
            if path != s.image_list.current and path not in self.answers and s.cached(path) is not None \
                    and (path, False) not in pending:
                s.client.submit(Intervene, image=path, image_size=s.model.image_size, steps=steps, maps=False,
                                clean=s.cached(path).result)

    def _on_intervened(self, request: Intervene, answer: Intervened) -> None:
        if answer.steps != tuple(self.steps) or request.image_size != self.session.model.image_size:
            return   # the steps or the size changed while it ran
        self.answers[answer.image] = answer
        shown = self.session.intervened
        if answer.maps is not None:
            shown[answer.image] = answer.maps
            for path in list(shown)[:-KEEP_MAPS]:     # the maps of the images shown longest ago: logits only
                del shown[path]
                self.answers[path] = dataclasses.replace(self.answers[path], maps=None)
            if answer.image == self.session.image_list.current:
                # every panel: the intervened run (and `_ask`: the other images next)
                self.session.image_list.current_changed.emit(answer.maps)
        self.changed.emit()
        if answer.maps is not None and answer.image == self.session.image_list.current:
            # the redraws the click held for this answer (the dock's table, the banner, the list) now, with the
            # panels': the window paints them all in one pass, not a second one a turn later
            relay().flush()

    def _on_scanned(self, _request: Request, answer: Scanned) -> None:
        self.importance[answer.image] = answer
        self.changed.emit()

    def _on_failed(self, _request: Request, summary: str, _details: str) -> None:
        self.failure = summary
        self.changed.emit()

    # ---------------------------------------------------------------------------------------------- menus

    def menu(self, parent: QWidget, layer: Any, head: Any) -> QMenu | None:
        """The context menu of a head (an overview tile, the Head selector): Ablate / Restore it, patch its
        attention or its block's output from another image of the list, Undo, Back to clean, the importance scan.
        Greyed out, saying why, for a model without the hook points; None where there is no head (a mean / max
        column) or no model."""
        if self.session.model.spec is None or not isinstance(head, int) or not isinstance(layer, int):
            return None
        menu = QMenu(parent)
        menu.setToolTipsVisible(True)
        why = self.why_not
        ablated = (layer, head) in self.heads
        act = menu.addAction(f"{'Restore' if ablated else 'Ablate'} layer {layer}, head {head}")
        act.triggered.connect(lambda: self.toggle(layer, head))
        listed = self.session.image_list
        others = [p for p in listed.paths if p != listed.current and p not in listed.failed]
        mean = menu.addAction(f"Ablate L{layer}.H{head} to its mean over the list's {len(self.mean_reference())} "
                              f"images")
        mean.triggered.connect(lambda: self.ablate_mean(layer, head))
        why_mean = self.why_not_mean()
        mean.setEnabled(why_mean is None)
        if why_mean is not None:
            mean.setToolTip(why_mean)
        resample = menu.addMenu(f"Ablate L{layer}.H{head} resampled from")
        for path in others:
            resample.addAction(_image_name(path)).triggered.connect(
                lambda _c=False, p=path: self.ablate_resample(layer, head, p))
        attention = menu.addMenu(f"Patch L{layer}.H{head}'s attention from")
        residual = menu.addMenu(f"Patch block {layer}'s output from")
        for path in others:
            attention.addAction(_image_name(path)).triggered.connect(
                lambda _c=False, p=path: self.patch_attention(layer, head, p))
            residual.addAction(_image_name(path)).triggered.connect(
                lambda _c=False, p=path: self.patch_residual(layer, p))
        for sub in (resample, attention, residual):
            sub.setToolTipsVisible(True)
            sub.setEnabled(bool(others) and why is None)
            if not others:
                sub.menuAction().setToolTip("add another image to the list: the image its output is taken from")
        menu.addSeparator()
        undo = menu.addAction("Undo last intervention")
        undo.setEnabled(bool(self.steps))
        undo.triggered.connect(self.undo)
        every = menu.addAction("Back to clean (undo all)")
        every.setEnabled(bool(self.steps))
        every.triggered.connect(self.clear_heads)
        menu.addSeparator()
        scan = menu.addAction("Importance of every head")
        scan.triggered.connect(self.scan)
        if why is not None:
            for action in (act, resample.menuAction(), attention.menuAction(), residual.menuAction(), scan):
                action.setEnabled(False)
                action.setToolTip(f"Not for this model: {why}")
        return menu

    def popup(self, parent: QWidget, layer: Any, head: Any, where: QPoint) -> None:
        """Show `menu` at a global position (nothing where there is no head)."""
        menu = self.menu(parent, layer, head)
        if menu is not None:
            menu.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
            menu.popup(where)


def hook_head_selector(iv: InterventionSession, state: Any, spin: QWidget, slider: QWidget) -> None:
    """The Head selector (spin box and slider of the Controls dock): right-click -> the head's menu; an ablated
    head (at the selected layer) is marked with an amber frame and says so in its tooltip."""
    tips = {w: w.toolTip() for w in (spin, slider)}

    def menu_at(widget: QWidget, pos: QPoint) -> None:
        iv.popup(widget, state.layer, state.head, widget.mapToGlobal(pos))

    for widget in (spin, slider, getattr(spin, "lineEdit", lambda: None)()):
        if widget is not None:
            widget.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
            widget.customContextMenuRequested.connect(lambda pos, w=widget: menu_at(w, pos))

    def mark(*_args: object) -> None:
        ablated = (state.layer, state.head) in iv.heads
        for widget, tip in tips.items():
            style = f"border: 2px dashed {MARK};" if ablated and widget is spin else \
                f"background: {MARK};" if ablated else ""
            if widget.styleSheet() != style:      # a style sheet set restyles the widget: only when it changes
                widget.setStyleSheet(style)
            widget.setToolTip((f"layer {state.layer}, head {state.head} is ablated (right-click: Restore)\n"
                               if ablated else "") + tip + "\nRight-click: ablate this head, or patch it")

    iv.changed.connect(mark)
    state.subscribe(lambda changed: mark() if changed & {"layer", "head"} else None)
    mark()


class InterventionBanner(QWidget):
    """In the main toolbar while the shown run is intervened: what was done (amber), Undo and Back to clean. In
    the toolbar, not a bar of its own: showing it lays out no dock (an ablate click redraws the panels once). It
    sits in a slot of the toolbar that keeps its room (grown to the widest banner yet, never shrunk): showing,
    hiding or retitling it lays the toolbar out only when it needs more room (the toolbar was laid out, and the
    window under it painted, on every click)."""

    def __init__(self, iv: InterventionSession, toolbar: QToolBar) -> None:
        self.slot = QWidget(toolbar)       # no layout: the banner is placed in it by hand, and nothing it does
        self.slot.setObjectName("interventionBannerSlot")          # reaches the toolbar but a slot grown
        self.slot.setFixedSize(0, 0)
        super().__init__(self.slot)
        self.setObjectName("interventionBanner")
        self.setVisible(False)
        self.iv = iv
        self.label = QLabel()
        self.label.setStyleSheet(f"color: black; background: {MARK}; padding: 2px 6px; font-weight: bold;")
        self.label.setMaximumWidth(560)
        self.undo_action = QAction("Undo", self)
        self.undo_action.setToolTip("take back the last intervention")
        self.undo_action.triggered.connect(iv.undo)
        self.clean_action = QAction("Back to clean", self)
        self.clean_action.setToolTip("take back every intervention: the clean run")
        self.clean_action.triggered.connect(iv.clear_heads)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(8, 0, 0, 0)
        layout.addWidget(self.label)
        for action in (self.undo_action, self.clean_action):
            button = QToolButton()
            button.setDefaultAction(action)
            layout.addWidget(button)
        layout.addStretch(1)               # in a slot wider than this banner: the room left blank
        self.action = toolbar.addWidget(self.slot)
        iv.changed.connect(lambda: relay().later(self.refresh))      # once per event-loop turn
        iv.session.image_list.current_changed.connect(lambda _maps: relay().later(self.refresh))

    def refresh(self) -> None:
        iv = self.iv
        if self.isHidden() == bool(iv.steps):
            self.setVisible(bool(iv.steps))
        if not iv.steps:
            return
        shown = iv.session.image_list.current_maps
        if iv.failure:
            state = f"failed: {iv.failure}"
        elif isinstance(shown, IntervenedMaps) and shown.what == iv.describe():
            state = "every panel shows this run"
        else:
            state = "running… (the panels show the run before)"
        text = f"Intervened: {iv.describe()} — {state}"
        self.label.setToolTip(text)
        self.label.setText(self.label.fontMetrics().elidedText(text, Qt.TextElideMode.ElideMiddle, 540))
        self._fit_slot()

    def _fit_slot(self) -> None:
        """Grow the toolbar's slot to this banner's size hint where it is wider (or of another height): the one
        change that lays the toolbar out."""
        need, slot = self.sizeHint(), self.slot.size()
        if need.width() > slot.width() or need.height() != slot.height():
            self.slot.setFixedSize(max(need.width(), slot.width()), need.height())
        self.setGeometry(0, 0, self.slot.width(), self.slot.height())


class LabelRoom(QWidget):
    """Holds a word-wrapped label, as wide as the layout gives and as tall as the label's lines, laid out by hand:
    a new text relays out the panel (and with it the dock and the main window) only when it takes another number of
    lines (an ablate click's 'Clean run …' -> 'Intervened: …' relaid the main window out every time)."""

    def __init__(self, label: QLabel) -> None:
        super().__init__()
        self.label = label
        label.setParent(self)
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Minimum)

    def event(self, event: QEvent) -> bool:
        if event.type() == QEvent.Type.LayoutRequest:      # the label's text (or font) changed
            self._fit()
        return super().event(event)

    def resizeEvent(self, event: Any) -> None:  # noqa: N802 - Qt override
        super().resizeEvent(event)
        self._fit()

    def _fit(self) -> None:
        height = max(self.label.heightForWidth(self.width()), self.label.minimumSizeHint().height())
        if height != self.minimumHeight():
            self.setMinimumHeight(height)       # another number of lines: the one change that lays the panel out
        self.label.setGeometry(0, 0, self.width(), height)


class InterventionsPanel(QWidget):
    """The Interventions dock: the steps with Undo and Back to clean, the current image's top-5 clean, intervened
    and Δ, and the importance scan (its grid is in the Overview dock)."""

    def __init__(self, interventions: InterventionSession, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("interventionsPanel")
        self.iv = interventions
        self.heads_label = wrapped_label("interventionsHeads")
        self.undo_button = push_button("Undo", interventions.undo)
        self.clear_button = push_button("Back to clean", interventions.clear_heads)
        self.scan_button = push_button(
            "Importance of every head", interventions.scan, "ablate each head alone on the current image (one "
            "forward per head, batched, in the worker): the drop of the top class's probability, drawn in the "
            "Overview dock (click a cell to ablate that head)")
        self.table = QTableWidget(0, 4)
        self.table.setHorizontalHeaderLabels(["class", "clean", "intervened", "Δ"])
        self.table.verticalHeader().setVisible(False)
        self.table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        self.table.verticalHeader().setDefaultSectionSize(20)
        self.table.setMinimumWidth(300)
        self.table.setMaximumHeight(self.table.verticalHeader().defaultSectionSize() * 6 + 6)   # five rows, header
        self._size_number_columns()
        buttons = QHBoxLayout()
        for button in (self.undo_button, self.clear_button, self.scan_button):
            buttons.addWidget(button)
        buttons.addStretch(1)
        side = QVBoxLayout()      # below the image the dock is wide and short: the table beside what was done
        side.addWidget(LabelRoom(self.heads_label))
        side.addLayout(buttons)
        side.addStretch(1)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(4, 2, 4, 2)
        layout.addWidget(self.table)
        layout.addLayout(side, 1)
        interventions.changed.connect(lambda: relay().later(self.refresh))      # once per event-loop turn
        interventions.session.image_list.current_changed.connect(lambda _m: relay().later(self.refresh))
        self._sized = False
        self._stale = True
        self._table: list[list[str]] = []      # the cells shown

    def showEvent(self, event: Any) -> None:  # noqa: N802 - Qt override
        """The first time the dock is shown below the image: as tall as the table of five rows, not half the
        window (the image and the Overview dock keep the height). Shown again: what changed while it was hidden."""
        super().showEvent(event)
        if self._stale:
            self.refresh()
        dock, window = self.parentWidget(), self.window()
        if not self._sized and dock is not None and hasattr(window, "resizeDocks") and not dock.isFloating():
            self._sized = True
            QTimer.singleShot(0, lambda: window.resizeDocks([dock], [self.table.maximumHeight() + 28],
                                                            Qt.Orientation.Vertical))

    def refresh(self) -> None:
        """Say what is done and fill the table; hidden (its dock closed, or behind another tab), only remember
        that it has to (an ablate click redraws what is on show only)."""
        self._stale = not self.isVisible()
        if self._stale:
            return
        iv = self.iv
        what = iv.describe()
        if iv.session.model.spec is not None and iv.why_not is not None:
            text = f"No interventions for this model: {iv.why_not}"
        elif not iv.steps:
            text = "Clean run. Right-click a head (an Overview tile or the Head selector) → Ablate, or patch it " \
                   "from another image of the list"
        elif iv.failure:
            text = f"{what}: {iv.failure}"
        elif iv.current() is None:
            text = f"Running with {what}…"
        else:
            text = f"Intervened: {what}"
        self.heads_label.setText(text)
        self.undo_button.setEnabled(bool(iv.steps))
        self.clear_button.setEnabled(bool(iv.steps))
        self.scan_button.setEnabled(iv.available and bool(iv.session.image_list.current))
        if iv.why_not is not None:
            self.scan_button.setToolTip(f"Not for this model: {iv.why_not}")
        self._fill_table()

    def _fill_table(self) -> None:
        current = self.iv.session.image_list.current
        clean = self.iv.session.cached(current) if current else None
        answer = self.iv.current()
        rows = [] if clean is None else clean.result.top_k(5)
        after = None if answer is None else probabilities(answer.logits)
        table = [[label, f"{p:.3f}", "" if after is None else f"{after[index]:.3f}",
                  "" if after is None else f"{after[index] - p:+.3f}"] for index, label, p in rows]
        if table == self._table:
            return                    # the same cells: nothing to lay out again
        labels = [row[0] for row in table] != [row[0] for row in self._table]
        self._table = table
        self.table.setRowCount(len(rows))
        for i, cells in enumerate(table):
            for j, text in enumerate(cells):
                item = self.table.item(i, j)
                if item is None:
                    self.table.setItem(i, j, QTableWidgetItem(text))
                elif item.text() != text:
                    item.setText(text)
        if labels:                    # the numbers' columns are as wide as their widest value from the start
            self.table.resizeColumnToContents(0)

    def _size_number_columns(self) -> None:
        """The numbers' columns as wide as their header or the widest number ('+0.000': digits are equally wide),
        once: an ablate click, which changes the numbers only, measures no column again."""
        table = self.table
        table.setRowCount(1)
        for j in range(1, table.columnCount()):
            table.setItem(0, j, QTableWidgetItem("+0.000"))
            table.resizeColumnToContents(j)
        table.setRowCount(0)


# ---------------------------------------------------------------------------------- the dock below the image

def _interventions_part(window: Any) -> Any:
    return InterventionSession(window.session, window)


def _interventions_panel(_window: Any, part: Any) -> QWidget:
    return InterventionsPanel(part)


def _attach_interventions(window: Any, iv: Any, _dock: QDockWidget) -> None:
    """The importance grid over the Overview, the head selector's marks and the image list's ablated badge."""
    window.importance_view = importance_view.attach(window.overview, iv)
    iv.scan_asked.connect(lambda: window.dock("overviewDock").raise_())
    hook_head_selector(iv, window.state, window.controls.head_spin, window.controls.head_slider)
    window.images.runs = iv
    iv.stats_shown = window.headstats.is_shown
    iv.changed.connect(lambda: relay().later(window.images.show_intervened))   # once per event-loop turn


docks.register(docks.SideDock(
    "interventionsDock", "Ablate", "Interventions",
    "ablated heads (right-click a tile in the Overview), the top-5 beside the clean run, and every head's importance",
    attribute="interventions", part=_interventions_part, panel=_interventions_panel, order=30,
    reveal_on="wanted", attach=_attach_interventions))
