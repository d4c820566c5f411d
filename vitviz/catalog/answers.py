"""What the user told vitviz about a model file that the file does not say ("remember for this file"): one store,
read by the window and by every command, so that a head count or norm order answered in the window is used by
`vitviz info` / `export` / `verify` too.

The store is a small JSON file, `$VITVIZ_ANSWERS`, else `$XDG_CONFIG_HOME/vitviz/answers.json` (default
`~/.config/vitviz/answers.json`): {model: {override: value}}, a file keyed by its absolute path, a named model
(`hf:ORG/NAME`, `timm:NAME`) by its name. Values are checked when read; a bad one is dropped, never applied. No
Qt, no torch.
"""
from __future__ import annotations

import contextlib
import json
import os
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from vitviz.core.options import OPTION, REMEMBERABLE
from vitviz.errors import VitvizError

ANSWERS_ENV = "VITVIZ_ANSWERS"
REMEMBERED = REMEMBERABLE   # the overrides remembered per model (`Option.remembered`)


class UnreadableStoreWarning(RuntimeWarning):
    """The answers store is there but cannot be read (its text names the file and why): no answers are used."""


def why_not(name: str, value: Any) -> str:
    """Why `value` cannot be remembered as the override `name` ('' when it can): the check `vitviz.load` makes
    of it (`validate.check_overrides`: heads at most MAX_HEADS, a finite attn_scale...), so nothing remembered is
    refused when the model loads."""
    from vitviz.core.reading.validate import check_overrides
    from vitviz.errors import OverrideError

    if name not in REMEMBERED:
        return f"{name} is not remembered (expected one of {', '.join(REMEMBERED)})"
    if name == "heads" and not (isinstance(value, int) and not isinstance(value, bool)):
        return f"override heads {value!r}; expected a whole number"
    try:
        check_overrides({name: value}, ())
    except OverrideError as e:
        return str(e)
    return ""


CHECKS = {name: (lambda v, name=name: v is not None and not why_not(name, v)) for name in REMEMBERED}


def stored(name: str, value: Any) -> Any:
    """A checked answer as the store keeps it: a number as a float (an attention scale answered 1 is 1.0)."""
    return float(value) if OPTION[name].value == "number" else value


def answers_path() -> Path:
    """Where the answers are kept."""
    if os.environ.get(ANSWERS_ENV):
        return Path(os.environ[ANSWERS_ENV])
    config = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(config) / "vitviz" / "answers.json"


def model_key(path: str) -> str:
    """A model file's absolute path; a model name as given."""
    from vitviz.catalog.named import is_named_model

    return path if is_named_model(path) else os.path.abspath(os.path.expanduser(path))


def checked(values: Any) -> dict[str, Any]:
    """The valid remembered overrides of `values` (others dropped)."""
    if not isinstance(values, dict):
        return {}
    return {k: v for k, v in values.items() if k in CHECKS and CHECKS[k](v)}


class AnswersStoreError(VitvizError):
    """The answers store is there but cannot be read: nothing is remembered into it (it is left as it is)."""


def _stored() -> tuple[dict[str, Any], str | None]:
    """The store's content ({} when it is missing) and why it cannot be read (None when it can): a FIFO,
    /dev/zero, not JSON, JSON nested too deeply or not an object... never blocks or reads more than 1 MiB."""
    from vitviz.core.files import read_json_file

    store = answers_path()
    if not os.path.lexists(store):
        return {}, None
    expected = "vitviz's answers store (JSON: {model: {override: value}})"
    try:
        data = read_json_file(store, expected, VitvizError, 1 << 20)
    except VitvizError as e:
        return {}, str(e)
    if not isinstance(data, dict):
        return {}, f"{store}: a JSON {type(data).__name__}, not an object; expected {expected}"
    return data, None


def read_all() -> dict[str, dict[str, Any]]:
    """Every model's remembered answers ({} when the store is missing or unreadable; an unreadable store is said
    in an `UnreadableStoreWarning` naming it)."""
    data, why = _stored()
    if why is not None:
        warnings.warn(f"{why}; no remembered answers are used (remove it, or set ${ANSWERS_ENV} to another file)",
                      UnreadableStoreWarning, stacklevel=2)
    return {str(k): kept for k, v in data.items() if (kept := checked(v))}


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    """One writer of the store at a time, threads and processes alike (the window and the command line): an
    exclusive `flock` on `answers.json.lock` beside it, where the platform and the folder allow one."""
    try:
        import fcntl
    except ImportError:   # Windows: no flock; the write itself stays atomic
        yield
        return
    target = answers_path()
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(f"{target}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:   # a store in a read-only or odd place: written unlocked, as before
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def answers_for(path: str) -> dict[str, Any]:
    """The overrides remembered for the model `path` ({} when none)."""
    return dict(read_all().get(model_key(path), {}))


def remember(path: str, values: dict[str, Any]) -> None:
    """Remember `values` for the model `path` on top of what is remembered already (a None value forgets that
    one); written atomically. An unwritable store is left as it is (remembering is a convenience).

    Raises:
        OverrideError: a value `vitviz.load` would refuse (attn_scale=inf, heads=10**30), naming the store.
    """
    from vitviz.errors import OverrideError

    for name, value in values.items():
        if name in CHECKS and value is not None and (why := why_not(name, value)):
            raise OverrideError(f"{answers_path()}: not remembered for {path}: {why}")
    with _locked():
        _update(path, values)


def _update(path: str, values: dict[str, Any]) -> None:
    """`remember`'s read, change and write, under the lock.

    Raises:
        AnswersStoreError: the store cannot be read (it is not overwritten).
    """
    data, unreadable = _stored()
    if unreadable is not None:
        raise AnswersStoreError(f"{unreadable}; nothing remembered, the store is left as it is (fix it, move it "
                                f"away, or set ${ANSWERS_ENV} to another file)")
    every = {str(k): kept for k, v in data.items() if (kept := checked(v))}
    _write(updated(every, model_key(path), values))


def updated(every: dict[str, dict[str, Any]], key: str, values: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """`every` model's answers with the model `key`'s updated by `values` (a None value forgets that one; a name
    that is not remembered, or a value its check refuses, is passed over); a model left with none is dropped."""
    mine = every.get(key, {})
    for name, value in values.items():
        if name not in CHECKS:
            continue
        if value is None:
            mine.pop(name, None)
        elif CHECKS[name](value):
            mine[name] = stored(name, value)
    if mine:
        every[key] = mine
    else:
        every.pop(key, None)
    return every


def forget(path: str) -> dict[str, Any]:
    """Forget every answer remembered for the model `path` (its settings are assumed again where the file does
    not say them); returns what was forgotten ({} when nothing was)."""
    with _locked():
        every = read_all()
        gone = every.pop(model_key(path), {})
        if gone:
            _write(every)
    return gone


def write_all(every: dict[str, dict[str, Any]]) -> None:
    """Replace the store's content with `every` -- unless the store is there and cannot be read (said by
    `read_all`'s warning): a file the user may still want is never overwritten."""
    with _locked():
        if _stored()[1] is None:
            _write(every)


def _write(every: dict[str, dict[str, Any]]) -> None:
    target = answers_path()
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".answers-", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(every, f, sort_keys=True, indent=1)
        os.replace(tmp, target)
    except OSError:
        pass


def describe(values: dict[str, Any]) -> str:
    """'heads 4, block_norm post'."""
    return ", ".join(f"{k} {v}" for k, v in values.items())
