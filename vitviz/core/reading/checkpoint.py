"""Reading checkpoint files and folders safely, without executing anything they contain.

`read_checkpoint` returns the tensors of the chosen state dict (unwrapped from training containers, upcast to
float32) plus every piece of metadata found beside them: `args`/`arch`/`hparams`/`config`/`image_size`/`classes`
of training checkpoints, side-car `config.json`/`preprocessor_config.json`, text configs next to the file
(`config.yaml`, `args.json`, `hparams.yaml`, ... -- read as text, never executed), safetensors `__metadata__`,
the file name.
"""
from __future__ import annotations

import _compat_pickle
import argparse
import difflib
import json
import os
import pickletools
import re
import stat
import struct
import warnings
import zipfile
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from vitviz.core.files import check_path, read_json_file
from vitviz.core.formats import FOLDER_WEIGHT_NAMES, WEIGHT_NAMES, WEIGHT_SUFFIXES
from vitviz.core.reading.towers import ROUTE, Tower, identify, tower_prefix
from vitviz.core.reading.validate import (
    Invalid, as_labels, check_config, check_open_clip_config, check_preprocessor, check_stored_tensors,
    inside, show, training_args,
)
from vitviz.errors import (
    CheckpointNotFoundError,
    CorruptCheckpointError,
    MetadataError,
    NoWeightsError,
    UnsafeCheckpointError,
)

if TYPE_CHECKING:
    import torch

# Nested state dicts, most preferred first (timm prefers EMA; DINO's teacher is the one people visualise; the
# rest are the names training scripts people write use).
NEST_KEYS = ("state_dict_ema", "model_ema", "state_dict", "model", "teacher", "student", "encoder", "target_encoder",
             "module", "model_state_dict", "model_state", "net", "network", "state", "weights")   # I-JEPA: encoder,
# target_encoder (its EMA), predictor: the encoder is taken (as transformers' converter does), the other is said
# Entries of a training checkpoint that are training state, not a description of the model.
TRAINING_STATE_KEYS = ("optimizer", "optimizer_state_dict", "optimizer_state", "optim", "opt", "scheduler",
                       "lr_scheduler", "scheduler_state_dict", "scaler", "amp", "loss_scaler", "rng_state",
                       "callbacks", "loops", "optimizer_states", "lr_schedulers")
# Text configs people keep next to their weights ({stem} is the weights file's name without its suffix).
SIDECAR_NAMES = ("{stem}.json", "{stem}.yaml", "{stem}.yml", "config.json", "config.yaml", "config.yml",
                 "args.json", "args.yaml", "args.yml", "hparams.yaml", "hparams.yml", "hparams.json",
                 "params.json", "params.yaml", "cfg.yaml", "cfg.json", "open_clip_config.json")
MAX_JSON_BYTES = 16 << 20       # config files, shard indexes (a 1000-shard index is ~100 KB)
MAX_HEADER_BYTES = 100 << 20    # a safetensors header (the safetensors library's own limit)
# A zip checkpoint's entries may inflate to at most this multiple of the file (+ ZIP_SLACK): PyTorch stores its
# entries uncompressed, so a real one inflates to about its own size; a zip bomb to thousands of times it.
ZIP_RATIO, ZIP_SLACK = 2, 16 << 20
LISTED = 8                      # names listed in a message before "... and N more"


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
    nest_others: tuple[str, ...] = ()                      # other, different state dicts beside it (none named)
    weights_file: Path | None = None
    sidecars: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # (file name, parsed text config)
    tower: Tower | None = None     # a composite model's vision tower: `tensors` and `config` are the tower's only


def read_checkpoint(path: str | Path, nest_key: str | None = None) -> RawCheckpoint:
    """Read a checkpoint file or folder.

    Args:
        path: a weights file (.pth/.pt/.bin/.safetensors/.ckpt) or a folder with one (HF / timm hub layout).
        nest_key: which nested state dict to take from a training container (default: EMA, then
            `state_dict`, `model`, `teacher`, ...).
    """
    p = Path(path).expanduser()
    st = check_path(p, "a ViT checkpoint file or folder", missing=CheckpointNotFoundError,
                    bad=CorruptCheckpointError, folder_ok=True)
    is_dir = stat.S_ISDIR(st.st_mode)
    folder = p if is_dir else (p.parent if p.name in FOLDER_WEIGHT_NAMES else None)   # its config.json beside it
    weights = _weights_in_folder(p) if is_dir else p
    # a transformers folder names its model before any tensor is read: a composite model's vision tower is read
    # alone (its tensors only), a model vitviz does not convert is refused by name (vitviz.core.reading.towers)
    config = _read_json(folder / "config.json") if folder is not None else None
    tower = identify(config, str(folder / "config.json")) if folder is not None and not nest_key else None
    raw = _read_weights_file(weights, nest_key, tower)
    raw.path = p
    raw.meta = training_args(raw.meta, weights)
    if folder is not None:
        if tower is not None:
            raw.tensors, raw.tower = _tower_tensors(raw, tower)
            config = tower.config
        raw.config = None if config is None else _checked_config(config, folder / "config.json")
        preprocessor = _read_json(folder / "preprocessor_config.json")
        raw.preprocessor = None if preprocessor is None else \
            check_preprocessor(preprocessor, folder / "preprocessor_config.json")
    labels_file = weights.parent / "class_indices.json"  # WZ educational ViT writes its labels here
    mapping = _read_json(labels_file)
    if mapping is not None:
        try:
            raw.labels = as_labels(mapping)
        except Invalid as e:
            raise MetadataError(f"{labels_file}: holds {show(mapping)}; {e}") from None
    raw.sidecars = read_sidecars(weights, skip=("config.json",) if raw.config is not None else ())
    return raw


def _checked_config(config: Any, where: Path) -> Any:
    """`check_config`, whose refusal of a field says which model the config names (and its route) when it does
    not already: a model type vitviz does not read may use a value that no ViT it reads does (SLANet's hardswish)."""
    try:
        return check_config(config, where)
    except MetadataError as e:
        named = config.get("model_type") or config.get("architecture") if isinstance(config, dict) else None
        if not isinstance(named, str) or not named or repr(named) in str(e):   # (a folder of its name: not named)
            raise
        raise MetadataError(f"{e}. The config names the model {named!r}; to see its attention, {ROUTE}") from e


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
            if path.name in skip or path in seen or path == weights or not os.path.lexists(path):
                continue
            seen.add(path)
            try:
                if not path.is_file():  # a FIFO or device would block: never opened
                    raise ValueError("not a regular file")
                if path.stat().st_size > 1_000_000:
                    raise ValueError("larger than 1 MB")
                text = path.read_text(encoding="utf-8")
                data = json.loads(text) if path.suffix == ".json" else parse_plain_yaml(text)
            except RecursionError:
                warnings.warn(f"{path}: skipped, nested too deeply to be a config", stacklevel=3)
                continue
            except (OSError, ValueError) as e:
                warnings.warn(f"{path}: skipped, not a readable config ({e})", stacklevel=3)
                continue
            if isinstance(data, dict) and data:
                found.append((path.name, _checked_sidecar(path, data)))
    return found


def _checked_sidecar(path: Path, data: dict[str, Any]) -> dict[str, Any]:
    """A side-car config with its open_clip model config (`open_clip_config.json`'s `model_cfg`, or any config
    stating a `vision_cfg`) checked field by field (`validate.check_open_clip_config`): the readers and the text
    tower build from it."""
    nested = "model_cfg" in data
    cfg = data["model_cfg"] if nested else data
    if path.name != "open_clip_config.json" and not (isinstance(cfg, dict) and "vision_cfg" in cfg):
        return data
    if not nested and "vision_cfg" not in data:
        return data   # an open_clip_config.json without a model config (its preprocess_cfg only)
    checked = check_open_clip_config(cfg, path, "model_cfg." if nested else "")
    return {**data, "model_cfg": checked} if nested else checked


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
    for name in FOLDER_WEIGHT_NAMES:
        if os.path.lexists(folder / name):  # a FIFO or device under a weights name is refused, not skipped
            check_path(folder / name, "a weights file", missing=NoWeightsError, bad=CorruptCheckpointError)
            return folder / name
    try:
        entries = sorted(folder.iterdir())
    except OSError as e:
        raise NoWeightsError(f"{folder}: cannot list the folder ({e.strerror or e})") from None
    candidates = [f for f in entries if f.suffix in WEIGHT_SUFFIXES and f.is_file()]
    if len(candidates) == 1:
        return candidates[0]
    held = [f for f in entries if f.is_dir() and not f.name.startswith(".") and _holds_weights(f)]
    run = ("; a training run's checkpoints open as a timeline (`vitviz export --timeline` on this folder, or Models "
           "› Open training run…)") if len(candidates) + len(held) > 1 else ""
    if candidates:
        raise NoWeightsError(f"{folder}: {len(candidates)} weights files ({_listed(c.name for c in candidates)}); "
                             "open the one you want directly" + run)
    if held:
        raise NoWeightsError(f"{folder}: no weights file of its own; {len(held)} folder(s) holding one "
                             f"({_listed(f.name for f in held)}): open one of them directly" + run)
    raise NoWeightsError(f"{folder}: no weights file found (found: {_listed(f.name for f in entries) or 'nothing'});"
                         f" expected one of {', '.join(WEIGHT_NAMES)} or a single *.safetensors/*.pth/*.bin file")


def _holds_weights(folder: Path) -> bool:
    """Whether a sub-folder holds a model folder's weights file (a run's `checkpoint-500/`): one listing, no read."""
    try:
        return any(f.name in FOLDER_WEIGHT_NAMES or f.suffix in WEIGHT_SUFFIXES for f in folder.iterdir())
    except OSError:
        return False


def _listed(names: Any) -> str:
    """The first `LISTED` names, and how many more: 'a.pth, b.pth, ... and 2992 more'."""
    names = list(names)
    more = f" and {len(names) - LISTED} more" if len(names) > LISTED else ""
    return ", ".join(names[:LISTED]) + more


def _read_json(path: Path) -> Any:
    """A JSON file's content (of any JSON type: callers check it), None when there is no such file.

    Raises:
        CorruptCheckpointError: not a regular file, larger than MAX_JSON_BYTES, not JSON, or nested too deeply.
    """
    if not os.path.lexists(path):
        return None
    return read_json_file(path, "a JSON config file", CorruptCheckpointError, MAX_JSON_BYTES)


def _tower_tensors(raw: RawCheckpoint, tower: Tower) -> tuple[dict[str, torch.Tensor], Tower]:
    """The tower's tensors of a composite model's weights, its prefix removed, and the tower with that prefix."""
    prefix = tower_prefix(tower, list(raw.tensors), str(raw.weights_file))
    return ({k[len(prefix):]: v for k, v in raw.tensors.items() if tower.under(prefix, k)},
            replace(tower, prefix=prefix))


def _read_weights_file(path: Path, nest_key: str | None, tower: Tower | None = None) -> RawCheckpoint:
    """The tensors of one weights file (or shard index); with `tower`, of a safetensors file only the tower's are
    read (lazily: the language model's tensors are never loaded)."""
    size = check_path(path, "a checkpoint file", missing=CheckpointNotFoundError, bad=CorruptCheckpointError).st_size
    if size == 0:
        raise CorruptCheckpointError(f"{path}: the file is empty (0 bytes); expected a checkpoint")
    keep = tower.wants if tower is not None else None
    if path.name.endswith(".index.json"):
        return _select(_read_sharded(path, keep), nest_key)
    with open(path, "rb") as f:
        head = f.read(16)
    if _looks_like_safetensors(head, size):
        return _select(_read_safetensors(path, keep), nest_key)
    if head.startswith(b"PK\x03\x04"):
        if _check_zip(path, size) == "npz":  # JAX / Flax weights: NumPy arrays, read without pickle
            from vitviz.core.reading.npz import read_npz

            return RawCheckpoint(path, read_npz(path), weights_file=path)
    elif not head[:1] == b"\x80":
        kind = "an image" if head[:4] in (b"\x89PNG", b"\xff\xd8\xff\xe0", b"\xff\xd8\xff\xe1") else "unrecognised data"
        raise CorruptCheckpointError(
            f"{path}: not a checkpoint (starts with bytes {head[:8].hex(' ')}, looks like {kind}); expected a "
            "PyTorch file (.pth/.pt/.bin, zip or pickle) or a .safetensors file")
    # a composite model's .bin: memory-mapped, and only its tower's tensors kept (the others never read)
    obj = _torch_load(path, mmap=keep is not None and head.startswith(b"PK\x03\x04"))
    if keep is not None and isinstance(obj, dict) and any(isinstance(k, str) and keep(k) for k in obj):
        obj = {k: v for k, v in obj.items() if isinstance(k, str) and keep(k)}
    return _unwrap(path, obj, nest_key)


def _looks_like_safetensors(head: bytes, size: int) -> bool:
    if len(head) < 9:
        return False
    (n,) = struct.unpack("<Q", head[:8])
    return 0 < n <= size - 8 and head[8:9] == b"{"


def _read_safetensors(path: Path, keep: Callable[[str], bool] | None = None) -> RawCheckpoint:
    """A safetensors file's tensors (with `keep`, only the names it keeps: read one by one, the others never
    loaded) and its string metadata."""
    from safetensors import SafetensorError, safe_open
    from safetensors.torch import load_file

    try:
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n > MAX_HEADER_BYTES:
                raise ValueError(f"a {n}-byte header, over the format's {MAX_HEADER_BYTES >> 20} MiB limit")
            header = json.loads(f.read(n))
        if not isinstance(header, dict):
            raise ValueError(f"the header is {show(header)}, not a JSON object")
        if keep is None:
            tensors = load_file(str(path), device="cpu")
        else:
            with safe_open(str(path), framework="pt", device="cpu") as f:
                tensors = {k: f.get_tensor(k) for k in f.keys() if keep(k)}
    except RecursionError:
        raise CorruptCheckpointError(f"{path}: damaged safetensors file (its header is nested too deeply); "
                                     "expected a complete safetensors file") from None
    except (SafetensorError, ValueError, OSError, struct.error) as e:
        raise CorruptCheckpointError(f"{path}: damaged safetensors file ({e}); expected a complete "
                                     "safetensors file") from e
    meta = header.get("__metadata__") or {}
    meta = {str(k): v for k, v in meta.items() if isinstance(v, str)} if isinstance(meta, dict) else {}
    return RawCheckpoint(path, _as_float(tensors, path), meta=meta, weights_file=path)


def _select(raw: RawCheckpoint, nest_key: str | None) -> RawCheckpoint:
    """`nest_key` for a flat file (safetensors, shards): the tensors under `<nest_key>.`, with that prefix
    removed -- the same model `nest_key` picks from a training checkpoint saved as one dict."""
    if not nest_key:
        return raw
    prefix = nest_key.rstrip(".") + "."
    picked = {k[len(prefix):]: v for k, v in raw.tensors.items() if k.startswith(prefix)}
    if not picked:
        stems = sorted({k.split(".")[0] for k in raw.tensors})
        raise CorruptCheckpointError(f"{raw.weights_file}: nest_key={nest_key!r}, but no tensor name starts with "
                                     f"{prefix!r} (this file holds one flat state dict; top-level names: "
                                     f"{_listed(stems)}); expected nest_key to name one of those prefixes")
    raw.tensors, raw.nest_key = picked, nest_key
    return raw


def _read_sharded(index: Path, keep: Callable[[str], bool] | None = None) -> RawCheckpoint:
    """A `model.safetensors.index.json` and its shards, each of which must lie inside the index's folder; with
    `keep`, only the shards holding a tensor it keeps are opened, and of them only those tensors read."""
    data = _read_json(index)
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        found = show(data) if not isinstance(data, dict) else f"weight_map {show(weight_map)}"
        raise MetadataError(f"{index}: shard index holds {found}; expected a JSON object with a non-empty "
                            "\"weight_map\": {tensor name: shard file name}")
    bad = [v for v in weight_map.values() if not isinstance(v, str)]
    if bad:
        raise MetadataError(f"{index}: weight_map value {show(bad[0])}; expected shard file names")
    tensors: dict[str, torch.Tensor] = {}
    kept = [v for k, v in weight_map.items() if keep is None or keep(str(k))] or list(weight_map.values())
    for name in sorted(set(kept)):
        shard = inside(index.parent, name)
        if shard is None:
            raise MetadataError(f"{index}: shard {name!r} lies outside the model folder {index.parent}; expected "
                                "shard file names inside that folder (refused, nothing outside it is read)")
        tensors.update(_read_safetensors(shard, keep).tensors)
    return RawCheckpoint(index, tensors, weights_file=index)


def _check_zip(path: Path, size: int) -> str:
    """Read the zip directory before anything is inflated: a damaged archive, a zip bomb (entries declaring far
    more bytes than the file could hold as PyTorch writes it) or a TorchScript archive are refused; returns 'npz'
    for a NumPy archive (read by vitviz.core.reading.npz), 'torch' otherwise."""
    try:
        with zipfile.ZipFile(path) as z:
            infos = z.infolist()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, OSError, EOFError, struct.error) as e:
        why = "an entry name that is not valid UTF-8" if isinstance(e, UnicodeDecodeError) else str(e) or \
            type(e).__name__
        raise CorruptCheckpointError(f"{path}: a damaged or truncated zip archive ({why}); expected a complete "
                                     "PyTorch checkpoint") from None
    declared = sum(i.file_size for i in infos)
    limit = ZIP_RATIO * size + ZIP_SLACK
    big = max(infos, key=lambda i: i.file_size, default=None)
    if declared > limit or any(i.compress_size > size for i in infos):
        raise CorruptCheckpointError(
            f"{path}: a zip archive whose entries declare {declared / 2**20:.0f} MiB from a {size / 2**20:.1f} MiB "
            f"file (largest: {big.filename if big else '?'!r}); refused before inflating anything (a zip bomb?). "
            "PyTorch stores checkpoint entries uncompressed; expected a file written by torch.save")
    return _refuse_torchscript(path, [i.filename for i in infos])


def _refuse_torchscript(path: Path, names: list[str]) -> str:
    """'npz' for a NumPy archive, 'torch' for a PyTorch zip; a TorchScript archive is refused."""
    if any("/code/" in n or n.endswith("constants.pkl") for n in names):
        raise UnsafeCheckpointError(
            f"{path}: a TorchScript archive (it contains compiled code); vitviz does not run code from files. "
            "Expected a state dict: in Python, `torch.save(torch.jit.load(p).state_dict(), 'weights.pth')`")
    if any(n.endswith(".npy") for n in names) and not any(n.endswith("data.pkl") for n in names):
        return "npz"
    return "torch"


def _torch_load(path: Path, mmap: bool = False) -> Any:
    """`torch.load(weights_only=True)`; with `mmap` (a zip checkpoint only), its tensors stay on disk until used."""
    import torch

    try:
        with torch.serialization.safe_globals([argparse.Namespace]):
            return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as e:  # noqa: BLE001 - classified below, always re-raised as a VitvizError
        text = str(e)
        globals_, complete = _pickle_globals(path)
        named = [_modern_name(*g.rsplit(".", 1)) for g in re.findall(r"Unsupported global: GLOBAL ([\w.]+)", text)]
        if not complete:  # a damaged stream: its last name may be cut short, torch's may be read from garbage
            globals_, named = globals_[:-1], []
        allowed = _allowed_globals()
        refused = [g for g in dict.fromkeys(globals_ + named) if g not in allowed]
        damaged = {g: close[0] for g in refused if (close := difflib.get_close_matches(g, allowed, 1, 0.9))}
        damaged.update({g: "a module.name" for g in refused if not re.fullmatch(r"[\w.]+\.\w+", g)})
        if [g for g in refused if g not in damaged]:
            raise _unsafe_error(path, [g for g in refused if g not in damaged]) from None
        first = next((line for line in text.splitlines() if line.strip()), "")[:200]
        detail = f"{type(e).__name__}: {first}" if first else type(e).__name__
        if isinstance(e, EOFError) or "truncated" in text or "unexpected EOF" in text:
            detail = f"the file ends too early: truncated ({detail})"
        elif damaged:
            g, close = next(iter(damaged.items()))
            detail = f"its pickle names {g}, a damaged form of {close}"
        elif "Weights only load failed" in text:
            detail = re.sub(r"^.*?WeightsUnpickler error: ", "", " ".join(text.split()))[:200]
        raise CorruptCheckpointError(f"{path}: could not be read as a PyTorch checkpoint ({detail}); "
                                     "expected a complete .pth/.pt/.bin file") from None


def _allowed_globals() -> set[str]:
    """What `torch.load(weights_only=True)` accepts here ('module.name'), plus argparse.Namespace (training
    args, accepted by vitviz's `safe_globals`)."""
    try:
        from torch import _weights_only_unpickler as unpickler

        allowed = set(unpickler._get_allowed_globals())
    except (ImportError, AttributeError):  # a torch without that private helper: the common names
        allowed = {"collections.OrderedDict", "builtins.set", "torch.Size", "torch._utils._rebuild_tensor_v2",
                   "torch._utils._rebuild_parameter", "torch.FloatStorage", "torch.HalfStorage",
                   "torch.BFloat16Storage", "torch.LongStorage", "torch.float32", "torch.float16", "torch.bfloat16"}
    return allowed | {"argparse.Namespace"}


# Modules whose functions run code or touch the system: a pickle naming them is an attack, not a model object.
_CALLING_MODULES = ("os", "posix", "nt", "subprocess", "builtins", "sys", "shutil", "socket", "importlib", "runpy",
                    "pty", "pickle", "marshal", "ctypes", "code", "codeop", "webbrowser", "platform", "commands",
                    "multiprocessing", "pdb", "timeit", "functools", "operator", "io", "_io", "tempfile", "glob",
                    "signal", "threading", "asyncio", "urllib", "http", "requests", "_codecs", "codecs")


def _pickle_globals(path: Path) -> tuple[list[str], bool]:
    """Names of the classes/functions a checkpoint's pickles would import, read without unpickling, and whether
    every pickle was read to its end. A zip checkpoint's `data.pkl` is read as one stream (its size was checked
    with the zip directory); a legacy stream holds several pickles in a row (magic number, protocol, system
    info, the object, storage keys) and each is scanned. Python 2 names (`commands.Popen`, protocol <= 2) are
    mapped to today's (`subprocess.Popen`), as the unpickler would."""
    found: list[str] = []
    try:
        with open(path, "rb") as f:
            if f.read(4) == b"PK\x03\x04":
                with zipfile.ZipFile(path) as z:
                    pkl = [n for n in z.namelist() if n.endswith("data.pkl")]
                    if not pkl:
                        return [], False
                    with z.open(pkl[0]) as stream:
                        complete = _scan_pickles(stream, found, 1)
            else:
                f.seek(0)
                complete = _scan_pickles(f, found, 5)
    except Exception:  # noqa: BLE001 - a damaged file: what was read so far
        complete = False
    return list(dict.fromkeys(found)), complete


def _scan_pickles(stream: Any, found: list[str], count: int) -> bool:
    """Append the globals of up to `count` consecutive pickles in `stream` to `found`; True when each one read
    ended with STOP (a stream that ends cleanly after one of them counts as complete)."""
    for n in range(count):
        if n:
            at = stream.tell()
            if not stream.read(1):
                return True
            stream.seek(at)
        strings: list[str] = []
        try:
            for op, arg, _ in pickletools.genops(stream):
                if op.name in ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE", "BINUNICODE8"):
                    strings.append(str(arg))
                elif op.name == "GLOBAL":
                    found.append(_modern_name(*str(arg).split(" ", 1)))
                elif op.name == "STACK_GLOBAL" and len(strings) >= 2:
                    found.append(_modern_name(strings[-2], strings[-1]))
        except Exception:  # noqa: BLE001 - truncated or not a pickle
            return False
    return True


def _modern_name(module: str, name: str = "") -> str:
    """`module.name` as Python 3 imports it (pickle protocol <= 2 maps Python 2 names, as `fix_imports` does)."""
    if (module, name) in _compat_pickle.NAME_MAPPING:
        module, name = _compat_pickle.NAME_MAPPING[(module, name)]
    elif module in _compat_pickle.IMPORT_MAPPING:
        module = _compat_pickle.IMPORT_MAPPING[module]
    return f"{module}.{name}" if name else module


def _unsafe_error(path: Path, refused: list[str]) -> UnsafeCheckpointError:
    """The refusal of a pickle naming `refused` globals: code it would call, NumPy objects, or a whole model."""
    calls = [g for g in refused if g.split(".")[0] in _CALLING_MODULES or (g.startswith("torch.") and
                                                                            "nn.modules" not in g)
             or not g.split(".")[-1][:1].isupper() and not g.startswith("numpy.")]
    numpy = [g for g in refused if g.startswith("numpy.")]
    if calls:
        what = f"a pickle that would call {', '.join(calls[:6])} when loaded (code execution)"
        fix = "only plain tensors and standard containers are accepted"
    elif numpy and len(numpy) == len(refused):
        what = f"NumPy objects in the pickle ({', '.join(numpy[:6])}), which weights_only=True does not accept"
        fix = "save plain Python numbers and tensors instead (e.g. float(x) for a NumPy scalar)"
    else:
        what = f"a whole pickled model object ({', '.join(refused[:6])})"
        fix = "save `model.state_dict()` instead"
    return UnsafeCheckpointError(f"{path}: refused: {what}. vitviz loads checkpoints with weights_only=True "
                                 f"and never runs code from a file; {fix}.")


def _is_state_dict(obj: Any) -> bool:
    import torch

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
            raise CorruptCheckpointError(f"{path}: no state dict under {nest_key!r}; keys: "
                                         f"{_listed(sorted(map(str, obj)))}")
        return RawCheckpoint(path, _as_float(obj[nest_key], path), meta, nest_key=nest_key, weights_file=path)
    if _is_state_dict(obj) and not any(_is_state_dict(obj.get(k)) for k in NEST_KEYS):
        return RawCheckpoint(path, _as_float(obj, path), meta, weights_file=path)
    for key in NEST_KEYS:
        if _is_state_dict(obj.get(key)):
            others = tuple(k for k in NEST_KEYS if k != key and _is_state_dict(obj.get(k))
                           and not _same_weights(obj[key], obj[k]))
            return RawCheckpoint(path, _as_float(obj[key], path), meta, nest_key=key, weights_file=path,
                                 nest_others=others)
    kinds = Counter(type(v).__name__ for v in obj.values())
    raise CorruptCheckpointError(f"{path}: a dict without tensors (keys {sorted(map(str, obj))[:10]}, "
                                 f"values {dict(kinds)}); expected a state dict or one nested under "
                                 f"{', '.join(NEST_KEYS)}")


def _same_weights(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two nested state dicts hold the same tensors (an EMA copy saved before it moved): then which one is
    taken makes no difference."""
    import torch

    return a.keys() == b.keys() and all(
        isinstance(a[k], torch.Tensor) and isinstance(b[k], torch.Tensor) and a[k].shape == b[k].shape
        and torch.equal(a[k], b[k]) for k in a)


def _metadata(obj: dict[str, Any]) -> dict[str, Any]:
    """The entries of a training checkpoint that describe the model (`arch`, `args`/`hparams`/`config`,
    `image_size`, `classes`, `class_to_idx`, ...): everything except state dicts and training state, with
    `argparse.Namespace` turned into dicts and tensors left out."""
    meta: dict[str, Any] = {}
    budget = [METADATA_ITEMS]
    for key, value in obj.items():
        name = str(key)
        if name in NEST_KEYS or name in TRAINING_STATE_KEYS or _is_state_dict(value):
            continue
        plain = _plain(value, 4, budget)
        if plain is not None:
            meta[name] = plain
    return meta


METADATA_ITEMS = 200_000  # values copied out of a checkpoint's metadata in all (shared references count each time)


def _plain(value: Any, depth: int, budget: list[int]) -> Any:
    """Plain data (dict, list, str, number, bool) from checkpoint metadata; None for tensors and the like, and
    for whatever lies past the `budget` of values (a pickle can share one list a million times)."""
    budget[0] -= 1
    if budget[0] < 0:
        return None
    if isinstance(value, argparse.Namespace):
        value = vars(value)
    if isinstance(value, (str, int, float, bool)):
        return value
    if depth <= 0:
        return None
    if isinstance(value, dict):
        out = {str(k): p for k, v in value.items() if (p := _plain(v, depth - 1, budget)) is not None}
        return out if out or not value else None
    if isinstance(value, (list, tuple)) and len(value) <= 100_000:
        items = [_plain(v, depth - 1, budget) for v in value]
        return items if all(i is not None for i in items) else None
    return None


def _as_float(sd: dict[str, Any], path: Path) -> dict[str, torch.Tensor]:
    """Keep tensors only, after refusing what a file may not smuggle in (broadcast views that would materialise
    as gigabytes, meta, sparse and quantized tensors); upcast half/bfloat16 to float32."""
    import torch

    check_stored_tensors(sd, path)
    out = {}
    for k, v in sd.items():
        if isinstance(v, torch.Tensor):
            out[str(k)] = v.float() if v.is_floating_point() and v.dtype != torch.float32 else v
    return out
