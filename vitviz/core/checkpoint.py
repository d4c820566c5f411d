"""Reading checkpoint files and folders safely, without executing anything they contain.

`read_checkpoint` returns the tensors of the chosen state dict (unwrapped from training containers, upcast to
float32) plus every piece of metadata found beside them: `args`/`arch`/`hparams`/`config`/`image_size`/`classes`
of training checkpoints, side-car `config.json`/`preprocessor_config.json`, text configs next to the file
(`config.yaml`, `args.json`, `hparams.yaml`, ... -- read as text, never executed), safetensors `__metadata__`,
the file name.
"""
from __future__ import annotations

import argparse
import io
import json
import pickletools
import struct
import warnings
import zipfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from vitviz.core.formats import WEIGHT_NAMES, WEIGHT_SUFFIXES
from vitviz.errors import (
    CheckpointNotFoundError,
    CorruptCheckpointError,
    NoWeightsError,
    UnsafeCheckpointError,
)

# Nested state dicts, most preferred first (timm prefers EMA; DINO's teacher is the one people visualise; the
# rest are the names training scripts people write use).
NEST_KEYS = ("state_dict_ema", "model_ema", "state_dict", "model", "teacher", "student", "encoder", "module",
             "model_state_dict", "model_state", "net", "network", "state", "weights")
# Entries of a training checkpoint that are training state, not a description of the model.
TRAINING_STATE_KEYS = ("optimizer", "optimizer_state_dict", "optimizer_state", "optim", "opt", "scheduler",
                       "lr_scheduler", "scheduler_state_dict", "scaler", "amp", "loss_scaler", "rng_state",
                       "callbacks", "loops", "optimizer_states", "lr_schedulers")
# Text configs people keep next to their weights ({stem} is the weights file's name without its suffix).
SIDECAR_NAMES = ("{stem}.json", "{stem}.yaml", "{stem}.yml", "config.json", "config.yaml", "config.yml",
                 "args.json", "args.yaml", "args.yml", "hparams.yaml", "hparams.yml", "hparams.json",
                 "params.json", "params.yaml", "cfg.yaml", "cfg.json")


@dataclass
class RawCheckpoint:
    """Tensors and metadata read from one checkpoint, before any family conversion."""

    path: Path
    tensors: dict[str, torch.Tensor]
    meta: dict[str, Any] = field(default_factory=dict)     # args, arch, safetensors metadata
    config: dict[str, Any] | None = None                   # config.json (HF or timm)
    preprocessor: dict[str, Any] | None = None             # HF preprocessor_config.json
    labels: tuple[str, ...] = ()                           # from side-car files
    nest_key: str = ""                                     # which nested dict was used
    weights_file: Path | None = None
    sidecars: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # (file name, parsed text config)


def read_checkpoint(path: str | Path, nest_key: str | None = None) -> RawCheckpoint:
    """Read a checkpoint file or folder.

    Args:
        path: a weights file (.pth/.pt/.bin/.safetensors/.ckpt) or a folder with one (HF / timm hub layout).
        nest_key: which nested state dict to take from a training container (default: EMA, then
            `state_dict`, `model`, `teacher`, ...).
    """
    p = Path(path).expanduser()
    if not p.exists():
        raise CheckpointNotFoundError(f"{p}: no such file or folder; expected a ViT checkpoint file or folder")
    folder = p if p.is_dir() else (p.parent if p.name in WEIGHT_NAMES else None)
    weights = _weights_in_folder(p) if p.is_dir() else p
    raw = _read_weights_file(weights, nest_key)
    raw.path = p
    if folder is not None:
        raw.config = _read_json(folder / "config.json")
        raw.preprocessor = _read_json(folder / "preprocessor_config.json")
    labels_file = weights.parent / "class_indices.json"  # WZ educational ViT writes its labels here
    if labels_file.is_file():
        raw.labels = _labels_from_mapping(_read_json(labels_file) or {})
    raw.sidecars = read_sidecars(weights, skip=("config.json",) if raw.config is not None else ())
    return raw


def read_sidecars(weights: Path, skip: tuple[str, ...] = ()) -> list[tuple[str, dict[str, Any]]]:
    """Text configs next to `weights` (and Lightning's `hparams.yaml` above a `checkpoints/` folder), parsed as
    JSON or plain YAML mappings -- text only, nothing is executed. A file that cannot be parsed is skipped with
    a warning naming it."""
    folders = [weights.parent]
    if weights.parent.name == "checkpoints":  # lightning_logs/version_N/checkpoints/epoch=...ckpt
        folders.append(weights.parent.parent)
    found: list[tuple[str, dict[str, Any]]] = []
    seen: set[Path] = set()
    for folder in folders:
        for pattern in SIDECAR_NAMES:
            path = folder / pattern.format(stem=weights.stem)
            if path.name in skip or path in seen or path == weights or not path.is_file():
                continue
            seen.add(path)
            try:
                if path.stat().st_size > 1_000_000:
                    raise ValueError("larger than 1 MB")
                text = path.read_text(encoding="utf-8")
                data = json.loads(text) if path.suffix == ".json" else parse_plain_yaml(text)
            except (OSError, ValueError) as e:
                warnings.warn(f"{path}: skipped, not a readable config ({e})", stacklevel=3)
                continue
            if isinstance(data, dict) and data:
                found.append((path.name, data))
    return found


def parse_plain_yaml(text: str) -> dict[str, Any]:
    """A small YAML subset, enough for the flat and nested `key: value` configs training scripts write: nested
    mappings by indentation, scalars (int, float, bool, null, quoted or plain strings), flow lists `[a, b]` and
    block lists (`- a`). Tags such as `!!python/object` are ignored, never executed; anything else is a string.

    Raises:
        ValueError: for lines that are neither `key: value` nor list items.
    """
    root: dict[str, Any] = {}
    stack: list[tuple[int, Any]] = [(-1, root)]  # (indent, container)
    pending: tuple[int, dict[str, Any], str] | None = None  # a `key:` whose value is on the next lines
    for number, line in enumerate(text.splitlines(), 1):
        stripped = _strip_comment(line).rstrip()
        if not stripped.strip() or stripped.strip() in ("---", "..."):
            continue
        indent = len(stripped) - len(stripped.lstrip(" "))
        body = stripped.strip()
        if pending is not None:
            p_indent, p_parent, p_key = pending
            pending = None
            if indent > p_indent:
                child: Any = [] if body.startswith("- ") or body == "-" else {}
                p_parent[p_key] = child
                stack.append((p_indent, child))
        while len(stack) > 1 and indent <= stack[-1][0]:
            stack.pop()
        container = stack[-1][1]
        if body.startswith("- ") or body == "-":
            if isinstance(container, list):
                container.append(_yaml_scalar(body[1:].strip()))
            continue
        key, sep, value = body.partition(":")
        if not sep or isinstance(container, list):
            raise ValueError(f"line {number}: expected 'key: value', found {body[:60]!r}")
        key, value = key.strip().strip("'\""), value.strip()
        if value.startswith("!"):  # a tag (e.g. !!python/tuple): keep only the plain value after it, if any
            value = value.partition(" ")[2].strip()
        if value == "" or value in ("|", ">"):
            container[key] = None
            pending = (indent, container, key)
        else:
            container[key] = _yaml_scalar(value)
    return root


def _strip_comment(line: str) -> str:
    quote = ""
    for i, ch in enumerate(line):
        if ch in "'\"" and not quote:
            quote = ch
        elif ch == quote:
            quote = ""
        elif ch == "#" and not quote and (i == 0 or line[i - 1] in " \t"):
            return line[:i]
    return line


def _yaml_scalar(text: str) -> Any:
    if text.startswith("[") and text.endswith("]"):
        inner = text[1:-1].strip()
        return [_yaml_scalar(part.strip()) for part in inner.split(",")] if inner else []
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    low = text.lower()
    if low in ("true", "yes", "on"):
        return True
    if low in ("false", "no", "off"):
        return False
    if low in ("null", "~", "none"):
        return None
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text


def _weights_in_folder(folder: Path) -> Path:
    for name in WEIGHT_NAMES:
        if (folder / name).is_file():
            return folder / name
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        return index
    candidates = sorted(f for f in folder.iterdir() if f.suffix in WEIGHT_SUFFIXES and f.is_file())
    if len(candidates) == 1:
        return candidates[0]
    found = ", ".join(sorted(f.name for f in folder.iterdir())[:12]) or "nothing"
    if candidates:
        raise NoWeightsError(f"{folder}: several weights files ({', '.join(c.name for c in candidates)}); "
                             "open the one you want directly")
    raise NoWeightsError(f"{folder}: no weights file found (found: {found}); expected one of "
                         f"{', '.join(WEIGHT_NAMES)} or a single *.safetensors/*.pth/*.bin file")


def _read_json(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise CorruptCheckpointError(f"{path}: not valid JSON ({e})") from e


def _labels_from_mapping(mapping: dict[str, Any]) -> tuple[str, ...]:
    try:
        items = sorted(((int(k), str(v)) for k, v in mapping.items()), key=lambda kv: kv[0])
    except (TypeError, ValueError):
        return ()
    return tuple(v for _, v in items)


def _read_weights_file(path: Path, nest_key: str | None) -> RawCheckpoint:
    size = path.stat().st_size
    if size == 0:
        raise CorruptCheckpointError(f"{path}: the file is empty (0 bytes); expected a checkpoint")
    if path.name.endswith(".index.json"):
        return _read_sharded(path)
    with open(path, "rb") as f:
        head = f.read(16)
    if _looks_like_safetensors(head, size):
        return _read_safetensors(path)
    if head.startswith(b"PK\x03\x04"):
        _refuse_torchscript(path)
    elif not head[:1] == b"\x80":
        kind = "an image" if head[:4] in (b"\x89PNG", b"\xff\xd8\xff\xe0", b"\xff\xd8\xff\xe1") else "unrecognised data"
        raise CorruptCheckpointError(
            f"{path}: not a checkpoint (starts with bytes {head[:8].hex(' ')}, looks like {kind}); expected a "
            "PyTorch file (.pth/.pt/.bin, zip or pickle) or a .safetensors file")
    obj = _torch_load(path)
    return _unwrap(path, obj, nest_key)


def _looks_like_safetensors(head: bytes, size: int) -> bool:
    if len(head) < 9:
        return False
    (n,) = struct.unpack("<Q", head[:8])
    return 0 < n <= size - 8 and head[8:9] == b"{"


def _read_safetensors(path: Path) -> RawCheckpoint:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
        tensors = load_file(str(path), device="cpu")
    except (SafetensorError, ValueError, OSError) as e:
        raise CorruptCheckpointError(f"{path}: damaged safetensors file ({e}); expected a complete "
                                     "safetensors file") from e
    meta = dict(header.get("__metadata__") or {})
    return RawCheckpoint(path, _as_float(tensors), meta=meta, weights_file=path)


def _read_sharded(index: Path) -> RawCheckpoint:
    data = _read_json(index) or {}
    files = sorted(set((data.get("weight_map") or {}).values()))
    if not files:
        raise CorruptCheckpointError(f"{index}: no weight_map in the shard index")
    tensors: dict[str, torch.Tensor] = {}
    for name in files:
        tensors.update(_read_safetensors(index.parent / name).tensors)
    return RawCheckpoint(index, tensors, weights_file=index)


def _refuse_torchscript(path: Path) -> None:
    try:
        with zipfile.ZipFile(path) as z:
            names = z.namelist()
    except zipfile.BadZipFile as e:
        raise CorruptCheckpointError(f"{path}: a damaged or truncated zip archive ({e}); expected a complete "
                                     "PyTorch checkpoint") from e
    if any("/code/" in n or n.endswith("constants.pkl") for n in names):
        raise UnsafeCheckpointError(
            f"{path}: a TorchScript archive (it contains compiled code); vitviz does not run code from files. "
            "Expected a state dict: in Python, `torch.save(torch.jit.load(p).state_dict(), 'weights.pth')`")
    if any(n.endswith(".npy") for n in names) and not any(n.endswith("data.pkl") for n in names):
        raise CorruptCheckpointError(f"{path}: a NumPy .npz archive (JAX weights), which vitviz cannot read yet; "
                                     "expected a PyTorch or safetensors checkpoint")


def _torch_load(path: Path) -> Any:
    try:
        with torch.serialization.safe_globals([argparse.Namespace]):
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - classified below, always re-raised as a VitvizError
        globals_ = _pickle_globals(path)
        if "Weights only load failed" in str(e) or globals_:
            raise _unsafe_error(path, globals_) from None
        raise CorruptCheckpointError(f"{path}: could not be read as a PyTorch checkpoint "
                                     f"({type(e).__name__}: {str(e).splitlines()[0][:200]}); "
                                     "expected a complete .pth/.pt/.bin file") from e


def _pickle_globals(path: Path) -> list[str]:
    """Names of the classes/functions a pickle would import, read without unpickling; [] if unreadable."""
    try:
        data = path.read_bytes()
        if data.startswith(b"PK\x03\x04"):
            with zipfile.ZipFile(io.BytesIO(data)) as z:
                pkl = [n for n in z.namelist() if n.endswith("data.pkl")]
                data = z.read(pkl[0]) if pkl else b""
        found, strings = [], []
        for op, arg, _ in pickletools.genops(io.BytesIO(data)):
            if op.name in ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE"):
                strings.append(arg)
            elif op.name == "GLOBAL":
                found.append(str(arg).replace(" ", "."))
            elif op.name == "STACK_GLOBAL" and len(strings) >= 2:
                found.append(f"{strings[-2]}.{strings[-1]}")
    except Exception:  # noqa: BLE001 - a broken pickle simply yields no names
        return []
    safe = ("collections.OrderedDict", "torch._utils._rebuild", "torch.", "argparse.Namespace", "builtins.set")
    return [g for g in dict.fromkeys(found) if not g.startswith(safe) or "nn.modules" in g]


def _unsafe_error(path: Path, globals_: list[str]) -> UnsafeCheckpointError:
    modules = [g for g in globals_ if "nn.modules" in g or g.split(".")[-1][:1].isupper()]
    names = ", ".join(globals_[:6]) or "unknown objects"
    if modules:
        what = f"a whole pickled model object ({names})"
        fix = "save `model.state_dict()` instead"
    else:
        what = f"a pickle that would call {names} when loaded"
        fix = "only plain tensors and standard containers are accepted"
    return UnsafeCheckpointError(f"{path}: refused: {what}. vitviz loads checkpoints with weights_only=True "
                                 f"and never runs code from a file; {fix}.")


def _is_state_dict(obj: Any) -> bool:
    if not isinstance(obj, dict) or not obj:
        return False
    n = sum(isinstance(v, torch.Tensor) for v in obj.values())
    return n >= max(1, len(obj) // 2)


def _unwrap(path: Path, obj: Any, nest_key: str | None) -> RawCheckpoint:
    if not isinstance(obj, dict):
        raise CorruptCheckpointError(f"{path}: holds a {type(obj).__name__}, expected a dict of tensors "
                                     "(a state dict) or a training checkpoint containing one")
    meta = _metadata(obj)
    if nest_key is not None:
        if not _is_state_dict(obj.get(nest_key)):
            raise CorruptCheckpointError(f"{path}: no state dict under {nest_key!r}; keys: {sorted(obj)[:10]}")
        return RawCheckpoint(path, _as_float(obj[nest_key]), meta, nest_key=nest_key, weights_file=path)
    if _is_state_dict(obj) and not any(_is_state_dict(obj.get(k)) for k in NEST_KEYS):
        return RawCheckpoint(path, _as_float(obj), meta, weights_file=path)
    for key in NEST_KEYS:
        if _is_state_dict(obj.get(key)):
            return RawCheckpoint(path, _as_float(obj[key]), meta, nest_key=key, weights_file=path)
    kinds = Counter(type(v).__name__ for v in obj.values())
    raise CorruptCheckpointError(f"{path}: a dict without tensors (keys {sorted(map(str, obj))[:10]}, "
                                 f"values {dict(kinds)}); expected a state dict or one nested under "
                                 f"{', '.join(NEST_KEYS)}")


def _metadata(obj: dict[str, Any]) -> dict[str, Any]:
    """The entries of a training checkpoint that describe the model (`arch`, `args`/`hparams`/`config`,
    `image_size`, `classes`, `class_to_idx`, ...): everything except state dicts and training state, with
    `argparse.Namespace` turned into dicts and tensors left out."""
    meta: dict[str, Any] = {}
    for key, value in obj.items():
        name = str(key)
        if name in NEST_KEYS or name in TRAINING_STATE_KEYS or _is_state_dict(value):
            continue
        plain = _plain(value, 4)
        if plain is not None:
            meta[name] = plain
    return meta


def _plain(value: Any, depth: int) -> Any:
    """Plain data (dict, list, str, number, bool) from checkpoint metadata; None for tensors and the like."""
    if isinstance(value, argparse.Namespace):
        value = vars(value)
    if isinstance(value, (str, int, float, bool)):
        return value
    if depth <= 0:
        return None
    if isinstance(value, dict):
        out = {str(k): p for k, v in value.items() if (p := _plain(v, depth - 1)) is not None}
        return out if out or not value else None
    if isinstance(value, (list, tuple)) and len(value) <= 100_000:
        items = [_plain(v, depth - 1) for v in value]
        return items if all(i is not None for i in items) else None
    return None


def _as_float(sd: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Keep tensors only; upcast half/bfloat16 to float32."""
    out = {}
    for k, v in sd.items():
        if isinstance(v, torch.Tensor):
            out[str(k)] = v.float() if v.is_floating_point() and v.dtype != torch.float32 else v
    return out
