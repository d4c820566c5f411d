"""Persistent settings (QSettings), versioned so a layout from another version is ignored, never half-applied.

Tests pass their own `QSettings` (an ini file in a temporary folder); the window never opens the user's file
unless `open_settings()` is called by the application entry point. `VITVIZ_SETTINGS` names an ini file to use
instead of the user's settings (handy for scripted screenshots and benchmarks).
"""
from __future__ import annotations

import os

from PySide6.QtCore import QByteArray, QSettings

from vitviz.catalog import answers
from vitviz.gui.state import COLORMAPS, ViewState

SETTINGS_VERSION = 2   # 2: the analysis docks
MAX_RECENT = 8


def open_settings() -> QSettings:
    """The user's settings, or the ini file named by VITVIZ_SETTINGS."""
    path = os.environ.get("VITVIZ_SETTINGS")
    if path:
        return QSettings(path, QSettings.Format.IniFormat)
    return QSettings(QSettings.Format.IniFormat, QSettings.Scope.UserScope, "vitviz", "vitviz")


def is_current(settings: QSettings) -> bool:
    """True when the stored settings were written by this settings version."""
    try:
        return int(settings.value("version", 0)) == SETTINGS_VERSION
    except (TypeError, ValueError):
        return False


def read_bytes(settings: QSettings, key: str) -> QByteArray | None:
    value = settings.value(key)
    return value if isinstance(value, QByteArray) and not value.isEmpty() else None


def recent_models(settings: QSettings) -> list[str]:
    value = settings.value("recent_models", [])
    if isinstance(value, str):
        value = [value]
    return [str(v) for v in (value or [])][:MAX_RECENT]


def add_recent_model(settings: QSettings, path: str) -> list[str]:
    """Put `path` first in the recent-model list and return the list: a file or folder as its absolute path (so
    that it opens again whatever folder vitviz is started from), a named model as its name (`_file_key`)."""
    path = _file_key(path)
    recent = [path] + [p for p in recent_models(settings) if p != path]
    settings.setValue("recent_models", recent[:MAX_RECENT])
    settings.setValue("version", SETTINGS_VERSION)
    return recent[:MAX_RECENT]


def restore_view(settings: QSettings, state: ViewState) -> None:
    """Apply the stored colormap and opacity (nothing when the settings are from another version)."""
    if not is_current(settings):
        return
    values: dict[str, object] = {}
    cmap = settings.value("view/colormap")
    if cmap in COLORMAPS:
        values["colormap"] = cmap
    try:
        opacity = float(settings.value("view/opacity", state.opacity))
        if 0.0 <= opacity <= 1.0:
            values["opacity"] = opacity
    except (TypeError, ValueError):
        pass
    state.update(**values)


def save_view(settings: QSettings, state: ViewState) -> None:
    settings.setValue("version", SETTINGS_VERSION)
    settings.setValue("view/colormap", state.colormap)
    settings.setValue("view/opacity", float(state.opacity))


def last_folder(settings: QSettings, kind: str) -> str:
    """The folder last used for `kind` ('model', 'images', 'export'), or ''."""
    return str(settings.value(f"folders/{kind}", "") or "") if is_current(settings) else ""


def set_last_folder(settings: QSettings, kind: str, folder: str) -> None:
    settings.setValue("version", SETTINGS_VERSION)
    settings.setValue(f"folders/{kind}", folder)


# "Remember for this file" lives in one store shared with the command line (vitviz.catalog.answers); these two
# QSettings keys are where earlier versions kept it: still read, moved into the store on the next answer.
REMEMBERED_KEY = "model/remembered"            # {file: {override: value}}
LEGACY_HEADS_KEY = "model/remembered_heads"     # {file: heads}, before the other settings were remembered
REMEMBERED = answers.REMEMBERED                 # the overrides remembered per file
_CHECKS = answers.CHECKS


def _read_json(settings: QSettings, key: str) -> dict:
    import json

    try:
        value = json.loads(str(settings.value(key, "{}") or "{}"))
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _remembered(settings: QSettings) -> dict[str, dict[str, object]]:
    """Every file's remembered settings -- the shared store over what earlier versions kept in `settings` (the
    legacy head counts included) -- values checked (a bad one is dropped, never applied)."""
    out: dict[str, dict[str, object]] = {}
    for file, heads in _read_json(settings, LEGACY_HEADS_KEY).items():
        if _CHECKS["heads"](heads):
            out[str(file)] = {"heads": heads}
    for file, values in _read_json(settings, REMEMBERED_KEY).items():
        out[str(file)] = {**out.get(str(file), {}), **answers.checked(values)}
    for file, values in answers.read_all().items():
        out[file] = {**out.get(file, {}), **values}
    return out


def remembered_settings(settings: QSettings, path: str) -> dict[str, object]:
    """The settings the user chose for the model file `path` ("remember for this file") as `vitviz.load`
    overrides ({'heads': 4, 'block_norm': 'post'}); {} when none."""
    return dict(_remembered(settings).get(_file_key(path), {}))


def remember_settings(settings: QSettings, path: str, values: dict[str, object]) -> None:
    """Remember `values` (overrides of `REMEMBERED`; a None value forgets that one) for the model file `path`,
    keyed by its absolute path, on top of what is remembered for it already, in the store the command line reads
    too (what `settings` held from earlier versions moves there)."""
    answers.write_all(answers.updated(_remembered(settings), _file_key(path), values))
    settings.remove(REMEMBERED_KEY)            # moved into the store
    settings.remove(LEGACY_HEADS_KEY)


def forget_settings(settings: QSettings, path: str) -> None:
    """Forget every setting remembered for the model file `path` (in the shared store and where earlier versions
    kept them)."""
    remember_settings(settings, path, {name: None for name in REMEMBERED})


def remembered_heads(settings: QSettings, path: str) -> int | None:
    """The head count the user chose for the model file `path` ("remember for this file"), or None."""
    heads = remembered_settings(settings, path).get("heads")
    return heads if isinstance(heads, int) else None


def remember_heads(settings: QSettings, path: str, heads: int | None) -> None:
    """Remember (None: forget) the head count chosen for the model file `path`."""
    remember_settings(settings, path, {"heads": None if heads is None else int(heads)})


def _file_key(path: str) -> str:
    """A model file's absolute path; a model name as given."""
    return answers.model_key(path)


ORIGINALS_KEY = "verify/originals"     # {file: {"against": 'timm:ARCH'} or {"code": 'FILE.py:FACTORY'}}


def remembered_original(settings: QSettings, path: str) -> tuple[str, str]:
    """(against, code) the user chose to verify the model file `path` against (Verify against…, remembered for
    the file): ('timm:vit_small_patch16_224', '') or ('auto', 'my_vit.py:build'); ('auto', '') when none."""
    entry = _read_json(settings, ORIGINALS_KEY).get(_file_key(path))
    if not isinstance(entry, dict):
        return "auto", ""
    against, code = entry.get("against"), entry.get("code")
    return (str(against) if isinstance(against, str) and against else "auto",
            str(code) if isinstance(code, str) else "")


def remember_original(settings: QSettings, path: str, against: str = "auto", code: str = "") -> None:
    """Remember what the model file `path` is verified against (('auto', '') forgets it)."""
    import json

    every = _read_json(settings, ORIGINALS_KEY)
    key = _file_key(path)
    if code:
        every[key] = {"code": code}
    elif against and against != "auto":
        every[key] = {"against": against}
    else:
        every.pop(key, None)
    settings.setValue(ORIGINALS_KEY, json.dumps(every))
    settings.setValue("version", SETTINGS_VERSION)


STOP_WAITING_KEY = "worker/stop_waiting_s"     # seconds before the user's own code is offered Stop waiting


def stop_waiting_seconds(settings: QSettings, default: float = 30.0) -> float | None:
    """How long a request running the user's own code (`--code`) may run before the status bar offers Stop
    waiting: the stored number of seconds (0 or less: never), else `default`."""
    try:
        value = float(settings.value(STOP_WAITING_KEY, default))
    except (TypeError, ValueError):
        return default
    if value != value or value in (float("inf"), float("-inf")):
        return default
    return value if value > 0 else None
