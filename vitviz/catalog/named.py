"""Named models: `torchvision:ARCH[:WEIGHTS]` (parsed against torchvision's Weights enums, found in the torch hub
cache, or downloaded there) and the hub names `hf:ORG/NAME[@REVISION]` / `timm:NAME[.TAG]` (`vitviz.catalog.hub`).

Qt-free; torchvision is imported only when a name is looked up. The network is touched only by `resolve_named`
(and `resolve_model_arg` given a name), and only when the named file is not cached yet. Everything here is
importable from `vitviz.catalog` as well.
"""
from __future__ import annotations

import errno
import hashlib
import http.client
import os
import secrets
import re
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from vitviz.catalog.dirs import torch_hub_dir
from vitviz.catalog.hub import cached_hub, check_hub_name, is_hub_name, resolve_hub
from vitviz.errors import VitvizError

Progress = Callable[[int, "int | None"], None]   # (bytes done, total bytes or None)

NAMED_PREFIX = "torchvision:"
TORCHVISION_ARCHS = ("vit_b_16", "vit_b_32", "vit_l_16", "vit_l_32", "vit_h_14")
_CHUNK = 1 << 20


class DownloadError(VitvizError):
    """A named model is not cached and could not be downloaded."""


def is_named_model(text: str) -> bool:
    """Whether `text` names a model (`torchvision:...`, `hf:...`, `timm:...`) rather than a path."""
    return str(text).startswith(NAMED_PREFIX) or is_hub_name(str(text))


def check_model_name(text: str) -> str:
    """A model name's syntax checked without importing torch or touching the network -- for a hub name its
    repository and revision (`vitviz.catalog.hub.check_hub_name`: a revision that could lead out of the cache is
    refused here), for a torchvision name its architecture; `text` stripped of surrounding spaces. The window's
    Models > Open by name checks with this before asking the worker; `resolve_named` checks the same again.

    Raises:
        VitvizError: text that is no model name (HubError for a bad hub name), naming what was expected.
    """
    text = str(text).strip()
    if is_hub_name(text):
        check_hub_name(text)
        return text
    parts = text.split(":")
    if parts[0] + ":" == NAMED_PREFIX and len(parts) in (2, 3) and parts[1] in TORCHVISION_ARCHS:
        if len(parts) == 2 or re.fullmatch(r"[A-Za-z0-9_]*", parts[2], re.ASCII):
            return text   # whether torchvision has these weights is looked up when the name is resolved
        raise VitvizError(f"{text[:120]!r}: weights {parts[2][:60]!r} are no name of torchvision's weights; "
                          f"expected torchvision:{parts[1]}:WEIGHTS such as IMAGENET1K_V1, or DEFAULT")
    if parts[0] + ":" == NAMED_PREFIX:
        lookup_named(text)   # refuses the architecture (before importing torchvision), naming the known ones
    raise VitvizError(f"{text[:120]!r}: not a model name; expected hf:ORG/NAME[@REVISION], timm:NAME[.TAG] or "
                      f"torchvision:ARCH[:WEIGHTS] with ARCH one of {', '.join(TORCHVISION_ARCHS)}")


def named_models() -> list[str]:
    """Every torchvision ViT and weights variant as a name, e.g. 'torchvision:vit_b_16:IMAGENET1K_V1'."""
    from torchvision.models import vision_transformer as tv

    names = []
    for arch in TORCHVISION_ARCHS:
        enum = getattr(tv, _enum_name(arch))
        names += [f"{NAMED_PREFIX}{arch}:{w.name}" for w in enum]
    return names


def _enum_name(arch: str) -> str:
    return arch.upper().replace("VIT", "ViT") + "_Weights"


@dataclass(frozen=True)
class NamedWeights:
    """What a named model resolves to before any download."""

    name: str        # canonical 'torchvision:ARCH:WEIGHTS'
    url: str
    file_name: str
    num_params: int


def lookup_named(text: str) -> NamedWeights:
    """Parse `torchvision:ARCH[:WEIGHTS]` against torchvision's Weights enums; raises VitvizError if unknown."""
    parts = str(text).split(":")
    if parts[0] + ":" != NAMED_PREFIX or len(parts) not in (2, 3) or parts[1] not in TORCHVISION_ARCHS:
        raise VitvizError(f"{text!r}: unknown model name; expected torchvision:ARCH[:WEIGHTS] with ARCH one of "
                          f"{', '.join(TORCHVISION_ARCHS)} (e.g. torchvision:vit_b_16:IMAGENET1K_V1)")
    from torchvision.models import vision_transformer as tv

    enum = getattr(tv, _enum_name(parts[1]))
    wanted = parts[2].upper() if len(parts) == 3 and parts[2] else "DEFAULT"
    try:
        weights = enum[wanted]
    except KeyError:
        choices = ", ".join(w.name for w in enum)
        raise VitvizError(f"{text!r}: {parts[1]} has no weights {wanted!r}; expected one of {choices} "
                          "or DEFAULT") from None
    return NamedWeights(f"{NAMED_PREFIX}{parts[1]}:{weights.name}", weights.url, weights.url.split("/")[-1],
                        int(weights.meta.get("num_params", 0)))


def cached_named(text: str, cache_dir: Path | None = None) -> Path | None:
    """The cached file of a named model, or None when it has not been downloaded (or the cache folder cannot
    be read: `resolve_named` then says why). For a hub name: its cached model folder."""
    if is_hub_name(text):
        return cached_hub(text, cache_dir)
    nw = lookup_named(text)
    return _cached((torch_hub_dir() if cache_dir is None else Path(cache_dir)) / nw.file_name)


def _cached(path: Path) -> Path | None:
    try:
        return path if path.is_file() and path.stat().st_size > 0 else None
    except OSError:
        return None


def resolve_named(text: str, cache_dir: Path | None = None, progress: Progress | None = None,
                  url: str | None = None, check_hash: bool = True, timeout: float = 30.0,
                  offline: bool | None = None) -> Path:
    """The local file of a named model: the cached one, else downloaded into the cache first.

    Args:
        text: 'torchvision:vit_b_16' or 'torchvision:vit_b_16:IMAGENET1K_SWAG_E2E_V1'; a hub name
            ('hf:ORG/NAME[@REVISION]', 'timm:NAME[.TAG]') resolves to its model folder (`vitviz.catalog.hub`).
        cache_dir: where to look and download to (default: the torch hub checkpoints folder; for hub names the
            Hugging Face cache).
        progress: called as progress(done_bytes, total_bytes_or_None) while downloading.
        url: download from here instead of torchvision's URL (a mirror, or a file:// URL in tests); the
            file still gets torchvision's name.
        check_hash: compare the SHA-256 prefix in torchvision's file name (`-c867db91.pth`) with the data.
        timeout: seconds each socket operation of a torchvision download may take. A hub name waits for the hub at
            most `$VITVIZ_HUB_TIMEOUT` (default 30) seconds in all (`vitviz.catalog.hub.resolve_hub`), and its
            revision is checked before anything is asked of the hub.
        offline: use only the cache. Default: `$HF_HUB_OFFLINE` for hub names (as huggingface_hub does);
            a torchvision name is downloaded unless `offline` is True.

    Raises:
        DownloadError: offline, failed, cut short or damaged download, naming the file, its URL and the folder
            to put it in; or the file could not be written there (disk full, no permission), naming the folder
            and the operating system's error. Nothing is left under the file's name then.
    """
    if is_hub_name(text):   # a model folder in the Hugging Face cache
        return resolve_hub(text, cache_dir=cache_dir, progress=progress, offline=offline)
    nw = lookup_named(text)
    folder = torch_hub_dir() if cache_dir is None else Path(cache_dir)
    dest = folder / nw.file_name
    if _cached(dest) is not None:
        return dest
    if offline:
        raise DownloadError(f"{nw.name}: {nw.file_name} is not in {folder}, and offline only the cache is used "
                            f"(download it once online, or put the file there: {nw.url})")
    _download(url or nw.url, dest, progress, timeout, _sha256_prefix(dest.name) if check_hash else "")
    return dest


def resolve_model_arg(text: str, progress: Progress | None = None, offline: bool | None = None) -> str:
    """A model argument as something `vitviz.core.running.load` reads: named models resolved, paths unchanged.

    The one resolution of names: `vitviz.load`, the commands (`vitviz.cli.models.resolve_cli_model`) and the window
    all come here, so a name means the same file everywhere (same cache, revisions, offline rules).
    """
    if not is_named_model(text):
        return text
    if is_hub_name(text):
        check_model_name(text)   # a malformed name or revision is refused before anything is asked of the hub
    return str(resolve_named(text, progress=progress, offline=offline))


def _sha256_prefix(file_name: str) -> str:
    """The SHA-256 prefix torch hub puts in a file name ('vit_b_16-c867db91.pth' -> 'c867db91'), else ''."""
    m = re.search(r"-([0-9a-f]{6,})\.[a-z]+$", file_name)
    return m.group(1) if m else ""


class _LocalWriteError(Exception):
    """An OSError writing the downloaded file on this computer (not the network's fault)."""

    def __init__(self, error: OSError) -> None:
        super().__init__(error)
        self.error = error


def _download(url: str, dest: Path, progress: Progress | None, timeout: float, sha256_prefix: str = "") -> None:
    """Stream `url` into a `.partial` file, and give it `dest`'s name only once it is complete (as long as the
    Content-Length said) and its SHA-256 starts with `sha256_prefix`: a failed, interrupted (Ctrl-C included)
    or damaged download leaves nothing behind, and never a file under the final name.

    The `.partial` file is created before the network is touched, so a cache folder that cannot be written is
    reported at once, as a local problem, not as a failed download."""
    # one temporary file per download: two downloads of the same model at once must not write into one file
    tmp = dest.with_name(f"{dest.name}.{os.getpid()}-{secrets.token_hex(4)}.partial")
    try:
        try:
            try:
                dest.parent.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise _LocalWriteError(e) from e
            done, total, sha256 = _stream(url, tmp, progress, timeout)
        except _LocalWriteError as e:
            raise _local_error(dest, e.error) from e.error
        except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException) as e:
            reason = getattr(e, "reason", None) or e
            raise DownloadError(
                f"{dest.name} is not in {dest.parent} and could not be downloaded from {url} ({reason}). "
                f"Download it on a computer with internet access and put it in {dest.parent}, "
                "then open it again (or open the file directly)") from e
        if total is not None and done != total:
            raise DownloadError(f"{dest.name}: the download from {url} stopped after {done:,} of {total:,} bytes "
                                f"and was not kept. Try again, or put the file in {dest.parent}")
        if not sha256.startswith(sha256_prefix):
            raise DownloadError(f"{dest.name}: the data downloaded from {url} has SHA-256 {sha256[:12]}..., "
                                f"expected {sha256_prefix}... (from the file name); the download was damaged or is "
                                f"not this file, and was not kept. Try again, or put the right file in "
                                f"{dest.parent}")
        try:
            os.replace(tmp, dest)
        except OSError as e:
            raise _local_error(dest, e) from e
    except BaseException:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass   # the folder cannot be written to or read: there is no .partial file either
        raise


_NO_SPACE = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC), errno.EFBIG}
_NO_PERMISSION = {errno.EACCES, errno.EPERM, errno.EROFS}


def _local_error(dest: Path, e: OSError) -> DownloadError:
    """The message for an OSError saving a download on this computer: the folder, the system's error and what
    to do about it (it is not a network problem, so no advice to download elsewhere)."""
    what = f"{e.strerror or e}" + (f": {os.fsdecode(e.filename)}" if isinstance(e.filename, (str, bytes, os.PathLike))
                                   else "")
    where = "set TORCH_HOME to a folder you can write to (the file goes in $TORCH_HOME/hub/checkpoints)"
    if e.errno in _NO_SPACE:
        advice = f"Free space on the disk that holds {dest.parent}, or {where} on a disk with room"
    elif e.errno in _NO_PERMISSION:
        advice = f"Make {dest.parent} writable, or {where}"
    else:
        advice = f"Check {dest.parent} (it must be a folder you can write to), or {where}"
    return DownloadError(f"{dest.name} could not be saved in {dest.parent} on this computer ({what}); nothing was "
                         f"kept. {advice}, then try again")


def _stream(url: str, tmp: Path, progress: Progress | None, timeout: float) -> tuple[int, int | None, str]:
    """Copy `url` into `tmp`: (bytes received, the Content-Length or None, their SHA-256 hex digest).

    OSErrors creating, writing or closing `tmp` come out as _LocalWriteError; any other error is the network's
    (or the source's)."""
    digest = hashlib.sha256()
    try:
        out = open(tmp, "xb")
    except OSError as e:
        raise _LocalWriteError(e) from e
    complete = False
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            length = response.headers.get("Content-Length")
            total = int(length) if length and length.isdigit() else None
            done = 0
            if progress:
                progress(0, total)
            while chunk := response.read(_CHUNK):
                try:
                    out.write(chunk)
                except OSError as e:
                    raise _LocalWriteError(e) from e
                digest.update(chunk)
                done += len(chunk)
                if progress:
                    progress(done, total)
        complete = True
    finally:
        try:
            out.close()
        except OSError as e:   # the last buffered bytes could not be written (disk full)
            if complete:
                raise _LocalWriteError(e) from e
    return done, total, digest.hexdigest()
