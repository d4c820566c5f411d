"""Models by name from the Hugging Face Hub: `hf:ORG/NAME[@REVISION]` and timm's hub names `timm:NAME[.TAG]`.

A name resolves to a model folder in the shared Hugging Face cache (the one transformers, timm and open_clip use),
through `huggingface_hub` — which already does what this needs (revisions, the cache layout, resumable downloads,
`HF_HOME`/`HF_HUB_CACHE`/`HF_ENDPOINT`, offline mode with `HF_HUB_OFFLINE=1`), so vitviz does not write its own.
As huggingface_hub (and so transformers and timm) does: online, a branch or tag is asked of the hub again
(`hf_hub_download` re-resolves the ref; a file of the same commit is not downloaded again), so a cached `main`
follows the repository; a commit hash, offline mode or a hub that cannot be reached use the cache as it is. Only
configuration and weight files are fetched, never code; a download is written under a temporary name and moved
into the cache when complete.

    folder = resolve_hub("hf:facebook/dinov2-small")                      # -> .../snapshots/<commit>/
    folder = resolve_hub("timm:vit_small_patch14_reg4_dinov2.lvd142m")   # the repository timm/<name>
    model = vitviz.load(folder)

Qt-free and torch-free; `huggingface_hub` is imported only when a name is resolved.
"""
from __future__ import annotations

import json
import math
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vitviz.catalog.dirs import hf_hub_dir
from vitviz.core.formats import HUB_WEIGHT_NAMES
from vitviz.errors import VitvizError

Progress = Callable[[int, "int | None"], None]   # (bytes done, total bytes or None)

HUB_PREFIXES = ("hf:", "timm:")
CONFIG_FILES = ("config.json", "preprocessor_config.json", "open_clip_config.json")
# The most seconds one resolve waits for the hub's answers in all (its metadata requests and each download's
# first bytes; time while bytes arrive does not count): `timeout=`, else $VITVIZ_HUB_TIMEOUT, else this.
DEFAULT_TIMEOUT = 30.0
TIMEOUT_ENV = "VITVIZ_HUB_TIMEOUT"
MAX_REVISION = 200   # characters; a branch, tag, `refs/pr/N` or a commit hash is far shorter
TICK = 0.05          # seconds between looks at a running hub request (progress, Cancel, the time limit)
# A repository name part as huggingface_hub and the hub accept it: ASCII letters, digits, '_', '-', '.', 1-96
# characters, starting and ending with a letter, digit or '_'.
_REPO_PART = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,94}[A-Za-z0-9_])?", re.ASCII)
_TIMM_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*(\.[A-Za-z0-9_-]+)?", re.ASCII)
# One '/'-separated section of a revision: a branch or tag name part, `pr`, a number, a commit hash.
_REVISION_PART = re.compile(r"[A-Za-z0-9_+-][A-Za-z0-9_.+-]*", re.ASCII)
_SHARD = re.compile(r"[A-Za-z0-9_.-]+\.(safetensors|bin)", re.ASCII)
REVISION_EXPECTED = ("a branch, tag or commit: ASCII letters, digits and . _ - + in sections separated by '/' "
                     f"(as in refs/pr/1), at most {MAX_REVISION} characters, no '..' and no section starting with "
                     "'.'")


class HubError(VitvizError):
    """A hub name is malformed, the repository or a file is missing, or it could not be downloaded."""


@dataclass(frozen=True)
class HubName:
    """A parsed hub name: the repository and revision it points to."""

    text: str            # as the user wrote it
    repo_id: str         # ORG/NAME on the hub
    revision: str | None


def is_hub_name(text: object) -> bool:
    """Whether `text` is a hub name (`hf:...` or `timm:...`) rather than a path."""
    return isinstance(text, str) and text.startswith(HUB_PREFIXES)


def _odd_characters(text: str) -> str:
    """'a line break', 'a non-ASCII character 'é'', ... for the first character of `text` no hub name has, or ''."""
    for ch in text:
        if ch in "\r\n":
            return "a line break"
        if ch == "\x00" or not ch.isprintable():
            return f"a control character {ch!r}"
        if ord(ch) > 127:
            return f"a non-ASCII character {ch!r}"
        if ch.isspace():
            return "a space"
        if ch == "\\":
            return "a backslash"
    return ""


def revision_problem(revision: str) -> str:
    """What makes `revision` unusable as a hub revision -- one that could name a file outside the cache (`..`, an
    absolute path, a backslash), or that is no branch, tag or commit -- in words; '' when it is fine.

    huggingface_hub writes `refs/<revision>` in the cache after asking the hub, so this is checked before it is
    called (a 404 carrying X-Repo-Commit is enough for the write)."""
    if not isinstance(revision, str) or not revision:
        return "is empty"
    odd = _odd_characters(revision)
    if odd:
        return f"holds {odd}"
    if len(revision) > MAX_REVISION:
        return f"is {len(revision)} characters long"
    if revision.startswith("/") or revision.endswith("/"):
        return "starts or ends with '/' (an absolute path?)"
    if ".." in revision:
        return "holds '..' (it could lead out of the cache folder)"
    for part in revision.split("/"):
        if not part:
            return "holds '//'"
        if part.startswith("."):
            return f"has a section {part!r} starting with '.'"
        if part.endswith(".lock"):
            return f"has a section {part!r} ending with '.lock'"
        if not _REVISION_PART.fullmatch(part):
            bad = next((c for c in part if not (c.isalnum() or c in "._+-")), part[:1])
            return f"holds {bad!r}"
    return ""


def check_revision(text: str, revision: str) -> str:
    """`revision` of the hub name `text`, refused unless it is a plain branch, tag or commit (see
    `revision_problem`); nothing has been asked of the hub or written anywhere yet.

    Raises:
        HubError: naming the name, the revision, what is wrong with it and what was expected.
    """
    problem = revision_problem(revision)
    if problem:
        shown = revision if len(revision) <= 80 else revision[:80] + "..."
        raise HubError(f"{text[:120]!r}: revision {shown!r} {problem}; expected {REVISION_EXPECTED}")
    return revision


def repo_problem(repo: str) -> str:
    """What makes `repo` (ORG/NAME) no repository name the hub has, in words, by huggingface_hub's own rules
    (so its HFValidationError never reaches the user); '' when it is fine."""
    odd = _odd_characters(repo)
    if odd:
        return f"holds {odd}"
    parts = repo.split("/")
    if len(parts) != 2:
        return "is not ORG/NAME (one '/')"
    for part in parts:
        if len(part) > 96:
            return f"has a part of {len(part)} characters (at most 96)"
        if not _REPO_PART.fullmatch(part):
            if part and part[0] in ".-" or part and part[-1] in ".-":
                return f"has a part {part!r} starting or ending with '.' or '-'"
            return f"has a part {part!r} that is not letters, digits, '_', '-' and '.'"
    if "--" in repo:
        return "holds '--'"
    if ".." in repo:
        return "holds '..'"
    if repo.endswith(".git"):
        return "ends with '.git'"
    return ""


def check_hub_name(text: str) -> tuple[str, str, str | None]:
    """The syntax of a hub name, checked without importing anything or touching the network: ('hf' or 'timm',
    the repository or timm name, the revision or None). The window checks a name with this before it asks the
    worker for it; `parse_hub_name` starts with it.

    Raises:
        HubError: naming what is wrong and what was expected.
    """
    if not isinstance(text, str):
        raise HubError(f"{text!r}: expected a hub name string hf:ORG/NAME[@REVISION] or timm:NAME[.TAG]")
    body, at, revision = text.partition("@")
    if at and not revision:
        raise HubError(f"{text!r}: empty revision after '@'; expected e.g. hf:ORG/NAME@main or @<commit>")
    if at:
        check_revision(text, revision)
    if body.startswith("hf:"):
        repo = body[3:]
        problem = repo_problem(repo)
        if problem:
            raise HubError(f"{text!r}: the repository name {repo!r} {problem}; expected hf:ORG/NAME[@REVISION] "
                           "(ASCII letters, digits, '_', '-' and '.', e.g. hf:facebook/dinov2-small)")
        return "hf", repo, revision or None
    if body.startswith("timm:"):
        name = body[5:]
        if not _TIMM_NAME.fullmatch(name) or repo_problem(f"timm/{name}"):
            why = repo_problem(f"timm/{name}") or "is not NAME[.TAG]"
            raise HubError(f"{text!r}: the timm name {name!r} {why.replace('has a part', 'has')}; expected "
                           "timm:NAME[.TAG], e.g. timm:vit_small_patch14_reg4_dinov2.lvd142m")
        return "timm", name, revision or None
    raise HubError(f"{text!r}: expected a hub name hf:ORG/NAME[@REVISION] or timm:NAME[.TAG]")


def parse_hub_name(text: str) -> HubName:
    """`hf:ORG/NAME[@REVISION]` or `timm:NAME[.TAG][@REVISION]` -> HubName; HubError says what was expected."""
    kind, name, revision = check_hub_name(text)
    if kind == "hf":
        return HubName(text, name, revision)
    if "." not in name:
        name = _timm_default_tag(name, text)
    return HubName(text, f"timm/{name}", revision)


def _timm_default_tag(name: str, text: str) -> str:
    """timm's default pretrained tag for an architecture (needs timm installed; the hub repository is NAME.TAG)."""
    try:
        import timm
    except ImportError:
        raise HubError(f"{text!r}: timm's hub repositories are named NAME.TAG; give the tag "
                       f"(e.g. timm:{name}.augreg_in21k_ft_in1k), or install timm to use its default tag") from None
    try:
        cfg = timm.models.get_pretrained_cfg(name)
    except Exception:  # noqa: BLE001 - timm raises several types for unknown names
        cfg = None
    hub_id = getattr(cfg, "hf_hub_id", None) if cfg is not None else None
    if not hub_id or not str(hub_id).startswith("timm/") or repo_problem(str(hub_id)):
        raise HubError(f"{text!r}: timm has no pretrained weights on the hub for {name!r}; expected a name from "
                       "timm.list_pretrained(), e.g. timm:vit_base_patch16_224.augreg2_in21k_ft_in1k")
    return str(hub_id)[len("timm/"):]


def hub_timeout(value: Any = None) -> float:
    """The most seconds a resolve waits for the hub in all: `value`, else $VITVIZ_HUB_TIMEOUT, else
    DEFAULT_TIMEOUT.

    Raises:
        HubError: a value (or the variable) that is not a number of seconds > 0.
    """
    where = "timeout"
    if value is None:
        value, where = os.environ.get(TIMEOUT_ENV) or DEFAULT_TIMEOUT, TIMEOUT_ENV
    try:
        seconds = float(value) if not isinstance(value, bool) else math.nan
    except (TypeError, ValueError):
        seconds = math.nan
    if not math.isfinite(seconds) or seconds <= 0:
        raise HubError(f"{where} {value!r}: expected a number of seconds > 0 (the most vitviz waits for the hub)")
    return seconds


VERBOSE_ENV = "VITVIZ_VERBOSE"   # set (the commands' --verbose): huggingface_hub's own messages are shown


def quiet_hub_library() -> None:
    """Keep huggingface_hub's own log lines and progress bars out of the terminal (vitviz says what happens, with
    its own progress), unless $VITVIZ_VERBOSE is set."""
    if _env_flag(VERBOSE_ENV):
        return
    from huggingface_hub.utils import disable_progress_bars, logging as hub_logging

    hub_logging.set_verbosity_error()
    disable_progress_bars()


def resolve_hub(text: str, cache_dir: Path | None = None, progress: Progress | None = None,
                endpoint: str | None = None, offline: bool | None = None, timeout: float | None = None) -> Path:
    """The local model folder of a hub name: its cached files, else downloaded into the Hugging Face cache.

    Args:
        text: `hf:ORG/NAME[@REVISION]` or `timm:NAME[.TAG][@REVISION]`.
        cache_dir: the hub cache (default: `$HF_HUB_CACHE`, `$HF_HOME/hub` or ~/.cache/huggingface/hub).
        progress: called as progress(done_bytes, total_bytes_or_None) while the hub is asked and a file
            downloads -- also about every 0.05 s with the same values while the hub has not answered yet -- ;
            an exception it raises cancels at once (the request still running is abandoned and stops at its next
            chunk; nothing partial is left under a final name).
        endpoint: the hub's address (default: `$HF_ENDPOINT`, else huggingface.co).
        offline: use only the cache (default: `$HF_HUB_OFFLINE` or `$TRANSFORMERS_OFFLINE`). Online, a branch or
            tag is re-resolved by the hub (a cached `main` follows the repository); a commit hash is not asked.
        timeout: the most seconds to wait for the hub's answers in all -- its metadata requests and each
            download's first bytes; time while bytes arrive does not count (default: `$VITVIZ_HUB_TIMEOUT`, else
            30).

    Raises:
        HubError: malformed name or revision (before the hub is asked); missing or gated repository, revision or
            weights; offline, unreachable, failing (HTTP 5xx) or silent hub, or a failed download -- naming the
            repository, the files, the cache folder and, for a wait, how long it waited.
    """
    cache = Path(cache_dir) if cache_dir is not None else hf_hub_dir()
    offline = hub_offline() if offline is None else offline
    if offline:
        _refuse_uncached_timm(text, cache)
    name = parse_hub_name(text)
    quiet_hub_library()
    endpoint = endpoint or os.environ.get("HF_ENDPOINT") or None
    fetch = _Fetcher(name, cache, progress, endpoint, offline, hub_timeout(timeout) if not offline else 0.0)
    try:
        weights = None
        for file in HUB_WEIGHT_NAMES:
            weights = fetch(file)
            if weights is not None:
                break
        if weights is None:
            fetch.fail_no_weights()
        for file in CONFIG_FILES:
            fetch(file)
        if weights.name.endswith(".index.json"):
            for shard in _tower_shards(weights, _shards(weights, text)):
                if fetch(shard) is None:
                    raise HubError(f"{text}: shard {shard} listed in {weights.name} is missing from {name.repo_id}"
                                   + (f" ({fetch.failure})" if fetch.failure else ""))
    finally:
        fetch.close()
    return weights.parent


def _refuse_uncached_timm(text: str, cache: Path) -> None:
    """Offline, a timm name with no tag whose architecture has no repository in the cache at all fails at once:
    finding timm's default tag means importing timm (seconds), and no tag could be in the cache anyway."""
    kind, name, _revision = check_hub_name(text)
    if kind != "timm" or "." in name or any(cache.glob(f"models--timm--{name}.*")):
        return
    raise HubError(f"{text}: offline (HF_HUB_OFFLINE is set) and no timm/{name}.TAG repository is in the cache "
                   f"{cache}; expected its weights there -- download it once with a network, or copy the repository "
                   "folder into that cache")


def cached_hub(text: str, cache_dir: Path | None = None) -> Path | None:
    """The cached model folder of a hub name (its weights are in the cache), or None; never touches the network."""
    try:
        resolved = resolve_hub(text, cache_dir=cache_dir, offline=True)
    except HubError:
        return None
    return resolved


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def hub_offline() -> bool:
    """huggingface_hub's offline mode: `$HF_HUB_OFFLINE`, or the legacy `$TRANSFORMERS_OFFLINE`, set."""
    return _env_flag("HF_HUB_OFFLINE") or _env_flag("TRANSFORMERS_OFFLINE")


def is_commit(revision: str | None) -> bool:
    """Whether a revision is a full commit hash (it never moves: the cache is used without asking the hub)."""
    return bool(revision) and re.fullmatch(r"[0-9a-f]{40}", revision or "") is not None


def _shards(index: Path, text: str) -> list[str]:
    """The shard files of a sharded checkpoint's index; names must be plain files of the same folder."""
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map")
    except (OSError, ValueError, AttributeError, RecursionError) as e:
        raise HubError(f"{text}: {index.name} is not a readable shard index ({e})") from None
    if not isinstance(weight_map, dict):
        raise HubError(f"{text}: {index.name} has no 'weight_map' object")
    shards = sorted({str(v) for v in weight_map.values()})
    bad = [s for s in shards if not _SHARD.fullmatch(s) or ".." in s]
    if bad:
        raise HubError(f"{text}: {index.name} names shard files outside the model folder or of another kind: "
                       f"{', '.join(repr(b) for b in bad[:3])}; expected plain *.safetensors / *.bin names")
    return shards


def _tower_shards(index: Path, shards: list[str]) -> list[str]:
    """The shards a sharded model needs: of a composite model whose config.json names a vision tower vitviz reads
    alone (`vitviz.core.reading.towers`), only those holding the tower's tensors -- a VLM's language model is never
    downloaded; of a model its config.json already refuses, none (opening it says why); of any other, all."""
    from vitviz.core.reading.towers import identify
    from vitviz.errors import CompositeModelError

    try:
        config = json.loads((index.parent / "config.json").read_text(encoding="utf-8"))
        tower = identify(config, str(index.parent / "config.json"))
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
    except CompositeModelError:
        return []
    except (OSError, ValueError, KeyError, TypeError, RecursionError, VitvizError):
        return shards   # no tower to narrow to: the load says what the model is
    if tower is None:
        return shards
    wanted = {str(v) for k, v in weight_map.items() if tower.wants(str(k))}
    return [s for s in shards if s in wanted] or shards


class _Aborted(Exception):
    """Raised inside an abandoned hub request (cancelled, or past the time limit) at its next progress step."""


class _Fetcher:
    """One file of the repository at a time: from the cache, else downloaded; None when the repository lacks it.

    Every network call runs in a daemon thread that this one waits for, `TICK` by `TICK`: so the progress callback
    (which may cancel) is called while the hub is silent, and the total wait is bounded by `timeout`. A failure
    to reach the hub (`failure`, in words) makes every later file come from the cache only."""

    def __init__(self, name: HubName, cache: Path, progress: Progress | None, endpoint: str | None,
                 offline: bool, timeout: float) -> None:
        self.name, self.cache, self.progress, self.endpoint, self.offline = name, cache, progress, endpoint, offline
        self.timeout, self.waited = timeout, 0.0
        self.unreachable: list[str] = []
        self.failure = ""                       # why the hub could not be used, in words
        self.abort = threading.Event()          # set: every running request stops at its next progress step
        self._done: int = 0
        self._total: int | None = None
        self._flowing = False                   # bytes of the current file are arriving (the clock stops)
        self._answered = False                  # the hub answered the current file's download request

    @property
    def where(self) -> str:
        import huggingface_hub as hh

        return (self.endpoint or hh.constants.ENDPOINT).rstrip("/")

    def close(self) -> None:
        self.abort.set()

    def __call__(self, file: str) -> Path | None:
        import huggingface_hub as hh
        from huggingface_hub import errors

        try:
            cached = hh.try_to_load_from_cache(self.name.repo_id, file, cache_dir=str(self.cache),
                                               revision=self.name.revision)
        except errors.HFValidationError as e:
            raise HubError(f"{self.name.text}: huggingface_hub refuses the name {self.name.repo_id!r} ({e}); "
                           "expected hf:ORG/NAME[@REVISION]") from None
        from_cache = Path(cached) if isinstance(cached, str) else None  # None also: the cache records no such file
        if self.offline or self.unreachable or (cached is not None and is_commit(self.name.revision)):
            if cached is None:   # offline, or the hub already failed once: the cache only
                self.unreachable.append(file)
            return from_cache
        try:   # online: the hub resolves the branch or tag again (a moved one brings its commit's files)
            self._wait(file, lambda: self._metadata(file))
            return Path(self._wait(file, lambda: self._download(file)))
        except _HubDown as e:   # past the time limit: the cache only from now on
            self.failure = str(e)
            self.unreachable.append(file)
            return from_cache
        except _CallFailed as failed:
            found = self._failed(failed.error, file)
            return from_cache if found is None and self.unreachable and cached is not None else found

    def _failed(self, error: BaseException, file: str) -> None:
        """What a failed request means: None for a file the repository lacks or a hub that is down (recorded:
        the cache only from now on); HubError for the rest, naming the repository and what went wrong."""
        from huggingface_hub import errors

        text, repo = self.name.text, self.name.repo_id
        if isinstance(error, (HubError, KeyboardInterrupt, SystemExit)):
            raise error
        if isinstance(error, _HubDown):
            self.failure = str(error)
            self.unreachable.append(file)
            return None
        if isinstance(error, errors.LocalEntryNotFoundError):   # huggingface_hub could not reach the hub
            cause = error.__cause__ or error.__context__
            self.failure = f"the hub at {self.where} could not be reached" + (
                f" ({_network_words(cause)})" if cause is not None else "")
            self.unreachable.append(file)
            return None
        if isinstance(error, errors.EntryNotFoundError):
            return None
        if isinstance(error, errors.GatedRepoError):
            raise HubError(f"{text}: {repo} is gated: accept its terms on the hub and log in (`hf auth login`), "
                           "then try again") from None
        if isinstance(error, errors.RepositoryNotFoundError):
            raise HubError(f"{text}: no repository {repo} on the hub (or it is private; log in with "
                           "`hf auth login`)") from None
        if isinstance(error, errors.RevisionNotFoundError):
            raise HubError(f"{text}: {repo} has no revision {self.name.revision!r}") from None
        if isinstance(error, errors.HfHubHTTPError):
            raise HubError(f"{text}: the hub at {self.where} answered {_status(error)} for {file} of {repo}") \
                from None
        if isinstance(error, errors.HFValidationError):
            raise HubError(f"{text}: huggingface_hub refuses the repository {repo!r} (revision "
                           f"{self.name.revision!r}): {error}; expected hf:ORG/NAME[@REVISION]") from None
        if isinstance(error, errors.OfflineModeIsEnabled):
            self.failure = "offline (huggingface_hub's offline mode is on)"
            self.unreachable.append(file)
            return None
        if _network_kind(error):
            raise HubError(f"{text}: downloading {file} of {repo} from {self.where} failed: "
                           f"{_network_words(error)}; try again (what arrived is kept for the next try)") from None
        if isinstance(error, OSError):
            if _is_network_error(error):
                self.failure = f"the hub at {self.where} could not be reached ({error})"
                self.unreachable.append(file)
                return None
            raise HubError(f"{text}: could not write {file} into {self.cache}: {error}") from None
        raise HubError(f"{text}: downloading {file} of {repo} from {self.where} failed: "
                       f"{_network_words(error)} (please report this as a vitviz bug)") from None

    # -------------------------------------------------------------------------------------- the two requests

    def _metadata(self, file: str) -> None:
        """One HEAD of the file, not retried, within the time left: tells a hub that is down (unreachable,
        silent, HTTP 5xx) from one that answers, before huggingface_hub's own retries (which wait ~23 s) start.
        A 4xx answer is left to `hf_hub_download` (it records what the repository lacks)."""
        import huggingface_hub as hh
        from huggingface_hub import errors

        url = hh.hf_hub_url(self.name.repo_id, file, revision=self.name.revision, endpoint=self.endpoint)
        try:
            hh.get_hf_file_metadata(url, timeout=max(0.05, self.timeout - self.waited), endpoint=self.endpoint)
        except errors.HfHubHTTPError as e:
            code = getattr(getattr(e, "response", None), "status_code", None)
            if code is not None and (code >= 500 or code == 429):
                raise _HubDown(f"the hub at {self.where} answered {_status(e)} for {file} -- "
                               + ("it is up but failing; try again later" if code >= 500 else
                                  "it asks to slow down (too many requests); try again in a while")) from None
        except Exception as e:  # noqa: BLE001 - httpx's errors, whichever httpx huggingface_hub uses
            kind = _network_kind(e)
            if kind == "timeout":
                raise _HubDown(f"the hub at {self.where} accepted the connection but did not answer (for {file}): "
                               f"waited {max(self.waited, self.timeout):.1f} s in all, the limit ({self.timeout:g} "
                               f"s, ${TIMEOUT_ENV} or timeout=)") from None
            if kind == "connect":
                raise _HubDown(f"the hub at {self.where} could not be reached ({_network_words(e)})") from None
            if kind == "redirects":
                raise HubError(f"{self.name.text}: the hub at {self.where} redirected the request for {file} of "
                               f"{self.name.repo_id} too many times (a redirect loop); expected a Hugging Face Hub "
                               "endpoint (check HF_ENDPOINT)") from None
            raise

    def _download(self, file: str) -> str:
        import huggingface_hub as hh

        return hh.hf_hub_download(self.name.repo_id, file, revision=self.name.revision, cache_dir=str(self.cache),
                                  endpoint=self.endpoint, etag_timeout=max(0.05, self.timeout - self.waited),
                                  tqdm_class=_progress_bar(self))

    # ----------------------------------------------------------------------------------------- the waiting

    def _report(self) -> None:
        if self.progress is not None:
            self.progress(self._done, self._total)

    def _wait(self, file: str, call: Callable[[], Any]) -> Any:
        """`call()` run in a daemon thread while this one waits for it: the progress callback is called every
        TICK (an exception it raises abandons the call and comes out as it is), and the time without arriving
        bytes counts against the limit (past it: _HubDown saying how long it waited). The call's own exception
        comes out as _CallFailed."""
        self._flowing = self._answered = False
        self._report()
        box: dict[str, Any] = {}
        finished = threading.Event()

        def run() -> None:
            try:
                box["value"] = call()
            except BaseException as e:  # noqa: BLE001 - handed to the waiting thread
                box["error"] = e
            finally:
                finished.set()

        threading.Thread(target=run, name=f"vitviz hub {self.name.repo_id} {file}", daemon=True).start()
        last = time.monotonic()
        try:
            while not finished.wait(TICK):
                now = time.monotonic()
                if not self._flowing:
                    self.waited += now - last
                last = now
                self._report()
                if self.waited > self.timeout:
                    what = (f"began sending {file} but no data arrived after that" if self._answered else
                            f"did not answer (for {file})")
                    raise _HubDown(f"the hub at {self.where} {what}: waited {self.waited:.1f} s in all, the limit "
                                   f"({self.timeout:g} s, ${TIMEOUT_ENV} or timeout=)")
            if not self._flowing:
                self.waited += time.monotonic() - last
        except BaseException:
            self.abort.set()   # the request runs on and stops at its next progress step
            raise
        self._report()
        if "error" in box:
            raise _CallFailed(box["error"])
        return box.get("value")

    def fail_no_weights(self) -> None:
        repo, text = self.name.repo_id, self.name.text
        cached, wanted = _cached_revisions(self.cache, repo), self.name.revision or "main"
        if self.unreachable and cached and wanted not in cached:
            where = ("offline (HF_HUB_OFFLINE is set)" if self.offline else
                     self.failure or f"the hub at {self.where} could not be reached")
            raise HubError(f"{text}: {where}; and the cache {self.cache} holds {repo} but not its revision "
                           f"{wanted!r}; cached: {', '.join(cached)} -- name one of them "
                           f"(hf:{repo}@REVISION), or download that revision once with a network")
        if self.unreachable:
            where = ("offline (HF_HUB_OFFLINE is set)" if self.offline else
                     self.failure or f"the hub at {self.where} could not be reached")
            raise HubError(f"{text}: {where}; and {repo} is not in the cache {self.cache}; expected its weights "
                           f"({' or '.join(HUB_WEIGHT_NAMES[:2])}) there -- download it once with a network, or copy "
                           "the repository folder into that cache")
        raise HubError(f"{text}: {repo} has no weights file vitviz reads; looked for {', '.join(HUB_WEIGHT_NAMES)}")


def _cached_revisions(cache: Path, repo: str) -> list[str]:
    """The revisions of a repository the cache holds, as huggingface_hub lays it out: its refs (branches, tags,
    refs/pr/N) and the commits of its snapshots; [] when the repository is not there."""
    folder = cache / f"models--{repo.replace('/', '--')}"
    refs = folder / "refs"
    try:
        names = sorted(p.relative_to(refs).as_posix() for p in refs.rglob("*") if p.is_file()) if refs.is_dir() else []
        commits = sorted(p.name for p in (folder / "snapshots").iterdir()) if (folder / "snapshots").is_dir() else []
    except OSError:
        return []
    return names + commits


class _HubDown(Exception):
    """The hub could not be used (unreachable, silent past the limit, failing with 5xx); the message says how."""


class _CallFailed(Exception):
    """A hub request's exception, carried out of its thread (an exception of the progress callback is not one)."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(error)
        self.error = error


def _status(e: Exception) -> str:
    """'HTTP 500 (Internal Server Error)' for an HfHubHTTPError."""
    response = getattr(e, "response", None)
    code = getattr(response, "status_code", None)
    phrase = getattr(response, "reason_phrase", "") or ""
    return f"HTTP {code}" + (f" ({phrase})" if phrase else "") if code is not None else str(e).splitlines()[0]


def _network_kind(e: BaseException) -> str:
    """'timeout', 'connect', 'redirects', 'protocol' or '' for an exception of httpx (whichever copy) or requests,
    by its class names (no import of either)."""
    names = {c.__name__ for c in type(e).__mro__}
    if "ConnectTimeout" in names:
        return "connect"
    if names & {"TimeoutException", "ReadTimeout", "ConnectTimeout", "PoolTimeout", "WriteTimeout", "Timeout",
                "TimeoutError"}:
        return "timeout"
    if names & {"ConnectError", "ConnectionError", "ProxyError", "NetworkError"} and "RemoteProtocolError" not in names:
        return "connect"
    if "TooManyRedirects" in names:
        return "redirects"
    if names & {"RemoteProtocolError", "ProtocolError", "LocalProtocolError", "ChunkedEncodingError",
                "DecodingError", "ReadError", "IncompleteRead"}:
        return "protocol"
    return ""


def _network_words(e: BaseException) -> str:
    """An exception as words for a message: the class and its text (one line), with what it means for the
    ones vitviz recognises."""
    text = " ".join(str(e).split())[:200]
    kind = _network_kind(e)
    meaning = {"protocol": "the connection broke off or the answer was cut short",
               "connect": "no connection could be made to that address", "timeout": "it did not answer in time",
               "redirects": "a redirect loop"}.get(kind, "")
    return f"{type(e).__name__}: {text}" + (f" -- {meaning}" if meaning else "")


def _is_network_error(e: OSError) -> bool:
    text = f"{type(e).__name__} {e}".lower()
    return any(w in text for w in ("connect", "timeout", "timed out", "network", "resolve", "unreachable", "offline"))


def _progress_bar(fetcher: _Fetcher) -> Any:
    """A tqdm class for `hf_hub_download` that records the bytes done for the waiting thread (which reports them)
    instead of drawing a bar, and stops an abandoned download at its next step."""
    from huggingface_hub.utils import tqdm as hf_tqdm

    class _Report(hf_tqdm):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            if fetcher.abort.is_set():
                raise _Aborted(f"{fetcher.name.text}: abandoned")
            kwargs["disable"] = True
            super().__init__(*args, **kwargs)
            self._done = int(kwargs.get("initial") or 0)
            fetcher._answered = True
            fetcher._done, fetcher._total = self._done, kwargs.get("total")   # a new file's bytes (until now:
            # the last file's, so that a file the repository lacks reports no step back to 0)

        def update(self, n: float | None = 1) -> bool | None:
            if fetcher.abort.is_set():
                raise _Aborted(f"{fetcher.name.text}: abandoned")
            self._done += int(n or 0)
            fetcher._done, fetcher._flowing = self._done, True
            return None

    return _Report
