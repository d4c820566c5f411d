"""The loaded model's state in the window: what it is (spec, where its weights or code came from, what it was
loaded with), where it runs, what its file does not say (the assumptions question), its verdict against the
original, the input size it runs at and its position embedding at that size.

State and the small rules over it (what a `Loaded` answer sets, what a reload loads again, whether the check
against the original is due, the question asked or not), and the signals that say it changed: no worker, no
widgets, testable alone (a QObject for its signals; no application is needed to emit them). The session
(`vitviz.gui.session`) owns one, turns its rules into requests and emits its signals in the order the panels need
(`position` says `pos_embed_ready` itself); a panel that shows only the model is built from this part.
"""
from __future__ import annotations

from typing import Any

from PySide6.QtCore import QObject, Signal

from vitviz.core.analyses.maps import PosEmbedData
from vitviz.core.spec import PLAIN_TRAITS, ModelSpec, Traits, whole_patches
from vitviz.gui import bundled
from vitviz.gui.assumptions import asks_unprompted, original_name, runs_own_code
from vitviz.gui.protocol import Loaded, PosEmbedded, Request, RopeKernels


class ModelSlot(QObject):
    """The loaded model (None of it until one has loaded) and how the next one is loaded, with the signals about
    it: which model, where it runs, the question about it, its verdict, its input size and position embedding."""

    model_loaded = Signal(object, str)      # ModelSpec, device (the session's cache is empty again)
    loading_changed = Signal(bool)          # a model load started (True) or ended, loaded or failed (False)
    device_changed = Signal(str)            # the device it runs on now (or still, after a move failed)
    assumptions_asked = Signal(object)      # ModelSpec whose file does not say settings that change attention
                                            # (`assumptions.asks_unprompted`): nothing runs until they are answered
    verification_changed = Signal()         # `verification` / `verify_failure` / the check's progress changed (or
                                            # a new model)
    size_changed = Signal(object)           # (h, w): the input size the images now run at
    pos_embed_ready = Signal()              # `pos_embed` / `rope` / `pos_grid` now describe the current input size

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.spec: ModelSpec | None = None
        self.device = ""
        self.device_preference: str | None = None   # where loads go (--device; None: CUDA when available)
        self.loading = ""                           # the path or name of the model being loaded ('' when no load is
                                                    # queued or running; the session says, `set_loading`)
        self.model_path = ""                        # the weights file or model name ('FILE.py:FACTORY' without one)
        self.model_code = ""                        # 'FILE.py:FACTORY' of a model built by the user's code
        self.load_overrides: dict[str, Any] = {}    # what the loaded model was loaded with (heads=, mean=, code=...)
        self.remembered: frozenset[str] = frozenset()   # those of them that are answers remembered for the file
                                                        # (`vitviz.load(_remembered=)`: their provenance says so)
        self.live_layers: tuple[tuple[str, str], ...] = ()   # a live model's (layer, mechanism that found it)
        self.live_skipped: tuple[tuple[str, str, tuple[int, ...]], ...] = ()   # attention calls it left out
        self.interruptible = True                   # a forward pass stops between layers when the window closes
        self.ask_assumptions = False                # ask what a loaded model's file does not say
        self.awaiting_answers = False               # asked: runs wait for the answer
        self.kept: set[str] = set()                 # models the user answered or kept the assumptions of (not asked
                                                    # again when they reload)
        self.library_layout = True                  # the loaded model's family is a library's (`Loaded`)
        self.capabilities: frozenset[str] = frozenset()   # what the loaded model can do (`Loaded.capabilities`)
        self.own_original = ""                      # run by its own code, verify can check it: its library
        self.described: dict[str, str] = {}         # assumed field -> what `describe_guess` says about it
        self.verify_models = True                   # check each converted model against its original (Verify)
        self.verification: Any = None               # the loaded model's `Verification`, once answered
        self.verify_failure = ""                    # why the check could not run ('' when it did or has not yet)
        self.verify_asked = False                   # the check of the loaded model has been asked for
        self.verify_against = "auto"                # what the check builds: 'auto', a library, 'LIBRARY:ARCH'
        self.verify_code = ""                       # 'FILE.py:FACTORY' the user chose to check against (Verify
                                                    # against…; a model built by code is checked against its own)
        self.verify_progress: tuple[float, str] | None = None   # how far the running check has got
        self.param_counts: dict[str, int] = {}
        self.image_size: tuple[int, int] | None = None     # None: the model's native size
        self.pending_size: tuple[int, int] | None = None   # the input size for the model being loaded (--size)
        self.pos_embed: PosEmbedData | None = None  # at `pos_grid` (None: not known yet, or the model has none)
        self.rope: RopeKernels | None = None         # a RoPE model's rotation kernels at `pos_grid`
        self.pos_grid: tuple[int, int] | None = None

    # ------------------------------------------------------------------------------------------ reading

    @property
    def traits(self) -> Traits:
        """How the loaded model is laid out, as its spec says (a plain ViT's before one has loaded)."""
        return self.spec.traits if self.spec is not None else PLAIN_TRAITS

    @property
    def runs_own_code(self) -> bool:
        """The loaded model runs from its own code (the live path): nothing converted, its code says its heads."""
        return runs_own_code(self.spec)

    @property
    def built_by_code(self) -> bool:
        """The loaded model runs the user's code: the live path, or a model built by a `code=` factory."""
        return self.spec is not None and (self.runs_own_code or bool(self.model_code))

    @property
    def verify_due(self) -> bool:
        """Whether the check against the original is to be asked now: a converted model that has not been, or a
        model run from its own code that verify can check (`own_original`: its library's own record of its
        attention); any other model run from its own code is the original: nothing to check."""
        return (self.verify_models and self.spec is not None and not self.verify_asked
                and (not self.runs_own_code or bool(self.own_original)))

    @property
    def checks_against(self) -> tuple[str, str]:
        """(against, code) of the check: what the user chose (Verify against…), else the library that names the
        model, or the code that built it; a model run from its own code is checked against its own library."""
        if self.runs_own_code:
            return "auto", ""
        return self.verify_against, self.verify_code or self.model_code

    def original_name(self) -> str:
        """How the verdict line names the original the check runs ('timm', 'my_vit.py:build'; '' when only the
        check knows: `assumptions.original_name`)."""
        if self.runs_own_code:
            return self.own_original
        against, code = self.checks_against
        return original_name(self.spec, against, code)

    def run_size(self) -> tuple[int, int] | None:
        """The (h, w) the images run at: the chosen size, else the model's own (None without a model)."""
        if self.spec is None:
            return None
        return self.image_size or tuple(self.spec.image_size)  # type: ignore[return-value]

    def whole_patches(self, size: tuple[int, int]) -> tuple[tuple[int, int], str]:
        """`size` rounded down to whole patches of the loaded model (at least one), as the model runs it, and the
        note that says so when that changes the size ('' when it does not, or without a model)."""
        if self.spec is None:
            return (int(size[0]), int(size[1])), ""
        p = self.spec.patch_size
        used = whole_patches(size, p, at_least_one=True)
        if used == tuple(size):
            return used, ""
        why = "is smaller than one" if min(size) < p else "is not a multiple of the"
        return used, f"Input size {size[0]}×{size[1]} {why} {p} px patch; using {used[0]}×{used[1]}"

    def reload_args(self, changes: dict[str, Any]) -> tuple[str | None, dict[str, Any]]:
        """What loads the current model again with `changes` (None removes one): its path (None for a model built
        by code alone) and its overrides. The remembered answers stay remembered (`_remembered`) unless `changes`
        say which are (`_remembered` among them) or change them (a new value is the user's word now)."""
        changes = dict(changes)
        remembered = changes.pop("_remembered", None)
        overrides = {k: v for k, v in {**self.load_overrides, **changes}.items() if v is not None}
        remembered = (self.remembered - set(changes)) if remembered is None else frozenset(remembered)
        if remembered & set(overrides):
            overrides["_remembered"] = frozenset(remembered & set(overrides))
        path = None if self.model_code and self.model_path == self.model_code else self.model_path
        return path, overrides

    def changes_anything(self, changes: dict[str, Any] | None) -> bool:
        """Whether answering the assumptions with `changes` loads the model differently (or says otherwise which
        of its values are remembered answers)."""
        changes = dict(changes or {})
        remembered = changes.pop("_remembered", None)
        return (any(self.load_overrides.get(k) != v for k, v in changes.items())
                or (remembered is not None and frozenset(remembered) != self.remembered))

    # ------------------------------------------------------------------------------------------ answers

    def loaded(self, request: Request, answer: Loaded) -> None:
        """A model has loaded for `request`: it replaces the one before, at its native size, its verdict and
        position embedding not known yet; the question is asked when `ask_assumptions` is on, its file leaves
        something open, and it is neither the demo (ours: its config says its heads) nor one the user answered."""
        args = request.args
        self.model_code = str(args.get("code") or "")
        self.spec, self.device, self.model_path = answer.spec, answer.device, args["path"] or self.model_code
        self.load_overrides = {k: v for k, v in args.items()
                               if k not in ("path", "device", "_remembered") and v is not None}
        self.remembered = frozenset(args.get("_remembered") or ())
        self.live_layers, self.live_skipped = answer.layers, answer.skipped
        self.interruptible = answer.interruptible
        self.library_layout, self.described = answer.library_layout, dict(answer.described)
        self.capabilities, self.own_original = answer.capabilities, answer.own_original
        self.verification, self.verify_failure, self.verify_asked = None, "", False
        self.verify_against, self.verify_code, self.verify_progress = "auto", "", None
        self.awaiting_answers = (self.ask_assumptions and asks_unprompted(answer.spec, answer.library_layout)
                                 and not bundled.is_demo(self.model_path) and self.model_path not in self.kept)
        self.param_counts = dict(answer.counts)
        self.image_size = None
        self.forget_position()

    def set_loading(self, name: str) -> None:
        """A load was asked for, answered, failed or dropped: `name` is the one still on its way ('' for none;
        `loading_changed`)."""
        self.loading = name
        self.loading_changed.emit(bool(name))

    def take_pending_size(self) -> tuple[int, int] | None:
        """The size asked for before the model loaded (--size), once: None when none was."""
        size, self.pending_size = self.pending_size, None
        return size

    def position(self, answer: PosEmbedded) -> None:
        """The position embedding (and RoPE kernels) at the answer's grid (`pos_embed_ready`)."""
        self.pos_grid, self.pos_embed, self.rope = tuple(answer.grid), answer.data, answer.rope
        self.pos_embed_ready.emit()

    def forget_position(self) -> None:
        """Another model, or its position embedding could not be read: none is known."""
        self.pos_embed, self.pos_grid, self.rope = None, None, None
