"""Models by name from the Hugging Face Hub: `hf:ORG/NAME[@REVISION]` and timm's hub names `timm:NAME[.TAG]`.

A name resolves to a model folder in the shared Hugging Face cache (the one transformers, timm and open_clip use):
the cached files when they are there, otherwise downloaded with `huggingface_hub` — which already does what this
needs (revisions, the cache layout, resumable downloads, `HF_HOME`/`HF_HUB_CACHE`/`HF_ENDPOINT`, offline mode
with `HF_HUB_OFFLINE=1`), so vitviz does not write its own. Only configuration and weight files are fetched,
never code; a download is written under a temporary name and moved into the cache when complete.

    folder = resolve_hub("hf:facebook/dinov2-small")                      # -> .../snapshots/<commit>/
    folder = resolve_hub("timm:vit_small_patch14_reg4_dinov2.lvd142m")   # the repository timm/<name>
    model = vitviz.load(folder)

Qt-free and torch-free; `huggingface_hub` is imported only when a name is resolved.
"""
from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vitviz.catalog.dirs import hf_hub_dir
from vitviz.errors import VitvizError

Progress = Callable[[int, "int | None"], None]   # (bytes done, total bytes or None)

HUB_PREFIXES = ("hf:", "timm:")
CONFIG_FILES = ("config.json", "preprocessor_config.json", "open_clip_config.json")
# Most preferred first; the first one a repository has is the model's weights.
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "open_clip_model.safetensors",
                "pytorch_model.bin", "open_clip_pytorch_model.bin")
_REPO = re.compile(r"^[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95}$")
_TIMM_NAME = re.compile(r"^[A-Za-z0-9][\w-]*(\.[\w-]+)?$")
_SHARD = re.compile(r"^[\w.-]+\.(safetensors|bin)$")


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


def parse_hub_name(text: str) -> HubName:
    """`hf:ORG/NAME[@REVISION]` or `timm:NAME[.TAG][@REVISION]` -> HubName; HubError says what was expected."""
    body, _, revision = text.partition("@")
    if "@" in text and not revision:
        raise HubError(f"{text!r}: empty revision after '@'; expected e.g. hf:ORG/NAME@main or @<commit>")
    if body.startswith("hf:"):
        repo = body[3:]
        if not _REPO.match(repo) or ".." in repo:
            raise HubError(f"{text!r}: expected hf:ORG/NAME[@REVISION], e.g. hf:facebook/dinov2-small")
        return HubName(text, repo, revision or None)
    if body.startswith("timm:"):
        name = body[5:]
        if not _TIMM_NAME.match(name):
            raise HubError(f"{text!r}: expected timm:NAME[.TAG], e.g. timm:vit_small_patch14_reg4_dinov2.lvd142m")
        if "." not in name:
            name = _timm_default_tag(name, text)
        return HubName(text, f"timm/{name}", revision or None)
    raise HubError(f"{text!r}: expected a hub name hf:ORG/NAME[@REVISION] or timm:NAME[.TAG]")


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
    if not hub_id or not str(hub_id).startswith("timm/"):
        raise HubError(f"{text!r}: timm has no pretrained weights on the hub for {name!r}; expected a name from "
                       "timm.list_pretrained(), e.g. timm:vit_base_patch16_224.augreg2_in21k_ft_in1k")
    return str(hub_id)[len("timm/"):]


def resolve_hub(text: str, cache_dir: Path | None = None, progress: Progress | None = None,
                endpoint: str | None = None, offline: bool | None = None) -> Path:
    """The local model folder of a hub name: its cached files, else downloaded into the Hugging Face cache.

    Args:
        text: `hf:ORG/NAME[@REVISION]` or `timm:NAME[.TAG][@REVISION]`.
        cache_dir: the hub cache (default: `$HF_HUB_CACHE`, `$HF_HOME/hub` or ~/.cache/huggingface/hub).
        progress: called as progress(done_bytes, total_bytes_or_None) while a file downloads; an exception
            it raises cancels the download (nothing partial is left under a final name).
        endpoint: the hub's address (default: `$HF_ENDPOINT`, else huggingface.co).
        offline: use only the cache (default: `$HF_HUB_OFFLINE`).

    Raises:
        HubError: malformed name; missing or gated repository, revision or weights; offline or failed download —
            naming the repository, the files and the cache folder.
    """
    name = parse_hub_name(text)
    cache = Path(cache_dir) if cache_dir is not None else hf_hub_dir()
    offline = _env_flag("HF_HUB_OFFLINE") if offline is None else offline
    endpoint = endpoint or os.environ.get("HF_ENDPOINT") or None
    fetch = _Fetcher(name, cache, progress, endpoint, offline)
    weights = None
    for file in WEIGHT_FILES:
        weights = fetch(file)
        if weights is not None:
            break
    if weights is None:
        fetch.fail_no_weights()
    for file in CONFIG_FILES:
        fetch(file)
    if weights.name.endswith(".index.json"):
        for shard in _shards(weights, text):
            if fetch(shard) is None:
                raise HubError(f"{text}: shard {shard} listed in {weights.name} is missing from {name.repo_id}")
    return weights.parent


def cached_hub(text: str, cache_dir: Path | None = None) -> Path | None:
    """The cached model folder of a hub name (its weights are in the cache), or None; never touches the network."""
    try:
        resolved = resolve_hub(text, cache_dir=cache_dir, offline=True)
    except HubError:
        return None
    return resolved


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def _shards(index: Path, text: str) -> list[str]:
    """The shard files of a sharded checkpoint's index; names must be plain files of the same folder."""
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map")
    except (OSError, ValueError, AttributeError) as e:
        raise HubError(f"{text}: {index.name} is not a readable shard index ({e})") from None
    if not isinstance(weight_map, dict):
        raise HubError(f"{text}: {index.name} has no 'weight_map' object")
    shards = sorted({str(v) for v in weight_map.values()})
    bad = [s for s in shards if not _SHARD.match(s)]
    if bad:
        raise HubError(f"{text}: {index.name} names shard files outside the model folder or of another kind: "
                       f"{', '.join(bad[:3])}; expected plain *.safetensors / *.bin names")
    return shards


class _Fetcher:
    """One file of the repository at a time: from the cache, else downloaded; None when the repository lacks it."""

    def __init__(self, name: HubName, cache: Path, progress: Progress | None, endpoint: str | None,
                 offline: bool) -> None:
        self.name, self.cache, self.progress, self.endpoint, self.offline = name, cache, progress, endpoint, offline
        self.unreachable: list[str] = []

    def __call__(self, file: str) -> Path | None:
        import huggingface_hub as hh
        from huggingface_hub import errors

        cached = hh.try_to_load_from_cache(self.name.repo_id, file, cache_dir=str(self.cache),
                                           revision=self.name.revision)
        if isinstance(cached, str):
            return Path(cached)
        if cached is not None:       # the cache records that the repository has no such file
            return None
        if self.offline or self.unreachable:   # offline, or the hub already failed once: the cache only
            self.unreachable.append(file)
            return None
        try:
            path = hh.hf_hub_download(self.name.repo_id, file, revision=self.name.revision,
                                      cache_dir=str(self.cache), endpoint=self.endpoint,
                                      tqdm_class=_progress_bar(self.progress) if self.progress else None)
        except errors.LocalEntryNotFoundError:   # (an EntryNotFoundError too) the hub could not be reached
            self.unreachable.append(file)
            return None
        except errors.EntryNotFoundError:
            return None
        except errors.GatedRepoError:
            raise HubError(f"{self.name.text}: {self.name.repo_id} is gated: accept its terms on the hub and log "
                           "in (`hf auth login`), then try again") from None
        except errors.RepositoryNotFoundError:
            raise HubError(f"{self.name.text}: no repository {self.name.repo_id} on the hub (or it is private; "
                           "log in with `hf auth login`)") from None
        except errors.RevisionNotFoundError:
            raise HubError(f"{self.name.text}: {self.name.repo_id} has no revision {self.name.revision!r}") from None
        except (errors.OfflineModeIsEnabled, OSError) as e:
            if isinstance(e, OSError) and not _is_network_error(e):
                raise HubError(f"{self.name.text}: could not write {file} into {self.cache}: {e}") from None
            self.unreachable.append(file)
            return None
        except errors.HfHubHTTPError as e:
            raise HubError(f"{self.name.text}: the hub answered {e} for {file}") from None
        return Path(path)

    def fail_no_weights(self) -> None:
        repo, text = self.name.repo_id, self.name.text
        if self.unreachable:
            where = "offline (HF_HUB_OFFLINE is set)" if self.offline else "the hub could not be reached"
            raise HubError(f"{text}: {where} and {repo} is not in the cache {self.cache}; expected its weights "
                           f"({' or '.join(WEIGHT_FILES[:2])}) there — download it once with a network, or copy "
                           "the repository folder into that cache")
        raise HubError(f"{text}: {repo} has no weights file vitviz reads; looked for {', '.join(WEIGHT_FILES)}")


def _is_network_error(e: OSError) -> bool:
    text = f"{type(e).__name__} {e}".lower()
    return any(w in text for w in ("connect", "timeout", "timed out", "network", "resolve", "unreachable", "offline"))


def _progress_bar(progress: Progress) -> Any:
    """A tqdm class for `hf_hub_download` that reports to `progress` instead of drawing a bar."""
    from huggingface_hub.utils import tqdm as hf_tqdm

    class _Report(hf_tqdm):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["disable"] = True
            super().__init__(*args, **kwargs)
            self._done = int(kwargs.get("initial") or 0)
            self._size = kwargs.get("total")

        def update(self, n: float | None = 1) -> bool | None:
            self._done += int(n or 0)
            progress(self._done, self._size)
            return None

    return _Report
