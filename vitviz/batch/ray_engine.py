"""The Ray engine of `vitviz export` (`--engine ray`): the same export over a Ray cluster, or a Ray started here.

The local engine's steps, spread over Ray Data's stages; nothing about maps, names or files is done differently:

- the driver (this process) lists the inputs (folders, glob patterns, text files of paths; local paths or
  pyarrow.fs URIs: `SourceStream`), names every output with the local engine's `Plan.jobs`, skips the images a
  previous manifest records as finished whose files are all there (`manifest + file check`), and turns what the
  actors report into the progress callback, the counts and the manifest's entries. It does so `CHUNK` images at
  a time, a Ray Data run each: a list of millions of lines is read as the export goes (work starts once its
  first chunk is listed), and what the driver holds per image is two hashes and a line of a spill file (the
  manifest's entries, written out at the end);
- decoding tasks (`Dataset.map`, one CPU each) run `pipeline.prepare` on each image: the hash, the skip check,
  decoding and preprocessing, exactly as the local engine's reader threads;
- a fixed pool of model actors (`Dataset.map_batches`): each loads the model once and hands every batch Ray
  gives it to `Exporter.export_batch` -- the local engine's batched forward pass, maps, pictures and atomic writes.

So the PNGs and .npz files are the local engine's, byte for byte, under the same names: same functions on the
same inputs (the actors render with the driver's `ModelSpec`, checked equal to the one they loaded). A forward
pass is batch-invariant on the CPU (tests/batch/test_ray_export.py compares with batches that differ); a GPU's kernels
may round differently with another batch size, as the local engine's would.

Outputs go to a local folder (on a cluster: one that every node sees, e.g. NFS) or to a pyarrow.fs URI
(`s3://bucket/maps`, `gs://...`, `hdfs://...`, `file:///...`): there the actor writes each file into a folder of
its own with the local engine's writer, then uploads it (object stores publish an object only when it is
complete; other filesystems get a temporary name, then a rename).

A worker that dies is restarted by Ray (Ray Data's fault tolerance: a dead actor is made again and its batch
retried, a dead decoding task retried; the files it had written are kept, and a retried image skips them) and
reported. Whatever happens, the manifest says what is on disk: the destination is listed before and after the run,
and the files a lost worker wrote count as this run's (`RayExporter._settle`).

When things go wrong: an `--address` that does not answer fails within `CONNECT_TIMEOUT` seconds naming it
(Ray itself would retry for minutes); the actors' temporary folders (`SCRATCH_PREFIX`: a shipped model, files on
their way to a URI) are removed as soon as they are used, and those of a killed actor by the next actor on its node
and by the driver; Ray's own log lines go to a log file in Ray's session folder (`RayLogs`) unless --verbose.

Ray is imported inside functions only: without it (`pip install "vitviz[ray]"`) `require_ray` says how to install
it.
"""
from __future__ import annotations

import fnmatch
import glob
import hashlib
import itertools
import json
import logging
import os
import pickle
import re
import shutil
import socket
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from vitviz.batch.jobs import MANIFEST, InputError, Job, collect_inputs, inside, is_uri, sha256_file, unique_stems
from vitviz.batch.pipeline import Exporter, Prepared, failure_text, prepare, summary_line
from vitviz.batch.plan import Plan, safe_name_stem, safe_stem
from vitviz.core.files import _atomic_write, check_path, read_json_file, remove_stale_temps, temp_prefix
from vitviz.core.running.images import check_image_path, is_image_file
from vitviz.core.spec import ModelSpec
from vitviz.errors import DiskFullError, VitvizError

INSTALL_HINT = 'pip install "vitviz[ray]"'
LIST_SUFFIXES = (".txt", ".lst")     # an input with this suffix lists images, one path or URI a line
OBJECT_STORES = ("s3", "gcs", "abfs")  # pyarrow.fs type names whose writes appear whole or not at all
MANIFEST_BYTES = 1 << 30              # a previous manifest read on resume (about 2 million images)
SIDECAR_BYTES = 1_000_000            # files beside a checkpoint shipped with it (config.json, args.yaml...)
FAULT_ENV = "VITVIZ_RAY_TEST_DIE_ONCE"  # tests: a flag file; the first actor call that creates it exits hard,
#                                        after writing its batch's files (as a node lost mid-run)
GATE_ENV = "VITVIZ_RAY_TEST_GATE"   # tests: a file an actor waits for (GATE_WAIT s) before its second batch; it
#                                      writes FILE.late when the file never came
GATE_WAIT = 120.0
SCRATCH_PREFIX = "vitviz-ray-"       # an actor's temporary folders: vitviz-ray-<pid>-<what>-<random>
CONNECT_TIMEOUT = 10.0               # seconds an --address may take to accept a connection
ACTOR_EXIT_WAIT = 30.0               # seconds a stopped chunk waits for this node's actors to finish their image
JOIN_TIMEOUT = 30.0                  # seconds a cluster that accepted the connection may take to answer as Ray
CHUNK = 20_000                       # images named, run on Ray Data and recorded at a time (see the module text)
BATCHES_PER_BLOCK = 1                # Ray Data blocks of this many batches: progress comes a block at a time
LOG_NAME = "vitviz-ray.log"          # Ray's own log lines of a run (in Ray's session logs folder), unless --verbose
VERBOSE_ENV = "VITVIZ_VERBOSE"       # set by the commands' --verbose
_GLOB_CHARS = re.compile(r"[*?[]")


class RayMissingError(VitvizError):
    """`--engine ray` without Ray Data installed."""


class RayEngineError(VitvizError):
    """The Ray job failed as a whole (a model that would not load on a worker, a cluster that went away)."""


def require_ray() -> None:
    """Import Ray Data, or say how to install it.

    Raises:
        RayMissingError: Ray (or Ray Data's pyarrow / pandas) is not installed.
    """
    try:
        import ray  # noqa: F401
        import ray.data  # noqa: F401
    except ImportError as e:
        raise RayMissingError(f"--engine ray runs the export on Ray Data, which is not installed ({e}); install it "
                              f"with {INSTALL_HINT}, or leave out --engine ray to export on this computer") from None


# ---------------------------------------------------------------------------------------------------------------
# inputs


@dataclass(frozen=True)
class Source:
    """One input image.

    Attributes:
        path: as jobs, the manifest and the .npz name it: the local engine's path, or the URI.
        read: where a decoding task reads it: the absolute path, or the URI.
        sub: its output subfolder (a folder's or a glob's subfolders are kept, as the local engine does).
    """

    path: Path | str
    read: str
    sub: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "sub", inside(self.sub))   # never a way out of the output folder

    @property
    def remote(self) -> bool:
        return isinstance(self.path, str)

    @property
    def named(self) -> Path | PurePosixPath:
        """The path its output names are made from (`unique_stems`)."""
        return self.path if isinstance(self.path, Path) else PurePosixPath(urlsplit(self.path).path)


def collect_sources(inputs: list[str], out: Path | str, pattern: str | None) -> list[Source]:
    """The images of the inputs, in order, without duplicates.

    An input is an image, a folder (searched recursively; `pattern` filters its file names, as the local
    engine's --glob), a glob pattern ('photos/**/*.jpg': files in subfolders keep them, relative to the
    pattern's folder), or a text file (.txt / .lst) listing any of these, one a line ('#' comments; relative
    paths are relative to the list's folder). Each may be a local path or a pyarrow.fs URI. Local files and
    folders given on the command line are collected exactly as the local engine collects them
    (`collect_inputs`), so both engines name the same outputs; a listed file is not looked at here (a list may
    hold millions): one that is missing fails as that image, not the run. The export itself takes them as they
    are listed (`SourceStream`).

    Raises:
        InputError: an input does not exist, or nothing was found.
    """
    if not _streamed(inputs):
        return [_local(path, sub) for path, sub in collect_inputs(inputs, _local_out(out), pattern)]
    found = list(_listed(inputs, out, pattern))
    if not found:
        raise InputError(_nothing_found(inputs, pattern))
    return found


def _streamed(inputs: list[str]) -> bool:
    """Whether the inputs are more than local files and folders (a list, a glob, a URI): collected here."""
    return any(is_uri(t) or _is_list(t) or _is_glob(t) for t in inputs)


def _local_out(out: Path | str) -> Path | None:
    return None if isinstance(out, str) else out


def _nothing_found(inputs: list[str], pattern: str | None) -> str:
    return (f"no images in {', '.join(inputs)}" + (f" matching {pattern!r}" if pattern else "")
            + "; expected PNG, JPEG, BMP, GIF, TIFF, WebP or PPM/PGM files")


def _key(text: str) -> int:
    """A 128-bit hash of a name: what is kept of each image listed, to tell a duplicate or a taken name (two
    names hashing alike: about one chance in 10^26 for a list of millions)."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest(), "big")


def _listed(inputs: list[str], out: Path | str, pattern: str | None) -> Iterator[Source]:
    """The images of `inputs` as they are listed, without duplicates (those seen are kept as `_key` hashes, not
    paths) and without those under a local output folder."""
    out_local = _local_out(out)
    out_abs = os.path.abspath(out_local) if out_local is not None else None
    seen: set[int] = set()
    for text in inputs:
        for source in _expand(text, out_local, pattern, lists=True):
            key = source.read  # the URI or the absolute path, as written (a list's millions are not stat-ed)
            if out_abs is not None and not source.remote and key.startswith(out_abs.rstrip(os.sep) + os.sep):
                continue
            hashed = _key(key)
            if hashed in seen:
                continue
            seen.add(hashed)
            yield source


class SourceStream:
    """The images an export reads and the stem each one's outputs are named by, as the Ray engine takes them.

    Local files and folders only (the local engine's inputs): collected whole and named by the local engine's
    `unique_stems`, so both engines write the same files. With a list, a glob or a URI among the inputs: listed
    as the export goes (`_listed`), each image named when it is listed: its file name's stem, or, when an earlier
    image of its subfolder took that, `stem_ext`, then `stem_2`, `stem_3`... (the names taken kept as hashes).

    The first image is listed here, so that a missing input, an unreadable list or inputs without images are
    said before anything else is done.

    Attributes:
        listed: images listed so far.
        complete: whether every input has been listed.

    Raises:
        InputError: an input does not exist or cannot be read, or nothing was found.
    """

    def __init__(self, inputs: list[str], out: Path | str, pattern: str | None) -> None:
        self.listed, self.complete = 0, False
        if _streamed(inputs):
            self.streamed = True
            self._items: Iterator[Source] = _listed(inputs, out, pattern)
            self._first = next(self._items, None)
            if self._first is None:
                raise InputError(_nothing_found(inputs, pattern))
            self._stems: list[str] | None = None
        else:
            self.streamed = False
            found = collect_sources(inputs, out, pattern)
            self._items, self._first = iter(found), None
            self._stems = unique_stems([(s.named, s.sub) for s in found], safe_stem)  # type: ignore[misc]

    def __iter__(self) -> Iterator[tuple[Source, str]]:
        """(image, stem) in input order; once only."""
        items = itertools.chain([self._first] if self._first is not None else [], self._items)
        self._first = None
        taken: set[int] = set()
        for source in items:
            if self._stems is not None:
                stem = self._stems[self.listed]
            else:
                stem = _free_stem(source, taken)
            self.listed += 1
            yield source, stem
        self.complete = True


def _free_stem(source: Source, taken: set[int]) -> str:
    """The first of the image's stem, `stem_ext`, `stem_2`, `stem_3`... no earlier image of its subfolder took."""
    name = source.path.name if isinstance(source.path, Path) else source.named.name
    base = safe_name_stem(name)
    dot = name.rfind(".")
    suffix = name[dot + 1:].lower() if 0 < dot < len(name) - 1 else ""
    folder = source.sub.as_posix()
    numbered = (f"{base}_{n}" for n in itertools.count(2))
    candidates = itertools.chain([base], [f"{base}_{suffix}"] if suffix else [], numbered)
    key, stem = next((k, stem) for stem in candidates if (k := _key(f"{folder}/{stem}")) not in taken)
    taken.add(key)
    return stem


def _local(path: Path, sub: Path) -> Source:
    return Source(path, os.path.abspath(path), sub)


def _is_list(text: str) -> bool:
    return PurePosixPath(urlsplit(text).path if is_uri(text) else text).suffix.lower() in LIST_SUFFIXES


def _is_glob(text: str) -> bool:
    return bool(_GLOB_CHARS.search(urlsplit(text).path if is_uri(text) else text)) and \
        (is_uri(text) or not os.path.lexists(text))


def _expand(text: str, out: Path | None, pattern: str | None, lists: bool) -> Iterator[Source]:
    """The images one input names (see `collect_sources`); `lists`: a text file of paths is read (not inside
    another list)."""
    if lists and _is_list(text):
        yield from _read_list(text, out, pattern)
    elif is_uri(text):
        yield from _uri_sources(text, pattern)
    elif _is_glob(text):
        yield from _local_glob(text)
    else:
        try:
            pairs = collect_inputs([text], out, pattern)
        except InputError:
            if not os.path.isdir(text):
                raise
            pairs = []  # a folder without images: the run says so only when no input has any
        yield from (_local(path, sub) for path, sub in pairs)


def _read_list(text: str, out: Path | None, pattern: str | None) -> Iterator[Source]:
    """The images a list names, read a line at a time (a list may hold millions of lines); a local list must be
    a regular file (`check_path`: a FIFO would block, a link to /dev/zero never end)."""
    listed_at_uri = is_uri(text)
    base = text.rsplit("/", 1)[0] if listed_at_uri else os.path.dirname(text)
    here = Path(".")
    for line in _list_lines(text):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        uri = is_uri(line)
        if not uri and not os.path.isabs(line):
            line = f"{base}/{line}" if listed_at_uri else os.path.normpath(os.path.join(base, line))
        if not uri and not _is_glob(line) and (is_image_file(line) or not os.path.isdir(line)):
            yield Source(Path(line), os.path.abspath(line), here)  # not looked at: a missing file fails as its image
        elif uri and not _is_glob(line) and is_image_file(urlsplit(line).path):
            yield Source(line, line, here)  # not opened here either: a URI pyarrow cannot read fails as its image
        else:
            yield from _expand(line, out, pattern, lists=False)


def _list_lines(text: str) -> Iterator[str]:
    """The lines of a list of images, local or at a pyarrow.fs URI, decoded as UTF-8 as they are read."""
    import codecs

    try:
        if is_uri(text):
            fs, path = filesystem(text)
            local_check(fs, path, text, "a list of images (a text file)")
            handle = fs.open_input_stream(path)
        else:
            check_path(text, "a list of images (a text file, one path a line)", missing=InputError, bad=InputError)
            handle = open(text, "rb")
        with handle:
            decoder, rest = codecs.getincrementaldecoder("utf-8")(), ""
            while chunk := handle.read(1 << 20):
                lines = (rest + decoder.decode(chunk)).split("\n")
                rest = lines.pop()
                yield from lines
            yield rest + decoder.decode(b"", final=True)
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"{text}: cannot read the list of images ({getattr(e, 'strerror', None) or e})") from None


def _glob_match(pattern: list[str], parts: list[str]) -> bool:
    """Whether relative path `parts` match glob `pattern` components ('**' spans any number of folders)."""
    if not pattern:
        return not parts
    if pattern[0] == "**":
        return any(_glob_match(pattern[1:], parts[i:]) for i in range(len(parts) + 1))
    return bool(parts) and fnmatch.fnmatchcase(parts[0], pattern[0]) and _glob_match(pattern[1:], parts[1:])


def _split_glob(path: str) -> tuple[str, list[str]]:
    """'a/b/*/c*.png' -> ('a/b', ['*', 'c*.png']): the folder to list and the pattern below it."""
    parts = path.split("/")
    first = next(i for i, part in enumerate(parts) if _GLOB_CHARS.search(part))
    return "/".join(parts[:first]), parts[first:]


def _natural(rel: str) -> tuple:
    return tuple(tuple(int(t) if i % 2 else t.lower() for i, t in enumerate(re.split(r"(\d+)", part)))
                 for part in rel.split("/")), rel


def _local_glob(text: str) -> Iterator[Source]:
    base, _pattern = _split_glob(Path(text).as_posix())
    matches = [m for m in glob.glob(text, recursive=True) if os.path.isfile(m) and is_image_file(m)]
    root = base or "."
    for match in sorted(matches, key=lambda m: _natural(Path(os.path.relpath(m, root)).as_posix())):
        path = Path(match)
        yield _local(path, Path(os.path.relpath(path.parent, root)))


def _uri_sources(uri: str, pattern: str | None) -> Iterator[Source]:
    """The images a URI names: one image, a folder's (recursively, filtered by `pattern`), or a glob's."""
    import pyarrow.fs as pafs

    fs, path = filesystem(uri)
    prefix = _prefix(uri, path)
    if _GLOB_CHARS.search(path):
        base, parts = _split_glob(path)
        selector = pafs.FileSelector(base, recursive=len(parts) > 1, allow_not_found=True)
        names = None
    else:
        info = fs.get_file_info(path)
        if info.type == pafs.FileType.NotFound:
            raise InputError(f"{uri}: not found; expected an image, a folder of images, a glob pattern or a list")
        if info.type != pafs.FileType.Directory:   # a FIFO or a device is no folder: refused by its kind
            local_check(fs, path, uri, "an image, a folder of images, a glob pattern or a list")
        if info.type == pafs.FileType.File:
            yield Source(uri, uri, Path("."))
            return
        base, parts = path.rstrip("/"), None
        selector = pafs.FileSelector(base, recursive=True)
        names = pattern
    try:
        infos = fs.get_file_info(selector)
    except OSError as e:
        raise InputError(f"{uri}: cannot list it ({e})") from None
    found = []
    for info in infos:
        if info.type != pafs.FileType.File:
            continue
        rel = info.path[len(base):].lstrip("/")
        rel_parts = rel.split("/")
        if any(p.startswith(".") for p in rel_parts) or not is_image_file(rel):
            continue
        if parts is not None and not _glob_match(parts, rel_parts):
            continue
        if names is not None and not fnmatch.fnmatchcase(rel_parts[-1].lower(), names.lower()):
            continue
        found.append(rel)
    for rel in sorted(found, key=_natural):
        full = prefix + base.rstrip("/") + "/" + rel
        yield Source(full, full, Path(PurePosixPath(rel).parent))


# ---------------------------------------------------------------------------------------------------------------
# filesystems and the destination

_FILESYSTEMS: dict[str, tuple[Any, str]] = {}


def filesystem(uri: str) -> tuple[Any, str]:
    """The pyarrow filesystem of a URI and the path in it, the filesystem made once per process and place
    (making one can cost a network round trip: an S3 region look-up)."""
    parts = urlsplit(uri)
    key = f"{parts.scheme}://{parts.netloc}?{parts.query}"
    if key not in _FILESYSTEMS:
        fs, path = _from_uri(uri)
        _FILESYSTEMS[key] = (fs, _prefix(uri, path))
    fs, prefix = _FILESYSTEMS[key]
    bare = uri.split("?", 1)[0]
    if not bare.startswith(prefix):
        return _from_uri(uri)
    return fs, bare[len(prefix):]


def _from_uri(uri: str) -> tuple[Any, str]:
    """pyarrow's filesystem of a URI; one it cannot open (ftp://, http://, 'FILE://', a file:// URI naming
    another host, hdfs:// without Java) is an InputError naming the URI."""
    import pyarrow
    import pyarrow.fs as pafs

    try:
        return pafs.FileSystem.from_uri(uri)
    except (pyarrow.ArrowException, ValueError, OSError) as e:
        raise InputError(f"{uri}: pyarrow.fs cannot open this URI ({str(e).splitlines()[0] if str(e) else e}); "
                         "expected a local path or a URI such as file:///abs/path, s3://bucket/key, gs://bucket/key, "
                         "hdfs://host:port/path (with Java and Hadoop installed)") from None


def local_check(fs: Any, path: str, uri: str, expected: str) -> None:
    """A file:// URI's file must be a regular file (`check_path`), as a local path's: pyarrow opens a FIFO (the
    read blocks) or /dev/zero (the read never ends) as it opens a file."""
    if fs.type_name == "local":
        check_path(path, expected, missing=InputError, bad=InputError)


def _prefix(uri: str, path: str) -> str:
    """What precedes the filesystem path in a URI: 's3://' for 's3://bucket/key', 'hdfs://host:port' ..."""
    bare = uri.split("?", 1)[0]
    for candidate in (path, path.rstrip("/")):
        if candidate and bare.rstrip("/").endswith(candidate.rstrip("/")):
            return bare.rstrip("/")[: len(bare.rstrip("/")) - len(candidate.rstrip("/"))]
    raise InputError(f"{uri}: cannot tell its filesystem path apart (pyarrow reads it as {path!r})")


def fetch(uri: str) -> bytes:
    """A file's bytes from a pyarrow.fs URI."""
    fs, path = filesystem(uri)
    local_check(fs, path, uri, "an image file")
    with fs.open_input_stream(path) as handle:
        return handle.read()


class Destination:
    """Where the outputs and the manifest go: a local folder (on a cluster, one every node sees) or a pyarrow.fs
    URI. Travels to the tasks and actors as its text; the filesystem is made again there (with that node's
    credentials).

    Attributes:
        root: the folder outputs are named under: the absolute local folder, or the path in the filesystem.
        remote: whether it is a URI.
    """

    def __init__(self, out: Path | str) -> None:
        self.out = out
        self.remote = isinstance(out, str)
        self.root = Path(filesystem(out)[1].rstrip("/") or "/") if isinstance(out, str) else Path(os.path.abspath(out))

    def __getstate__(self) -> dict[str, Any]:
        return {"out": self.out}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["out"])  # type: ignore[misc]

    @property
    def fs(self) -> Any:
        assert isinstance(self.out, str)
        return filesystem(self.out)[0]

    def make(self) -> None:
        """Create the folder (an object store needs none)."""
        try:
            if self.remote:
                self.fs.create_dir(self.root.as_posix(), recursive=True)
            else:
                self.root.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise InputError(f"{self.out}: cannot create the output folder ({getattr(e, 'strerror', None) or e})") \
                from e

    def files(self) -> set[str]:
        """Every file under the folder, as paths relative to it ('sub/cat_cls_L11_Hmean.png')."""
        if not self.remote:
            found = set()
            for dirpath, _dirs, names in os.walk(self.root):
                rel = Path(dirpath).relative_to(self.root)
                found.update((rel / name).as_posix() for name in names)
            return found
        import pyarrow.fs as pafs

        base = self.root.as_posix().rstrip("/")
        infos = self.fs.get_file_info(pafs.FileSelector(base, recursive=True, allow_not_found=True))
        return {i.path[len(base):].lstrip("/") for i in infos if i.type == pafs.FileType.File}

    def present(self, paths: list[Path]) -> list[bool]:
        """Whether each of these outputs exists."""
        if not self.remote:
            return [p.exists() for p in paths]
        import pyarrow.fs as pafs

        infos = self.fs.get_file_info([p.as_posix() for p in paths])
        return [i.type != pafs.FileType.NotFound for i in infos]

    def read_json(self, name: str) -> Any:
        """A JSON file in the folder (the previous run's manifest), or None when there is none.

        Raises:
            InputError: it is there but not a regular file, over MANIFEST_BYTES, not JSON or nested too deeply.
        """
        import json

        where = f"{self.out}/{name}" if self.remote else self.root / name
        expected = "the manifest of an earlier run (JSON; move it away or pass --overwrite to start afresh)"
        if not self.remote:
            if not os.path.lexists(where):
                return None
            return read_json_file(where, expected, InputError, MANIFEST_BYTES)   # a FIFO, /dev/zero, deep nesting
        import pyarrow.fs as pafs

        try:
            info = self.fs.get_file_info((self.root / name).as_posix())
            if info.type == pafs.FileType.NotFound:
                return None
            if info.type != pafs.FileType.File or (info.size or 0) > MANIFEST_BYTES:
                raise InputError(f"{where}: not a file of at most {MANIFEST_BYTES >> 20} MiB; expected {expected}")
            with self.fs.open_input_stream((self.root / name).as_posix()) as handle:
                return json.loads(handle.read(MANIFEST_BYTES + 1).decode("utf-8"))
        except RecursionError:
            raise InputError(f"{where}: JSON nested too deeply to read; expected {expected}") from None
        except (OSError, ValueError) as e:
            raise InputError(f"{where}: not readable as JSON ({e}); expected {expected}") from None

    def write_json(self, name: str, data: dict[str, Any]) -> None:
        """Write a JSON file into the folder, atomically, as `write_json_atomic` lays it out; a value that is an
        iterator (the manifest's images, read back from the run's spill file) is written an item at a time."""
        if not self.remote:
            _atomic_write(self.root / name, lambda handle: dump_json(data, handle), overwrite=True)
            return
        with tempfile.TemporaryDirectory(prefix="vitviz-") as tmp:
            local = Path(tmp) / name
            _atomic_write(local, lambda handle: dump_json(data, handle), overwrite=True)
            self.upload(local, name)

    def upload(self, local: Path, rel: str) -> None:
        """Copy a finished local file to `rel` under the folder, so that it appears whole or not at all."""
        fs, target = self.fs, (self.root / rel).as_posix()
        parent = target.rsplit("/", 1)[0]
        if fs.type_name in OBJECT_STORES:
            with open(local, "rb") as src, fs.open_output_stream(target) as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
            return
        fs.create_dir(parent, recursive=True)
        tmp = f"{parent}/{temp_prefix(PurePosixPath(target))}upload.tmp"  # type: ignore[arg-type]
        try:
            with open(local, "rb") as src, fs.open_output_stream(tmp) as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
            fs.move(tmp, target)
        finally:
            try:
                fs.delete_file(tmp)
            except OSError:
                pass  # moved into place


def dump_json(data: dict[str, Any], handle: Any) -> None:
    """`data` as `write_json_atomic` writes it (indent 2, sets and tuples as lists), into a binary `handle`; a
    top-level value that is an iterator is written as a list, an item at a time (never all in memory)."""
    streamed = {key: value for key, value in data.items() if isinstance(value, Iterator)}
    marks = {key: json.dumps(f"\0{key}\0") for key in streamed}
    text = json.dumps({k: f"\0{k}\0" if k in streamed else v for k, v in data.items()}, indent=2, default=list)
    for key, items in streamed.items():
        head, _, text = text.partition(marks[key])
        handle.write(head.encode("utf-8"))
        sep = "["
        for item in items:
            body = json.dumps(item, indent=2, default=list).replace("\n", "\n    ")
            handle.write(f"{sep}\n    {body}".encode("utf-8"))
            sep = ","
        handle.write(b"[]" if sep == "[" else b"\n  ]")
    handle.write((text + "\n").encode("utf-8"))


# ---------------------------------------------------------------------------------------------------------------
# the model, as every actor loads it


@dataclass(frozen=True)
class ModelRecipe:
    """How every actor loads the driver's model: `vitviz.load(checkpoint, device=device, **overrides)`.

    The checkpoint travels by path (every node reads it there: this machine, or a shared filesystem) or through
    Ray's object store (`files`: a reference to its files, put there once, with the small files beside it that
    vitviz reads: config.json, training args, labels). Either way each actor checks that its model's spec is the
    driver's.

    Attributes:
        checkpoint: what `vitviz.load` takes (None: --code builds the model with its own weights).
        overrides: the command line's model overrides (heads, eps, code...).
        device: where the actors run it.
        spec: the driver's spec: written into every .npz, and compared with each actor's.
        threads: torch's thread count in the actors: the local engine's (the driver's `torch.get_num_threads()`),
            because the backward passes of the maps of a class or a prompt round differently with another count
            (Ray would give an actor one thread per CPU it reserves).
        files: None (by path), or an ObjectRef of {relative path: bytes}.
        name: the checkpoint's path among `files`.
    """

    checkpoint: str | None
    overrides: dict[str, Any]
    device: str
    spec: ModelSpec
    threads: int
    files: Any = None
    name: str = ""

    @property
    def shipped(self) -> str:
        return "path" if self.files is None else "object store"


def model_files(checkpoint: str) -> tuple[dict[str, bytes], str]:
    """The files that make up a checkpoint, to ship through the object store, and the checkpoint's path among
    them: a model folder's files (not its subfolders), or the file with the small files beside it (and above
    a Lightning 'checkpoints' folder), named relative to the folder above it so its folder's name travels too."""
    path = Path(checkpoint).absolute()
    if path.is_dir():
        return {f"{path.name}/{f.name}": f.read_bytes() for f in sorted(path.iterdir())
                if f.is_file() and not f.name.startswith(".")}, path.name
    folders = [path.parent] + ([path.parent.parent] if path.parent.name == "checkpoints" else [])
    top = folders[-1].parent
    files = {path.relative_to(top).as_posix(): path.read_bytes()}
    for folder in folders:
        for f in sorted(folder.iterdir()):
            if f != path and f.is_file() and not f.name.startswith(".") and f.stat().st_size <= SIDECAR_BYTES:
                files[f.relative_to(top).as_posix()] = f.read_bytes()
    return files, path.relative_to(top).as_posix()


def scratch(what: str) -> Path:
    """A new temporary folder of this process, named `SCRATCH_PREFIX`<pid>-<what>-<random>: the pid tells the
    folder a killed process left (`sweep_scratch`) from one in use."""
    return Path(tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-{what}-"))


def sweep_scratch() -> list[Path]:
    """Remove, from this node's temporary folder, the `scratch` folders of processes that are gone (an actor that
    was killed while it held a copy of the model or files on their way to a URI); those of running processes stay.

    Returns:
        the folders removed.
    """
    removed = []
    try:
        entries = list(Path(tempfile.gettempdir()).iterdir())
    except OSError:
        return removed
    for entry in entries:
        found = re.fullmatch(rf"{re.escape(SCRATCH_PREFIX)}(\d+)-[a-z]+-\w+", entry.name)
        if found is None or _alive(int(found.group(1))) or entry.is_symlink() or not entry.is_dir():
            continue
        shutil.rmtree(entry, ignore_errors=True)
        removed.append(entry)
    return removed


def _alive(pid: int) -> bool:
    """Whether process `pid` runs on this node (one of another user counts as running)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def same_model(loaded: ModelSpec, driver: ModelSpec) -> list[str]:
    """The spec fields in which an actor's model differs from the driver's (its source path aside)."""
    a, b = loaded.to_dict(), driver.to_dict()
    return sorted(k for k in set(a) | set(b) if k != "source" and a.get(k) != b.get(k))


# ---------------------------------------------------------------------------------------------------------------
# the stages: decoding tasks and model actors


def _job(plan: Plan, row: dict[str, Any], root: Path) -> Job:
    """A row's job, its outputs named by the local engine's `Plan.jobs` under `root`."""
    path: Path | str = row["source"] if row["remote"] else Path(row["source"])
    job = plan.jobs([(path, Path(row["sub"]))], root, [row["stem"]])[0]  # type: ignore[list-item]
    job.index = int(row["index"])
    return job


def read_row(row: dict[str, Any], spec: ModelSpec, plan: Plan, dest: Destination) -> dict[str, Any]:
    """A decoding task: `prepare` one image (hash, skip check, decode, preprocess) for the actors.

    Returns:
        the row with 'status' ('ready', 'skipped' or 'failed'), 'error', 'sha256', 'present' (the outputs that
        exist at a URI destination, one a line) and 'payload' (the pickled model input, display and region).
    """
    job = _job(plan, row, dest.root)
    out = {**row, "status": "ready", "error": "", "sha256": "", "present": "", "payload": b"",
           "decoder": os.getpid()}
    try:
        complete = None
        if dest.remote:
            there = dest.present(job.outputs)
            out["present"] = "\n".join(p.relative_to(dest.root).as_posix() for p, ok in zip(job.outputs, there) if ok)
            complete = lambda _job: all(there)  # noqa: E731
        if row["remote"]:
            item = prepare(job, spec, plan, data=fetch(row["read"]), complete=complete)
        else:
            item = prepare(job, spec, plan, file=Path(row["read"]), complete=complete)
    except (VitvizError, OSError) as e:
        out.update(status="failed", error=failure_text(job, e), sha256=job.sha256)
        return out
    out["sha256"] = job.sha256
    if item is None:
        out["status"] = "skipped"
    else:
        out["payload"] = pickle.dumps((item.x.numpy(), item.display, item.region), protocol=pickle.HIGHEST_PROTOCOL)
    return out


def _die_once(flag: str) -> None:
    """Fault injection for tests (`FAULT_ENV`): the first call anywhere that creates `flag` kills its process."""
    if not flag:
        return
    try:
        fd = os.open(flag, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return
    os.close(fd)
    os._exit(1)


def _wait_for(gate: str) -> None:
    """Test hook (`GATE_ENV`): wait until `gate` exists -- the driver has shown the progress of the batches before
    -- for at most GATE_WAIT seconds; mark a wait in vain with `gate`.late."""
    import time

    deadline = time.monotonic() + GATE_WAIT
    while not os.path.exists(gate):
        if time.monotonic() > deadline:
            Path(f"{gate}.late").touch()
            return
        time.sleep(0.05)


class ExportActor:
    """A model actor: loads the model once, then exports every batch Ray hands it with the local engine."""

    def __init__(self, recipe: ModelRecipe, plan: Plan, dest: Destination) -> None:
        import ray

        from vitviz.core.running.load import load

        sweep_scratch()  # what an actor killed on this node before left
        context = ray.get_runtime_context()
        self.actor, self.node, self.pid = context.get_actor_id() or "", context.get_node_id() or "", os.getpid()
        self.reconstructed = bool(context.was_current_actor_reconstructed)
        checkpoint, folder = recipe.checkpoint, None
        import torch

        torch.set_num_threads(recipe.threads)
        try:
            if recipe.files is not None:  # the model's files, written for `load`, removed once it is loaded
                folder = scratch("model")
                for rel, data in ray.get(recipe.files).items():
                    (folder / rel).parent.mkdir(parents=True, exist_ok=True)
                    (folder / rel).write_bytes(data)
                checkpoint = str(folder / recipe.name)
            with warnings.catch_warnings():  # the driver has said its warnings once
                warnings.simplefilter("ignore")
                model = load(checkpoint, device=recipe.device, **recipe.overrides)
        finally:
            if folder is not None:
                shutil.rmtree(folder, ignore_errors=True)
        differs = same_model(model.spec, recipe.spec)
        if differs:
            raise RayEngineError(f"the model loaded on node {self.node[:12]} from {checkpoint} is not the driver's: "
                                 f"{', '.join(differs)} differ. Give every node the same checkpoint and the files "
                                 "beside it (a shared filesystem), or ship it with --ship-model store")
        self.device = str(model.device)
        self.plan, self.dest = plan, dest
        self.exporter = Exporter(model, plan, [], spec=recipe.spec)
        self.fault, self.gate, self.calls = os.environ.get(FAULT_ENV, ""), os.environ.get(GATE_ENV, ""), 0

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, list[Any]]:
        """Export one batch; for a URI destination its files are written into a folder of this call's, uploaded,
        and the folder removed."""
        if self.calls and self.gate:
            _wait_for(self.gate)
        self.calls += 1
        keys = list(batch)
        rows = [dict(zip(keys, values)) for values in zip(*(batch[k].tolist() for k in keys))]
        root = scratch("out") if self.dest.remote else self.dest.root
        try:
            jobs, fatal = self._export(rows, root)
            written = ["\n".join(p.relative_to(root).as_posix() for p in job.written) for job in jobs]
        finally:
            if self.dest.remote:
                shutil.rmtree(root, ignore_errors=True)
        return {
            "index": [job.index for job in jobs], "status": [job.status for job in jobs],
            "error": [job.error for job in jobs], "sha256": [job.sha256 for job in jobs], "written": written,
            "actor": [self.actor] * len(jobs), "node": [self.node] * len(jobs), "pid": [self.pid] * len(jobs),
            "device": [self.device] * len(jobs), "reconstructed": [self.reconstructed] * len(jobs),
            "fatal": [fatal] * len(jobs), "decoded_here": [row["decoder"] == self.pid for row in rows],
        }

    def _export(self, rows: list[dict[str, Any]], root: Path) -> tuple[list[Job], str]:
        """The rows' jobs, named under `root`, exported (and uploaded to a URI destination); the DiskFullError's
        text, if a write hit a full disk."""
        import torch

        jobs, ready = [], []
        for row in rows:
            job = _job(self.plan, row, root)
            job.sha256 = row["sha256"]
            if row["status"] == "ready":
                x, display, region = pickle.loads(row["payload"])
                ready.append(Prepared(job, torch.from_numpy(x), display, region))
            else:
                job.status, job.error = row["status"], row["error"]
            jobs.append(job)
        fatal = ""
        if ready:
            try:
                self.exporter.export_batch(ready)
            except DiskFullError as e:  # that image failed with it; the driver stops the run
                fatal = str(e)
        _die_once(self.fault)
        if self.dest.remote:
            for job, row in zip(jobs, rows):
                self._upload(job, root, set(row["present"].split("\n")) - {""})
        return jobs, fatal

    def _upload(self, job: Job, root: Path, present: set[str]) -> None:
        """Move a job's files from the call's folder `root` to the destination; one that exists there is left
        alone (unless --overwrite), as the local engine leaves it."""
        uploaded = []
        try:
            for path in job.written:
                rel = path.relative_to(root).as_posix()
                if self.plan.overwrite or rel not in present:
                    self.dest.upload(path, rel)
                    uploaded.append(path)
                path.unlink()
        except OSError as e:
            job.status, job.error = "failed", failure_text(job, e)
        job.written = uploaded


# ---------------------------------------------------------------------------------------------------------------
# the driver


@dataclass
class RaySettings:
    """The command line's Ray options; None: chosen from the cluster (see `RayExporter`).

    Attributes:
        address: the cluster to join (default $RAY_ADDRESS); without either, Ray starts a local instance.
        actors: model actors (one model each).
        gpus_per_actor: GPUs each actor reserves (fractions share a GPU).
        cpus_per_actor: CPUs each actor reserves (its torch threads).
        ship: 'path', 'store' (the object store) or None: by path on a local Ray, through the object store on a
            cluster that was joined by address.
    """

    address: str | None = None
    actors: int | None = None
    gpus_per_actor: float | None = None
    cpus_per_actor: float | None = None
    ship: str | None = None


def _node_id() -> str:
    """This process's Ray node ("" when Ray is not running here)."""
    try:
        import ray

        return ray.get_runtime_context().get_node_id() if ray.is_initialized() else ""
    except Exception:  # noqa: BLE001 - a Ray that cannot say: no actor is waited for
        return ""


def _alive(pid: int) -> bool:
    """Whether process `pid` still runs on this machine."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:      # another user's process with that number: it runs
        return True
    return True


@dataclass
class _Worker:
    node: str
    device: str
    pids: set[int] = field(default_factory=set)
    restarts: int = 0
    images: int = 0


class RayExporter:
    """Runs a plan over the images of a `SourceStream` on Ray, `CHUNK` images at a time; `counts`, `records()`
    (each image's manifest entry) and `engine_record()` say what happened. The local `Exporter`'s interface: the
    CLI drives either.

    Args:
        checkpoint, overrides, device: how the actors load the model (`ModelRecipe`).
        spec: the driver's loaded model's spec.
        sources: (image, stem) pairs, in order (a `SourceStream`, or any iterable of them).
        root: the folder outputs are named under (the local folder as given, or the URI's path: `dest.root`).
        dest: the output folder or URI.
        on_progress: called on this thread with each job as it finishes (or is skipped).
        on_message: a line for the user (a worker that died and was restarted).
        on_listed: called with the number of images listed so far, as each chunk is listed.
        quiet: no line about temporary files an earlier run left.

    Defaults from the cluster: with GPUs (and --device not cpu) one GPU per actor and one actor per GPU; without,
    an actor for every T + 1 CPUs (T: torch's thread count here, which every actor runs with), so decoding keeps
    CPUs of its own; each actor reserves one CPU. Each chunk starts the actor pool anew (Ray Data's pool lives as
    long as its dataset): with CHUNK images a chunk, loading the model once a chunk costs little.
    """

    def __init__(self, checkpoint: str | None, overrides: dict[str, Any], device: str, spec: ModelSpec, plan: Plan,
                 sources: Iterable[tuple[Source, str]], root: Path, dest: Destination, settings: RaySettings,
                 on_progress: Callable[[Job], None] | None = None, on_message: Callable[[str], None] | None = None,
                 on_listed: Callable[[int], None] | None = None, quiet: bool = False) -> None:
        self.checkpoint, self.overrides, self.device, self.spec = checkpoint, overrides, device, spec
        self.plan, self.sources, self.root, self.dest, self.settings = plan, sources, root, dest, settings
        self.on_progress = on_progress or (lambda _job: None)
        self.on_message = on_message or (lambda _text: None)
        self.on_listed = on_listed or (lambda _n: None)
        self.quiet = quiet
        self.counts = {"done": 0, "skipped": 0, "failed": 0, "files": 0}
        self.total = 0              # images listed and named so far (every image, once the run went through)
        self.workers: dict[str, _Worker] = {}
        self.resumed = 0            # images skipped from the previous manifest, never read
        self.actors = 0
        self.gpus_per_actor = 0.0
        self.cpus_per_actor = 1.0
        self.cpus = 0.0             # the cluster's
        self.threads = _torch_threads()
        self.decoded_in_actors = 0  # images a Ray that fused the stages decoded in an actor (0 expected)
        self.address = ""
        self.shipped = ""
        self.chunks = 0             # Ray Data runs (one per chunk with images to do)
        self.log: Path | None = None  # Ray's own log lines of this run (None: --verbose, on the terminal)
        self.jobs: dict[int, Job] = {}      # the chunk's jobs by index
        self._sources: dict[int, tuple[Source, str]] = {}  # the chunk's images and stems by index
        self._before: set[str] = set()  # the chunk's outputs on disk when it began (relative paths)
        self._resumed: set[int] = set()  # the chunk's jobs skipped from the previous manifest
        self._reported: set[int] = set()
        self._previous: dict[str, str] = {}  # the previous manifest's finished images: path -> sha256
        self._spill: Any = None     # the manifest's entries of the chunks done, a JSON line each
        self._ray: Any = None       # (recipe, failures) once Ray is started for this run
        self._logs: RayLogs | None = None
        self._started = False

    # -- the run ------------------------------------------------------------------------------------------------

    def run(self) -> None:
        """Process every image, a chunk at a time. On KeyboardInterrupt (or a full disk, or a failed Ray job) stop
        the job and its actors, record what is on disk for the chunk's images no actor reported, re-raise; images
        not listed yet are not in the manifest (a rerun lists them again)."""
        self._previous = self._recorded()
        self._spill = tempfile.TemporaryFile("w+", encoding="utf-8", prefix="vitviz-manifest-")
        stale = [self.root / MANIFEST] if not self.dest.remote else []
        try:
            for chunk in _batched(iter(self.sources), CHUNK):
                self._chunk(chunk, stale)
                stale = []
        finally:
            self._stop_ray()

    def _chunk(self, chunk: list[tuple[Source, str]], stale: list[Path]) -> None:
        """Name, skip, run and record one chunk of images."""
        first = self.total
        self.total += len(chunk)
        self.on_listed(self.total)
        pairs = [(source.path, source.sub) for source, _ in chunk]
        jobs = self.plan.jobs(pairs, self.root, [stem for _, stem in chunk])  # type: ignore[arg-type]
        self.jobs, self._sources = {}, {}
        for job, (source, stem) in zip(jobs, chunk):
            job.index += first
            self.jobs[job.index], self._sources[job.index] = job, (source, stem)
        self._resumed, self._reported = set(), set()
        if not self.dest.remote:
            removed = remove_stale_temps([path for job in jobs for path in job.outputs] + stale)
            if removed and not self.quiet:
                self.on_message(f"vitviz: removed {len(removed)} temporary file(s) a killed earlier run left in "
                                f"{self.dest.out}")
        self._before = self._present(jobs)
        try:
            self._skip_recorded(jobs)
            todo = [job for job in jobs if job.status == "pending"]
            if todo:
                self._run(todo)
        except BaseException:
            self._let_actors_finish()
            raise
        finally:
            self._settle(jobs)
            for job in jobs:
                self._spill.write(json.dumps(job.record(self.root)) + "\n")

    def _let_actors_finish(self) -> None:
        """After a stop (Ctrl+C, a full disk, a failed job): wait, at most ACTOR_EXIT_WAIT s, until this node's
        actors have exited. Ray lets an actor it releases finish the batch it is running, so without the wait an
        image written just after the stop would be on disk but not in the manifest. Actors on other nodes are not
        waited for (their processes cannot be seen from here): a rerun finds their late files and records them."""
        here = _node_id()
        pids = {pid for worker in self.workers.values() if worker.node == here for pid in worker.pids}
        deadline = time.monotonic() + ACTOR_EXIT_WAIT
        while pids and time.monotonic() < deadline:
            pids = {pid for pid in pids if _alive(pid)}
            if pids:
                time.sleep(0.05)

    def _run(self, todo: list[Job]) -> None:
        """One Ray Data run over a chunk's images to do (Ray started, and sized, for the first)."""
        if self._ray is None:
            self._start_ray()
        recipe, failures = self._ray
        try:
            self.chunks += 1
            self._blocks(self._dataset(todo, recipe))
        except failures as e:  # an actor that would not start, an error in a worker, a lost cluster
            where = f" (Ray's log: {self.log})" if self.log else ""
            raise RayEngineError(f"the Ray job stopped: {_ray_error(e)}{where}") from e

    def _start_ray(self) -> None:
        """Join the cluster or start Ray, Ray's lines into the log file, the pool sized, the model's recipe made."""
        import ray
        import ray.data.exceptions

        failures = (ray.exceptions.RayError, ray.data.exceptions.SystemException, ConnectionError)
        self._quiet_ray()
        self._logs = RayLogs(verbose=RayLogs.verbose_now())
        self._logs.capture()
        try:
            self._started = self._connect()
            self.log = self._logs.start()
            self._size(joined=self._started and self.address != "local")
            self._ray = (self._recipe(), failures)
        except failures as e:
            where = f" (Ray's log: {self.log})" if self.log else ""
            raise RayEngineError(f"the Ray job stopped: {_ray_error(e)}{where}") from e

    def _stop_ray(self) -> None:
        """Stop the Ray this run started; Ray's lines back to the terminal; a killed actor's folders removed."""
        try:
            if self._started:
                import ray

                ray.shutdown()
        finally:
            if self._logs is not None:
                self._logs.stop()
            sweep_scratch()  # a killed actor's folders on this node

    def _connect(self) -> bool:
        """Join the cluster (or start a local Ray); True when this run started Ray (and so stops it). An address
        that accepts no connection within CONNECT_TIMEOUT seconds, or does not answer as a Ray cluster within
        JOIN_TIMEOUT seconds, is refused (Ray would try for minutes).

        Raises:
            RayEngineError: naming the address and what went wrong.
        """
        import ray

        if ray.is_initialized():
            self.address = "already initialised"
            return False
        address = self.settings.address or os.environ.get("RAY_ADDRESS") or None
        if address:
            probe_address(address)
            probe_cluster(address)
        try:
            verbose = RayLogs.verbose_now()  # else Ray's start-up lines (INFO) would reach the terminal
            ray.init(address=address or "local", include_dashboard=False, log_to_driver=verbose,
                     logging_level=logging.INFO if verbose else logging.ERROR)
        except (ConnectionError, ValueError, RuntimeError) as e:
            raise RayEngineError(f"cannot {'join the Ray cluster at ' + address if address else 'start Ray'}: "
                                 f"{e}") from None
        self.address = address or "local"
        return True

    @staticmethod
    def _quiet_ray() -> None:
        """No Ray Data progress bars or execution statistics: the CLI draws its own bar."""
        import ray.data

        context = ray.data.DataContext.get_current()
        context.enable_progress_bars = False
        context.enable_operator_progress_bars = False
        context.enable_auto_log_stats = False

    def _present(self, jobs: list[Job]) -> set[str]:
        """The outputs of these jobs that are in the destination now (relative paths); none when it cannot be
        asked."""
        outputs = [path for job in jobs for path in job.outputs]
        try:
            return {self._rel(p) for p, there in zip(outputs, self.dest.present(outputs)) if there}
        except OSError:
            return set()

    def _size(self, joined: bool) -> None:
        """The actor pool from the settings and the cluster's resources; refuse one that cannot run."""
        import ray

        res = ray.cluster_resources()
        cpus, gpus = float(res.get("CPU", 0)), float(res.get("GPU", 0))
        s = self.settings
        gpa = s.gpus_per_actor if s.gpus_per_actor is not None else (1.0 if gpus >= 1 and self.device != "cpu" else 0.0)
        cpa = s.cpus_per_actor if s.cpus_per_actor is not None else 1.0
        actors = s.actors or (max(1, int(gpus // gpa)) if gpa else max(1, int(cpus // (self.threads + 1))))
        self.actors, self.gpus_per_actor, self.cpus_per_actor, self.cpus = actors, gpa, cpa, cpus
        problems = []
        if gpa * actors > gpus:
            problems.append(f"{actors} actor(s) x {gpa:g} GPU need {gpa * actors:g} GPU(s); the cluster has {gpus:g}")
        if cpa * actors + 1 > cpus:
            problems.append(f"{actors} actor(s) x {cpa:g} CPU leave {max(0.0, cpus - cpa * actors):g} of the "
                            f"cluster's {cpus:g} CPUs for decoding images; at least 1 is needed (fewer --actors, "
                            "or --cpus-per-actor 0.5)")
        if problems and not joined:
            raise RayEngineError("; ".join(problems))
        for problem in problems:  # an autoscaling cluster may still add the nodes
            self.on_message(f"vitviz: warning: {problem}; the export waits until the cluster has them")
        ship = s.ship or ("store" if joined else "path")
        self.shipped = "object store" if ship == "store" and self.checkpoint is not None else "path"

    def _recipe(self) -> ModelRecipe:
        import ray

        if self.shipped == "object store" and self.checkpoint is not None:
            files, name = model_files(self.checkpoint)
            return ModelRecipe(self.checkpoint, self.overrides, self._actor_device(), self.spec, self.threads,
                               ray.put(files), name)
        checkpoint = None if self.checkpoint is None else os.path.abspath(self.checkpoint)
        overrides = dict(self.overrides)
        if isinstance(overrides.get("code"), str):  # FILE.py:FACTORY relative to here
            file, _, factory = overrides["code"].rpartition(":")
            overrides["code"] = f"{os.path.abspath(file)}:{factory}" if file else overrides["code"]
        return ModelRecipe(checkpoint, overrides, self._actor_device(), self.spec, self.threads)

    def _actor_device(self) -> str:
        """--device auto: CUDA for actors holding a GPU, else the CPU (a GPU Ray did not give it is not used)."""
        if self.device != "auto":
            return self.device
        return "cuda" if self.gpus_per_actor > 0 else "cpu"

    def _env(self) -> dict[str, Any]:
        """The VITVIZ_* settings of this process (VITVIZ_PACKED changes the numerics) for every task and actor."""
        env = {k: v for k, v in os.environ.items() if k.startswith("VITVIZ_")}
        return {"runtime_env": {"env_vars": env}} if env else {}

    def _dataset(self, todo: list[Job], recipe: ModelRecipe) -> Any:
        """A chunk's two stages: decoding tasks, then the actor pool, over one row per image to do."""
        import ray.data

        rows = [self._row(job) for job in todo]
        # A block per batch: an actor hands back its output a block at a time (`_blocks` takes each as it comes),
        # so the progress moves a batch at a time (bench/ray_progress.py measures what smaller blocks cost).
        per_block = BATCHES_PER_BLOCK * self.plan.batch_size
        blocks = min(len(rows), max(2 * max(1, self.actors), -(-len(rows) // per_block)), 20_000)
        env = self._env()
        gpus = {"num_gpus": self.gpus_per_actor} if self.gpus_per_actor else {}
        # At most as many decoding tasks at once as the CPUs the actors leave, and never the pool's size: Ray Data
        # fuses a map whose cap is the actor pool's (or has none) into the actors, which would then decode too.
        decoders = max(int(self.cpus - self.actors * self.cpus_per_actor), 1)
        decoders = decoders if decoders != self.actors else decoders + 1
        with warnings.catch_warnings():  # Ray's deprecation notes about its own arguments
            warnings.simplefilter("ignore")
            ds = ray.data.from_items(rows, override_num_blocks=blocks)
            ds = ds.map(read_row, fn_kwargs={"spec": self.spec, "plan": self.plan, "dest": self.dest}, num_cpus=1,
                        compute=ray.data.TaskPoolStrategy(size=decoders), **env)
            return ds.map_batches(ExportActor, fn_constructor_kwargs={"recipe": recipe, "plan": self.plan,
                                                                      "dest": self.dest},
                                  batch_size=self.plan.batch_size, batch_format="numpy",
                                  compute=ray.data.ActorPoolStrategy(size=self.actors),
                                  num_cpus=self.cpus_per_actor, **gpus, **env)

    def _blocks(self, ds: Any) -> None:
        """Take each block of finished images as soon as an actor hands it back: blocks are read without Ray
        Data's read-ahead (`iter_rows` waits for the next block before it yields the rows of one, which would
        hold every batch's progress back until the next batch is done)."""
        said: list[warnings.WarningMessage] = []
        blocks = iter(ds.iter_batches(batch_size=None, batch_format="numpy", prefetch_batches=0))
        try:
            with warnings.catch_warnings(record=True) as said:  # type: ignore[assignment]   # Ray Data's own (its executor's thread too)
                warnings.simplefilter("default")
                for block in blocks:
                    keys = list(block)
                    for values in zip(*(block[k].tolist() for k in keys)):
                        self._take(dict(zip(keys, values)))
        finally:
            close = getattr(blocks, "close", None)
            if close is not None:
                close()
            for warning in said:
                if self._logs is None or not self._logs.warning(warning):
                    warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)

    def _row(self, job: Job) -> dict[str, Any]:
        source, stem = self._sources[job.index]
        return {"index": job.index, "source": str(source.path), "read": source.read, "remote": source.remote,
                "sub": source.sub.as_posix(), "stem": stem}

    def _take(self, row: dict[str, Any]) -> None:
        """One image an actor finished: its job, the counts, the worker's record, the progress callback."""
        job = self.jobs[int(row["index"])]
        if job.index in self._reported:  # a retried batch's rows come once; a second report changes nothing
            return
        self._reported.add(job.index)
        job.status, job.error, job.sha256 = row["status"], row["error"], row["sha256"]
        job.written = [self.root / rel for rel in row["written"].split("\n") if rel]
        self.counts[job.status] = self.counts.get(job.status, 0) + 1
        worker = self.workers.setdefault(row["actor"], _Worker(row["node"], row["device"]))
        if row["pid"] not in worker.pids:
            worker.pids.add(row["pid"])
            if row["reconstructed"]:
                worker.restarts += 1
                self.on_message(f"vitviz: a model worker died and Ray restarted it (actor {row['actor'][:12]}, node "
                                f"{row['node'][:12]}, now pid {row['pid']}); its batch was retried")
        worker.images += 1
        self.decoded_in_actors += bool(row["decoded_here"])
        self.on_progress(job)
        if row["fatal"]:
            raise DiskFullError(row["fatal"])

    # -- resume, stop and the record ----------------------------------------------------------------------------

    def _recorded(self) -> dict[str, str]:
        """The previous manifest's images recorded as done or skipped with their hash: path -> sha256 ({} with
        --overwrite or without one)."""
        if self.plan.overwrite:
            return {}
        previous = self.dest.read_json(MANIFEST)
        entries = previous.get("images") if isinstance(previous, dict) else None
        if not isinstance(entries, list):
            return {}
        return {str(e.get("path")): str(e["sha256"]) for e in entries if isinstance(e, dict)
                and e.get("status") in ("done", "skipped") and e.get("sha256")}

    def _skip_recorded(self, jobs: list[Job]) -> None:
        """Skip, without reading them, the images the previous manifest records as done or skipped (with their
        hash) whose outputs are all in the destination (when their chunk began); the rest are checked by the
        decoding tasks as the local engine checks them."""
        for job in jobs:
            sha256 = self._previous.get(str(job.path))
            if sha256 is not None and all(self._rel(p) in self._before for p in job.outputs):
                job.status, job.sha256 = "skipped", sha256
                self.counts["skipped"] += 1
                self.resumed += 1
                self._resumed.add(job.index)
                self.on_progress(job)

    def _rel(self, path: Path) -> str:
        return path.relative_to(self.root).as_posix()

    def _settle(self, jobs: list[Job]) -> None:
        """After a chunk, finished or stopped: its entries say what is on disk (its outputs looked up once).

        - an image no actor reported whose outputs are all there is done (atomic writes leave no partial file),
          and hashed here, so that its entry has its sha256 as every other (a resume trusts it);
        - an image reported skipped whose outputs were not all there when the chunk began is done: a worker that
          was lost after writing them (a node that died) had its batch read and run again, which found them;
        - each image's files written are those it reported and those of its outputs that were not there when the
          chunk began (a lost worker's); the count of files is their sum.
        """
        present = self._present(jobs)
        for job in jobs:
            there = [p for p in job.outputs if self._rel(p) in present]
            new = {p for p in there if self._rel(p) not in self._before}
            complete = bool(job.outputs) and len(there) == len(job.outputs)
            if job.status == "pending":
                job.written = there
                if complete:
                    job.status = "done"
                    self.counts["done"] += 1
                    self._hash(job)
            else:
                if job.status == "skipped" and job.index not in self._resumed and complete and new:
                    job.status = "done"
                    self.counts["skipped"] -= 1
                    self.counts["done"] += 1
                reported = set(job.written)
                job.written = [p for p in job.outputs if p in reported or p in new]
            self.counts["files"] += len(job.written)

    def _hash(self, job: Job) -> None:
        """An image's sha256, read here (a few images: those in flight when the run stopped); left empty when it
        cannot be read (a resume then hashes it again)."""
        source, _stem = self._sources[job.index]
        try:
            if source.remote:
                job.sha256 = hashlib.sha256(fetch(source.read)).hexdigest()
            else:
                check_image_path(Path(source.read))  # a regular file: a FIFO would block the hash
                job.sha256 = sha256_file(Path(source.read))
        except (OSError, VitvizError):
            pass

    def records(self) -> Iterator[dict[str, Any]]:
        """Every image's manifest entry, in order, read back from the spill file (never all held at once)."""
        if self._spill is None:
            return
        self._spill.flush()
        self._spill.seek(0)
        for line in self._spill:
            yield json.loads(line)

    # -- what the CLI shows and records ------------------------------------------------------------------------

    def summary(self, out: Any, seconds: float, interrupted: bool) -> str:
        """The local engine's summary line, naming the engine."""
        actors = f", {self.actors} actor{'s' if self.actors != 1 else ''}" if self.actors else ""
        return summary_line(self.counts, self.total, out, seconds, interrupted, engine=f"on Ray{actors}")

    @property
    def devices(self) -> str:
        """Where the maps were computed: the actors' devices ('' when no actor ran)."""
        return ",".join(sorted({w.device for w in self.workers.values()}))

    def engine_record(self) -> dict[str, Any]:
        """The manifest's 'engine': the cluster, the pool, how the model travelled, every worker and its
        restarts, the images skipped from the previous manifest, the chunks, whether every input was listed."""
        listed_all = getattr(self.sources, "complete", True)
        return {
            "name": "ray", "address": self.address, "actors": self.actors, "gpus_per_actor": self.gpus_per_actor,
            "cpus_per_actor": self.cpus_per_actor, "torch_threads": self.threads, "model_shipped": self.shipped,
            "restarts": sum(w.restarts for w in self.workers.values()), "resumed_from_manifest": self.resumed,
            "decoded_in_actors": self.decoded_in_actors, "log": str(self.log) if self.log else None,
            "chunks": self.chunks, "chunk_images": CHUNK, "listed_all": listed_all,
            "workers": [{"actor": a, "node": w.node, "device": w.device, "pids": sorted(w.pids),
                         "restarts": w.restarts, "images": w.images} for a, w in sorted(self.workers.items())],
        }


def _batched(items: Iterator[Any], n: int) -> Iterator[list[Any]]:
    """Lists of `n` items (the last may hold fewer), taken from `items` as they come."""
    while chunk := list(itertools.islice(items, n)):
        yield chunk

def probe_address(address: str) -> None:
    """Refuse a cluster address whose host does not accept a TCP connection within CONNECT_TIMEOUT seconds (Ray
    would retry for minutes, printing only its own warnings); 'auto' and 'local' are Ray's to read.

    Raises:
        RayEngineError: naming the address, what happened and what was expected.
    """
    found = re.fullmatch(r"(?:ray://)?\[?([^\[\]/]+?)\]?:(\d{1,5})/?", address.strip())
    if found is None:
        return  # 'auto', 'local' or a form Ray itself explains
    host, port = found.group(1), int(found.group(2))
    try:
        socket.create_connection((host, port), timeout=CONNECT_TIMEOUT).close()
    except OSError as e:
        why = "no answer" if isinstance(e, TimeoutError) else (e.strerror or str(e) or type(e).__name__)
        raise RayEngineError(f"cannot join the Ray cluster at {address}: {host}:{port} accepted no connection within "
                             f"{CONNECT_TIMEOUT:g} s ({why}); expected the address of a running cluster's head "
                             "(`ray start --head` prints it; HOST:6379, or ray://HOST:10001 for Ray Client), or no "
                             "--address and no RAY_ADDRESS to start Ray on this computer") from None


def probe_cluster(address: str, timeout: float | None = None) -> None:
    """Refuse, within `timeout` seconds (JOIN_TIMEOUT), a cluster address that accepts connections but does not
    answer as a Ray cluster's GCS: another service on that port, a cluster of another Ray version, or one started
    with token authentication (RAY_AUTH_MODE=token) that refuses this computer's token -- `ray.init` would try
    for about a quarter of an hour, with Ray's warnings only. Ray's own client asks for the cluster's id, in a
    thread (its call cannot be interrupted; it ends by itself later). 'ray://' (Ray Client), 'auto' and 'local'
    are Ray's to read.

    Raises:
        RayEngineError: naming the address, what happened and what was expected.
    """
    found = re.fullmatch(r"\[?([^\[\]/]+?)\]?:(\d{1,5})/?", address.strip())
    if found is None:
        return
    try:
        from ray._raylet import GcsClient
    except ImportError:   # a Ray without this client: its own connection (and its own waiting) then
        return

    timeout = JOIN_TIMEOUT if timeout is None else timeout
    answer: dict[str, Any] = {}

    def ask() -> None:
        try:
            answer["id"] = GcsClient(address=f"{found.group(1)}:{found.group(2)}").cluster_id
        except Exception as e:  # noqa: BLE001 - whatever Ray's client raises is said below
            answer["error"] = e

    asking = threading.Thread(target=ask, name="vitviz-ray-join", daemon=True)
    asking.start()
    asking.join(timeout)
    if "id" in answer:
        return
    why = (f"answered, but not as a Ray cluster this computer may join ({_ray_error(answer['error'])})"
           if "error" in answer else f"did not answer as a Ray cluster within {timeout:g} s")
    token = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")
    has = ("this computer has a token in $RAY_AUTH_TOKEN" if os.environ.get("RAY_AUTH_TOKEN") else
           f"this computer has one in {token}" if token.is_file() else "this computer has none")
    raise RayEngineError(f"cannot join the Ray cluster at {address}: it accepts connections but {why}; expected the "
                         "GCS address of a running Ray cluster (`ray start --head` prints it, HOST:6379) of Ray "
                         f"{_ray_version()}. A cluster started with token authentication (RAY_AUTH_MODE=token) "
                         f"also needs its token here, in ~/.ray/auth_token or $RAY_AUTH_TOKEN ({has})") from None


def _ray_version() -> str:
    import ray

    return str(ray.__version__)


NATIVE_LINE = re.compile(rb"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ [DIWEFC] \d+ \d+\] ")  # Ray's C++ log lines


class NativeLines:
    """What Ray's C++ core writes on this process's standard error (file descriptor 2; an ERROR line when an
    actor's arguments sit in the object store, 'Failed to connect to GCS' warnings...), where no Python logger
    reaches: fd 2 becomes a pipe while Ray runs, and a thread sends the lines in Ray's format
    ('[2026-12-06 11:49:07,171 E 30590 30590] core_worker.cc:2465: ...') to `sink`, everything else (vitviz's
    own lines, the progress bar) on to the terminal as written."""

    def __init__(self, sink: Callable[[bytes], None]) -> None:
        self.sink = sink
        self._saved: int | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        sys.stderr.flush()
        self._saved = os.dup(2)
        read, write = os.pipe()
        os.dup2(write, 2)
        os.close(write)
        self._thread = threading.Thread(target=self._pump, args=(read, self._saved), name="vitviz-ray-stderr",
                                        daemon=True)
        self._thread.start()

    def _pump(self, read: int, terminal: int) -> None:
        pending = b""
        try:
            with os.fdopen(read, "rb", buffering=0) as pipe:
                while chunk := pipe.read(1 << 16):
                    pending += chunk
                    *whole, pending = re.split(rb"(?<=[\r\n])", pending)
                    for part in whole:
                        self._route(part, terminal)
                    if pending and not re.match(rb"\[(\d|$)", pending):   # a bar redrawn without a newline
                        self._route(pending, terminal)
                        pending = b""
                if pending:
                    self._route(pending, terminal)
        except OSError:
            pass  # the terminal went away: nothing left to show

    def _route(self, data: bytes, terminal: int) -> None:
        if NATIVE_LINE.match(data):
            self.sink(data)
        else:
            os.write(terminal, data)

    def stop(self) -> None:
        """fd 2 back to the terminal; the lines still in the pipe are routed first."""
        if self._saved is None:
            return
        sys.stderr.flush()
        os.dup2(self._saved, 2)     # closes the pipe's end the process held: the thread reads to its end
        if self._thread is not None:
            self._thread.join(5.0)  # a process Ray started that kept the pipe open: left to the daemon thread
        if self._thread is None or not self._thread.is_alive():
            os.close(self._saved)
        self._saved, self._thread = None, None


class RayLogs:
    """Ray's own log lines of a run, into a file instead of the terminal (unless --verbose): the Python loggers
    'ray' and 'ray.data' (Ray Data keeps its own ray-data.log too) and the error messages the cluster sends the
    driver (a worker or node that died: tens of lines each, which Ray prints on stdout). vitviz says what they
    mean in a line of its own (a restarted worker, the error that stopped the job, naming the file).

    The file is `LOG_NAME` in Ray's session logs folder (where Ray's other logs are), appended to; everything is
    put back as it was by `stop`.
    """

    def __init__(self, verbose: bool) -> None:
        self.verbose = verbose
        self.path: Path | None = None
        self._handler: logging.Handler | None = None
        self._removed: list[tuple[logging.Logger, logging.Handler]] = []
        self._level = logging.NOTSET
        self._printer: Any = None
        self._native: NativeLines | None = None
        self._early: list[bytes] = []   # Ray's C++ lines from before the file was known

    def capture(self) -> None:
        """Before Ray is joined or started: Ray's C++ lines on stderr to the file (`NativeLines`)."""
        if not self.verbose and self._native is None:
            self._native = NativeLines(self._native_line)
            self._native.start()

    def _native_line(self, data: bytes) -> None:
        if self._handler is None:
            self._early.append(data)
            return
        self._handler.emit(logging.LogRecord("ray.native", logging.WARNING, "", 0,
                                             data.decode("utf-8", "replace").rstrip(), None, None))

    def warning(self, said: warnings.WarningMessage) -> bool:
        """Put a warning Ray raised into the file; False for one that is not Ray's, or with --verbose."""
        if self._handler is None or f"{os.sep}ray{os.sep}" not in (said.filename or ""):
            return False
        self._handler.emit(logging.LogRecord("ray.warnings", logging.WARNING, said.filename, said.lineno,
                                             f"{said.category.__name__}: {said.message}", None, None))
        return True

    @staticmethod
    def verbose_now() -> bool:
        """Whether --verbose (or $VITVIZ_VERBOSE) asks for Ray's lines on the terminal."""
        return os.environ.get(VERBOSE_ENV, "") not in ("", "0")

    def start(self) -> Path | None:
        """Send the lines to the file (Ray is started); its path, or None with --verbose."""
        if self.verbose:
            return None
        import ray._private.worker as ray_worker

        node = getattr(ray_worker, "_global_node", None)
        folder = Path(node.get_logs_dir_path()) if node is not None else Path(tempfile.gettempdir())
        self.path = folder / LOG_NAME
        self._handler = logging.FileHandler(self.path, encoding="utf-8", delay=True)
        self._handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        for name in ("ray", "ray.data"):
            logger = logging.getLogger(name)
            for handler in list(logger.handlers):
                if type(handler) is not logging.FileHandler and isinstance(handler, logging.StreamHandler):
                    logger.removeHandler(handler)
                    self._removed.append((logger, handler))
            logger.addHandler(self._handler)
        self._level = logging.getLogger("ray").level
        logging.getLogger("ray").setLevel(logging.INFO)  # the file takes what the terminal would not
        # The driver's listener of the cluster's error messages prints them with this function (Ray has no
        # public switch for it); they go to the file while the run lasts.
        self._printer = getattr(ray_worker, "print_to_stdstream", None)
        if self._printer is not None:
            ray_worker.print_to_stdstream = self._to_file
        for data in self._early:
            self._native_line(data)
        self._early = []
        return self.path

    def _to_file(self, data: dict[str, Any], ignore_prefix: bool = False) -> None:
        if self._handler is None:
            return
        for line in data.get("lines", []):
            self._handler.emit(logging.LogRecord("ray", logging.WARNING, "", 0, f"({data.get('pid', '')}) {line}",
                                                 None, None))

    def stop(self) -> None:
        """Put Ray's handlers, printer and stderr back; close the file (Ray's C++ lines from a run that never
        reached Ray's session, e.g. a cluster that would not answer, go to `LOG_NAME` in the temporary folder)."""
        if self._native is not None:
            self._native.stop()
            self._native = None
        if self._handler is None and self._early:
            with open(Path(tempfile.gettempdir()) / LOG_NAME, "ab") as early:
                early.writelines(self._early)
            self._early = []
        if self._handler is None:
            return
        import ray._private.worker as ray_worker

        if self._printer is not None:
            ray_worker.print_to_stdstream = self._printer
        for name in ("ray", "ray.data"):
            logging.getLogger(name).removeHandler(self._handler)
        for logger, handler in self._removed:
            logger.addHandler(handler)
        logging.getLogger("ray").setLevel(self._level)
        self._handler.close()
        self._handler, self._removed = None, []


def _torch_threads() -> int:
    """torch's thread count here: the local engine's, which the actors use too (`ModelRecipe.threads`)."""
    import torch

    return torch.get_num_threads()


def _ray_error(error: BaseException) -> str:
    """A Ray exception's cause in one line: the last 'SomeError: message' line of its text (Ray puts the worker's
    traceback there) or of its causes', without Ray's tracebacks."""
    texts = []
    cause: BaseException | None = error
    while cause is not None and len(texts) < 10:
        texts.append(str(cause))
        cause = getattr(cause, "cause", None) or cause.__cause__
    lines = [line.strip() for text in texts for line in text.splitlines()]
    found = [line for line in lines if re.match(r"^[\w.]*(Error|Exception|Interrupt)\b.*: ", line)]
    if found:
        kind, _, message = found[-1].partition(": ")
        return f"{kind.rsplit('.', 1)[-1]}: {message}"[:500]
    return (next((line for line in reversed(lines) if line), "") or type(error).__name__)[:500]
