"""`--code FILE.py:FACTORY`: the user's own model class, built by running their file, with a weights file loaded.

    model = load_code("model.py:build_vit", "weights.pth", {})     # -> LiveModel (vitviz.core.running.live.model)

The only module of vitviz that imports a user's file (`importlib.util.spec_from_file_location`); the recorder
and the describer run a module they are given, and never import code.

`module_from_code` imports FILE.py (its folder on `sys.path` while it runs, so its own imports work) and calls
FACTORY() -- that runs the file's code, so callers do it only when the user asks for it. Whatever the file does
(`sys.exit()` from an argparse at import time, `KeyboardInterrupt`, any `BaseException`) comes back as a
`UserCodeError`; what it prints goes to stderr, so that `vitviz info --json` stays JSON.

`load_weights` puts a weights file (read with `weights_only=True`, never executed) into what the factory returned:
every parameter with its shape and a float dtype for a float tensor (int8 weights are not silently cast), a common
wrapper prefix removed ('module.', Lightning's 'model.'). A transformers model given its `save_pretrained` folder,
whose keys are often older than the module's own names, is loaded by the library's own `from_pretrained` when the
strict match fails -- and the provenance says which route was used.
"""
from __future__ import annotations

import contextlib
import errno
import importlib.util
import inspect
import os
import sys
import types
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from vitviz.core.reading.checkpoint import read_checkpoint
from vitviz.core.running.live.describe import materialise_lazy
from vitviz.core.running.live.errors import NoAttentionError, UserCodeError, user_call
from vitviz.core.running.live.model import LiveModel, load_live
from vitviz.errors import VitvizError

_STRIP = ("module.", "_orig_mod.", "model.", "net.", "backbone.")


def module_from_code(ref: str) -> nn.Module:
    """Import FILE.py and call FACTORY() (a function or class needing no arguments) -> the user's model.

    This runs the file's code: callers do it only when the user asked for it (`code=`, `--code`).
    """
    path_text, sep, factory = ref.rpartition(":")
    if not sep or not path_text or not factory:
        raise UserCodeError(f"code {ref!r}: expected FILE.py:FACTORY, e.g. model.py:build_model (a function or class "
                            "that returns the model)")
    path = Path(path_text).expanduser()
    shown = ref if len(ref) <= 160 else ref[:120] + "..." + ref[-30:]
    try:
        is_file = path.is_file()
    except OSError as e:   # a name too long for the system, a folder that cannot be read...
        longest = max((len(part) for part in path.parts), default=0)
        why = (f"the file name is too long for this system ({len(str(path))} characters, the longest part "
               f"{longest}; most systems allow 255 per name)") if e.errno == errno.ENAMETOOLONG else \
            f"it cannot be read ({e.strerror or e})"
        raise UserCodeError(f"code {shown!r}: {why}; expected FILE.py:FACTORY") from None
    if not is_file or path.suffix != ".py":
        raise UserCodeError(f"code {shown!r}: {path} is not a Python file; expected FILE.py:FACTORY")
    name = f"vitviz_user_code_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise UserCodeError(f"code {shown!r}: {path} cannot be imported as a Python module")
    user = importlib.util.module_from_spec(spec)
    folder = str(path.resolve().parent)
    added = folder not in sys.path
    if added:
        sys.path.insert(0, folder)  # its own imports of files beside it
    sys.modules[name] = user
    try:
        try:
            with _prints_to_stderr():
                user_call(lambda: spec.loader.exec_module(user), f"code {shown!r}", f"importing {path}")
        except UserCodeError:
            sys.modules.pop(name, None)
            raise
        made = _call_factory(user, factory, shown, path)
    finally:
        if added and folder in sys.path:
            sys.path.remove(folder)
    if not isinstance(made, nn.Module):
        raise UserCodeError(f"code {shown!r}: {factory}() returned a {type(made).__name__}; expected a "
                            "torch.nn.Module")
    return made


@contextlib.contextmanager
def _prints_to_stderr() -> Any:
    """What the user's file prints while vitviz runs it goes to stderr: vitviz's own output stays its own."""
    with contextlib.redirect_stdout(sys.stderr):
        yield


def _call_factory(user: types.ModuleType, factory: str, ref: str, path: Path) -> Any:
    obj: Any = user
    for part in factory.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            found = sorted(n for n, v in vars(user).items() if callable(v) and not n.startswith("_")
                           and getattr(v, "__module__", None) == user.__name__)
            raise UserCodeError(f"code {ref!r}: {path} defines no {factory!r}; it defines "
                                f"{', '.join(found[:10]) or 'no functions or classes'}")
    if not callable(obj):
        raise UserCodeError(f"code {ref!r}: {factory} is a {type(obj).__name__}, not a function or class")
    try:
        params = inspect.signature(obj).parameters.values()
        needed = [p.name for p in params if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY,
                                                                                  p.POSITIONAL_OR_KEYWORD,
                                                                                  p.KEYWORD_ONLY)]
    except (TypeError, ValueError):
        needed = []
    if needed:
        raise UserCodeError(f"code {ref!r}: {factory} needs arguments ({', '.join(needed)}); expected a function or "
                            "class callable without arguments (write a small one that builds your model)")
    with _prints_to_stderr():
        return user_call(obj, f"code {ref!r}", f"{factory}()")


def load_weights(module: nn.Module, checkpoint: str | Path, nest_key: str | None = None,
                 overrides: Mapping[str, Any] | None = None) -> str:
    """Load a checkpoint file or folder (read with weights_only=True, never executed) into the factory's model:
    every parameter must be there with its shape and a floating dtype where the model's is one, nothing extra; a
    common wrapper prefix ('module.', ...) is removed. Buffers the file lacks keep the model's own values. A model
    on the meta device gets the file's tensors as they are (`assign`). A transformers model whose folder's keys
    do not match is loaded by its own `from_pretrained` instead. A model with Lazy modules (nn.LazyLinear, the d2l
    book's ViT) is first given its shapes by one dry forward (`materialise_lazy`; `overrides`' image_size= and
    in_chans= set its input). Returns a description for the provenance.

    Raises:
        UserCodeError: the file does not fit the model, naming the tensors (and the transformers route's failure
            too, when it was tried), or its Lazy modules could not be given shapes.
    """
    raw = read_checkpoint(checkpoint, nest_key)
    lazy = materialise_lazy(module, overrides or {}, str(raw.path), raw.tensors)
    try:
        loaded = _load_strict(module, raw.tensors, raw.path)
        return f"{loaded}; {lazy}" if lazy else loaded
    except UserCodeError as strict:
        pretrained = _pretrained_folder(module, checkpoint)
        if pretrained is None:
            raise
        return _load_with_from_pretrained(module, pretrained, strict)


def _load_strict(module: nn.Module, tensors: Mapping[str, torch.Tensor], path: Path) -> str:
    own = user_call(module.state_dict, str(path), f"{type(module).__name__}.state_dict()")
    params = {n for n, _ in module.named_parameters()}
    best, removed = dict(tensors), ""
    for prefix in _STRIP:
        stripped = {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}
        if len(set(stripped) & set(own)) > len(set(best) & set(own)):
            best, removed = stripped, prefix
    missing = [k for k in own if k not in best and k in params]
    extra = [k for k in best if k not in own]
    wrong = [f"{k}: file {tuple(best[k].shape)} vs model {tuple(own[k].shape)}" for k in own
             if k in best and tuple(best[k].shape) != tuple(own[k].shape)]
    kinds = [f"{k} ({_dtype(best[k])} into {_dtype(own[k])})" for k in own
             if k in best and own[k].is_floating_point() != best[k].is_floating_point()]
    if missing or extra or wrong or kinds:
        parts = []
        if kinds:
            parts.append(f"tensors whose values are not floats where the model's are (or the reverse; quantized or "
                         f"integer weights are not converted): {'; '.join(kinds[:5])}"
                         + (f" (+{len(kinds) - 5})" if len(kinds) > 5 else ""))
        if wrong:
            parts.append(f"shapes differ: {'; '.join(wrong[:5])}" + (f" (+{len(wrong) - 5})" if len(wrong) > 5 else ""))
        if missing:
            parts.append(f"the model's parameters not in the file: {', '.join(missing[:8])}"
                         + (f" (+{len(missing) - 8})" if len(missing) > 8 else ""))
        if extra:
            parts.append(f"tensors the model does not have: {', '.join(extra[:8])}"
                         + (f" (+{len(extra) - 8})" if len(extra) > 8 else ""))
        raise UserCodeError(f"{path}: does not fit the model the code built ({type(module).__name__}): "
                            + " | ".join(parts))
    on_meta = any(t.is_meta for t in own.values())
    if on_meta:   # nothing to copy into: the file's tensors become the model's, in its dtypes
        best = {k: v.to(own[k].dtype) if v.is_floating_point() else v for k, v in best.items()}
    user_call(lambda: module.load_state_dict(best, strict=False, assign=on_meta), str(path),
              f"{type(module).__name__}.load_state_dict()")
    kept = [k for k in own if k not in best]
    return (f"weights {path} ({len(best)} tensors" + (f", prefix {removed!r} removed" if removed else "")
            + ("; assigned to a model built on the meta device" if on_meta else "")
            + (f"; the model's own {', '.join(kept[:4])} kept" if kept else "") + ")")


def _dtype(t: torch.Tensor) -> str:
    return str(t.dtype).replace("torch.", "")


def _pretrained_folder(module: nn.Module, checkpoint: str | Path) -> Path | None:
    """The folder to give transformers' `from_pretrained` when `module` is a transformers model and `checkpoint`
    is (or sits in) a folder with a config.json; else None."""
    if not callable(getattr(type(module), "from_pretrained", None)) or not hasattr(module, "config") \
            or not type(module).__module__.startswith("transformers."):
        return None
    path = Path(checkpoint).expanduser()
    folder = path if path.is_dir() else path.parent
    return folder if (folder / "config.json").is_file() else None


def _load_with_from_pretrained(module: nn.Module, folder: Path, strict: UserCodeError) -> str:
    """Load the folder with the model class's own `from_pretrained` (its renames of older keys), then copy that
    state into `module` key for key; the strict match's failure is kept in the message."""
    cls = type(module)

    def load() -> nn.Module:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return cls.from_pretrained(str(folder), config=module.config)

    try:
        loaded = user_call(load, str(folder), f"{cls.__name__}.from_pretrained")
        _load_strict(module, loaded.state_dict(), folder)
    except UserCodeError as e:
        raise UserCodeError(f"{strict}; transformers' {cls.__name__}.from_pretrained was tried too and failed: "
                            f"{e}") from e
    return (f"weights {folder} loaded by transformers' {cls.__name__}.from_pretrained (its own renames of the "
            f"folder's keys; a strict key match failed: {str(strict).split(': ', 1)[-1][:160]})")


def load_code(ref: str, checkpoint: Any, overrides: Mapping[str, Any]) -> LiveModel:
    """`code=FILE.py:FACTORY`: build the user's model by running their code, load the weights file into it (when
    given) and capture it live. The model is new, so it goes to `device` ('auto' by default, as for files)."""
    if checkpoint is not None and not isinstance(checkpoint, (str, Path, os.PathLike)):
        raise UserCodeError(f"code {ref!r}: expected a weights file (or none) beside it, got a "
                            f"{type(checkpoint).__name__}")
    module = module_from_code(ref)
    how = f"code {ref}"
    if checkpoint is not None:
        how += "; " + load_weights(module, checkpoint, overrides.get("nest_key"), overrides)
    else:
        how += "; the weights its factory made (no weights file given)"
    overrides = {**overrides, "device": overrides.get("device") or "auto"}
    source = str(checkpoint) if checkpoint is not None else ref
    try:
        return load_live(module, overrides, source=source, how=how)
    except NoAttentionError as e:
        if checkpoint is None or not e.file_step:
            raise
        refused = _file_route_refusal(checkpoint, overrides.get("nest_key"))
        if refused is None:         # the file route reads it: the advice stands
            raise
        steps = e.step or "vitviz has nothing to show of it"
        raise NoAttentionError(f"{e.seen} Its weights file by itself is no way in either: without code= it is "
                               f"refused ({refused}). Next: {steps}", e.seen, e.step) from e


def _file_route_refusal(checkpoint: str | Path | os.PathLike[str], nest_key: str | None) -> str | None:
    """What the file route (the weights file converted by its layout, without code) says when it refuses
    `checkpoint`, shortened to what it saw; None when it reads the file."""
    from vitviz.core.reading.families import convert

    try:
        convert(read_checkpoint(checkpoint, nest_key))
    except VitvizError as e:
        text = str(e).split(": ", 1)[-1]
        cut = min((i for i in (text.find(" Most common"), text.find(" If your code"), text.find(" Expected a"),
                               text.find(" If it is a Vision")) if i > 0), default=len(text))
        return text[:cut].rstrip(" .")
    return None
