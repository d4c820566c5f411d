"""Loading: a checkpoint path, a model folder, a state dict or a model object -> `VitModel`.

    model = load("vit_b_16-c867db91.pth", heads=12, device="cuda")

Reading the file is `checkpoint`, naming its family and converting its keys is `families`, inferring every
spec field with its provenance is `hyperparams`; here the reference ViT is built and every tensor is loaded
exactly (each key and shape asserted).
"""
from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from vitviz.core.running.capture import VitModel
from vitviz.core.reading.checkpoint import RawCheckpoint, read_checkpoint
from vitviz.core.reading.families import FAMILY_NAMES, convert, named_refusal
from vitviz.core.reading.hyperparams import infer_spec, warn_guesses
from vitviz.core.reading.objects import module_heads, module_settings, raw_from_dict, raw_from_module
from vitviz.core.running.live import LiveModelError, load_code, load_live
from vitviz.core.running.live.packing import is_packed, packed_tower
from vitviz.core.running.model import ReferenceViT
from vitviz.core.running.runtime import check_input_size, check_model_memory, resolve_device
from vitviz.core.reading.towers import BY_CODE, BY_CODE_ROUTE, load_tower, original_tower, tower_module
from vitviz.core.options import (
    LIVE, NUMERIC_FIELDS, OPTION, OPTIONS, REFERENCE, REMEMBERABLE, only_for, remembered_source,
)
from vitviz.core.reading.validate import (
    check_canonical, check_exact_tensors, check_overrides, check_route, check_spec, check_weights,
)
from vitviz.core.running.winload import is_windowed, load_windowed
from vitviz.core.protocol import WINDOWS, capabilities_of
from vitviz.core.running.winload import APPLIES as WINDOWED_APPLY
from vitviz.errors import (
    CheckpointError, CompositeModelError, DeviceError, InconsistentCheckpointError, OverrideError, UnknownLayoutError,
    VitvizError,
)


def load(path: "str | Path | dict[str, Any] | torch.nn.Module | None", **overrides: Any) -> VitModel:
    """Load any supported ViT checkpoint into the reference model, or run a model object live.

    Args:
        path: a file, a folder (HF / timm hub), an in-memory state dict, or any `torch.nn.Module`. A module whose
            state dict is a layout vitviz knows is converted to the reference ViT (the head count read from it);
            any other module, or any with `live=True`, runs as written with its attention captured
            (`vitviz.core.running.live`; `spec.family == 'live'`, the path taken is `spec.source_of('path')`).
            With `code=` it is the weights file for the code's model (or None).
        **overrides: the keywords of `vitviz.core.options.OPTIONS` (each record says its value, choices and the
            routes that take it): heads, family, image_size (int or (h, w)), eps, mean, std, interpolation,
            labels, pos_interp, act, nest_key, device ('auto', 'cpu', 'cuda', 'cuda:1'), ...; for the live path
            also live (True: always, False: never), grid ((rows, cols)), num_prefix, and code='FILE.py:FACTORY'
            (runs that file's code to build the model: only pass it when the user asked for it). One that the
            route taken does not take (act= for a module run live, window= for a plain ViT) is refused.
            `_remembered` (private, for the command line and the window): the names of the overrides whose values
            are answers remembered for this file (`vitviz.catalog.answers`), not typed now; their provenance says
            'remembered: ...' (still given) instead of 'override', so that everything showing the model says so.
    """
    remembered = _remembered_names(overrides.pop("_remembered", ()), overrides)
    tower = tower_module(path) if isinstance(path, torch.nn.Module) else None
    if tower is None:
        return _mark_remembered(_load(path, overrides), remembered, overrides)
    # a composite transformers model (LLaVA, PaliGemma, a depth model): its vision tower is the model shown
    if type(tower[0]).__name__ in BY_CODE_CLASSES and overrides.get("live") is not False \
            and overrides.get("code") is None:   # a tower vitviz runs by its code (Qwen-VL, Pixtral): never converted
        model = _load(tower[0], {**overrides, "live": True}, how=f"{BY_CODE_ROUTE}: transformers' "
                      f"{type(tower[0]).__name__} runs, vitviz converts nothing")
        return _mark_remembered(_said(model, "path", f"the vision tower {tower[1]}"), remembered, overrides)
    model = _load(tower[0], overrides)
    return _mark_remembered(_said(model, "path", f"the vision tower {tower[1]}"), remembered, overrides)


def _said(model: VitModel, key: str, note: str) -> VitModel:
    """`model` with `note` added to its `key` provenance entry (its spec and its network's, kept the same)."""
    spec = model.spec
    marked = replace(spec, provenance=tuple((k, f"{v}; {note}" if k == key else v) for k, v in spec.provenance))
    net = getattr(model, "net", None)
    if getattr(net, "spec", None) is spec:
        net.spec = marked
    model.spec = marked
    return model


def _load(path: "str | Path | dict[str, Any] | torch.nn.Module | None", overrides: dict[str, Any],
          how: str = "asked for") -> VitModel:
    """`load` once the remembered answers are set aside; `how`: why a module asked to run live does."""
    unknown = set(overrides) - set(OPTION)
    if unknown:
        raise VitvizError(f"unknown override(s) {sorted(unknown)}; expected any of "
                          f"{', '.join(o.name for o in OPTIONS)}")
    # every value's type and range, once (an OverrideError names it)
    overrides = check_overrides(overrides, FAMILY_NAMES)
    if overrides.get("code") is not None:
        check_route(overrides, LIVE, f"code={overrides['code']}", _LIVE_WHY)
        code = overrides.pop("code")
        return load_code(code, path, {k: v for k, v in overrides.items() if k != "live"})
    live = overrides.pop("live", None)
    asked = [k for k in LIVE_ONLY if overrides.get(k) is not None]     # grid=, num_prefix=, in_chans=
    if not isinstance(path, torch.nn.Module):
        if live or asked:
            raise VitvizError(f"{', '.join(asked) or 'live'}= applies to the live path: a torch.nn.Module, or "
                              "code='FILE.py:FACTORY'")
        return _load_reference(path, overrides)
    if live or asked:
        check_route(overrides, LIVE, type(path).__name__, _LIVE_WHY)
        return load_live(path, overrides, how=how)
    if is_packed(path):   # packed patches + grid_thw (Qwen-VL): no layout the reference ViT takes
        check_route(overrides, LIVE, type(path).__name__, _LIVE_WHY)
        return load_live(path, overrides, how=f"{type(path).__name__} takes packed patches and grid_thw: its own "
                                             "code runs")
    try:
        model = _load_reference(path, overrides)
    except Exception as refused:  # noqa: BLE001 - not a known layout: the live path runs it, and says why
        if live is False or isinstance(refused, OverrideError):   # an override that does not fit: the user's to fix
            raise
        why = f"its state dict is no layout vitviz converts: {type(refused).__name__}: {refused}"
        check_route(overrides, LIVE, type(path).__name__, f"{_LIVE_WHY}, the route this module takes because {why}")
        try:
            return load_live(path, overrides, how=why)
        except LiveModelError as e:
            raise type(e)(f"{e} (Converting it to the reference ViT failed too: {why})") from e  # UserCodeError...
    what = "windowed model" if WINDOWS in capabilities_of(model) else "ViT"
    model.spec = model.net.spec = replace(model.spec, provenance=(*model.spec.provenance, (
        "path", f"reference: its state dict converted to vitviz's reference {what} (live=True runs its own code)")))
    return model


def _remembered_names(names: Any, overrides: dict[str, Any]) -> frozenset[str]:
    """The `_remembered` keyword checked: names of `REMEMBERABLE` overrides; those not given (None) are dropped.

    Raises:
        VitvizError: something else than a collection of those names.
    """
    if not isinstance(names, (set, frozenset, list, tuple)) or not all(isinstance(n, str) for n in names):
        raise VitvizError(f"_remembered={names!r}; expected a collection of override names among "
                          f"{', '.join(REMEMBERABLE)}")
    unknown = set(names) - set(REMEMBERABLE)
    if unknown:
        raise VitvizError(f"_remembered names {sorted(unknown)}; expected overrides among {', '.join(REMEMBERABLE)} "
                          "(the ones a file's answers are remembered for)")
    return frozenset(n for n in names if overrides.get(n) is not None)


def _mark_remembered(model: VitModel, remembered: frozenset[str], overrides: dict[str, Any]) -> VitModel:
    """`model` with the provenance of each remembered override said as such ('remembered: ...', given): only a
    field the override set (its source 'override'; a live model's heads, read from its attention, stay read)."""
    if not remembered:
        return model
    sources = {field: remembered_source(name, overrides[name]) for name in remembered for field in OPTION[name].fields}
    spec = model.spec
    provenance = tuple((k, sources[k] if k in sources and str(v).startswith("override") else v)
                       for k, v in spec.provenance)
    if provenance == spec.provenance:
        return model
    marked = replace(spec, provenance=provenance)
    net = getattr(model, "net", None)
    if getattr(net, "spec", None) is spec:
        net.spec = marked
    model.spec = marked
    return model


BY_CODE_CLASSES = frozenset(cls for _, cls in BY_CODE.values())   # towers run by their transformers code
LIVE_ONLY = tuple(k for k in only_for(LIVE) if k not in ("code", "live"))   # they ask for the live path
_LIVE_WHY = "a model run from its own code (the live path: its code computes its blocks)"


def _load_reference(path: "str | Path | dict[str, Any] | torch.nn.Module", overrides: dict[str, Any]) -> VitModel:
    """A checkpoint, state dict or model object converted to the reference ViT. Whatever a file holds, the
    answer is a model or a `VitvizError` naming the file: an unexpected exception from a reader is reported as a
    `CheckpointError` (with its type, so it can be filed as a bug), never as a traceback."""
    if not isinstance(path, (str, bytes, os.PathLike)):
        return _convert_and_build(path, overrides)
    try:
        return _convert_and_build(path, overrides)
    except VitvizError:
        raise
    except MemoryError as e:
        raise DeviceError(f"{os.fsdecode(path)}: ran out of memory while loading ({e or 'MemoryError'})") from e
    except RecursionError as e:
        raise CheckpointError(f"{os.fsdecode(path)}: nested too deeply to read; expected a checkpoint") from e
    except ImportError as e:  # a broken or missing package, not a broken file: name the package
        package = (e.name or str(e)).split(".")[0]
        raise VitvizError(f"{os.fsdecode(path)}: loading it needs the package {package!r}, which failed to import "
                          f"({type(e).__name__}: {str(e)[:200]}); reinstall it (pip install --force-reinstall "
                          f"{package}). The file itself was not at fault") from e
    except Exception as e:  # noqa: BLE001 - the promise: a VitvizError for every file
        if "Cannot allocate memory" in str(e) or "unable to mmap" in str(e):   # the host's, not the file's
            raise DeviceError(f"{os.fsdecode(path)}: not enough memory to map it while loading ({str(e)[:200]}); "
                              "close other programs or raise this process's memory limit") from e
        raise CheckpointError(f"{os.fsdecode(path)}: could not be loaded (unexpected {type(e).__name__}: "
                              f"{str(e)[:300]}); please report this file's layout as a vitviz bug") from e


def _convert_and_build(path: "str | Path | dict[str, Any] | torch.nn.Module", overrides: dict[str, Any]) -> VitModel:
    resolve_device(overrides.get("device"))   # an unavailable device is refused before the file is read
    stated: dict[str, tuple[Any, str]] = {}
    if isinstance(path, torch.nn.Module):  # a model in memory (timm, torchvision, transformers)
        heads = module_heads(path)
        stated = {k: v for k, v in module_settings(path).items() if overrides.get(k) is None}
        if heads and not overrides.get("heads"):
            stated["heads"] = (heads, f"model object: {type(path).__name__} num_heads")
        overrides = {**overrides, **{k: v for k, (v, _) in stated.items()}}
        raw = raw_from_module(path)
    elif isinstance(path, dict):
        raw = raw_from_dict(path)
    elif isinstance(path, (str, bytes, os.PathLike)):
        raw = read_checkpoint(os.fsdecode(path), overrides.get("nest_key"))
        if raw.tower is not None and raw.tower.by_code[1]:
            return _load_by_code(raw, overrides)
    else:
        raise VitvizError(f"cannot load a {type(path).__name__}; expected a checkpoint path, a model folder, "
                          "a state dict or a torch.nn.Module")
    try:
        return _build_converted(path, raw, overrides, stated)
    except (UnknownLayoutError, InconsistentCheckpointError) as e:
        # a file whose config names it: a layout vitviz does not read is refused naming it and the route that works
        named = e if overrides.get("family") else named_refusal(e, raw)
        by_code = None if isinstance(path, torch.nn.Module) or overrides.get("family") else _timm_by_code(raw,
                                                                                                       overrides)
        if by_code is not None:
            return by_code
        if named is e:
            raise
        raise named from e


def _timm_by_code(raw: RawCheckpoint, overrides: dict[str, Any]) -> Any:
    """A timm hub folder (config.json naming its `architecture`, `model_args`) whose layout vitviz does not
    convert, run by timm's own code: the architecture built as the folder's config says (`timm.create_model`, no
    pretrained download), the file's tensors loaded into it strictly, and run live with its attention captured
    where timm computes it. None when that does not work (not a timm architecture, tensors that do not fit,
    options of the reference model, a model the live path refuses): the caller's refusal stands."""
    cfg = raw.config or {}
    arch = cfg.get("architecture")
    if not isinstance(arch, str) or not raw.tensors:
        return None
    try:
        import timm
    except ImportError:
        return None
    where = str(raw.path)
    try:
        check_route(overrides, LIVE, where, f"timm {arch!r} run {BY_CODE_ROUTE}")
        if not timm.is_model(arch):
            return None
        args = dict(cfg.get("model_args") or {})
        if isinstance(cfg.get("num_classes"), int):
            args.setdefault("num_classes", cfg["num_classes"])
        net = timm.create_model(arch, pretrained=False, **args)   # (its buffers that no file holds: computed)
        net.load_state_dict(dict(raw.tensors), strict=True)
        net = net.float().eval()
        count = len(raw.tensors)
        how = (f"{BY_CODE_ROUTE}: timm {timm.__version__} {arch!r} built from config.json (model_args) with the "
               f"file's {count} tensors; timm's code runs, vitviz converts nothing")
        model = load_live(net, overrides, source=where, how=how)
    except (VitvizError, RuntimeError, TypeError, ValueError, KeyError, AssertionError):
        return None
    raw.tensors = {}
    named = ("identity", f"named: timm architecture {arch!r} (config.json), run {BY_CODE_ROUTE}")
    model.spec = replace(model.spec, provenance=(*(kv for kv in model.spec.provenance if kv[0] != "identity"), named))
    return model


def _build_converted(path: Any, raw: Any, overrides: dict[str, Any], stated: dict[str, tuple[Any, str]]) -> VitModel:
    """`raw` converted (its family detected) and built as the reference ViT or windowed model."""
    device = resolve_device(overrides.get("device"))
    conv = convert(raw, overrides.get("family"), overrides)
    is_module = isinstance(path, torch.nn.Module)
    if is_windowed(conv):  # Swin, SAM / ViTDet: the windowed reference model (what a model object states about a
        # plain ViT's blocks -- its norm order, attention scale -- is no setting of these)
        kept = {k: v for k, v in overrides.items() if not is_module or k not in stated or k in WINDOWED_APPLY}
        return load_windowed(conv, raw, kept, warn=not is_module)
    check_route(overrides, REFERENCE, str(raw.path), "a plain ViT (vitviz's reference model)")
    check_canonical(conv.tensors, raw.path)
    spec = infer_spec(conv, raw, overrides, warn=not is_module)
    if is_module:  # a guess that changes the numbers: the object's own code (the live path) knows better
        guessed = [k for k, _ in spec.guesses if k in NUMERIC_FIELDS]
        if guessed:
            raise VitvizError(f"converting it would guess {', '.join(guessed)} ({dict(spec.guesses)[guessed[0]]})")
        warn_guesses(spec)
    if isinstance(path, torch.nn.Module) and stated:  # not the caller's overrides: the object said so
        said = {OPTION[k].provenance_field: src for k, (_, src) in stated.items()}
        spec = replace(spec, provenance=tuple((k, said.get(k, v)) for k, v in spec.provenance))
    check_spec(spec, spec.source)
    shadow = _build(spec, torch.device("meta"))  # shapes only: keys, shapes and size checked before allocating
    check_exact_tensors(shadow.state_dict(), conv.tensors, spec.source)
    check_weights(conv.tensors, spec.source)
    check_model_memory(sum(t.numel() * 4 for t in shadow.state_dict().values()), device, spec.source)
    check_input_size(spec, spec.source)
    net = _build(spec, torch.device("cpu"))
    net.load_state_dict(conv.tensors, strict=True)
    net.eval()
    padded = conv.hints.get("zero_params", (0, ""))[0]   # zeros a conversion added (a block-diagonal qkv)
    spec = replace(spec, num_params=sum(p.numel() for p in net.parameters()) - padded)
    net.spec = spec
    model = VitModel(net, spec, torch.device("cpu"), conv.dropped)
    return model.to(str(device))


def _load_by_code(raw: RawCheckpoint, overrides: dict[str, Any]) -> Any:
    """A composite model's vision tower that vitviz runs by transformers' own code (`towers.BY_CODE`): built from
    the folder's config.json as the composite model builds it (never remote code), given the file's tower tensors
    (read alone: `raw.tensors`), and run live with its attention captured where its code computes it.

    Raises:
        CompositeModelError: the tensors do not fit the tower transformers builds from the config.
    """
    import transformers

    tower = raw.tower
    assert tower is not None
    where = str(raw.path)
    check_route(overrides, LIVE, where, f"a vision tower run {BY_CODE_ROUTE} (transformers' {tower.by_code[1]})")
    folder = raw.path if raw.path.is_dir() else raw.path.parent
    try:
        config = transformers.AutoConfig.from_pretrained(str(folder), local_files_only=True)
    except (ValueError, OSError, KeyError, TypeError) as e:
        raise CompositeModelError(f"{where}: transformers {transformers.__version__} cannot read its config.json "
                                  f"({type(e).__name__}: {str(e)[:200]}); expected the config of a "
                                  f"{tower.model_type!r} model as transformers saves it") from e
    sub, cls, what = original_tower(config, tower)
    try:
        net, info = load_tower(config, tower, cls, sub, raw.tensors)
    except RuntimeError as e:    # shapes that differ: transformers refuses them (ignore_mismatched_sizes=False)
        with torch.device("meta"):
            own = cls(sub).state_dict()
        shapes = [f"{k} {tuple(v.shape)} (the tower's: {tuple(own[k].shape)})" for k, v in raw.tensors.items()
                  if k in own and tuple(own[k].shape) != tuple(v.shape)]
        raise CompositeModelError(f"{where}: its tower tensors do not fit {what}: other shapes: "
                                  f"{', '.join(shapes[:4]) or str(e)[:200]}; expected the weights of the model its "
                                  "config.json names") from e
    params = {n for n, _ in net.named_parameters()}
    bad = [f"{k}: {', '.join(map(str, sorted(v, key=str)[:4]))}" for k, v in
           (("missing", [m for m in info.get("missing_keys", ()) if m in params]),
            ("not in the tower", info.get("unexpected_keys", ())), ("other shapes", info.get("mismatched_keys", ())))
           if v]
    if bad:
        raise CompositeModelError(f"{where}: its tower tensors ({tower.place()}) do not fit {what}: "
                                  f"{' | '.join(bad)}; expected the weights of the model its config.json names")
    count = len(raw.tensors)
    raw.tensors = {}    # the module holds its weights now: the file's copies are let go before the probe runs
    net = net.float().eval()
    module: torch.nn.Module = net
    if is_packed(net):
        pre = raw.preprocessor or {}
        mean, std = pre.get("image_mean"), pre.get("image_std")
        stated = all(isinstance(v, (list, tuple)) and len(v) == 3 for v in (mean, std))
        stats = (mean, std, "metadata: preprocessor_config.json image_mean / image_std") if stated else None
        module = packed_tower(net, overrides.get("image_size"), stats, tower.model_type)
    how = (f"{BY_CODE_ROUTE}: {what} built from config.json with the file's {count} tower tensors "
           f"({tower.place()}); transformers {transformers.__version__}'s code runs, vitviz converts nothing")
    model = load_live(module, overrides, source=where, how=how)
    named = ("identity", f"named: {tower.describe()} (config.json), run {BY_CODE_ROUTE}")
    model.spec = replace(model.spec, provenance=(*(kv for kv in model.spec.provenance if kv[0] != "identity"), named))
    return model


def _build(spec: Any, device: torch.device) -> ReferenceViT:
    """The reference ViT for `spec` on `device` ('meta': no memory, for checking); a spec the model cannot
    express is an InconsistentCheckpointError naming the file."""
    try:
        with device:
            return ReferenceViT(spec)
    except (ValueError, TypeError) as e:
        raise InconsistentCheckpointError(f"{spec.source}: no reference ViT fits ({e})") from e


def _load_exact(net: ReferenceViT, sd: dict[str, torch.Tensor], where: str) -> None:
    """Load every tensor, asserting each key and shape; anything left over or missing is an error."""
    check_exact_tensors(net.state_dict(), sd, where)
    net.load_state_dict(sd, strict=True)
