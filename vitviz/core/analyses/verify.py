"""Verifying a converted model against its original implementation: a proof, not a promise.

    check = verify(vitviz.load("vit_small/"))   # -> Verification
    check.verdict                               # 'verified' | 'unverified' | 'differs'
    check.summary()                             # 'Verified against timm 1.0.31 (max 3e-7)'

vitviz converts a checkpoint into its own reference ViT. When something names the model (a timm architecture or
a transformers model type in its config.json, an open_clip model config, a torchvision file name, a timm name in
the training args), the library that made it can build the original: with the file's own weights (read with
`read_checkpoint`, never unpickling code), on one seeded random input of the model's input shape (already
normalised: no image preprocessing is involved), at the model's native size and at one other size (native + 2
patches per side), in float32. Every layer's per-head attention is compared with the original's own eager softmax
(`atol` 1e-5) and the output (class scores or the pooled / projected features) too (`atol` 1e-4). The original's
attention is read where it computes it: transformers with `attn_implementation='eager'`, each layer's weights at
the modules its `output_attentions` reads them from (never asked for as a whole stack); timm with its fused
attention off; open_clip, torchvision and the user's code through the live path's capture
(`vitviz.core.running.live.watch_attention`: nn.MultiheadAttention weights per head, SDPA recomputed, explicit
softmax copied). One forward of the original per size, in step with vitviz's on a thread of its own: each layer is
compared as both compute it and let go, so neither model's (L, H, T, T) stack is held (a composite model's tower
run by its transformers code included: each layer's weights handed over as its next layer begins). A whole CLIP or
SigLIP file's original is its vision side alone (transformers' `CLIPVisionModelWithProjection`, ...): no text tower
is built; open_clip's is its vision tower alone (`CLIP(...).visual`). The file's tensors the original is given are
held once: each that equals, element for element, one vitviz's model holds shares that one's storage (read-only).

With `code='FILE.py:FACTORY'` the user's own module (built by their factory, the file's weights loaded into it as
`vitviz.load(path, code=...)` does) is the original, and vitviz's conversion of the file is checked against it.

The verdict is 'verified' only when every comparison at every size is within tolerance; 'differs' says from which
layer; 'unverified' says why nothing was compared: nothing names the model (then building a library model from
vitviz's own guesses would prove nothing), the library is not importable, or no library builds that family.

A windowed model (Swin, SAM, ViTDet) is compared block by block with the original its config or release name
names: the last section. A timm model vitviz runs by its own code (CaiT, Hiera: live, or a timm hub folder) is
compared with timm's own record of the same model's attention, laid out by the model's own token order: the section
before it.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import json
import math
import os
import re
import threading
import types
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from vitviz.core.options import OPTIONS
from vitviz.core.protocol import WINDOWS, capabilities_of
from vitviz.core.running.runtime import available_memory, format_bytes, resolve_device
from vitviz.errors import VitvizError

ATOL_ATTENTION = 1e-5
ATOL_OUTPUT = 1e-4
VERIFIED, UNVERIFIED, DIFFERS = "verified", "unverified", "differs"
LIBRARIES = ("timm", "transformers", "open_clip", "torchvision", "dinov2")
AGAINST = ("auto",) + LIBRARIES
_PACKAGES = {"timm": "timm", "transformers": "transformers", "open_clip": "open_clip_torch",
             "torchvision": "torchvision", "dinov2": "dinov2 --no-deps"}
# the libraries `against` may name one architecture of ('timm:NAME'): those `vitviz.core.reading.identify` searches
_BY_ARCH = ("timm", "torchvision", "dinov2", "open_clip", "transformers")
_PROBE_SEED = 0
VERIFY_BYTES = 16 << 30  # the attention a comparison may keep when the free memory cannot be read
# layers of (heads, T, T) float32 maps alive at once in a comparison where both models hand each layer over as they
# compute it (each side's scores, softmax and the copy it hands over, the one waiting to be taken, the comparison's
# difference buffer): bench/verify_held.py measured 7.4 (timm, transformers) to 9.3 (a Qwen2.5-VL tower by its code)
# at T = 1600, alike at depth 8 and 16; and beside a whole stack of vitviz's (no `forward_streamed`): 5.3
_STREAMED_LAYERS = 10
_BESIDE_STACK = 6
ONE_SIZE = ("the native size only: nothing in the model depends on the input size (no position table, RoPE or "
            "relative position bias), so another size computes nothing the native one does not")
_EXTRA_PATCHES = 2   # the other size: native + this many patches per side (larger, so a fixed table fails loudly)


class VerifyError(VitvizError):
    """The original could not be run (its forward fails at the model's native size)."""


class _CannotRun(Exception):
    """The original cannot run at this input size (a fixed position table, a size check): the size is skipped."""


class _NotBuildable(Exception):
    """The library the model is named by cannot build it (an architecture it does not register): unverified."""


@dataclass(frozen=True)
class Verification:
    """The outcome of comparing a converted model with its original implementation.

    Attributes:
        verdict: 'verified' (every comparison within tolerance), 'differs' or 'unverified' (nothing compared).
        library: the library that built the original ('timm', 'transformers', 'open_clip', 'torchvision'), or
            'code' for the user's own FILE.py:FACTORY; '' when nothing was built.
        version: that library's version ('' for code).
        original: what was built, e.g. "timm.create_model('vit_small_patch16_224') ...".
        against: how the summary names the original: 'timm 1.0.31', or 'model.py:build' for code.
        max_attention: the largest absolute difference of any layer's per-head attention (None: not compared).
        max_output: the largest absolute difference of the output (class scores or features).
        per_layer: per size checked, ((layer, max attention difference), ...).
        first_differing_layer: the first layer whose attention is beyond tolerance at any size, else None.
        sizes: the input sizes (h, w) compared, native first.
        assumptions: the spec fields that are assumed (`ModelSpec.assumptions`).
        reason: why it is unverified, or what differs when it is more than numbers (a shape, a layer count).
        skipped: (size, why) for the sizes the original cannot run at.
        output_per_size: the output's largest difference per size checked.
        fitting: for a file nothing names, the library architectures whose parameters have exactly its names and
            shapes ('timm:vit_small_patch16_224', ...; `vitviz.core.reading.identify`); () when the model was named.
        matches: those of them that compute what vitviz shows (within tolerance).
        alternatives: (architecture, how it differs) for fitting ones that compute something else, or that state
            another value of a setting no tensor shows.
        confirmed: the assumed settings this comparison confirmed (they become 'verified' in the spec:
            `confirmed_spec`).
        open: (setting, the alternatives) for assumed settings the candidates do not agree on: they stay
            assumptions.
        causes: when it differs, (setting, what the original has) for the settings that could explain it.
        suggested: the load overrides that would make vitviz compute what the original does ((name, value), ...).
        one_size: why the other size of the default two was not compared ('' when it was, or sizes were given):
            nothing in the model depends on the input size.
    """

    verdict: str
    library: str = ""
    version: str = ""
    original: str = ""
    against: str = ""
    max_attention: float | None = None
    max_output: float | None = None
    per_layer: tuple[tuple[tuple[int, float], ...], ...] = ()
    first_differing_layer: int | None = None
    sizes: tuple[tuple[int, int], ...] = ()
    assumptions: tuple[str, ...] = ()
    reason: str = ""
    skipped: tuple[tuple[tuple[int, int], str], ...] = ()
    output_per_size: tuple[float, ...] = ()
    atol_attention: float = ATOL_ATTENTION
    atol_output: float = ATOL_OUTPUT
    fitting: tuple[str, ...] = ()
    matches: tuple[str, ...] = ()
    alternatives: tuple[tuple[str, str], ...] = ()
    confirmed: tuple[str, ...] = ()
    open: tuple[tuple[str, str], ...] = ()
    causes: tuple[tuple[str, str], ...] = ()
    suggested: tuple[tuple[str, Any], ...] = ()
    one_size: str = ""

    @property
    def verified(self) -> bool:
        return self.verdict == VERIFIED

    def summary(self) -> str:
        """One line: 'Verified against timm 1.0.31 (max 3e-7)', 'Not verified — 3 assumptions (eps, mlp_kind,
        block_norm)', 'Differs from the original from layer 1 (max 0.62)'."""
        if self.verdict == VERIFIED:
            against = self.against or f"{self.library} {self.version}".strip()
            worst = max(v for v in (self.max_attention, self.max_output) if v is not None)
            if self.fitting:
                more = len(self.matches) - 1
                line = (f"Matches {against} (shapes exact; max {format_difference(worst)}"
                        + (f"; {more} other architecture{'s' if more != 1 else ''} alike" if more > 0 else "") + ")")
                if self.open:
                    line += " — still assumed: " + ", ".join(name for name, _ in self.open)
                return line
            native = f"; at {self.sizes[0][0]}x{self.sizes[0][1]} only" if self.one_size and self.sizes else ""
            return f"Verified against {against} (max {format_difference(worst)}{native})"
        if self.verdict == DIFFERS:
            original = f"{self.against} " if self.fitting and self.against else "the original "
            if self.first_differing_layer is not None:
                worst = self.max_attention
                detail = format_difference(worst) if worst is not None and math.isfinite(worst) else None
                line = (f"Differs from {original}from layer {self.first_differing_layer} "
                        + (f"(max {detail})" if detail else f"({self.reason.split('; ')[0]})"))
            elif self.max_output is not None and math.isfinite(self.max_output):
                line = f"Differs from {original}in its output (max {format_difference(self.max_output)})"
            else:
                line = f"Differs from {original.strip()}: {self.reason}"
            if self.causes:
                line += "; could be " + ", ".join(f"{name} ({what})" for name, what in self.causes[:3])
            return line
        if self.reason.startswith("nothing names the model"):
            n = len(self.assumptions)
            if not n:
                return "Not verified — nothing names the model"
            return f"Not verified — {n} assumption{'s' if n != 1 else ''} ({', '.join(self.assumptions)})"
        return f"Not verified — {self.reason}"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (the export manifest's 'verification'); a difference that could not be measured
        (shapes that do not match) is None."""
        def number(v: float | None) -> float | None:
            return None if v is None or not math.isfinite(v) else float(v)

        return {
            "verdict": self.verdict, "summary": self.summary(), "library": self.library, "version": self.version,
            "original": self.original, "against": self.against, "max_attention": number(self.max_attention),
            "max_output": number(self.max_output),
            "per_layer": [{"size": list(size), "layers": [[layer, number(d)] for layer, d in layers],
                           "output": number(self.output_per_size[i]) if i < len(self.output_per_size) else None}
                          for i, (size, layers) in enumerate(zip(self.sizes, self.per_layer))],
            "first_differing_layer": self.first_differing_layer, "sizes": [list(s) for s in self.sizes],
            "assumptions": list(self.assumptions), "reason": self.reason,
            "skipped": [{"size": list(size), "why": why} for size, why in self.skipped],
            "atol_attention": self.atol_attention, "atol_output": self.atol_output,
            "fitting": list(self.fitting), "matches": list(self.matches),
            "alternatives": [{"original": a, "how": how} for a, how in self.alternatives],
            "confirmed": list(self.confirmed), "open": [{"setting": f, "alternatives": a} for f, a in self.open],
            "causes": [{"setting": f, "original": what} for f, what in self.causes],
            "suggested": dict(self.suggested), "one_size": self.one_size,
        }


def format_difference(value: float) -> str:
    """3e-07 -> '3e-7', 0.6234 -> '0.62', 0 -> '0'."""
    if value == 0:
        return "0"
    if not math.isfinite(value):
        return str(value)
    if abs(value) < 1e-3:
        mantissa, exponent = f"{value:.0e}".split("e")
        return f"{mantissa}e{int(exponent)}"
    return f"{value:.2g}"


# ---------------------------------------------------------------------------------------------------------------
# The original


Each = Callable[[np.ndarray], None]


@dataclass
class _Original:
    """An original implementation, ready to run: `run(size, x, each)` -> (per-layer (H, T, T) maps, output (K,) or
    None), each map given to `each` as it is computed where the library lets it be read then (the maps returned are
    then none; a tower run by its transformers code returns them at the end); it raises `_CannotRun` for a size
    the original cannot take. `stated`: what its module object states about the settings no tensor shows
    ({override: (value, source)}, as `vitviz.load(module)` reads them). `compared`: what each size's comparison
    found (`_against_ours`), so that its forward runs once per size however often a comparison asks, without
    keeping its maps."""

    library: str
    version: str
    description: str
    run: Callable[[tuple[int, int], torch.Tensor, Each], tuple[list[np.ndarray], np.ndarray | None]]
    against: str = ""   # how the summary names it (default: library and version)
    stated: dict[str, tuple[Any, str]] = field(default_factory=dict)
    name: str = ""      # 'timm:vit_small_patch16_224' for an architecture found by its shapes
    compared: dict[tuple[int, int], tuple[Any, ...]] = field(default_factory=dict, repr=False)


Progress = Callable[[float, str], None]
# Each option -> the spec field it answers (`vitviz.core.options`): what a module object states about its settings
# (`vitviz.core.reading.objects.module_settings`, keyed by option) read as the spec fields they set.
_STATED_FIELDS = {o.name: o.provenance_field for o in OPTIONS if o.provenance_field}
# Assumptions a probe comparison never reaches: the probe is already normalised, so the image preprocessing is
# not compared; the interpolation of a position table only at a size other than the native one; the input size
# only for an original that takes no other.
_NOT_PROBED = ("preprocess", "resize_recipe")
_OTHER_SIZES_ONLY = ("pos_interp", "rel_pos_interp")
_FIXED_SIZE_ONLY = ("image_size", "pos_grid")


def verify(model: Any, against: str = "auto", code: str | None = None,
           sizes: Sequence[int | tuple[int, int]] | None = None, device: str | None = None,
           progress: Progress | None = None) -> Verification:
    """Compare `model` (a `VitModel` from `vitviz.load`) with its original implementation.

    Args:
        model: the converted model. With `code`, the reference ViT of the weights file (a model loaded with
            `code=` itself is converted again from its file, without the code).
        against: 'auto' (the library that names the model; for a file nothing names, the architectures whose
            parameters fit it exactly, `vitviz.core.reading.identify`), one of 'timm', 'transformers', 'open_clip',
            'torchvision' (the model must be named by that library, or fit one of its architectures), or one
            architecture 'timm:NAME' / 'torchvision:ARCH' (compared whatever names the model). Never ignored: an
            `against` that cannot be honoured is said in the verdict.
        code: 'FILE.py:FACTORY': the user's module is the original (this runs FILE.py's code: only when asked).
        sizes: input sizes to compare at (N or (h, w)); default the native size and native + 2 patches per side.
        device: where the original runs (default: where the model is); both are compared in float32.
        progress: called as `progress(fraction, text)` while it runs (from the calling thread).

    A file whose weights do not fit the original its name builds 'differs' (it is not the model its name says).

    Raises:
        VerifyError: the original's forward fails at the first size, or no size could be compared.
        UserCodeError: `code` cannot be imported or run, or the file's weights do not fit its model.
    """
    check = _verify(model, against, code, sizes, device, progress)
    # `_sizes` left the other size out (a model run by its own code says its own reason)
    if sizes is None and check.verified and len(check.sizes) == 1 and not check.skipped and not check.one_size:
        return dataclasses.replace(check, one_size=ONE_SIZE)
    return check


def _verify(model: Any, against: str, code: str | None, sizes: Sequence[int | tuple[int, int]] | None,
            device: str | None, progress: Progress | None) -> Verification:
    library_asked, arch_asked = _parse_against(against)
    if library_asked not in AGAINST or (arch_asked and library_asked not in _BY_ARCH):
        raise VitvizError(f"against={against!r}; expected one of {', '.join(AGAINST)}, or one architecture "
                          f"LIBRARY:ARCH of {', '.join(_BY_ARCH)} (e.g. 'timm:vit_small_patch16_224')")
    if code is not None and against != "auto":
        raise VitvizError(f"against={against!r} and code=: the original is either a library's model or your code")
    if not hasattr(model, "spec"):
        raise VitvizError(f"model is {type(model).__name__}; expected a model from vitviz.load")
    if device is not None:
        device = str(resolve_device(device))   # 'bogus', 'cuda:9' on a machine without it: DeviceError, named
    say = progress or (lambda _f, _t: None)
    spec = model.spec
    assumptions = tuple(name for name, _ in spec.assumptions)
    own = _own_code(model) if code is None and spec.family == "live" and not arch_asked else None
    if own is not None and library_asked in ("auto", own[1]):   # its library's code runs it: its own record of it
        return _verify_own_code(model, *own, sizes, say, assumptions)
    if WINDOWS in capabilities_of(model):  # Swin, SAM / ViTDet: their originals built and compared per block
        return _verify_windowed(model, against, code, sizes, device, progress)
    if code is not None and spec.family == "live":
        model = _reference_of(spec.source, device or model.device)
        spec = model.spec
        assumptions = tuple(name for name, _ in spec.assumptions)

    def unverified(reason: str, library: str = "", version: str = "") -> Verification:
        return Verification(UNVERIFIED, library=library, version=version, assumptions=assumptions, reason=reason)

    if code is None and spec.family == "live" and _by_its_code(spec):
        if (missing := _not_importable("transformers")):
            return unverified(missing, "transformers")
        say(0.0, "Building the transformers original…")
        try:
            original = _build_by_code(Path(spec.source), torch.device(device or model.device))
        except _NotBuildable as e:
            return unverified(str(e), "transformers", _version("transformers"))
        except _WeightsDoNotFit as e:
            version = _version("transformers")
            return Verification(DIFFERS, library="transformers", version=version, original=e.what,
                                against=f"transformers {version}", assumptions=assumptions, reason=str(e))
        return _compare(model, original, _sizes(spec, sizes, not _streams(model)), assumptions,
                        torch.device(device or model.device), say)
    if code is None and spec.family == "live" and _by_timm_code(spec):
        return unverified("timm's own code runs this file (built from its config.json with the file's tensors, "
                          "strictly): vitviz converted nothing, so there is no conversion to verify; the maps are "
                          "the attention timm's modules compute, as recorded (the provenance's 'path' says where)",
                          "timm", _version("timm"))
    if code is None and spec.family == "live":
        return unverified("a live model runs its own code as written: nothing was converted, so there is nothing "
                          "to verify (to check vitviz's conversion of the file, verify vitviz.load(path) with "
                          "code=FILE.py:FACTORY)")
    path = Path(spec.source)
    if not path.exists():
        return unverified(f"the model was not loaded from a file ({spec.source}); the original is built with a "
                          "file's own weights")
    checked = _sizes(spec, sizes, not _streams(model))
    dev = torch.device(device or model.device)
    if code is not None:
        say(0.0, f"Building {Path(code.rpartition(':')[0]).name}'s model…")
        return _compare(model, _build_code(code, path, dev), checked, assumptions, dev, say, everything=True)
    identity = spec.source_of("identity")
    library, name = _named_library(identity) if spec.named else (None, "")
    if arch_asked or not spec.named or (library is None and library_asked != "auto"):
        return _identified(model, path, against, checked, assumptions, dev, say)
    if library is None:
        return unverified(f"family not supported: {identity}; no library vitviz builds originals with "
                          f"({', '.join(LIBRARIES)}) makes this model; pass code=FILE.py:FACTORY to check it "
                          "against your own code")
    if library_asked not in ("auto", library):
        return unverified(f"against={against!r}, but the model is named by {library} ({identity})")
    if (missing := _not_importable(library)):
        return unverified(missing, library)
    try:
        say(0.0, f"Building the {library} original…")
        original = _BUILDERS[library](spec, path, name, dev, raw=_read(path, model))
        return _compare(model, original, checked, assumptions, dev, say)
    except _NotBuildable as e:
        return unverified(str(e), library, _version(library))
    except _WeightsDoNotFit as e:  # named as a model whose weights these are not
        version = _version(library)
        return Verification(DIFFERS, library=library, version=version, original=e.what,
                            against=f"{library} {version}", assumptions=assumptions, reason=str(e))


def _not_importable(library: str) -> str:
    """Why `library` cannot build an original here ('' when it can)."""
    try:
        importlib.import_module(library)
    except Exception as e:  # noqa: BLE001 - not only ImportError: a broken install raises what it raises
        return (f"{library} is not importable ({type(e).__name__}: {e}); pip install {_PACKAGES[library]} "
                "(with a torchvision that matches your torch)")
    return ""


def _parse_against(against: str) -> tuple[str, str]:
    library, _, arch = str(against).partition(":")
    return library.strip(), arch.strip()


# ---------------------------------------------------------------------------------------------------------------
# A file nothing names: its architecture found by its shapes, then compared


def _identified(model: Any, path: Path, against: str, sizes: list[tuple[int, int]], assumptions: tuple[str, ...],
                device: torch.device, say: Progress) -> Verification:
    """Find the library architectures whose parameters fit the file exactly (`identify.candidates`), load the file
    into each kind of them and compare. One forward of each distinct kind (and one of vitviz's, compared with it
    layer by layer) at the native size, the other sizes for the first that matches."""
    from vitviz.core.reading import identify
    spec = model.spec
    library_asked, _ = _parse_against(against)

    def unverified(reason: str, library: str = "") -> Verification:
        version = _version(library) if library and not _not_importable(library) else ""
        return Verification(UNVERIFIED, library=library, version=version, assumptions=assumptions, reason=reason)

    raw = _read(path, model)
    layout = identify.layout_shapes(raw.tensors)
    if layout is None:
        n = len(assumptions)
        return unverified(f"nothing names the model: {n} assumption{'s' if n != 1 else ''}; its key layout is none "
                          f"that {' or '.join(identify.LIBRARIES)} makes, so no library architecture can be found by "
                          "its shapes (pass code=FILE.py:FACTORY to check it against your own code)")
    library, prefix, shapes = layout
    if library_asked not in ("auto", library):
        return unverified(f"against={against!r}, but the file's keys are {library}'s layout, not {library_asked}'s")
    if (missing := _not_importable(library)):
        return unverified(missing, library)
    say(0.0, f"Finding the {library} architecture with these shapes…")
    found = identify.candidates(raw.tensors, against, progress=lambda f, t: say(0.3 * f, t))
    if not found and ":" in against:   # the architecture asked for: its shapes say how it does not fit
        asked = identify.Candidate(library, _parse_against(against)[1], identify.fitting_kwargs(library, shapes),
                                   prefix)
        what = f"{library} {asked.arch}"
        try:
            tower = {k[len(prefix):]: v for k, v in raw.tensors.items() if k.startswith(prefix)}
            _check_fit(asked.build("meta"), tower, what, path)
        except _WeightsDoNotFit as e:
            return Verification(DIFFERS, library=library, version=_version(library), original=what, against=what,
                                assumptions=assumptions, reason=str(e))
    if not found:
        n = len(assumptions)
        return unverified(f"nothing names the model: {n} assumption{'s' if n != 1 else ''}; no {library} "
                          f"architecture ({', '.join(_searched(library))}) has exactly its parameter names and "
                          "shapes (a model of one's own in that library's layout); pass code=FILE.py:FACTORY to "
                          "check it against your own code", library)
    groups: dict[str, list[Any]] = {}
    for c in found:
        groups.setdefault(_kind_of(c), []).append(c)
    fitting = tuple(c.name for c in found)
    results: list[tuple[list[Any], _Original, Verification]] = []
    for i, members in enumerate(groups.values()):
        lead = members[0]
        say(0.3 + 0.5 * i / len(groups), f"Comparing with {library} {lead.arch}…")
        try:
            original = _build_candidate(lead, spec, path, raw, device)
        except _WeightsDoNotFit as e:  # cannot happen for a fitting candidate, said if it does
            results.append((members, _Original(library, _version(library), e.what, _no_run, name=lead.name),
                            Verification(DIFFERS, reason=str(e))))
            continue
        results.append((members, original, _compare(model, original, sizes[:1], assumptions, device)))
    agreeing = [r for r in results if r[2].verdict == VERIFIED]
    alternatives = tuple((m.name, _how_differs(spec, r[1].stated, r[2])) for r in results
                         if r[2].verdict != VERIFIED for m in r[0])
    if not agreeing:
        best = min(results, key=lambda r: r[2].max_attention if r[2].max_attention is not None else math.inf)
        members, original, check = best
        return dataclasses.replace(check, against=f"{library} {members[0].arch}", fitting=fitting,
                                   alternatives=alternatives, **_differs_causes(spec, original, check))
    members, original, _ = agreeing[0]
    say(0.8, f"Comparing with {library} {members[0].arch} at another size…")
    check = _compare(model, original, sizes, assumptions, device)
    matches = tuple(m.name for r in agreeing for m in r[0])
    open_ = _open_settings(spec, results)
    confirmed = _confirmed(spec, check, original.stated, every=len(results) == 1, left=tuple(f for f, _ in open_))
    alternatives += tuple((m.name, "computes the same; states " + _stated_text(r[1].stated, spec))
                          for r in agreeing[1:] for m in r[0] if _stated_differences(spec, r[1].stated))
    say(1.0, "")
    return dataclasses.replace(check, against=f"{library} {members[0].arch}", fitting=fitting, matches=matches,
                               alternatives=alternatives, open=open_, confirmed=confirmed if check.verified else (),
                               **({} if check.verified else _differs_causes(spec, original, check)))


def _searched(library: str) -> tuple[str, ...]:
    from vitviz.core.reading import identify
    if library == "timm":
        return tuple(f"timm.models.{m}" for m in identify.TIMM_MODULES)
    if library == "open_clip":
        return ("open_clip's model configs",)
    if library == "transformers":
        return tuple(identify.TRANSFORMERS_ARCHS)
    return tuple(identify.DINOV2_ARCHS) if library == "dinov2" else identify.TORCHVISION_ARCHS


def _no_run(size: tuple[int, int], x: torch.Tensor, _each: Each) -> tuple[list[np.ndarray], None]:
    raise _CannotRun("it could not be built with the file's weights")


def _kind_of(candidate: Any) -> str:
    """What decides what an architecture computes, beyond its shapes: its modules as built (their classes, eps,
    activations: `repr`) and the settings timm keeps as attributes (pooling, prefix tokens in the table)."""
    net = candidate.build("meta")
    attrs = {a: getattr(net, a, None) for a in ("global_pool", "pool_include_prefix", "no_embed_class",
                                                "num_prefix_tokens", "dynamic_img_pad", "final_norm")}
    return repr(net) + repr(sorted(attrs.items()))


def _build_candidate(candidate: Any, spec: Any, path: Path, raw: Any, device: torch.device) -> _Original:
    if candidate.library == "timm":
        return _build_timm(spec, path, candidate.arch, device, why="its parameters fit the file exactly",
                           label=candidate.name, raw=raw, fit=candidate.build("meta"))
    if candidate.library == "dinov2":
        return _build_dinov2(candidate, path, raw, device)
    if candidate.library == "transformers":
        return _build_transformers(spec, path, candidate.arch, device, candidate=candidate, raw=raw)
    if candidate.library == "open_clip":
        from vitviz.core.reading.identify import open_clip_config

        cfg = open_clip_config(candidate.arch, candidate.kwargs.get("img_size"))
        return _build_open_clip(spec, path, candidate.arch, device, given=(cfg, f"open_clip '{candidate.arch}'"),
                                label=candidate.name, raw=raw)
    return _build_torchvision(spec, path, candidate.arch, device, label=candidate.name, raw=raw)


def _build_dinov2(candidate: Any, path: Path, raw: Any, device: torch.device) -> _Original:
    """facebookresearch/dinov2's backbone (its `dinov2` package) with the file's weights; it resamples its own
    position table at another size (`interpolate_pos_encoding`), so one module runs both sizes."""
    from vitviz.core.reading.identify import DINOV2_ARCHS

    what = f"dinov2.models.vision_transformer.{DINOV2_ARCHS[candidate.arch][0]}(patch_size=14, " \
           f"img_size={candidate.kwargs.get('img_size', 518)}, init_values=1.0) (dinov2 hub {candidate.arch})"
    net = _built(lambda: candidate.build("cpu"), raw.tensors, what, path).float().eval().to(device)
    return _Original("dinov2", _version("dinov2"), what, _captured_run(lambda _size: net), stated=_stated(net),
                     name=candidate.name)


def _stated_value(spec: Any, override: str, value: Any) -> Any:
    """A stated value as the spec field holds it (an attention scale of head_dim ** -0.5 is 0.0 in both)."""
    if override == "attn_scale" and value and abs(float(value) - spec.head_dim ** -0.5) < 1e-12:
        return 0.0
    return value


def _stated_differences(spec: Any, stated: dict[str, tuple[Any, str]]) -> dict[str, Any]:
    """{spec field: the original's value} for each setting the original states otherwise than vitviz's spec."""
    out = {}
    for override, (value, _src) in stated.items():
        field_name = _STATED_FIELDS.get(override)
        if field_name is None or not spec.relevant(field_name):
            continue
        theirs = _stated_value(spec, override, value)
        if not _same(getattr(spec, field_name, None), theirs):
            out[field_name] = theirs
    return out


def _same(mine: Any, theirs: Any) -> bool:
    """Whether a setting's two values are the same (numbers to 1e-12; a size as a tuple)."""
    if isinstance(mine, float) or isinstance(theirs, float):
        return mine is not None and theirs is not None and abs(float(mine) - float(theirs)) <= 1e-12
    if isinstance(mine, (tuple, list)) or isinstance(theirs, (tuple, list)):
        return tuple(mine or ()) == tuple(theirs or ())
    return mine == theirs


def _stated_text(stated: dict[str, tuple[Any, str]], spec: Any) -> str:
    diffs = _stated_differences(spec, stated)
    return ", ".join(f"{k} {v}" for k, v in diffs.items()) or "the same settings"


def _how_differs(spec: Any, stated: dict[str, tuple[Any, str]], check: Verification) -> str:
    diffs = _stated_differences(spec, stated)
    where = (f"differs from layer {check.first_differing_layer}" if check.first_differing_layer is not None
             else "differs in its output" if check.verdict == DIFFERS else "not compared")
    if check.max_attention is not None and math.isfinite(check.max_attention):
        where += f" (max {format_difference(check.max_attention)})"
    return where + (f"; it has {', '.join(f'{k} {v}' for k, v in diffs.items())}" if diffs else "")


def _open_settings(spec: Any, results: list[tuple[list[Any], _Original, Verification]]) -> tuple[
        tuple[str, str], ...]:
    """(setting, the alternatives) for each assumed setting some fitting architecture states otherwise than what
    is shown: no tensor tells them apart, so it stays an assumption."""
    assumed = {f for f, _ in spec.assumptions}
    out: dict[str, list[str]] = {}
    for members, original, _check in results:
        for field_name, value in _stated_differences(spec, original.stated).items():
            if field_name in assumed:
                out.setdefault(field_name, []).append(f"{value} as {', '.join(m.name for m in members)}")
    return tuple((f, "; ".join(alts)) for f, alts in out.items())


def _confirmed(spec: Any, check: Verification, stated: dict[str, tuple[Any, str]], every: bool,
               left: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The assumed settings a verified comparison confirms. `every`: the original is the only kind of model the
    file can be (the user's own code, or one kind of architecture fits): every assumed setting the probe reaches.
    Otherwise only those the originals state (eps, activation, ...) with the value shown. The preprocessing is
    never confirmed (the probe is normalised already), a table's interpolation only at a size other than the
    native one; `left`: settings that stay open."""
    if not check.verified:
        return ()
    other_size = any(tuple(s) != tuple(spec.image_size) for s in check.sizes)
    # the input size is confirmed only where the original takes no other (it could not run at the other size)
    fixed_size = bool(check.skipped) and not other_size
    stated_fields = {_STATED_FIELDS[k] for k in stated if k in _STATED_FIELDS}
    out = []
    for name, _src in spec.assumptions:
        if name in _NOT_PROBED or name in left or (name in _OTHER_SIZES_ONLY and not other_size) or (
                name in _FIXED_SIZE_ONLY and not fixed_size):
            continue
        if name in _stated_differences(spec, stated):   # the original says otherwise: within tolerance, not the same
            continue
        if every or name in stated_fields:
            out.append(name)
    return tuple(out)


def _differs_causes(spec: Any, original: _Original, check: Verification) -> dict[str, Any]:
    """`causes` and `suggested` for a comparison that differs: the head count the original's maps have, and each
    assumed setting its module states otherwise."""
    causes: list[tuple[str, str]] = []
    suggested: dict[str, Any] = {}
    heads = _heads_in(check.reason)
    if heads is not None and heads != spec.num_heads:
        causes.append(("num_heads", f"{heads} heads"))
        suggested["heads"] = heads
    override_of = {_STATED_FIELDS[k]: k for k in original.stated if k in _STATED_FIELDS}
    for field_name, value in _stated_differences(spec, original.stated).items():
        if field_name == "num_heads" and "heads" in suggested:
            continue
        causes.append((field_name, f"{value}"))
        suggested[override_of[field_name]] = value
    assumed = {f for f, _ in spec.assumptions}
    causes.sort(key=lambda c: c[0] not in assumed)   # an assumption first: the likelier cause
    return {"causes": tuple(causes), "suggested": tuple(suggested.items())}


def _heads_in(reason: str) -> int | None:
    """The original's head count from a shape note ('... (heads, T, T) = (4, 50, 50), vitviz's (1, 50, 50)')."""
    m = re.search(r"\(heads, T, T\) = \((\d+),", reason or "")
    return int(m.group(1)) if m else None


def confirmed_spec(spec: Any, check: Verification) -> Any:
    """`spec` with the settings `check` confirmed no longer assumed: each source becomes 'verified: ...' (kind
    'verified'), saying against what; unchanged when nothing was confirmed."""
    if not check.confirmed:
        return spec
    against = check.against or check.library
    worst = format_difference(check.max_attention or 0.0)
    how = (f"verified: {against} computes the same with it (attention max {worst})"
           + ("; its parameters fit the file exactly" if check.fitting else ""))
    confirmed = set(check.confirmed)
    provenance = tuple((k, f"{how} (was {v})" if k in confirmed else v) for k, v in spec.provenance)
    return dataclasses.replace(spec, provenance=provenance)


def apply_verification(model: Any, check: Verification) -> None:
    """Mark the settings `check` confirmed as verified in `model.spec` (and its network's)."""
    spec = confirmed_spec(model.spec, check)
    if spec is not model.spec:
        model.spec = spec
        net = getattr(model, "net", None)
        if net is not None and hasattr(net, "spec"):
            net.spec = spec


def _reference_of(source: str, device: str) -> Any:
    from vitviz.core.running.load import load

    return load(source, device=device)


def _named_library(identity: str) -> tuple[str | None, str]:
    """(library, model name) from the spec's 'identity' entry; (None, '') when no library here makes it."""
    if (m := re.match(r"named: timm architecture '([^']+)'", identity)):
        return "timm", m.group(1)
    if identity.startswith("named: transformers model_type"):
        return "transformers", ""
    if identity.startswith("named: open_clip model config"):
        return "open_clip", ""
    if (m := re.match(r"named: torchvision (\S+) \(file name\)", identity)):
        return "torchvision", m.group(1)
    if (m := re.match(r"named: (?:model name|the published file) '([^']+)'", identity)):
        try:
            import timm
        except Exception:  # noqa: BLE001 - ImportError, or a broken install's error: said by the caller
            return "timm", m.group(1)  # said as 'not importable' by the caller
        if timm.is_model(m.group(1)):
            return "timm", m.group(1)
    return None, ""


def _sizes(spec: Any, sizes: Sequence[int | tuple[int, int]] | None, whole: bool) -> list[tuple[int, int]]:
    """The sizes to compare at, checked: whole patches, at least one, and the attention the comparison holds at once
    fitting in memory (`_held_layers`: a few layers where both models hand each layer over as they compute it, a
    whole stack more where vitviz's model gives its `whole` stack: no `forward_streamed`), refused before the
    allocation a size of 100000 asks. By default the native size and native + 2 patches per side, that one only
    where it can differ (`_one_size`)."""
    native = (int(spec.image_size[0]), int(spec.image_size[1]))
    if sizes is None:
        p = spec.patch_size
        other = (native[0] + _EXTRA_PATCHES * p, native[1] + _EXTRA_PATCHES * p)
        return [native] if _one_size(spec) else [native, other]
    expected = f"expected input sizes N or (h, w) in whole {spec.patch_size} px patches, e.g. [{native[0]}]"
    if isinstance(sizes, (str, bytes)) or not isinstance(sizes, Sequence):
        raise VitvizError(f"sizes={sizes!r}: {expected}")
    out = []
    for s in sizes:
        size = (s, s) if _whole(s) else tuple(s) if isinstance(s, (tuple, list)) and len(s) == 2 else None
        if size is None or not all(_whole(v) for v in size):
            raise VitvizError(f"size {s!r}: {expected}")
        if size[0] % spec.patch_size or size[1] % spec.patch_size or min(size) < spec.patch_size:
            raise VitvizError(f"size {size}: expected whole {spec.patch_size} px patches")
        tokens = (size[0] // spec.patch_size) * (size[1] // spec.patch_size) + spec.num_prefix
        held = _held_layers(spec, whole)
        needed = held * spec.num_heads * tokens * tokens * 4
        free = available_memory()
        if needed > (free if free is not None else VERIFY_BYTES):
            how = (f"{held} layers' maps held at once, vitviz's whole stack of {spec.depth} among them (the model "
                   "gives no layer before its last: no forward_streamed)" if whole else
                   f"{held} layers' maps held at once, each layer compared as both models compute it")
            raise VitvizError(f"size {size}: comparing the attention of {spec.num_heads} heads over {tokens:,} "
                              f"tokens ({how}) needs {format_bytes(needed)}, more than the "
                              f"{format_bytes(free or VERIFY_BYTES)} {'available' if free is not None else 'allowed'}"
                              "; expected a smaller size")
        out.append((int(size[0]), int(size[1])))
    if not out:
        raise VitvizError("sizes=(): expected at least one input size")
    return out


def _streams(model: Any) -> bool:
    """Whether vitviz's model hands each layer's attention over as it computes it (`forward_streamed`)."""
    return callable(getattr(model, "forward_streamed", None))


def _held_layers(spec: Any, whole: bool) -> int:
    """How many layers of (heads, T, T) maps a comparison holds at once: `_STREAMED_LAYERS`, or vitviz's `whole`
    stack and `_BESIDE_STACK` (every original hands its layers over as it computes them)."""
    return spec.depth + _BESIDE_STACK if whole else _STREAMED_LAYERS


def _one_size(spec: Any) -> bool:
    """Whether a comparison at another size than the native one would prove nothing more (`ONE_SIZE`): a model
    with no position table (learned or computed), no RoPE and no relative position bias computes every token alike
    at any size. A model run by its own code (live) is not known to be so."""
    return not (spec.family == "live" or spec.pos_embed or spec.rope or spec.rel_pos or spec.rel_pos_mlp)


def _whole(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def probe_input(spec: Any, size: tuple[int, int]) -> torch.Tensor:
    """The deterministic probe: a seeded standard-normal (1, C, h, w) tensor, already normalised."""
    return torch.randn(1, spec.in_chans, *size, generator=torch.Generator().manual_seed(_PROBE_SEED))


# ---------------------------------------------------------------------------------------------------------------
# Comparing


def _compare(model: Any, original: _Original, sizes: list[tuple[int, int]], assumptions: tuple[str, ...],
             device: torch.device, say: Progress | None = None, everything: bool = False,
             at_size: Callable[[tuple[int, int]], tuple[Any, ...]] | None = None) -> Verification:
    """Run the original and vitviz's model on the probe at each size and compare every layer's maps and the output.
    `everything`: the original is the model itself (the user's code), so a match confirms every assumed setting
    the probe reaches; otherwise only those the original's modules state. The original runs first; vitviz's
    forward then compares each layer as it is computed (`_against_ours`), so a few layers' maps are held at a
    time (a vitviz model without `forward_streamed`: its whole stack), never both models' stacks. `at_size(size)`:
    another way to compare at one size (a windowed model's, block by block: `_windowed_at_size`); its verdict
    confirms no setting (windowed settings are not yet confirmed)."""
    checked: list[tuple[int, int]] = []
    per_layer: list[tuple[tuple[int, float], ...]] = []
    outputs: list[float] = []
    skipped: list[tuple[tuple[int, int], str]] = []
    problems: list[str] = []
    first: int | None = None
    for i, size in enumerate(sizes):
        if say is not None:
            say(i / len(sizes), f"Comparing at {size[0]}x{size[1]} ({i + 1}/{len(sizes)})…")
        try:
            if at_size is not None:
                original.compared[size] = at_size(size)
            elif size not in original.compared:   # its one forward at this size, compared with ours as both run
                original.compared[size] = _against_ours(model, probe_input(model.spec, size), original, size, device)
        except _CannotRun as e:
            skipped.append((size, str(e)))
            continue
        except _TheirsFailed as failed:   # the original's own forward failed: said, with its error
            e = failed.error
            if not checked and not skipped:
                raise VerifyError(f"{original.description}: its forward failed on a {size[0]}x{size[1]} probe "
                                  f"({type(e).__name__}: {e})") from e
            skipped.append((size, f"the original cannot run at {size[0]}x{size[1]} ({type(e).__name__}: "
                                  f"{str(e)[:200]})"))
            continue
        layers, layer_first, notes, out_diff, note = original.compared[size]
        problems += notes
        if layer_first is not None:
            first = layer_first if first is None else min(first, layer_first)
        if note:
            problems.append(note)
        checked.append(size)
        per_layer.append(layers)
        outputs.append(out_diff)
    if not checked:
        raise VerifyError(f"{original.description}: no size could be compared ("
                          + "; ".join(f"{s[0]}x{s[1]}: {why}" for s, why in skipped) + ")")
    max_attention = max((d for layers in per_layer for _, d in layers), default=0.0)
    max_output = max(outputs)
    ok = first is None and not problems and max_output <= ATOL_OUTPUT
    check = Verification(
        VERIFIED if ok else DIFFERS, library=original.library, version=original.version,
        original=original.description, against=original.against or f"{original.library} {original.version}",
        max_attention=max_attention, max_output=max_output, per_layer=tuple(per_layer), first_differing_layer=first,
        sizes=tuple(checked), assumptions=assumptions, reason="; ".join(dict.fromkeys(problems)),
        skipped=tuple(skipped), output_per_size=tuple(outputs))
    if say is not None:
        say(1.0, "")
    if at_size is not None:
        return check
    if check.verified:
        return dataclasses.replace(check, confirmed=_confirmed(model.spec, check, original.stated, every=everything))
    return dataclasses.replace(check, **_differs_causes(model.spec, original, check))


def _against_ours(model: Any, x: torch.Tensor, original: _Original, size: tuple[int, int],
                  device: torch.device) -> tuple[Any, ...]:
    """The original's forward and vitviz's on the probe `x`, in step: the original runs on a thread of its own
    (`_Theirs`) and hands each layer's map over as it computes it; vitviz's forward compares its own layer of that
    index with it as its softmax is done and lets both go. So neither model's (L, H, T, T) stack is ever held (an
    original whose run returned its maps only at the end would hold its own stack until they are handed over, one
    at a time: none of verify's originals does). (per layer differences, first layer beyond tolerance, notes,
    output difference, output note). A model with no `forward_streamed` gives its whole stack
    (`forward_captured`) and is compared from it."""
    theirs = _Theirs(original, size, x)
    sink = _LayerByLayer(theirs, size)
    ours: BaseException | None = None
    with _exact_float32(device), _exact_float32(torch.device(model.device)):
        theirs.start()
        try:
            if _streams(model):
                out_ours = model.forward_streamed(x, sink.append)
            else:
                attn, out_ours = model.forward_captured(x)
                for layer in attn[0]:
                    sink.append(torch.from_numpy(layer)[None])
                del attn
        except _TheirsStopped:   # the original failed before its last layer: it is said, not ours
            out_ours = None
        except BaseException as e:  # noqa: BLE001 - ours failed: the original is let finish, then it is raised
            ours = e
        finally:
            theirs.finish()
    layers, first, notes = _settled(ours, theirs, sink, model, x)
    return (layers, first, notes, *_output_difference(out_ours[0], theirs.out, size))


def _settled(ours: BaseException | None, theirs: Any, sink: Any, model: Any, x: torch.Tensor) -> tuple[Any, ...]:
    """After both forwards: ours' failure raised, then the original's; a non-finite map refused as a capture refuses
    it (its cause named); else (per layer differences, first layer beyond tolerance, notes)."""
    if ours is not None:
        raise ours
    theirs.raise_failure()
    if not sink.finite:
        model.forward_captured(x)
    return sink.differences()


_DONE = object()   # the original's thread has finished (its output, or its failure, is set)


class _TheirsFailed(Exception):
    """The original's own forward failed (with `error`, not one of vitviz's): said as the original's."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


class _TheirsStopped(Exception):
    """Raised inside vitviz's forward when the original failed: nothing is left to compare with."""


class _Theirs:
    """The original's forward at one size on a thread of its own, each layer's (H, T, T) map handed over through a
    queue of one as it is computed (the thread waits until the one before was taken), then `_DONE`. `out`: its
    output vector; its failure is raised by `raise_failure` (its `_CannotRun` and `VitvizError` as they are, any
    other as `_TheirsFailed`)."""

    def __init__(self, original: _Original, size: tuple[int, int], x: torch.Tensor) -> None:
        import queue
        import threading

        self.original, self.size, self.x = original, size, x
        self.maps: queue.Queue = queue.Queue(maxsize=1)
        self.out: np.ndarray | None = None
        self.error: BaseException | None = None
        self.done = False
        self.taken = 0    # layers handed over to vitviz's forward
        self.extra = 0    # layers computed beyond those (counted by `finish`)
        self.thread = threading.Thread(target=self._run, name="vitviz-verify-original", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def _run(self) -> None:
        try:
            maps, self.out = self.original.run(self.size, self.x, self.maps.put)
            while maps:   # an original that gives its maps only at the end: handed over one at a time
                self.maps.put(maps.pop(0))
        except BaseException as e:  # noqa: BLE001 - raised where it is asked for (`raise_failure`)
            self.error = e
        finally:
            self.maps.put(_DONE)

    def next(self) -> np.ndarray | None:
        """The original's next layer; None when it has no more (it finished, or failed)."""
        if self.done:
            return None
        item = self.maps.get()
        if item is _DONE:
            self.done = True
            return None
        self.taken += 1
        return item

    def finish(self) -> None:
        """Wait for the original's thread, counting the layers it computed beyond those taken (`extra`)."""
        while not self.done:
            if self.maps.get() is _DONE:
                self.done = True
            else:
                self.extra += 1
        self.thread.join()

    def raise_failure(self) -> None:
        if self.error is None:
            return
        if isinstance(self.error, (_CannotRun, VitvizError)):
            raise self.error
        raise _TheirsFailed(self.error) from self.error


class _LayerByLayer:
    """A capture sink comparing each (1, H, T, T) layer of vitviz's with the original's of that index as both
    come (`_Theirs`): the largest |difference| per layer, or inf where shapes or layer counts differ."""

    def __init__(self, theirs: _Theirs, size: tuple[int, int]) -> None:
        self.theirs, self.where = theirs, f"at {size[0]}x{size[1]}"
        self.rows: list[tuple[int, float]] = []
        self.notes: list[str] = []
        self.finite = True
        self.diff: torch.Tensor | None = None

    def append(self, layer: torch.Tensor) -> None:
        i = len(self.rows)
        a = layer[0].float().cpu()
        b = self.theirs.next()
        if b is None and self.theirs.error is not None:
            raise _TheirsStopped     # the original failed: `_settled` raises its failure, ours is not read
        d = math.inf                 # no layer of the original's at this index, or one of another shape
        if b is not None and tuple(a.shape) != tuple(b.shape):
            self.notes.append(f"layer {i} {self.where}: the original's attention has shape (heads, T, T) = "
                              f"{tuple(b.shape)}, vitviz's {tuple(a.shape)}")
        elif b is not None:
            # torch's ops use every core (numpy's one), and one pass less: ours is read for non-finite values only
            # where the largest difference is not finite -- a NaN or inf of ours always makes it so (x - finite,
            # inf - inf, NaN - anything)
            b = torch.as_tensor(b)
            dtype = torch.promote_types(a.dtype, b.dtype)   # a float64 original is compared in float64
            if self.diff is None or self.diff.shape != a.shape or self.diff.dtype != dtype:
                self.diff = torch.empty(a.shape, dtype=dtype)   # one buffer for every layer: no temporaries
            torch.sub(a, b, out=self.diff).abs_()
            d = float(self.diff.max())
        if not math.isfinite(d):
            self.finite = self.finite and bool(torch.isfinite(a).all())
        self.rows.append((i, d))

    def differences(self) -> tuple[tuple[tuple[int, float], ...], int | None, list[str]]:
        """Per layer the largest |difference|; the first layer beyond tolerance; what could not be compared."""
        ours = len(self.rows)
        count = self.theirs.taken + self.theirs.extra
        rows = self.rows + [(i, math.inf) for i in range(ours, count)]
        first = next((i for i, d in rows if d > ATOL_ATTENTION), None)
        notes = list(self.notes)
        if ours != count:
            notes.append(f"{self.where}: the original computes {count} self-attention layers, vitviz {ours}")
        return tuple(rows), first, notes


def _output_difference(ours: np.ndarray, theirs: np.ndarray | None, size: tuple[int, int]) -> tuple[float, str]:
    if theirs is None:
        return math.inf, f"at {size[0]}x{size[1]}: the original's forward returns no output tensor to compare"
    if ours.shape != theirs.shape:
        return math.inf, (f"at {size[0]}x{size[1]}: the original's output has shape {theirs.shape}, vitviz's "
                          f"{ours.shape}")
    diff = float(np.abs(ours - theirs).max()) if ours.size else 0.0
    if diff > ATOL_OUTPUT and theirs.size and theirs.min() >= 0 and abs(float(theirs.sum()) - 1.0) < 1e-4:
        # the original ends in a Softmax (tutorial ViTs return probabilities): vitviz's output is the logits before
        # it, so the probabilities are compared
        exp = np.exp(ours.astype(np.float64) - ours.max())
        return float(np.abs(exp / exp.sum() - theirs).max()), ""
    return diff, ""


@contextmanager
def _exact_float32(device: torch.device) -> Iterator[None]:
    """No TF32 on CUDA while comparing (cuDNN convolutions use it by default): float32 means float32."""
    if device.type != "cuda":
        yield
        return
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


# ---------------------------------------------------------------------------------------------------------------
# Running an original


def _capture(module: nn.Module, x: torch.Tensor, each: Callable[[np.ndarray], None] | None = None) -> tuple[
        list[np.ndarray], Any]:
    """One forward of `module` with every self-attention it computes read where it is computed (the live path's
    capture: nn.MultiheadAttention weights per head, SDPA recomputed, explicit softmax copied): the (H, T, T)
    maps in call order and the forward's result. With `each`, each map is given to it as it is computed (a copy:
    the module may reuse its tensor) and none is kept."""
    from vitviz.core.running.live.record import _Recorder, watch_attention

    keep = None if each is None else (lambda m: each(m[0].float().cpu().clone().numpy()))
    recorder = _Recorder(int(x.shape[0]), keep=keep)
    with torch.inference_mode(), watch_attention(module, recorder):
        out = module(x)
    return [m[0].cpu().numpy() for m in recorder.maps], out


def _main_tensor(out: Any) -> np.ndarray | None:
    """The output vector (K,) of a forward's result: a (1, K) tensor, or the one the live path shows."""
    from vitviz.core.running.live.describe import _main_output

    main, _ = _main_output(out)
    if main is None or main.dim() != 2:
        return None
    return main[0].detach().float().cpu().numpy()


def _device_of(module: nn.Module) -> torch.device:
    return next((p.device for p in module.parameters()), torch.device("cpu"))


class _WeightsDoNotFit(VerifyError):
    """The file's weights do not fit the original its name builds: the model is not what its name says."""

    def __init__(self, message: str, what: str) -> None:
        super().__init__(message)
        self.what = what


def _built(factory: Callable[[], nn.Module], tensors: dict[str, torch.Tensor], what: str, where: Path) -> nn.Module:
    """`factory()` with the file's tensors. It is built on the meta device first (shapes only): every parameter
    must come from the file with its shape and nothing may be left over (a training wrapper's prefix 'module.', ...
    is removed when that makes them fit). When the file holds every tensor the module has (and its constructor
    computes none of its own), the file's tensors are the module's (no random init to overwrite); otherwise it is
    built for real and loaded (buffers the file lacks keep the module's own values)."""
    try:
        with torch.device("meta"):
            shadow = factory()
    except Exception:  # noqa: BLE001 - a constructor that needs real tensors: checked after building instead
        shadow = None
    if shadow is not None:
        tensors = _strip_wrappers(tensors, shadow.state_dict())
        _check_fit(shadow, tensors, what, where)
        state = shadow.state_dict()
        computed = {n for n, _ in shadow.named_buffers()} - set(state)   # non-persistent: made by its constructor
        cached = any(isinstance(v, torch.Tensor) for m in shadow.modules() for v in vars(m).values())
        if not computed and not cached and all(k in tensors for k in state):
            # every tensor it has comes from the file: take them as they are, no random init to overwrite
            shadow.load_state_dict({k: tensors[k] for k in state}, strict=True, assign=True)
            return shadow
    net = factory()
    if shadow is None:
        tensors = _strip_wrappers(tensors, net.state_dict())
        _check_fit(net, tensors, what, where)
    net.load_state_dict(tensors, strict=False)
    return net


def _check_fit(module: nn.Module, tensors: dict[str, torch.Tensor], what: str, where: Path) -> None:
    own = module.state_dict()
    params = {n for n, _ in module.named_parameters()}
    missing = sorted(k for k in own if k not in tensors and k in params)
    extra = sorted(k for k in tensors if k not in own)
    wrong = [f"{k}: file {tuple(tensors[k].shape)} vs original {tuple(own[k].shape)}" for k in own
             if k in tensors and tuple(tensors[k].shape) != tuple(own[k].shape)]
    if missing or extra or wrong:
        parts = ([f"shapes differ: {'; '.join(wrong[:4])}"] if wrong else []) + \
                ([f"not in the file: {', '.join(missing[:6])}"] if missing else []) + \
                ([f"not in the original: {', '.join(extra[:6])}"] if extra else [])
        raise _WeightsDoNotFit(f"{where}: its weights do not fit {what}: " + " | ".join(parts), what)


def _read(path: Path, model: Any = None) -> Any:
    """The file's tensors (`read_checkpoint`). With `model` (the vitviz model being verified), each tensor equal
    element for element to one `model` holds (same shape, dtype and device) becomes that one, and one equal to a
    block of rows of one (a query, key or value weight vitviz fused into its qkv) or to one in another shape (a
    class token vitviz keeps as (1, 1, D)) becomes a view of it in the file's shape; a float16 / bfloat16 tensor
    is compared as the float32 the original runs in. The storage is shared, read-only, so the weights are not held
    twice. The original still gets every tensor of the file, with the file's values in the file's own shape:
    nothing of vitviz's conversion reaches it, only memory is saved."""
    from vitviz.core.reading.checkpoint import read_checkpoint

    raw = read_checkpoint(path)
    net = getattr(model, "net", None)
    if not isinstance(net, nn.Module):
        return raw
    mine = [t for t in net.state_dict().values() if t.is_contiguous()]
    held: dict[tuple[Any, ...], list[torch.Tensor]] = {}
    for t in mine:
        held.setdefault(_fingerprint(t), []).append(t)
    views: dict[tuple[Any, ...], list[torch.Tensor]] = {}
    shapes = {tuple(t.shape) for t in raw.tensors.values() if t.numel()}
    for h in mine:   # vitviz's tensors in the file's shapes, whole or a block of rows (contiguous either way)
        for shape in shapes:
            if shape == tuple(h.shape):
                continue
            if h.numel() == math.prod(shape):
                parts = [h.view(shape)]
            elif (len(shape) == h.dim() and shape[1:] == tuple(h.shape[1:]) and h.shape[0] % shape[0] == 0
                  and h.shape[0] <= 8 * shape[0]):   # fused: qkv, kv, gate and up (not every row of a matrix)
                parts = list(h.split(shape[0]))
            else:
                continue
            for part in parts:
                views.setdefault(_fingerprint(part), []).append(part)
    for k, t in raw.tensors.items():
        # a float16 / bfloat16 file's tensor is compared as the float32 the original runs in (exactly its values)
        wide = t.float() if t.is_floating_point() and t.dtype != torch.float32 else t
        key = _fingerprint(wide)
        same = next((h for h in (*held.get(key, ()), *views.get(key, ())) if torch.equal(h, wide)), None)
        if same is not None:
            raw.tensors[k] = same
    return raw


def _fingerprint(t: torch.Tensor) -> tuple[Any, ...]:
    """What two equal tensors share, cheap to compute: shape, dtype, device and up to 8 sampled values."""
    flat = t.detach().reshape(-1)
    sample = flat[:: max(1, flat.numel() // 8)][:8].tolist() if flat.numel() else []
    return (tuple(t.shape), t.dtype, t.device, *sample)


def _folder(path: Path) -> Path:
    return path if path.is_dir() else path.parent


def _version(module_name: str) -> str:
    from vitviz.core.reading.identify import _version as release

    return release(module_name)


def _captured_run(build: Callable[[tuple[int, int]], nn.Module],
                  output: Callable[[Any], np.ndarray | None] = _main_tensor) -> Callable[
        [tuple[int, int], torch.Tensor, Each], tuple[list[np.ndarray], np.ndarray | None]]:
    """`run(size, x, each)` for an original whose module at a size is `build(size)` (which may raise
    `_CannotRun`): each map given to `each` as it is computed."""
    def run(size: tuple[int, int], x: torch.Tensor, each: Each) -> tuple[list[np.ndarray], np.ndarray | None]:
        module = build(size)
        maps, out = _capture(module, x.to(_device_of(module)), each)
        return maps, output(out)
    return run


def _build_timm(spec: Any, path: Path, name: str, device: torch.device, why: str | None = None, label: str = "",
                raw: Any = None, fit: nn.Module | None = None) -> _Original:
    """timm.create_model from the config.json beside the file (as timm reads a hub folder), or from the name in
    the training args; dynamic_img_size so that one model runs both sizes (resampling its table as timm does)."""
    import timm

    raw = raw if raw is not None else _read(path)
    cfg = (raw.config or {}) if not label else {}
    arch = cfg.get("architecture")
    if isinstance(arch, str) and not timm.is_model(arch):
        # a timm-style folder of a model of one's own (the demo's `vit_demo_shapes_patch8_64`): no registered name,
        # but its `model_args` are timm VisionTransformer's, which is then the original
        model_args = cfg.get("model_args")
        if not (arch.startswith("vit_") and isinstance(model_args, dict)):
            raise _NotBuildable(f"timm has no architecture {arch!r} (named by {_folder(path).name}/config.json) and "
                             "the config gives no VisionTransformer model_args to build it from")
        from timm.models.vision_transformer import VisionTransformer

        kwargs = {**model_args, "num_classes": int(cfg.get("num_classes", spec.num_classes))}
        args = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
        what = (f"timm VisionTransformer({args}) from {_folder(path).name}/config.json ('{arch}' is not a registered "
                "timm name)")
        make: Callable[..., nn.Module] = VisionTransformer
    elif isinstance(arch, str):
        make = functools.partial(timm.create_model, f"local-dir:{_folder(path)}", pretrained=False)
        what = f"timm.create_model('{cfg['architecture']}') from {_folder(path).name}/config.json"
        kwargs: dict[str, Any] = {}
    else:  # named by the training args or a published file's name: the sizes are the file's own (its head and
        # its position table)
        kwargs = {"num_classes": spec.num_classes, "img_size": tuple(spec.pos_grid[i] * spec.patch_size
                                                                      for i in range(2))}
        if fit is not None:   # found by its shapes: built as it fitted (its class count and size)
            kwargs = {"num_classes": int(fit.num_classes), "img_size": tuple(fit.patch_embed.img_size)}
        args = ", ".join(f"{k}={v}" for k, v in kwargs.items())
        make = functools.partial(timm.create_model, name, pretrained=False)
        what = f"timm.create_model('{name}', {args}) ({why or spec.source_of('identity')})"
    dynamic = [True]

    def factory() -> nn.Module:
        if dynamic[0]:
            try:
                return make(**kwargs, dynamic_img_size=True)
            except TypeError:  # a model class without dynamic_img_size: its native size only
                dynamic[0] = False
        return make(**kwargs)

    net = _built(factory, raw.tensors, what, path)
    for m in net.modules():
        if hasattr(m, "fused_attn"):
            m.fused_attn = False  # its eager softmax, not F.scaled_dot_product_attention
    net = net.float().eval().to(device)
    native = tuple(spec.image_size)

    def build(size: tuple[int, int]) -> nn.Module:
        if not dynamic[0] and size != native:
            raise _CannotRun(f"{type(net).__name__} takes no dynamic_img_size: timm runs it at its own size only")
        return net

    return _Original("timm", timm.__version__, what, _captured_run(build), stated=_stated(net), name=label)


def _strip_wrappers(tensors: dict[str, torch.Tensor], own: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The tensors with a training wrapper's prefix ('module.', '_orig_mod.') removed when that makes them fit."""
    best = tensors
    for prefix in ("module.", "_orig_mod.", "model."):
        stripped = {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}
        if len(set(stripped) & set(own)) > len(set(best) & set(own)):
            best = stripped
    return best


def _build_transformers(spec: Any, path: Path, name: str, device: torch.device, candidate: Any = None,
                        raw: Any = None) -> _Original:
    """The config.json's architecture class with eager attention (a whole CLIP / SigLIP: its vision side alone,
    `_vision_side`); the reference attention is what its own `output_attentions` returns, read at the modules
    transformers reads it from as each layer computes it (`_attention_outputs`), never asked for as a whole stack.
    `candidate`: a class found by the file's shapes (`vitviz.core.reading.identify`), built with its model type's
    default configuration at the file's class count and size."""
    import transformers

    folder = _folder(path)
    if candidate is not None:
        from vitviz.core.reading.identify import TRANSFORMERS_ARCHS, transformers_config

        config = transformers_config(candidate.arch, candidate.kwargs)
        cls = getattr(transformers, TRANSFORMERS_ARCHS[candidate.arch][1])
        what = (f"transformers.{candidate.arch}({type(config).__name__}(), eager attention) (its parameters fit "
                "the file exactly)")
    else:
        config = transformers.AutoConfig.from_pretrained(str(folder), local_files_only=True,
                                                         attn_implementation="eager")
        arch = next(iter(getattr(config, "architectures", None) or []), None)
        cls = getattr(transformers, arch, None) if arch else None
        if cls is None:  # no architecture stated: the backbone of its model type
            cls = transformers.AutoModel
            what = (f"transformers.AutoModel ({folder.name}/config.json model_type {config.model_type!r}, eager "
                    "attention)")
        else:
            what = f"transformers.{arch} ({folder.name}/config.json, eager attention)"
    from vitviz.core.reading.towers import from_tensors, original_tower

    raw = raw if raw is not None else _read(path)
    tensors = raw.tensors
    if raw.tower is not None:   # a composite model's vision tower: transformers' own tower module, built alone
        config, cls, what = original_tower(config, raw.tower)
    else:
        config, cls, tensors, what = _vision_side(config, cls, tensors, what)
    # transformers renames a file's keys to its modules' (v5 names them differently): its own loader does that,
    # given the tensors vitviz read (no file is opened by transformers), in float32 (as it runs here), so that those
    # sharing vitviz's storage are taken as they are, not cast to the dtype the config names
    config.dtype = torch.float32
    net, info = from_tensors(cls, config, tensors)
    params = {n for n, _ in net.named_parameters()}
    missing = sorted(k for k in info.get("missing_keys", ()) if k in params)
    bad = [*(f"not in the file: {', '.join(missing[:6])}" for _ in [0] if missing),
           *(f"not in the original: {', '.join(sorted(info['unexpected_keys'])[:6])}" for _ in [0]
             if info.get("unexpected_keys")),
           *(f"shapes differ: {', '.join(str(k) for k in sorted(info['mismatched_keys'], key=str)[:4])}" for _ in [0]
             if info.get("mismatched_keys"))]
    if bad:
        raise _WeightsDoNotFit(f"{path}: its weights do not fit {what}: " + " | ".join(bad), what)
    net = net.float().eval().to(device)
    vision = getattr(net, "vision_model", None)   # a CLIP / SigLIP: its vision tower
    # a task model on a ViT backbone (ViTPose, Depth Anything, CHMv2): vitviz shows its backbone
    backbone = getattr(net, "backbone", None) if getattr(config, "backbone_config", None) is not None else None
    tower = vision if isinstance(vision, nn.Module) else backbone if isinstance(backbone, nn.Module) else net
    accepts = inspect.signature(tower.forward).parameters
    native = tuple(spec.image_size)
    points = _attention_outputs(net)   # (those of a text tower, which is not run, are never called)
    if not points:
        raise _NotBuildable(f"{what}: transformers names no module its output_attentions reads "
                            "(`_can_record_outputs`)")

    def run(size: tuple[int, int], x: torch.Tensor, each: Each) -> tuple[list[np.ndarray], np.ndarray | None]:
        kw = {"interpolate_pos_encoding": True} if size != native and "interpolate_pos_encoding" in accepts else {}
        if tower is backbone:
            kw["output_hidden_states"] = True
        handed = [0]

        def hook(index: int, _m: nn.Module, _i: Any, out: Any) -> None:
            weights = out[index] if isinstance(out, tuple) else out
            if weights is not None:   # (1, H, T, T): the layer's own softmax, handed over as it is computed
                handed[0] += 1
                each(weights.detach()[0].float().cpu().clone().numpy())

        handles = [m.register_forward_hook(functools.partial(hook, index)) for m, index in points]
        try:
            with torch.inference_mode():
                out = tower(pixel_values=x.to(device), **kw)
                vec = (_backbone_output(tower, out, spec) if tower is backbone
                       else _hf_output(net, tower, out, spec.pooling))
        finally:
            for h in handles:
                h.remove()
        if not handed[0]:
            raise VerifyError(f"{what}: its attention modules returned no attention weights")
        return [], vec

    return _Original("transformers", transformers.__version__, what, run, stated=_stated(net),
                     name=candidate.name if candidate is not None else "")


def _attention_outputs(net: nn.Module) -> list[tuple[nn.Module, int]]:
    """The modules of `net` whose outputs transformers' `output_attentions` collects, with the index of the weights
    in their output: what each of its models names in `_can_record_outputs['attentions']` (a class, the end of a
    module's name, or an `OutputRecorder` with its index and layer name), matched as transformers' own capture hooks
    match them (`transformers.utils.output_capturing`), in the order they run."""
    from transformers.utils.output_capturing import OutputRecorder

    recorders = []
    for m in net.modules():
        named = (getattr(type(m), "_can_record_outputs", None) or {}).get("attentions")
        for r in named if isinstance(named, list) else [named] if named is not None else []:
            recorders.append(r if isinstance(r, OutputRecorder) else OutputRecorder(
                target_class=None if isinstance(r, str) else r, index=1, class_name=r if isinstance(r, str) else None))
    points = []
    for name, m in net.named_modules():
        for r in recorders:
            if not ((r.target_class is not None and isinstance(m, r.target_class))
                    or (r.class_name is not None and name.endswith(r.class_name))):
                continue
            if r.layer_name is None or f".{r.layer_name.strip('.')}." in f".{name}.":
                points.append((m, r.index))
                break
    return points


def _vision_side(config: Any, cls: type, tensors: dict[str, torch.Tensor], what: str) -> tuple[Any, type, Any, str]:
    """For a whole dual-encoder file (a CLIP, a SigLIP: a `vision_config` beside a `text_config`, its image side
    under `vision_model.`): transformers' own class of its vision side (`CLIPVisionModelWithProjection` where the
    file has the image projection, else the model class of its vision config) from the vision config, given only
    the vision side's tensors, so that the text tower is not built for a comparison of the image side. Unchanged
    (config, cls, tensors, what) where transformers has no such class (a whole AIMv2's projection)."""
    import transformers

    vision_config, text_config = getattr(config, "vision_config", None), getattr(config, "text_config", None)
    if vision_config is None or text_config is None or not any(k.startswith("vision_model.") for k in tensors):
        return config, cls, tensors, what
    vision_cls = transformers.MODEL_MAPPING.get(type(vision_config), None)
    projected = any(k.startswith("visual_projection.") for k in tensors)
    if vision_cls is not None and projected:
        vision_cls = getattr(transformers, f"{vision_cls.__name__}WithProjection", None)
        vision_config.projection_dim = config.projection_dim
    if vision_cls is None:
        return config, cls, tensors, what
    kept = {k: v for k, v in tensors.items() if k.startswith(("vision_model.", "visual_projection."))}
    side = "vision_config and the image projection" if projected else "vision_config"
    return vision_config, vision_cls, kept, (f"transformers.{vision_cls.__name__}, the vision side of {what} "
                                             f"({side}; its text tower not built)")


def _by_its_code(spec: Any) -> bool:
    """Whether a live model is a composite model's vision tower that `vitviz.load(path)` runs by its transformers
    code (`vitviz.core.reading.towers.BY_CODE`): its file can build transformers' own tower to compare with."""
    from vitviz.core.reading.towers import BY_CODE_ROUTE

    path = spec.source_of("path")
    return f"({BY_CODE_ROUTE}: " in path and not _by_timm_code(spec) and Path(spec.source).exists()


def _by_timm_code(spec: Any) -> bool:
    """Whether a live model is a timm hub folder that `vitviz.load(path)` runs by timm's own code (an architecture
    vitviz does not convert: CaiT, LeViT, Twins, Hiera …)."""
    from vitviz.core.reading.towers import BY_CODE_ROUTE

    return f"({BY_CODE_ROUTE}: timm " in spec.source_of("path")


_RECORDING = threading.local()   # `.calls`: the `_LayerCalls` of the by-code run on this thread, if any


def _recorded_eager(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attention_mask: Any, **kwargs: Any) -> Any:
    """transformers' own eager attention function of `module`'s modeling file, its weights handed to the run on
    this thread (the original's attention, read where transformers returns it, not through vitviz's capture)."""
    import sys

    out, weights = sys.modules[type(module).__module__].eager_attention_forward(
        module, query, key, value, attention_mask, **kwargs)
    calls = getattr(_RECORDING, "calls", None)
    if calls is not None:
        calls.add(module, weights)
    return out, weights


class _LayerCalls:
    """One layer's map from the consecutive calls of one attention module (its windows: on the diagonal, zero
    between them), given to `give` as (H, T, T) as soon as another module's call begins, or at `flush`: so a run
    holds the layer being computed and no more."""

    def __init__(self, give: Callable[[np.ndarray], None]) -> None:
        self.give = give
        self.owner: nn.Module | None = None
        self.parts: list[torch.Tensor] = []

    def add(self, module: nn.Module, weights: torch.Tensor) -> None:
        if module is not self.owner:
            self.flush()
            self.owner = module
        self.parts.append(weights.detach()[0].float().cpu())

    def flush(self) -> None:
        parts, self.parts, self.owner = self.parts, [], None
        if not parts:
            return
        if len(parts) == 1:   # (its module has returned: nothing writes to the weights any more)
            self.give(parts[0].numpy())
            return
        total = sum(int(p.shape[-1]) for p in parts)
        full = torch.zeros(int(parts[0].shape[0]), total, total)
        start = 0
        for p in parts:
            full[:, start:start + p.shape[-1], start:start + p.shape[-1]] = p
            start += int(p.shape[-1])
        del parts
        self.give(full.numpy())


def _build_by_code(path: Path, device: torch.device) -> _Original:
    """transformers' own vision tower of a composite model vitviz runs by its code, built again from the file (its
    config.json, its tower tensors) and run with its own eager attention, whose weights are read through
    transformers' `AttentionInterface` and handed over one layer at a time as the next layer begins (`_LayerCalls`):
    its stack is never held. A packed-patch tower (Qwen-VL) is given the image as its own image processor
    class packs it (`patchify`), and each token is put on the image's grid by where that processor put its pixels (an
    image of patch coordinates, packed alike) and, where the tower moves its tokens (Qwen2.5-VL's windows), by its
    first block's input matched row for row to its patch embedding."""
    import transformers
    from transformers.models.auto.image_processing_auto import IMAGE_PROCESSOR_MAPPING_NAMES

    from vitviz.core.reading.towers import load_tower, original_tower
    from vitviz.core.running.live.packing import RASTER, merge_size, temporal_size

    raw = _read(path)
    config = transformers.AutoConfig.from_pretrained(str(_folder(path)), local_files_only=True)
    sub, cls, what = original_tower(config, raw.tower)
    net, info = load_tower(config, raw.tower, cls, sub, raw.tensors)
    if info.get("missing_keys") or info.get("unexpected_keys") or info.get("mismatched_keys"):
        raise _WeightsDoNotFit(f"{path}: its tower tensors do not fit {what}", what)
    net = net.float().eval().to(device)
    transformers.AttentionInterface.register("vitviz_recorded_eager", _recorded_eager)
    packed = "grid_thw" in inspect.signature(net.forward).parameters
    raster = packed and net.config.model_type in RASTER
    argument = "hidden_states" if "hidden_states" in inspect.signature(net.forward).parameters else "pixel_values"
    temporal = int(temporal_size(net) or 1)    # (the tower's own: a processor's default may be a video's)

    def patchify(image: torch.Tensor) -> Any:
        """The processor's `patchify` of `image` with the tower's patch, merge and temporal sizes (those it takes, by
        name: Kimi-K2.5's takes the patch size alone, Muse Spark's no merge size)."""
        sizes = {"patch_size": int(net.config.patch_size), "merge_size": int(merge_size(net.config) or 1),
                 "temporal_patch_size": temporal}
        taken = inspect.signature(processor.patchify).parameters
        return processor.patchify(image, **{k: v for k, v in sizes.items() if k in taken})
    processor = None
    if packed:
        kind = raw.tower.model_type.removesuffix("_thinker")   # (an Omni thinker: the whole model's processor)
        entry = IMAGE_PROCESSOR_MAPPING_NAMES.get(kind) or IMAGE_PROCESSOR_MAPPING_NAMES.get(kind.removesuffix("_moe"))
        name = entry.get("torchvision") if isinstance(entry, dict) else entry
        processor = getattr(transformers, name)() if isinstance(name, str) else None
        if processor is None or not hasattr(processor, "patchify"):
            raise _NotBuildable(f"{what}: no image processor with `patchify` for model_type "
                                f"{raw.tower.model_type!r} to pack the probe as the model's own processor would")
        what += f", given the probe as transformers' {type(processor).__name__}.patchify packs it"

    def order(size: tuple[int, int], seen: dict[str, torch.Tensor]) -> torch.Tensor:
        """For each raster cell, its token's position in the tower's blocks."""
        cfg = net.config
        p = int(cfg.patch_size)
        rows, cols = size[0] // p, size[1] // p
        coords = torch.zeros(1, 3, *size)
        coords[0, 0] = (torch.arange(size[0]) // p)[:, None].float()
        coords[0, 1] = (torch.arange(size[1]) // p)[None, :].float()
        where, _, _ = patchify(coords)
        where = where.reshape(*where.shape[:2], -1)    # (a raster tower's processor gives (1, T, C * t, p, p))
        # where the processor puts a patch's first value of channel 1: (C, t, p, p) -> t * p * p, (p, p, C, t) -> t
        marked = torch.zeros(1, 3, *size)
        marked[0, 1] = 1.0
        second = int(patchify(marked)[0].reshape(*where.shape)[0, 0].nonzero()[0])
        cell = (where[0, :, 0] * cols + where[0, :, second]).long()     # processor position -> raster cell
        moved = torch.arange(rows * cols)
        if "block" not in seen:     # a tower that keeps the processor's order (no blocks to match)
            placed = torch.empty(rows * cols, dtype=torch.long)
            placed[cell] = torch.arange(rows * cols)
            return placed
        block, embedded = seen["block"].float(), seen["embed"].float()
        block, embedded = block.reshape(-1, block.shape[-1]), embedded.reshape(-1, embedded.shape[-1])
        distance, match = torch.cdist(block, embedded, compute_mode="donot_use_mm_for_euclid_dist").min(dim=1) \
            if block.shape == embedded.shape == (rows * cols, block.shape[-1]) else (torch.ones(1), moved)
        if bool((distance == 0).all()) and torch.equal(match.sort().values, moved):
            moved = match.cpu()                                          # block position -> processor position
        placed = torch.empty(rows * cols, dtype=torch.long)
        placed[cell[moved]] = torch.arange(rows * cols)
        return placed

    def run(size: tuple[int, int], x: torch.Tensor, each: Each) -> tuple[list[np.ndarray], np.ndarray | None]:
        own = net.config._attn_implementation
        net.config._attn_implementation = "vitviz_recorded_eager"
        seen: dict[str, torch.Tensor] = {}
        placed: list[np.ndarray] = []   # the raster order, found once the first block has begun (`order`)

        def give(layer: np.ndarray) -> None:
            if packed:
                if not placed:
                    placed.append(order(size, seen).numpy())
                layer = layer[:, placed[0]][:, :, placed[0]]
            each(layer)

        calls = _LayerCalls(give)
        # what the blocks' input is made of before any reordering (Ovis 2.5: embeddings, layers; Cosmos 3 Edge:
        # encoder.layers; Muse Spark: its embeddings normed by ln_pre, then reordered into windows)
        embed = getattr(net, "ln_pre", None) or getattr(net, "patch_embed", None) or getattr(net, "embeddings", None)
        blocks = getattr(net, "blocks", None) or getattr(net, "layers", None) or \
            getattr(getattr(net, "encoder", None), "layers", None)

        def block_input(_m: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            seen.setdefault("block", args[0] if args else kwargs["hidden_states"])

        def embedded(_m: nn.Module, _a: Any, out: torch.Tensor) -> None:
            seen.setdefault("embed", out)

        hooks = [embed.register_forward_hook(embedded),
                 blocks[0].register_forward_pre_hook(block_input, with_kwargs=True)] \
            if packed and isinstance(embed, nn.Module) and blocks else []     # (PaddleOCR-VL's: neither found)
        _RECORDING.calls = calls
        try:
            with torch.inference_mode():
                if packed:
                    cfg = net.config
                    patches, gh, gw = patchify(x)
                    grid = torch.tensor([[1, gh, gw]], device=device)
                    # the shape its forward takes (`packing.RASTER`): the processor's has a batch axis of one
                    pixels = patches if RASTER.get(cfg.model_type, "").startswith("(1,") else patches[0]
                    out = net(pixel_values=pixels.to(device), grid_thw=grid) if raster else \
                        net(**{argument: patches[0].to(device)}, grid_thw=grid)
                else:
                    out = net(pixel_values=x.to(device), image_sizes=[size])
                calls.flush()   # its last layer
        finally:
            _RECORDING.calls = None
            net.config._attn_implementation = own
            for hook in hooks:
                hook.remove()
        hidden = out.last_hidden_state
        vec = (hidden[0] if hidden.dim() == 3 else hidden).float().mean(dim=0).cpu().numpy()
        return [], vec

    return _Original("transformers", transformers.__version__, what, run)


def _backbone_output(tower: nn.Module, out: Any, spec: Any) -> np.ndarray | None:
    """A task model's backbone returns feature maps, no pooled vector: vitviz's features are its final norm's
    output pooled as the spec pools (the CLS token, or the patches' average)."""
    norm = getattr(tower, "layernorm", None) or getattr(tower, "norm", None)
    if not isinstance(norm, nn.Module) or not getattr(out, "hidden_states", None):
        return None
    x = norm(out.hidden_states[-1])
    pooled = x[:, 0] if spec.pooling == "token" else x[:, spec.num_prefix:].mean(dim=1)
    return pooled[0].detach().float().cpu().numpy()


def _hf_output(net: nn.Module, tower: nn.Module, out: Any, pooling: str = "token") -> np.ndarray | None:
    """What vitviz's output is for a transformers model: the logits; a whole CLIP's projected image embedding; a
    backbone's pooled output, except behind a tanh pooler (ViTPooler, which vitviz does not keep), where it is the
    final norm's CLS token (the mean of its tokens for a tower without one, `pooling` 'avg'); Janus's SigLIP tower:
    the mean of its normed tokens (what vitviz shows; its `pooler_output` normalises the first token again)."""
    def vec(t: torch.Tensor) -> np.ndarray:
        return t[0].detach().float().cpu().numpy()

    logits = getattr(out, "logits", None)
    if logits is not None and logits.dim() == 2:   # class scores (not a pre-training head's reconstruction)
        return vec(logits)
    pooled = getattr(out, "pooler_output", None)
    projection = getattr(net, "visual_projection", None)
    if tower is not net and isinstance(projection, nn.Module) and pooled is not None:
        return vec(projection(pooled))
    pooler = getattr(tower, "pooler", None)
    if type(tower).__name__ == "JanusVisionModel":   # its pooler_output is the first token normed twice: not shown
        return vec(out.last_hidden_state.mean(dim=1))
    if pooled is not None and not (isinstance(pooler, nn.Module) and hasattr(pooler, "dense")):
        return vec(pooled)
    hidden = out.last_hidden_state
    if type(tower).__name__ in ("IJepaModel", "Aimv2VisionModel") or pooling == "avg":   # no CLS token: the mean
        return vec(hidden.mean(dim=1))
    return vec(hidden[:, 0])


def _one_size_at_a_time(make: Callable[[tuple[int, int]], nn.Module], native: tuple[int, ...],
                        square_only: str) -> Callable[[tuple[int, int]], nn.Module]:
    """`build(size)` for an original that is built anew for each input size (`make(size)`) and resizes its position
    table to square grids only: the same size again is the module built before; another size lets that one go first
    (one model in memory at a time); a non-square size other than `native` is refused (`_CannotRun(square_only)`)
    before anything is let go."""
    held: dict[tuple[int, int], nn.Module] = {}

    def build(size: tuple[int, int]) -> nn.Module:
        if size not in held:
            if size != native and size[0] != size[1]:
                raise _CannotRun(square_only)
            held.clear()
            held[size] = make(size)
        return held[size]

    return build


def _build_open_clip(spec: Any, path: Path, name: str, device: torch.device,
                     given: tuple[dict[str, Any], str] | None = None, label: str = "", raw: Any = None) -> _Original:
    """The vision tower open_clip builds for the model config beside the file (`CLIP(...).visual`), with the file's
    `visual.*` weights; at another size a tower of that size with the table resized as open_clip does when it
    loads (`resize_pos_embed`)."""
    import open_clip
    from open_clip.model import _build_vision_tower, resize_pos_embed

    raw = raw if raw is not None else _read(path)
    cfg, file_name = given if given is not None else _open_clip_model_cfg(raw)
    if cfg is None:
        raise VerifyError(f"{path}: the identity names an open_clip model config, but none is beside the file")
    visual = {k[len("visual."):]: v for k, v in raw.tensors.items() if k.startswith("visual.")} or raw.tensors
    what = f"open_clip CLIP(**{file_name} model_cfg).visual"
    native = tuple(spec.image_size)

    def make(size: tuple[int, int]) -> nn.Module:
        vision_cfg = dict(cfg["vision_cfg"])
        if size != native:
            vision_cfg["image_size"] = size[0]
        def factory() -> nn.Module:
            return _build_vision_tower(int(cfg["embed_dim"]), vision_cfg, quick_gelu=bool(cfg.get("quick_gelu", False)))

        tensors = visual
        if size != native:
            state = {f"visual.{k}": v for k, v in visual.items()}
            with torch.device("meta"):
                resize_pos_embed(state, types.SimpleNamespace(visual=factory()))   # its grid size only
            tensors = {k[len("visual."):]: v for k, v in state.items()}
        return _built(factory, tensors, what, path).float().eval().to(device)

    build = _one_size_at_a_time(make, native, "open_clip resizes its position table to square grids only")
    return _Original("open_clip", open_clip.__version__, what, _captured_run(build), stated=_stated(build(native)),
                     name=label)


def _open_clip_model_cfg(raw: Any) -> tuple[dict[str, Any] | None, str]:
    """The `model_cfg` of an open_clip_config.json beside the file (or a config stating one)."""
    for file_name, data in raw.sidecars:
        cfg = data.get("model_cfg", data) if isinstance(data, dict) else {}
        if isinstance(cfg, dict) and isinstance(cfg.get("vision_cfg"), dict):
            return cfg, file_name
    cfg = (raw.config or {}).get("model_cfg")
    if isinstance(cfg, dict) and isinstance(cfg.get("vision_cfg"), dict):
        return cfg, "config.json"
    return None, ""


def _build_torchvision(spec: Any, path: Path, arch: str, device: torch.device, label: str = "",
                       raw: Any = None) -> _Original:
    """torchvision.models.get_model(arch, weights=None) with the file's weights; at another (square) size a model
    of that size with the table resampled by torchvision's own `interpolate_embeddings`."""
    import torchvision
    from torchvision.models.vision_transformer import interpolate_embeddings

    raw = raw if raw is not None else _read(path)
    head = raw.tensors.get("heads.head.weight")
    kwargs = {"num_classes": int(head.shape[0])} if head is not None else {}
    what = f"torchvision.models.get_model('{arch}', weights=None)"
    native = tuple(spec.image_size)

    def make(size: tuple[int, int]) -> nn.Module:
        tensors = dict(raw.tensors)
        extra: dict[str, Any] = {}
        if size != native:
            tensors = interpolate_embeddings(size[0], spec.patch_size, tensors)
            extra["image_size"] = size[0]
        net = _built(lambda: torchvision.models.get_model(arch, weights=None, **kwargs, **extra), tensors, what, path)
        return net.float().eval().to(device)

    build = _one_size_at_a_time(make, native, "torchvision's VisionTransformer takes square inputs only")
    stated = _stated(build(native))
    return _Original("torchvision", torchvision.__version__, what, _captured_run(build), stated=stated, name=label)


def _build_code(code: str, path: Path, device: torch.device) -> _Original:
    """The user's module from FILE.py:FACTORY with the file's weights loaded into it, as `load(path, code=...)`
    does (`live.code.module_from_code`, `live.code.load_weights`)."""
    from vitviz.core.running.live.code import load_weights, module_from_code

    module = module_from_code(code)
    how = load_weights(module, path)
    module = module.float().eval().to(device)
    file_name, _, factory = code.rpartition(":")
    ref = f"{Path(file_name).name}:{factory}"
    what = f"{ref}() ({how})"

    return _Original("code", "", what, _captured_run(lambda _size: module), against=ref, stated=_stated(module))


def _stated(module: nn.Module) -> dict[str, tuple[Any, str]]:
    """What an original's module object states about the settings no tensor shows, as `vitviz.load(module)` reads
    them ({override: (value, source)}; {} when it states nothing plainly)."""
    from vitviz.core.reading.objects import module_heads, module_settings

    try:
        out = dict(module_settings(module))
    except VitvizError:
        out = {}
    heads = module_heads(module)
    if heads:
        out["heads"] = (heads, f"model object: {type(module).__name__} num_heads")
    if "eps" in out and "eps_final" not in out and any(
            isinstance(m, nn.LayerNorm) for n, m in module.named_modules() if n.split(".")[-1] in ("norm", "fc_norm")
            and n.count(".") == 0):
        out["eps_final"] = (out["eps"][0], out["eps"][1] + " (its final norm's too)")   # said once when they agree
    return out


_BUILDERS: dict[str, Callable[..., _Original]] = {   # (spec, path, name, device, raw=...)
    "timm": _build_timm, "transformers": _build_transformers, "open_clip": _build_open_clip,
    "torchvision": _build_torchvision,
}


# ---------------------------------------------------------------------------------------------------------------
# Remembered verdicts: a second export of the same model costs nothing extra


def from_dict(data: dict[str, Any]) -> Verification:
    """The `Verification` a `to_dict()` was made from (a difference that could not be measured comes back inf)."""
    def number(v: Any) -> float | None:
        return math.inf if v is None else float(v)

    def measured(key: str) -> float | None:   # None: nothing was compared; inf: compared, not measurable
        return None if data.get(key) is None and not data["per_layer"] else number(data.get(key))

    sizes = tuple(tuple(int(x) for x in s) for s in data.get("sizes", ()))
    per_layer = tuple(tuple((int(layer), number(d)) for layer, d in entry["layers"]) for entry in data["per_layer"])
    return Verification(
        data["verdict"], library=data.get("library", ""), version=data.get("version", ""),
        original=data.get("original", ""), against=data.get("against", ""),
        max_attention=measured("max_attention"), max_output=measured("max_output"),
        per_layer=per_layer, first_differing_layer=data.get("first_differing_layer"), sizes=sizes,
        assumptions=tuple(data.get("assumptions", ())), reason=data.get("reason", ""),
        skipped=tuple((tuple(s["size"]), s["why"]) for s in data.get("skipped", ())),
        output_per_size=tuple(number(e.get("output")) for e in data["per_layer"]),
        atol_attention=float(data.get("atol_attention", ATOL_ATTENTION)),
        atol_output=float(data.get("atol_output", ATOL_OUTPUT)),
        fitting=tuple(data.get("fitting", ())), matches=tuple(data.get("matches", ())),
        alternatives=tuple((a["original"], a["how"]) for a in data.get("alternatives", ())),
        confirmed=tuple(data.get("confirmed", ())),
        open=tuple((o["setting"], o["alternatives"]) for o in data.get("open", ())),
        causes=tuple((c["setting"], c["original"]) for c in data.get("causes", ())),
        suggested=tuple(dict(data.get("suggested", {})).items()), one_size=str(data.get("one_size", "")))


def verification_key(model: Any, against: str = "auto", code: str | None = None) -> str | None:
    """What a verdict depends on, hashed: the weights file's bytes (and a config beside it), the converted model's
    spec (every setting, given or assumed), `against` / `code`, and the versions of vitviz, torch and the
    libraries originals are built with. None for a model not loaded from a file, or run by code its file does not
    name (a user's module given its weights: that code is not in the key)."""
    import hashlib
    from importlib import metadata

    path = Path(model.spec.source)
    if not path.is_file() or (model.spec.family == "live" and not _by_timm_code(model.spec)
                              and not _by_its_code(model.spec)):
        return None
    h = hashlib.sha256()
    files = [path] + [p for p in sorted(path.parent.glob("*.json")) if p.is_file()]
    for p in files:
        h.update(p.name.encode() + b"\0")
        with open(p, "rb") as f:
            while chunk := f.read(1 << 22):
                h.update(chunk)
    if code:
        code_file = Path(code.rpartition(":")[0])
        h.update(code_file.read_bytes() if code_file.is_file() else code.encode())
    versions = []
    for package in ("vitviz", "torch", *(p.split()[0] for p in _PACKAGES.values())):   # distribution names
        try:
            versions.append(f"{package}={metadata.version(package)}")
        except metadata.PackageNotFoundError:
            versions.append(f"{package}=-")
    h.update(json.dumps([model.spec.to_json(), against, code or "", versions]).encode())
    return h.hexdigest()


def remembered_verify(model: Any, against: str = "auto", code: str | None = None,
                      progress: Progress | None = None, fresh: bool = False) -> tuple[Verification, bool]:
    """`verify(model, against, code)`, remembered in `$VITVIZ_CACHE/verified/` by `verification_key`: the same
    file, settings and versions a second time give the remembered verdict at no cost. (verdict, True when it was
    remembered). `fresh`: check again (and remember the new verdict). A verdict that could not be made (an error)
    is not remembered."""
    store = _store(model, against, code)
    if store is not None and not fresh and (known := _remembered_at(store)) is not None:
        return known, True
    check = verify(model, against=against, code=code, progress=progress)
    if store is not None:
        try:
            store.parent.mkdir(parents=True, exist_ok=True)
            tmp = store.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(check.to_dict()), encoding="utf-8")
            os.replace(tmp, store)
        except OSError:
            pass
    return check, False


def remembered_verification(model: Any, against: str = "auto", code: str | None = None) -> Verification | None:
    """The remembered verdict of `model` (`remembered_verify`), without checking anything; None when there is none."""
    store = _store(model, against, code)
    return _remembered_at(store) if store is not None else None


def _remembered_at(store: Path) -> Verification | None:
    """The verdict kept in `store` (None: none, or not one: a damaged entry is checked again)."""
    from vitviz.core.files import read_small_json

    data = read_small_json(store)
    try:
        return from_dict(data) if isinstance(data, dict) else None
    except (KeyError, TypeError, ValueError):
        return None


def _store(model: Any, against: str, code: str | None) -> Path | None:
    from vitviz.core.files import cache_dir as _cache_dir

    try:
        key = verification_key(model, against, code)
    except OSError:
        return None
    return _cache_dir() / "verified" / f"{key}.json" if key else None


# ---------------------------------------------------------------------------------------------------------------
# What the user's code says about the settings a file does not


_CODE_FIELDS = {**_STATED_FIELDS, "image_size": "image_size"}


def code_settings(path: str | Path, code: str, device: str = "cpu") -> dict[str, tuple[Any, str]]:
    """What FILE.py:FACTORY's model, with the file's weights, says about the settings no tensor of the file shows:
    {override: (value, source)} -- the head count its attention maps have and the input size its forward takes (run
    live, `vitviz.core.running.live`), and what its modules state (eps, activation, attention scale, norm order, pooling,
    as `vitviz.load(module)` reads them). Runs the user's code: only when they asked for it."""
    from vitviz.core.running.live.code import load_code

    live = load_code(code, str(path), {"device": device})
    ref = Path(code.rpartition(":")[0]).name + ":" + code.rpartition(":")[2]
    out = {k: (v, f"model object: your code {ref} ({src.removeprefix('model object: ')})")
           for k, (v, src) in _stated(live.net).items()}
    spec = live.spec
    out["heads"] = (int(spec.num_heads), f"model object: your code {ref}: its attention maps have {spec.num_heads} "
                                         "heads (captured as it ran)")
    size = tuple(int(s) for s in spec.image_size)
    if spec.kind_of("image_size") != "assumed":
        out["image_size"] = (size, f"model object: your code {ref}: {spec.source_of('image_size')}")
    else:   # a size its forward takes (the file's own guess may be one it refuses), still a guess
        out["image_size"] = (size, f"guess: {size[0]}x{size[1]}, an input your code {ref} takes "
                                   f"({spec.source_of('image_size').removeprefix('guess: ')})")
    return out


def settings_to_fill(spec: Any, said: dict[str, tuple[Any, str]], given: dict[str, Any]) -> dict[str, Any]:
    """The settings of `said` (`code_settings`) to load the file with: those the file's conversion (`spec`)
    assumed with another value, and the caller did not give."""
    out = {}
    for name, (value, _src) in said.items():
        field_name = _CODE_FIELDS.get(name)
        if field_name is None or given.get(name) is not None or not spec.relevant(field_name):
            continue
        if spec.kind_of(field_name) != "assumed":
            continue
        value = _stated_value(spec, name, value)
        if not _same(getattr(spec, field_name), value):
            out[name] = value
    return out


def mark_sources(model: Any, sources: dict[str, str]) -> None:
    """Say where settings came from in `model.spec` ({override: source}): the values loaded as overrides that the
    user's code stated are read from it ('model object: your code ...'), not the user's word."""
    if not sources:
        return
    by_field = {_CODE_FIELDS.get(k, k): v for k, v in sources.items()}
    spec = dataclasses.replace(model.spec, provenance=tuple((k, by_field.get(k, v)) for k, v in model.spec.provenance))
    model.spec = spec
    if getattr(model, "net", None) is not None and hasattr(model.net, "spec"):
        model.net.spec = spec


# ---------------------------------------------------------------------------------------------------------------
# timm models run by their own code: what vitviz shows against timm's own record of the same model's attention
# (transformers' HieraModel handed over alike: its attention modules' own softmax, its tokens by its `unroll`)
#
# A timm architecture vitviz does not convert (CaiT's talking heads and class attention, Hiera's mask units ...) runs
# by timm's own code: a live object, or a timm hub folder built from its config.json (`load._timm_by_code`). No
# conversion is checked there, but what vitviz shows is still a claim: that its recorder (a function mode following
# each softmax to the product that applies it, SDPA's probabilities recomputed) read every map where the model
# computes it, and that every token is drawn where the model took it from. The original here is the same timm model
# again -- built afresh from the folder (`timm.create_model('local-dir:...')`, the file's tensors, strictly), or for
# a live object a copy of its modules sharing its parameters and buffers (no second copy of the weights; nothing of
# the user's object is changed) -- run as it is set (its fused attention as the model has it: turned off, the
# model's eager path is another computation, whose float differences in layers vitviz does not show reach the ones
# it does: 9e-5 on a tiny NextViT), its attention read at the boundary of its own attention modules, not by
# vitviz's recorder: the input of a module's `attn_drop` (an identity in eval, right before `attn @ v`: the weights
# it applies, after CaiT's talking-heads mix); where it has none (Hiera's, LeViT's), the left operand of the first
# product after its softmax whose shape is the softmax's (the softmax itself, or EfficientFormerV2's mixed by its
# talking-heads convolution); where it is fused, the probabilities its SDPA call computes on that call's own q, k,
# mask and scale. Each map is laid out as vitviz shows it by the model's own token order:
#
# - a plain model's (1, H, q, k) on vitviz's T x T grid: q == k == T as it is; q == k < T (tokens that join later,
#   CaiT's class token, concatenated before the others) in the lower right; q < k == T (the joining queries over
#   [them, the tokens]) as the top q rows, the rest zero;
# - Hiera's (1, H, W, n, n) (or (1, H, N, N) for its global blocks): the model's own `unroll` applied to the grid
#   cells' coordinates gives each token's cell, each query pooling keeps the maximum of a group's coordinates,
#   halved; token t of a block is window t % W, place t // W (timm's `reshape(B, -1, W, ...)`), and goes to the
#   window and place vitviz draws its cell at (the block's `BlockGeometry.slot_of`), the rest zero.
#
# Then `_compare` as for every other original: each layer at 1e-5, the output at 1e-4. By default at the size the
# model's code was built for only (`OWN_CODE_SIZE`).

OWN_CODE_SIZE = ("the size the model's own code was built for only: vitviz runs it as built (nothing vitviz converts "
                 "depends on the size); pass sizes= to compare at others it takes")
_SOFTMAXES = (torch.softmax, torch.Tensor.softmax, torch.nn.functional.softmax)
_PRODUCTS = (torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.bmm, torch.Tensor.bmm)


def own_original(model: Any) -> str:
    """The library whose own code `verify(model)` compares a model vitviz runs by its own code (live) with: 'timm' or
    'transformers' (this section's record of its attention, or a composite model's tower transformers' code builds
    from its file); '' when verify cannot check it (a user's module: nothing converted, nothing to compare with) or
    the model is not run by its own code. What the window asks a verdict for."""
    spec = getattr(model, "spec", None)
    if spec is None or spec.family != "live":
        return ""
    own = _own_code(model)
    if own is not None:
        return own[1]
    return "transformers" if _by_its_code(spec) else ""


def _own_code(model: Any) -> tuple[nn.Module, str] | None:
    """(the module a live model runs, its library) when verify can record its attention itself: a timm model's, plain
    (`LiveModel`) or a Hiera shown per stage (its `unroll`), or transformers' `HieraModel` (its `unroll_schedule`);
    None otherwise."""
    from vitviz.core.running.live.stages import StagedModel

    net = getattr(model, "net", None)
    if not isinstance(net, nn.Module) or not _own_attention(net):
        return None
    staged = isinstance(model, StagedModel)
    if type(net).__module__.startswith("timm.") and (not staged or isinstance(getattr(net, "unroll", None), nn.Module)):
        return net, "timm"
    if staged and type(net).__module__.startswith("transformers.models.hiera.") and hasattr(net, "unroll_schedule"):
        return net, "transformers"
    return None


def _verify_own_code(model: Any, net: nn.Module, library: str, sizes: Sequence[int | tuple[int, int]] | None,
                     say: Progress, assumptions: tuple[str, ...]) -> Verification:
    """`verify(model)` for a model vitviz runs by its library's own code: the section's comparison."""
    from vitviz.core.running.live.stages import StagedModel, _output

    spec = model.spec
    if (missing := _not_importable(library)):
        return Verification(UNVERIFIED, library=library, assumptions=assumptions, reason=missing)
    version = _version(library)
    by_file = library == "timm" and _by_timm_code(spec) and Path(spec.source).exists()
    say(0.0, f"Building the {library} original…")
    try:
        original, what = (_timm_from_folder(model, Path(spec.source)) if by_file else _shared_copy(net, library))
    except _WeightsDoNotFit as e:
        return Verification(DIFFERS, library=library, version=version, original=e.what,
                            against=f"{library} {version}", assumptions=assumptions, reason=str(e))
    order = getattr(getattr(model, "layout", None), "order", None)
    if order is not None and list(order) != sorted(order):
        return Verification(UNVERIFIED, library=library, version=version, assumptions=assumptions,
                            reason="vitviz shows this model's tokens in another order than its code keeps them "
                                   f"({list(order)[:6]} ...): verify lays the original's maps out in the model's "
                                   "own order only")
    staged = isinstance(model, StagedModel)
    shown = {model.names[i] for i in model.shown} if staged else {name for name, _ in model.layers}
    unshown = {name for name, *_ in model.skipped}
    recorded = {name for name, _ in _own_attention(original)}
    if not shown <= recorded:
        return Verification(UNVERIFIED, library=library, version=version, assumptions=assumptions,
                            reason=f"vitviz shows attention of {sorted(shown - recorded)[:3]}, which are no "
                                   f"{library} attention modules (fused_attn, attn_drop) verify records the weights of")
    place = _hiera_placer(model, original) if staged else _on_vitviz_grid(model)
    what += (", each attention module's weights read where its own code applies them (attn_drop's input, the "
             "product after its softmax, or its SDPA call's probabilities), laid out by the model's own token order")

    def run(size: tuple[int, int], x: torch.Tensor, each: Each) -> tuple[list[np.ndarray], np.ndarray | None]:
        def keep(name: str, weights: torch.Tensor) -> None:
            if name not in unshown:   # (one vitviz neither shows nor says it leaves out: counted, unmatched)
                each(place(size, weights.detach().float().cpu()))
        with torch.inference_mode():
            out = _recorded_by_modules(original, x.to(_device_of(original)), keep, shown | unshown)
        return [], _output(out, 1)[0] if staged else _main_tensor(out)

    checked = ([tuple(spec.image_size)] if sizes is None else _window_sizes(spec, sizes) if staged
               else _sizes(spec, sizes, not _streams(model)))
    check = _compare(model, _Original(library, version, what, run), checked, assumptions, _device_of(original), say)
    return dataclasses.replace(check, one_size=OWN_CODE_SIZE if sizes is None else "")


def _timm_from_folder(model: Any, path: Path) -> tuple[nn.Module, str]:
    """The folder's timm architecture built afresh from its config.json with the file's tensors (strictly)."""
    import timm

    raw = _read(path, model)
    arch = (raw.config or {}).get("architecture")
    what = f"timm.create_model('{arch}') from {_folder(path).name}/config.json with the file's tensors"
    net = _built(lambda: timm.create_model(f"local-dir:{_folder(path)}", pretrained=False), raw.tensors, what, path)
    return net.float().eval().to(model.device), what


def _shared_copy(net: nn.Module, library: str) -> tuple[nn.Module, str]:
    """A copy of the live module's modules holding its very parameters and buffers (no second copy of the weights):
    its attention switches and hooks are the copy's own, so the user's object is left as it is. The hooks' functions
    are shared, not copied: one may hold what cannot be copied (the window's interruption hook, its model's lock)."""
    import copy

    memo: dict[int, Any] = {id(t): t for t in (*net.parameters(), *net.buffers())}
    for m in net.modules():
        memo.update({id(fn): fn for name, hooks in vars(m).items() if name.endswith("hooks") and isinstance(hooks, dict)
                     for fn in hooks.values()})
    twin = copy.deepcopy(net, memo).eval()
    return twin, f"{library} {type(net).__name__}: the module given, its own code and weights"


def _own_attention(net: nn.Module) -> list[tuple[str, nn.Module]]:
    """The attention modules of `net`: timm's, with its SDPA switch (`fused_attn`), an `attn_drop` (CaiT's
    talking-heads attention has only that) or an attention class's name and head count (LeViT's, EfficientFormer's,
    MViTv2's), and Hiera's (`use_mask_unit_attn`: transformers' too)."""
    return [(name, m) for name, m in net.named_modules() if hasattr(m, "fused_attn") or hasattr(m, "use_mask_unit_attn")
            or isinstance(getattr(m, "attn_drop", None), nn.Module)
            or ("Attention" in type(m).__name__ and isinstance(getattr(m, "num_heads", None), int))]


def _recorded_by_modules(net: nn.Module, x: torch.Tensor, keep: Callable[[str, torch.Tensor], None],
                         named: set[str]) -> Any:
    """`net(x)` with each attention module's weights given to `keep(name, weights)` as its own code applies them
    (see the section): the input of its `attn_drop`; where it has none, the left operand of the first product after
    its softmax whose shape is the softmax's (the softmax itself in `attn @ v`; EfficientFormerV2's talking heads
    mixed by a convolution after it), or the softmax when no such product follows in the module; where its attention
    is fused, the probabilities of its SDPA call (`_sdpa_weights`). A call inside attention modules nested in one
    another is the innermost one's among those `named` (vitviz's layers, shown or said), else the innermost one's."""
    from torch.overrides import TorchFunctionMode

    inside: list[tuple[str, nn.Module]] = []
    waiting: dict[str, torch.Tensor] = {}      # a module's softmax whose product is still to come
    handles = []

    def left(_m: nn.Module, _a: Any, _o: Any) -> None:
        name, _ = inside.pop()
        if name in waiting:                    # no product of its shape followed: the softmax as it is
            keep(name, waiting.pop(name))

    for name, m in _own_attention(net):
        handles.append(m.register_forward_pre_hook(lambda m, _a, name=name: inside.append((name, m))))
        handles.append(m.register_forward_hook(left))
        drop = getattr(m, "attn_drop", None)
        if isinstance(drop, nn.Module):
            handles.append(drop.register_forward_pre_hook(lambda _m, a, name=name: keep(name, a[0])))

    class Weights(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                               kwargs: dict[str, Any] | None = None) -> Any:
            out = func(*args, **(kwargs or {}))
            if not inside:
                return out
            name, m = next((n for n in reversed(inside) if n[0] in named), inside[-1])
            if func is torch.nn.functional.scaled_dot_product_attention:
                keep(name, _sdpa_weights(*args, **(kwargs or {})))
            elif isinstance(getattr(m, "attn_drop", None), nn.Module):
                pass                                                    # read at its attn_drop
            elif func in _SOFTMAXES:
                if name in waiting:
                    keep(name, waiting.pop(name))
                waiting[name] = out
            elif func in _PRODUCTS and name in waiting and args and isinstance(args[0], torch.Tensor) \
                    and args[0].shape == waiting[name].shape:
                del waiting[name]
                keep(name, args[0])
            return out

    try:
        with Weights():
            return net(x)
    finally:
        for h in handles:
            h.remove()


def _sdpa_weights(query: torch.Tensor, key: torch.Tensor, _value: torch.Tensor, attn_mask: Any = None,
                  dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
                  enable_gqa: bool = False) -> torch.Tensor:
    """The probabilities `F.scaled_dot_product_attention` computes on these arguments (its own signature, so a call's
    positional and keyword arguments bind as they did there), in float32; dropout is off in eval."""
    from vitviz.core.running.live.record import sdpa_probabilities

    return sdpa_probabilities(query, key, attn_mask, is_causal, scale, enable_gqa)


def _on_vitviz_grid(model: Any) -> Callable[[tuple[int, int], torch.Tensor], np.ndarray]:
    """A plain model's (1, H, q, k) map laid on vitviz's (H, T, T) grid (see the section); a map that fits it in
    none of those ways is given as it is (its shape is then said as differing)."""
    def place(size: tuple[int, int], w: torch.Tensor) -> np.ndarray:
        t = model.spec.num_prefix + (size[0] // model.spec.patch_size) * (size[1] // model.spec.patch_size)
        m = w[0].numpy() if w.dim() == 4 else w.numpy()
        q, k = m.shape[-2:]
        if m.ndim != 3 or (q == k == t):
            return m
        full = np.zeros((m.shape[0], t, t), np.float32)
        if q == k < t:
            full[:, t - k:, t - k:] = m
        elif q < k == t:
            full[:, :q, :] = m
        else:
            return m
        return full
    return place


def _hiera_placer(model: Any, net: nn.Module) -> Callable[[tuple[int, int], torch.Tensor], np.ndarray]:
    """Hiera's (1, H, W, n, n) or (1, H, N, N) maps of the blocks vitviz shows, in call order, laid on each block's
    windows as vitviz draws them (see the section): the cells of the tokens by the model's own `unroll`."""
    import sys

    if isinstance(getattr(net, "unroll", None), nn.Module):      # timm's `Unroll` module
        grid, unroll = [int(v) for v in net.unroll.size], net.unroll
    else:                                                         # transformers' `unroll` function
        cfg = net.config
        grid = [int(s) // int(t) for s, t in zip(cfg.image_size, cfg.patch_stride)]
        unroll = functools.partial(sys.modules[type(net).__module__].unroll, image_shape=list(cfg.image_size),
                                   patch_stride=list(cfg.patch_stride), schedule=net.unroll_schedule)
    rows, cols = torch.meshgrid(torch.arange(grid[0]), torch.arange(grid[1]), indexing="ij")
    with torch.inference_mode():
        coords = unroll(torch.stack([rows.flatten(), cols.flatten()], -1)[None].float())[0]   # (N, 2)
    pooled = {name for name, *_ in model.skipped}
    cells_of: list[torch.Tensor] = []
    for name, m in _own_attention(net):     # the cells of each shown block's tokens, in the model's order
        if name in pooled:
            q = int(getattr(m, "q_stride", None) or m.query_stride)
            coords = coords.view(q, -1, 2).amax(dim=0) // 2
            grid = [(g + 1) // 2 for g in grid]
            continue
        cells_of.append((coords[:, 0] * grid[1] + coords[:, 1]).long())
    geometry = model.spec.geometry()
    count = [0]

    def place(_size: tuple[int, int], w: torch.Tensor) -> np.ndarray:
        i = count[0] % len(geometry)
        count[0] += 1
        geo, cells = geometry[i], cells_of[i].numpy()
        m = w[0].numpy()
        m = m[:, None] if m.ndim == 3 else m                     # (H, W, n, n)
        heads, windows, n = m.shape[0], m.shape[1], m.shape[2]
        out = np.zeros((geo.num_windows, heads, geo.window_tokens, geo.window_tokens), np.float32)
        slot = geo.slot_of[cells]                                # (N, 2): vitviz's (window, place) of each token
        for win in range(windows):
            tokens = np.arange(n) * windows + win
            if (slot[tokens, 0] != slot[tokens[0], 0]).any():    # one unit's tokens drawn in two windows: unequal
                return np.full(out.shape, math.inf, np.float32)
            at = slot[tokens, 1]
            out[int(slot[tokens[0], 0])][:, at[:, None], at[None, :]] = m[:, win]
        return out
    return place


# ---------------------------------------------------------------------------------------------------------------
# Windowed models (Swin, SAM, ViTDet): the original built from the file, compared block by block
#
# `verify` hands a model with the `WINDOWS` capability here. The original is built by the library whose config
# names the file: a timm hub folder (config.json 'architecture' + 'model_args') with `timm.create_model` (Swin with
# `strict_img_size=False`: timm then builds its shift masks at each run, so it takes another size), a transformers
# folder (config.json 'architectures') with that class and eager attention, a torchvision Swin file under its torch-hub
# release name with that `torchvision.models` builder; the file's tensors are loaded into it (every parameter from
# the file, nothing left over: `_built` / `towers.from_tensors`).
#
# On the seeded probe (`probe_input`) at the native size and native + 2 patches per side, the original's own softmax
# is read where it computes it (timm: each block's `attn.softmax` module, Swin, or the `attn.attn_drop` right after
# its softmax, SAM, with its fused attention off; transformers: each block's attention module's attention weights,
# never collected by `output_attentions` (`_transformers_windowed`); torchvision: its `F.softmax` calls),
# one block at a time on the original's thread (`_Theirs`), and vitviz's windowed model compares its own block of
# that index with it as its softmax probe gives it (`_LayerByLayer`): (windows, heads, n, n) against the original's
# (B x windows, heads, n, n) for a batch of one, window order and all, so that neither model's stack of blocks is
# held. The output is compared too: Swin's class scores (or pooled features), SAM's / ViTDet's feature map.
# Tolerances are verify's (`ATOL_ATTENTION`, `ATOL_OUTPUT`). A size the original refuses (transformers' SAM takes
# its native size only) is skipped, said.
#
# Not built (the verdict stays 'unverified', saying why): a file no config or release name names (a bare state dict,
# microsoft's Swin-Transformer or segment-anything's layout).

# what is and is not built here, said in every windowed verdict that is not a comparison
WINDOWED_BUILT = ("vitviz verify builds windowed originals (Swin, SAM, ViTDet) for files a config or a release name "
                  "names (a timm hub folder, a transformers folder, a torchvision Swin file under its torch-hub name)")
UNNAMED_UNVERIFIED = (WINDOWED_BUILT + "; nothing names this file's architecture (a bare state dict, or "
                      "microsoft's or segment-anything's layout), so the original's "
                      "settings would be vitviz's own reading of it and prove nothing; vitviz's windowed models are "
                      "proven equal to torchvision's, timm's and transformers' by its own test suite on small models, "
                      "but this file is not checked")
_WINDOWED_LIBRARY = {"timm-swin": "timm", "timm-sam": "timm", "hf-swin": "transformers", "hf-sam": "transformers",
                     "hf-vitdet": "transformers", "torchvision-swin": "torchvision"}


def _verify_windowed(model: Any, against: str, code: str | None, sizes: Any, device: str | None,
                     progress: Progress | None) -> Verification:
    """`verify(model)` for a windowed model (`WINDOWS`): its original built from its file, compared block by
    block."""
    say = progress or (lambda _f, _t: None)
    spec = model.spec
    assumptions = tuple(name for name, _ in spec.assumptions)

    def unverified(reason: str, library: str = "") -> Verification:
        version = _version(library) if library and not _not_importable(library) else ""
        return Verification(UNVERIFIED, library=library, version=version, assumptions=assumptions, reason=reason)

    if spec.family == "live":
        return unverified("a live model runs its own code as written: nothing was converted, so there is nothing "
                          "to verify")
    if code is not None or ":" in against:
        return unverified(f"{'code=' if code is not None else f'against={against!r}'}: a windowed model is compared "
                          "with the original its config names only (not yet with an architecture or code named here)")
    library = _WINDOWED_LIBRARY.get(spec.family)
    if library is None:
        return unverified(UNNAMED_UNVERIFIED)
    if against not in ("auto", library):
        return unverified(f"against={against!r}, but the model is named by {library} ({spec.family})")
    path = Path(spec.source)
    if not path.exists():
        return unverified(f"the model was not loaded from a file ({spec.source}); the original is built with a "
                          "file's own weights")
    raw = _read(path, model)
    config = raw.config or {}
    if library == "timm" and not isinstance(config.get("architecture"), str):
        return unverified(UNNAMED_UNVERIFIED, library)
    if library == "transformers" and not (_folder(path) / "config.json").is_file():
        return unverified(UNNAMED_UNVERIFIED, library)
    release = _torchvision_release(raw) if library == "torchvision" else None
    if library == "torchvision" and release is None:
        return unverified(UNNAMED_UNVERIFIED, library)
    if (missing := _not_importable(library)):
        return unverified(missing, library)
    dev = torch.device(device or model.device)
    checked = _window_sizes(spec, sizes)
    say(0.0, f"Building the {library} original…")
    try:
        original = (_timm_windowed(path, raw, dev, spec.arch != "sam") if library == "timm"
                    else _torchvision_windowed(path, raw, dev, release) if release is not None
                    else _transformers_windowed(path, raw, dev))
    except _NotBuildable as e:
        return unverified(str(e), library)
    except _WeightsDoNotFit as e:
        version = _version(library)
        return Verification(DIFFERS, library=library, version=version, original=e.what,
                            against=f"{library} {version}", assumptions=assumptions, reason=str(e))
    return _compare_windowed(model, original, checked, assumptions, dev, say)


def _window_sizes(spec: Any, sizes: Any) -> list[tuple[int, int]]:
    """verify's sizes: the native one and native + 2 patches per side, or those given (whole patches)."""
    native = (int(spec.image_size[0]), int(spec.image_size[1]))
    p = int(spec.patch_size)
    if sizes is None:
        return [native, (native[0] + _EXTRA_PATCHES * p, native[1] + _EXTRA_PATCHES * p)]
    expected = f"expected input sizes N or (h, w) in whole {p} px patches, e.g. [{native[0]}]"
    if isinstance(sizes, (str, bytes)) or not hasattr(sizes, "__iter__"):
        raise VitvizError(f"sizes={sizes!r}: {expected}")
    out = []
    for s in sizes:
        size = (s, s) if _whole(s) else tuple(s) if isinstance(s, (tuple, list)) and len(s) == 2 else None
        if size is None or not all(_whole(x) for x in size) or size[0] % p or size[1] % p or min(size) < p:
            raise VitvizError(f"size {s!r}: {expected}")
        out.append((int(size[0]), int(size[1])))
    if not out:
        raise VitvizError("sizes=(): expected at least one input size")
    return out


# ---------------------------------------------------------------------------------------------------------------
# The originals: each block's softmax handed over as it is computed


def _streamed_blocks(net: nn.Module, points: list[tuple[nn.Module, int]], read: Callable[[Any], torch.Tensor],
                     x: torch.Tensor, each: Each, call: Callable[[nn.Module, torch.Tensor], Any],
                     given_up: bool = False) -> Any:
    """`call(net, x)` with the output of each of `points` (module, its block's heads) read (`read`), laid out as
    (B x windows, heads, n, n) and given to `each` as a copy, as computed. `given_up`: the points return
    (output, weights, ...) and their callers collect the weights to the end (an `output_attentions` that travels
    down the model's layers): once copied, an empty tensor goes on in their place, so no block's weights are held
    after it is handed over."""
    def hook(heads: int, _m: nn.Module, _i: Any, out: Any) -> Any:
        probs = read(out).detach()
        each(probs.reshape(-1, heads, *probs.shape[-2:]).float().cpu().clone().numpy())
        return (out[0], probs.new_empty(0), *out[2:]) if given_up else None

    handles = [m.register_forward_hook(functools.partial(hook, heads)) for m, heads in points]
    try:
        with torch.inference_mode():
            return call(net, x.to(_device_of(net)))
    finally:
        for h in handles:
            h.remove()


def _timm_windowed(path: Path, raw: Any, device: torch.device, swin: bool) -> _Original:
    """timm.create_model from the folder's config.json, its eager softmax read in every block (Swin's `attn.softmax`,
    SAM's `attn.attn_drop` right after its softmax). Swin is built with `strict_img_size=False` (its shift masks
    then made at each run, so it takes another size; the same computation at the native one); SAM takes any size."""
    import timm

    arch = raw.config["architecture"]
    if not timm.is_model(arch):
        raise _NotBuildable(f"timm has no architecture {arch!r} (named by {_folder(path).name}/config.json)")
    kwargs = {"strict_img_size": False} if swin else {}
    what = (f"timm.create_model('{arch}'{', strict_img_size=False' if swin else ''}) from "
            f"{_folder(path).name}/config.json")
    net = _built(lambda: timm.create_model(f"local-dir:{_folder(path)}", pretrained=False, **kwargs), raw.tensors,
                 what, path)
    for m in net.modules():
        if hasattr(m, "fused_attn"):
            m.fused_attn = False   # its eager softmax, not F.scaled_dot_product_attention
    net = net.float().eval().to(device)
    # Swin's softmax module, or SAM's dropout right after its softmax: (B x windows [x heads], n, n)
    points = [(getattr(m, "softmax", None) or m.attn_drop, int(m.num_heads)) for name, m in net.named_modules()
              if name.endswith("attn") and hasattr(m, "num_heads") and hasattr(m, "attn_drop")]
    if not points:
        raise _NotBuildable(f"{what} has no attention module whose softmax vitviz reads")
    call = (lambda n, t: n(t)) if swin else (lambda n, t: n.forward_features(t))   # SAM: its neck output

    def run(_size: tuple[int, int], x: torch.Tensor, each: Each) -> tuple[list[np.ndarray], np.ndarray | None]:
        out = _streamed_blocks(net, points, lambda o: o, x, each, call)
        return [], out[0].float().cpu().numpy().reshape(-1)

    return _Original("timm", timm.__version__, what, run)


# each returns (output, attention weights (B x windows, heads, n, n))
_HF_ATTENTION = ("SwinAttention", "Swinv2SelfAttention", "SamVisionAttention", "VitDetAttention")


def _transformers_windowed(path: Path, raw: Any, device: torch.device) -> _Original:
    """The config.json's class with eager attention, its attention weights read at each block's self-attention
    module. Built afresh for each size: transformers' Swin v1 keeps, in its modules, a shift it dropped for one
    size's grid."""
    import transformers

    from vitviz.core.reading.towers import from_tensors

    folder = _folder(path)
    config = transformers.AutoConfig.from_pretrained(str(folder), local_files_only=True, attn_implementation="eager")
    arch = next(iter(getattr(config, "architectures", None) or []), None)
    cls = getattr(transformers, arch, None) if arch else None
    what = (f"transformers.{arch} ({folder.name}/config.json, eager attention)" if cls is not None else
            f"transformers.AutoModel ({folder.name}/config.json model_type {config.model_type!r}, eager attention)")
    cls = cls or transformers.AutoModel

    def build() -> nn.Module:
        net, info = from_tensors(cls, config, raw.tensors)
        params = {n for n, _ in net.named_parameters()}
        bad = sorted(k for k in info.get("missing_keys", ()) if k in params) + \
            sorted(info.get("unexpected_keys", ())) + sorted(str(k) for k in info.get("mismatched_keys", ()))
        if bad:
            raise _WeightsDoNotFit(f"{path}: its weights do not fit {what}: {', '.join(bad[:6])}", what)
        return net.float().eval().to(device)

    if not _hf_points(build()):   # the file's weights fit (or it differs), before anything is compared
        raise _NotBuildable(f"{what} has no self-attention module vitviz reads ({', '.join(_HF_ATTENTION)})")

    # SAM / ViTDet: the image encoder alone (a whole SamModel's `vision_encoder`), its feature map compared
    sam = config.model_type in ("sam", "sam_vision_model", "vitdet")

    def run(_size: tuple[int, int], x: torch.Tensor, each: Each) -> tuple[list[np.ndarray], np.ndarray | None]:
        net = build()
        # a model whose attention modules return their weights at every call (what its `_can_record_outputs`
        # names: Swin, SAM) is not asked for `output_attentions`, which would collect them all; one whose modules
        # return them only when asked (Swin v2, ViTDet) is asked, and each block's are let go once handed over
        asked = not _attention_outputs(net)

        def forward(net: nn.Module, x: torch.Tensor) -> Any:
            return (getattr(net, "vision_encoder", net) if sam else net)(
                pixel_values=x, **({"output_attentions": True} if asked else {}))

        out = _streamed_blocks(net, _hf_points(net), lambda o: o[1], x, each, forward, given_up=asked)
        if sam:   # the encoder's last hidden state, or a VitDetBackbone's last feature map
            fmap = out.last_hidden_state if getattr(out, "last_hidden_state", None) is not None else \
                out.feature_maps[-1]
            return [], fmap[0].float().cpu().numpy().reshape(-1)
        vec = getattr(out, "logits", None)
        vec = vec if vec is not None else out.pooler_output
        return [], vec[0].float().cpu().numpy()

    return _Original("transformers", transformers.__version__, what, run)


def _hf_points(net: nn.Module) -> list[tuple[nn.Module, int]]:
    return [(m, int(getattr(m, "num_attention_heads", None) or m.num_heads)) for m in net.modules()
            if type(m).__name__ in _HF_ATTENTION]


def _torchvision_release(raw: Any) -> dict[str, Any] | None:
    """The torchvision Swin release the file's torch-hub name names (`families.swin.torchvision_swin_weights`)."""
    from vitviz.core.reading.families.swin import torchvision_swin_weights

    return torchvision_swin_weights(raw.weights_file.name) if raw.weights_file else None


def _torchvision_windowed(path: Path, raw: Any, device: torch.device, release: dict[str, Any]) -> _Original:
    """torchvision's `swin_t` / ... / `swin_v2_b` (the release its file name names) with the file's weights; it calls
    `F.softmax` inside `shifted_window_attention`, each call read on the original's thread (a torch function mode is
    the thread's own) and handed over as computed."""
    import torchvision
    from torch.overrides import TorchFunctionMode

    arch = release["arch"]
    what = f"torchvision.models.{arch}() ({release['weights']}, by the file name)"
    net = _built(getattr(torchvision.models, arch), raw.tensors, what, path).float().eval().to(device)

    def run(_size: tuple[int, int], x: torch.Tensor, each: Each) -> tuple[list[np.ndarray], np.ndarray | None]:
        class Softmaxes(TorchFunctionMode):
            def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                                   kwargs: dict[str, Any] | None = None) -> Any:
                out = func(*args, **(kwargs or {}))
                if func is torch.nn.functional.softmax:
                    each(out.detach().float().cpu().clone().numpy())
                return out

        with torch.inference_mode(), Softmaxes():
            out = net(x.to(device))
        return [], out[0].float().cpu().numpy()

    return _Original("torchvision", torchvision.__version__, what, run)


# ---------------------------------------------------------------------------------------------------------------
# Comparing block by block


def _compare_windowed(model: Any, original: _Original, sizes: list[tuple[int, int]], assumptions: tuple[str, ...],
                      device: torch.device, say: Progress) -> Verification:
    """Both forwards on the probe at each size, in step, each block compared as both compute it."""
    return _compare(model, original, sizes, assumptions, device, say,
                    at_size=lambda size: _windowed_at_size(model, original, size, device))


def _windowed_at_size(model: Any, original: _Original, size: tuple[int, int], device: torch.device) -> tuple[Any, ...]:
    """(per block differences, first block beyond tolerance, notes, output difference, output note) at `size`."""
    try:
        geometry = model.spec_at(size).geometry()
    except VitvizError as e:   # a size vitviz says the original's rule cannot run
        raise _CannotRun(str(e)) from None
    x = probe_input(model.spec, size)
    theirs = _Theirs(original, size, x)
    sink = _LayerByLayer(theirs, size)
    net = model.net
    hooks = [blk.attn.probe.register_forward_hook(lambda _m, _i, out: sink.append(out.detach()[None]))
             for blk in net.all_blocks()]
    ours: BaseException | None = None
    out_ours = None
    with _exact_float32(device), _exact_float32(torch.device(model.device)), \
            getattr(model, "_lock", None) or nullcontext():
        theirs.start()
        try:
            with torch.inference_mode():
                feats = net.forward_features(x.to(model.device), geometry)
                # SAM: its neck's feature map, as the original's encoder gives it; Swin: its class scores / features
                out_ours = (feats if model.spec.arch == "sam" else net.head(net.pool(feats)))[0].float().cpu().numpy()
                out_ours = out_ours.reshape(-1)
        except _TheirsStopped:
            pass
        except BaseException as e:  # noqa: BLE001 - ours failed: the original is let finish, then it is raised
            ours = e
        finally:
            for h in hooks:
                h.remove()
            theirs.finish()
    layers, first, notes = _settled(ours, theirs, sink, model, x)
    if out_ours is None:
        return (layers, first, notes, float("inf"), "the original's forward stopped before its output")
    return (layers, first, notes, *_output_difference(out_ours, theirs.out, size))

