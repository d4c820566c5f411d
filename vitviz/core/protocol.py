"""What a loaded model offers (`Model`) and what it can do (`capabilities`): asked instead of its class or family.

    model.capabilities      # frozenset({'attention', 'early_stop', 'rows', 'reference', 'gradients', ...})
    is_reference(model)     # vitviz's reference ViT: its hooks give gradients, block outputs, a MAP head's map

`VitModel` (`vitviz.core.running.capture`, a checkpoint converted to the reference ViT) and `LiveModel`
(`vitviz.core.running.live`, the user's own module run as written) both satisfy `Model`; neither inherits the other. The
capability words are the ones `vitviz.core.analyses.mapkinds` names as a map kind's needs.

No torch here (only under TYPE_CHECKING): the window's process can ask without it.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import numpy as np
    import torch

    from vitviz.core.spec import AttentionResult, ModelSpec

ATTENTION = "attention"     # forward_captured gives every layer's (H, T, T) self-attention over all the tokens
EARLY_STOP = "early_stop"   # forward_captured(logits=False, upto=L) stops the forward pass after layer L
ROWS = "rows"               # forward_captured(rows=[...]) keeps only those query rows
REFERENCE = "reference"     # runs as vitviz's ReferenceViT, with its probes and hooks
GRADIENTS = "gradients"     # its attention is exposed to autograd (relevance maps, LeGrad: vitviz.core.analyses.relevance)
FEATURES = "features"       # the blocks' output tokens can be kept (vitviz.core.analyses.features.capture_features)
MAP_HEAD = "map_head"       # a MAP pooling head whose attention forward_captured(pool=[...]) collects
POS_TABLE = "pos_table"     # a learned position table: pos_embed() returns it (else None)
WINDOWS = "windows"         # attends inside windows (Swin, SAM / ViTDet): run() gives a WindowedResult, its maps are
                            # a WindowedMaps (vitviz.core.analyses.winview), its spec a WindowedSpec

CAPABILITIES = frozenset({ATTENTION, EARLY_STOP, ROWS, REFERENCE, GRADIENTS, FEATURES, MAP_HEAD, POS_TABLE, WINDOWS})


@runtime_checkable
class Model(Protocol):
    """A loaded model that vitviz captures attention from (`isinstance(m, Model)` checks the names only).

    `forward_captured(x, ...)` -> (attentions (B, L, H, T, T), output (B, K)); `pool`, a list, gets the MAP head's
    attention (B, H', 1, N') appended when the model has one (`'map_head' in capabilities`) and stays empty
    otherwise -- every model takes it, so callers pass it without asking which kind they hold.
    """

    spec: ModelSpec

    @property
    def device(self) -> str: ...

    @property
    def capabilities(self) -> frozenset[str]: ...

    def to(self, device: str | None) -> Model: ...

    def prepare(self, image: Any, image_size: tuple[int, int] | None = None) -> tuple[Any, ...]: ...

    def run(self, image: Any, image_size: tuple[int, int] | None = None, half: bool = False,
            logits: bool = True) -> AttentionResult: ...

    def forward_captured(self, x: torch.Tensor, half: bool = False, logits: bool = True,
                         upto: int | None = None, rows: Sequence[int] | None = None,
                         pool: list[np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]: ...

    def pos_embed(self, grid: tuple[int, int] | None = None) -> np.ndarray | None: ...


def capabilities_of(model: Any) -> frozenset[str]:
    """`model.capabilities`, or none for an object that states none (a windowed model, a stand-in)."""
    caps = getattr(model, "capabilities", None)
    return caps if isinstance(caps, frozenset) else frozenset()


def capabilities_of_spec(spec: Any) -> frozenset[str]:
    """What a spec alone says its model can do, before a loaded model answers (`capabilities_of`): a windowed
    spec's model attends inside windows (`WINDOWS`); a plain ViT's runs as vitviz's reference ViT unless its family
    is 'live' (the user's own module). This and `windowed` are the one place that tells the lanes apart (how a
    model is laid out, its spec says itself: `ModelSpec.traits`, `WindowedSpec.traits`)."""
    if windowed(spec):
        return frozenset({WINDOWS})
    return frozenset({ATTENTION}) if getattr(spec, "family", "") == "live" else frozenset({ATTENTION, REFERENCE})


def windowed(thing: Any) -> bool:
    """Whether a model, spec, result or per-image holder is of the windowed lane (Swin, SAM / ViTDet): its
    capabilities say `WINDOWS`, or its spec is a `WindowedSpec` (`windowed` set). The one adapter: everything
    else asks capabilities, the `ImageMaps` interface (`vitviz.core.analyses.maps`) or its spec's `traits`."""
    if WINDOWS in capabilities_of(thing):
        return True
    spec = getattr(thing, "spec", thing)      # a result's or holder's spec, or the spec itself
    return bool(getattr(spec, "windowed", False))


def is_reference(model: Any) -> bool:
    """Whether `model` runs as vitviz's reference ViT (gradients, block outputs and the MAP head through its
    hooks); False for a model run from its own code (`LiveModel`) and for anything without capabilities."""
    return REFERENCE in capabilities_of(model)


# ---------------------------------------------------------------------------------------------- interventions

LIVE_REFUSAL = ("it runs your own module, whose attention vitviz reads where it finds it but whose heads' outputs "
                "and blocks it cannot replace exactly")
WINDOWED_REFUSAL = ("its attention runs per (shifted) window over stages of different widths; the interventions are "
                    "defined on the plain ViT's (layer, head, token)")


def refusal(capabilities: frozenset[str], family: str = "") -> str | None:
    """Why a model of these capabilities cannot take interventions exactly (`vitviz.core.running.interventions`), or
    None when it can (vitviz's reference ViT): what the window says on its greyed-out Ablate and Patch entries."""
    if REFERENCE in capabilities:
        return None
    return WINDOWED_REFUSAL if WINDOWS in capabilities else LIVE_REFUSAL if family == "live" else \
        "it does not run as vitviz's reference ViT (it has none of its head and attention hook points)"
