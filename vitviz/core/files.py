"""Files that are never half-written: atomic PNG, npz and JSON writes, and cleanup of a killed writer's leftovers.

Files are written to a temporary file in the destination folder and moved into place with `os.replace` (or
`os.link` when overwriting is not allowed), so a crash never leaves a half-written file under the final name.
A temporary file's name carries the writer's process id; one left behind by a killed writer (SIGKILL, power
loss) is removed by `remove_stale_temps` on the next run.
"""
from __future__ import annotations

import errno
import json
import os
import re
import stat
import socket
import tempfile
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any, BinaryIO, Callable

import numpy as np
from PIL import Image

from vitviz.core.spec import AttentionResult
from vitviz.errors import VitvizError


# ------------------------------------------------------------------------------------------------------ paths


def file_kind(mode: int) -> str:
    """What a non-regular path is, in words ('a named pipe (FIFO)', 'a character device', ...)."""
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a special file"


def check_path(path: str | os.PathLike[str], expected: str, *, missing: type[VitvizError],
               bad: type[VitvizError], folder_ok: bool = False) -> os.stat_result:
    """`os.stat` of `path`, refusing before anything opens it: a missing path or a broken link or a symbolic
    link loop (`missing`), and anything that is not a regular file -- a FIFO, a device, a socket, or a folder
    unless `folder_ok` (`bad`).

    Args:
        expected: what the path should be, for the message ('an image file', 'a ViT checkpoint ...').
    """
    if "\x00" in os.fsdecode(path):     # os.stat would raise ValueError: no file has such a name
        raise missing(f"{str(path)!r}: holds a NUL character, which no file name can; expected {expected}")
    try:
        st = os.stat(path)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise missing(f"{path}: a symbolic link loop (its links lead back to each other); expected "
                          f"{expected}") from None
        if e.errno in (errno.ENOENT, errno.ENOTDIR):
            found = "a broken symbolic link (its target does not exist)" if os.path.islink(path) else \
                "not found (no such file or folder)"
            raise missing(f"{path}: {found}; expected {expected}") from None
        if e.errno == errno.ENAMETOOLONG:
            raise missing(f"{str(path)[:120]}...: the name is too long for this system; expected {expected}") \
                from None
        raise bad(f"{path}: cannot be read ({e.strerror or e}); expected {expected}") from None
    if stat.S_ISREG(st.st_mode) or (folder_ok and stat.S_ISDIR(st.st_mode)):
        return st
    raise bad(f"{path}: {file_kind(st.st_mode)}, not a regular file (refused before opening it, as reading it "
              f"could block or never end); expected {expected}")


def check_rgb(rgb: np.ndarray, what: str) -> np.ndarray:
    """`rgb` as an (H, W, 3) uint8 array, else a ValueError naming `what`."""
    arr = np.asarray(rgb)
    if arr.ndim != 3 or arr.shape[2] != 3 or arr.dtype != np.uint8:
        raise ValueError(f"{what} must be an (H, W, 3) uint8 array, found shape {arr.shape} dtype {arr.dtype}")
    return arr


class OutputExistsError(VitvizError, FileExistsError):
    """The output file exists and overwriting was not asked for."""


_TEMP_NAME = re.compile(r"^\.(?P<name>.+)\.(?P<pid>\d+)@(?P<host>[A-Za-z0-9_.-]*)-[a-z0-9_]{8}\.tmp$")


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", socket.gethostname())[:64]


def temp_prefix(target: Path) -> str:
    """Prefix of the temporary file `target` is written through: '.{name}.{pid}@{host}-' (mkstemp adds
    'xxxxxxxx.tmp'). The host tells writers on other machines (a shared folder) apart: their files are never
    taken for a dead local writer's."""
    return f".{target.name}.{os.getpid()}@{_host()}-"


def _process_alive(pid: int) -> bool:
    if pid == os.getpid() or os.name == "nt":  # on Windows os.kill(pid, 0) would terminate the process
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists but belongs to someone else
        return True
    return True


def remove_stale_temps(targets: Iterable[Path]) -> list[Path]:
    """Delete the temporary files that writers no longer running left for any of `targets`; return them.

    Only files named like this module's temporaries *for one of the given targets*, written on this host, are
    considered, and only when the process id in the name is gone, so a concurrent writer's file is left alone
    (a writer in another PID namespace with the same host name is the exception). On Windows nothing is removed.
    """
    wanted: dict[Path, set[str]] = defaultdict(set)
    for target in targets:
        wanted[Path(target).parent].add(Path(target).name)
    removed: list[Path] = []
    for folder, names in wanted.items():
        try:
            entries = [e for e in os.scandir(folder) if e.name.endswith(".tmp")]
        except OSError:  # no such folder yet: nothing was left there
            continue
        for entry in entries:
            m = _TEMP_NAME.match(entry.name)
            if m and m["name"] in names and m["host"] == _host() and not _process_alive(int(m["pid"])):
                try:
                    os.unlink(entry.path)
                except OSError:
                    continue
                removed.append(Path(entry.path))
    return removed


def _atomic_write(path: str | os.PathLike[str], write: Callable[[BinaryIO], None], overwrite: bool) -> Path:
    """Write through `write` into a temporary file next to `path`, then move it into place."""
    target = Path(path)
    if not overwrite and target.exists():
        raise OutputExistsError(f"{target} exists; pass overwrite=True to replace it")
    fd, tmp_name = tempfile.mkstemp(prefix=temp_prefix(target), suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp_name, 0o644)  # mkstemp makes it private; an exported file should be readable like any other
        if overwrite:
            os.replace(tmp_name, target)
        else:
            _link_exclusive(tmp_name, target)
    finally:
        if os.path.exists(tmp_name):
            os.unlink(tmp_name)
    return target


def _link_exclusive(tmp_name: str, target: Path) -> None:
    """Move into place only if the target still does not exist (hard link when the filesystem allows)."""
    try:
        os.link(tmp_name, target)
    except FileExistsError as exc:
        raise OutputExistsError(f"{target} appeared while writing; pass overwrite=True to replace it") from exc
    except OSError:  # no hard links here (some network or FAT filesystems): checked above, replace
        os.replace(tmp_name, target)


def write_png_atomic(path: str | os.PathLike[str], rgb: np.ndarray, overwrite: bool = False) -> Path:
    """Write an (H, W, 3) uint8 image as PNG, atomically.

    Raises:
        OutputExistsError: `path` exists and `overwrite` is False.
    """
    image = Image.fromarray(check_rgb(rgb, "rgb"))
    return _atomic_write(path, lambda handle: image.save(handle, format="PNG"), overwrite)


def write_npz_atomic(path: str | os.PathLike[str], result: AttentionResult, overwrite: bool = False,
                     extra: dict[str, np.ndarray] | None = None) -> Path:
    """Write a result's arrays and spec to an uncompressed .npz, atomically.

    Keys: 'attentions' (L, H, T, T), 'logits' (C,), 'input' (C, H, W), 'image' (H, W, 3), 'spec' (the spec as
    JSON text), 'source', 'features' and 'interventions' (what was done to the model, a string array) when the
    result has them, then the arrays of `extra` under their own keys (relevance maps, PCA colours, token norms; a
    key of the result's is refused). Nothing is pickled.

    Raises:
        OutputExistsError: `path` exists and `overwrite` is False.
    """
    arrays: dict[str, np.ndarray] = {
        "attentions": np.asarray(result.attentions),
        "logits": np.asarray(result.logits),
        "input": np.asarray(result.input),
        "image": np.asarray(result.image),
        "spec": np.array(result.spec.to_json()),
        "source": np.array(result.source),
    }
    if result.features is not None:
        arrays["features"] = np.asarray(result.features)
    if result.interventions:   # what was done to the model during the run, one description each
        arrays["interventions"] = np.array(list(result.interventions))
    for key, value in (extra or {}).items():
        if key in arrays or key in ("spec", "source"):
            raise ValueError(f"extra array {key!r} would replace the result's own")
        arrays[key] = np.asarray(value)
    return write_arrays_atomic(path, arrays, overwrite)


def write_arrays_atomic(path: str | os.PathLike[str], arrays: dict[str, np.ndarray], overwrite: bool = False) -> Path:
    """Write named arrays to an uncompressed .npz, atomically (nothing pickled: text as 0-d string arrays).

    Raises:
        OutputExistsError: `path` exists and `overwrite` is False.
    """
    return _atomic_write(path, lambda handle: np.savez(handle, **arrays), overwrite)


def write_text_atomic(path: str | os.PathLike[str], text: str, overwrite: bool = False) -> Path:
    """Write `text` as UTF-8, atomically (a CSV table).

    Raises:
        OutputExistsError: `path` exists and `overwrite` is False.
    """
    return _atomic_write(path, lambda handle: handle.write(text.encode("utf-8")), overwrite)


def write_json_atomic(path: str | os.PathLike[str], data: dict[str, Any]) -> Path:
    """Write `data` as indented JSON (sets and tuples as lists), atomically, replacing any old file."""
    text = json.dumps(data, indent=2, default=list) + "\n"
    return _atomic_write(path, lambda handle: handle.write(text.encode("utf-8")), overwrite=True)


def read_npz(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a file written by `write_npz_atomic`: arrays by key, 'spec' parsed to a dict, 'source' as str."""
    with np.load(path, allow_pickle=False) as data:
        out: dict[str, Any] = {key: data[key] for key in data.files}
    if "spec" in out:
        out["spec"] = json.loads(str(out["spec"]))
    if "source" in out:
        out["source"] = str(out["source"])
    if "interventions" in out:
        out["interventions"] = [str(t) for t in out["interventions"]]
    return out


CACHE_ENV = "VITVIZ_CACHE"


def cache_dir() -> Path:
    """vitviz's own cache folder (remembered verdicts, the library architectures' shape signatures):
    `$VITVIZ_CACHE`, else `$XDG_CACHE_HOME/vitviz` (default ~/.cache/vitviz)."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "vitviz"


def read_json_file(path: str | os.PathLike[str], expected: str, error: type[VitvizError],
                   limit: int = 64 << 20) -> Any:
    """The JSON in a regular file of at most `limit` bytes, read by name (a manifest, a store of vitviz's own).

    Raises:
        error: missing, not a regular file (`check_path`: a FIFO would block the read, /dev/zero never end), over
            `limit` bytes, unreadable, not UTF-8 JSON, or nested too deeply for Python's parser.
    """
    st = check_path(path, expected, missing=error, bad=error)
    if st.st_size > limit:
        raise error(f"{path}: {st.st_size} bytes; expected {expected} of at most {limit >> 20} MiB")
    try:
        with open(path, "rb") as f:
            return json.loads(f.read(limit + 1)[:limit].decode("utf-8"))
    except RecursionError:
        raise error(f"{path}: JSON nested too deeply to read; expected {expected}") from None
    except (OSError, ValueError) as e:   # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise error(f"{path}: not readable as JSON ({getattr(e, 'strerror', None) or e}); expected {expected}") \
            from None


def read_small_json(path: Path, limit: int = 8 << 20) -> Any:
    """The JSON in a small regular file of vitviz's own (a cache entry), or None: a missing file, something that
    is not a regular file (a FIFO would block the open, /dev/zero never end), one over `limit` bytes, one that is
    not JSON or is nested too deeply. Never blocks, never reads more than `limit` (`read_json_file`)."""
    try:
        return read_json_file(path, "a small JSON file", VitvizError, limit)
    except VitvizError:
        return None
