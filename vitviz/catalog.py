"""The ViT checkpoints already on this computer, and named models that resolve to a cached or downloaded file.

Qt-free. Scanning reads directory listings and small JSON files only; torch (through torchvision's weights
tables) is imported only when a torch-hub file is named like a torchvision ViT, or a named model is resolved,
so call `scan` from a worker thread when the window must not stall.

    entries = scan(recent=["~/runs/vit.pth"])          # torch hub cache, HF hub cache, recent files
    path = resolve_named("torchvision:vit_b_16")       # cached file, else downloaded with progress
    model = vitviz.load(path)

Named models are `torchvision:ARCH[:WEIGHTS]`, ARCH one of torchvision's ViTs (vit_b_16, vit_b_32, vit_l_16,
vit_l_32, vit_h_14) and WEIGHTS a member of its Weights enum (IMAGENET1K_V1, IMAGENET1K_SWAG_E2E_V1, ...;
default DEFAULT). The file keeps torchvision's name, so `vitviz.load` reads the preprocessing and categories
from it, and it lands in the torch hub cache where torchvision itself would look.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from vitviz.errors import VitvizError

Progress = Callable[[int, "int | None"], None]   # (bytes done, total bytes or None)

NAMED_PREFIX = "torchvision:"
TORCHVISION_ARCHS = ("vit_b_16", "vit_b_32", "vit_l_16", "vit_l_32", "vit_h_14")
WEIGHT_SUFFIXES = (".safetensors", ".pth", ".pt", ".bin", ".ckpt")
HF_WEIGHT_NAMES = ("model.safetensors", "pytorch_model.bin", "model.safetensors.index.json")
HF_VIT_TYPES = {"vit": "hf-vit", "deit": "hf-deit", "dinov2": "hf-dinov2", "dinov2_with_registers": "hf-dinov2",
                "vit_mae": "hf-vit_mae", "vit_msn": "hf-vit_msn"}
_TV_FILE = re.compile(r"^vit_[blh]_\d+(_swag\w*|_lc\w*)?-[0-9a-f]{8}\.pth$")
_CHUNK = 1 << 20


class DownloadError(VitvizError):
    """A named model is not cached and could not be downloaded."""


@dataclass(frozen=True)
class CatalogEntry:
    """One checkpoint found on this computer.

    Attributes:
        name: what a menu shows, e.g. 'vit_b_16 · IMAGENET1K_V1' or 'google/vit-base-patch16-224'.
        path: what to pass to `vitviz.load` (a file, or a model folder for Hugging Face snapshots).
        source: 'torch hub', 'hugging face' or 'recent'.
        family: a guess from the name and config files ('torchvision', 'timm', 'deit', 'dino', 'hf-vit', ...),
            confirmed only by loading.
        size: bytes of the weights.
        detail: one line more (weights enum, class count, architecture), may be empty.
        named: the `torchvision:ARCH:WEIGHTS` name when the file is a known torchvision download, else ''.
    """

    name: str
    path: Path
    source: str
    family: str
    size: int
    detail: str = ""
    named: str = ""

    @property
    def size_text(self) -> str:
        return format_size(self.size)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["path"] = str(self.path)
        return out


def format_size(n: int) -> str:
    """Bytes as a short human string: '330 MB', '12.4 kB'."""
    value = float(n)
    for unit in ("B", "kB", "MB", "GB"):
        if value < 1000 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" or value >= 100 else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} GB"


# ------------------------------------------------------------------------------------------------ locations
def _cache_home() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser()


def torch_hub_dir() -> Path:
    """Where torch hub keeps downloaded weights: `$TORCH_HOME/hub/checkpoints` (torch.hub's own rule)."""
    home = os.environ.get("TORCH_HOME")
    root = Path(home).expanduser() if home else _cache_home() / "torch"
    return root / "hub" / "checkpoints"


def hf_hub_dir() -> Path:
    """The Hugging Face hub cache: `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else ~/.cache/huggingface/hub."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME")
    return (Path(home).expanduser() if home else _cache_home() / "huggingface") / "hub"


# ------------------------------------------------------------------------------------------------- scanning
def scan(recent: Iterable[str | os.PathLike] = (), torch_dir: Path | None = None,
         hf_dir: Path | None = None) -> list[CatalogEntry]:
    """Every ViT checkpoint in the torch hub cache, the HF hub cache and `recent` (most recent first).

    Recent paths that no longer exist are left out; a recent path that is also in a cache is listed once.
    Files that are clearly not ViTs (resnet50-*.pth, BERT snapshots) are skipped.
    """
    found = scan_recent(recent) + scan_torch_hub(torch_dir) + scan_hf_hub(hf_dir)
    seen: set[str] = set()
    out = []
    for entry in found:
        key = os.path.realpath(entry.path)
        if key not in seen:
            seen.add(key)
            out.append(entry)
    return out


def scan_torch_hub(folder: Path | None = None) -> list[CatalogEntry]:
    """ViT weight files in the torch hub checkpoints folder, sorted by name."""
    folder = torch_hub_dir() if folder is None else Path(folder)
    if not folder.is_dir():
        return []
    out = []
    for f in sorted(folder.iterdir()):
        if f.is_file() and f.suffix in WEIGHT_SUFFIXES:
            entry = _file_entry(f, "torch hub")
            if entry is not None:
                out.append(entry)
    return out


def _file_entry(f: Path, source: str, keep_unknown: bool = False) -> CatalogEntry | None:
    """An entry for one weights file, its family guessed from the name; None for files that are not ViTs."""
    size = f.stat().st_size
    if _TV_FILE.match(f.name):
        tv = _torchvision_info(f.name)
        if tv is not None:
            weights = tv["weights"].split(".")[-1]
            named = f"{NAMED_PREFIX}{tv['arch']}:{weights}"
            detail = f"torchvision {tv['weights']}, {len(tv['categories'])} classes, {tv['crop']} px"
            return CatalogEntry(f"{tv['arch']} · {weights}", f, source, "torchvision", size, detail, named)
    family = guess_family_from_name(f.name)
    if family is None and not keep_unknown:
        return None
    return CatalogEntry(f.name, f, source, family or "unknown", size)


def _torchvision_info(file_name: str) -> dict[str, Any] | None:
    from vitviz.core.metadata import torchvision_weights

    return torchvision_weights(file_name)


def guess_family_from_name(name: str) -> str | None:
    """A family guess from a file or repository name; None when it does not look like a ViT."""
    n = name.lower()
    if "dinov2" in n:
        return "dinov2"
    if "deit3" in n or "deit_3" in n:
        return "deit3"
    if "deit" in n:
        return "deit"
    if "dino" in n:
        return "dino"
    if "mae" in n and "vit" in n:
        return "mae"
    if "vit" in n:
        return "timm"
    return None


def scan_hf_hub(folder: Path | None = None) -> list[CatalogEntry]:
    """ViT model snapshots in the Hugging Face hub cache (`models--ORG--NAME/snapshots/REV/`)."""
    folder = hf_hub_dir() if folder is None else Path(folder)
    if not folder.is_dir():
        return []
    out = []
    for repo in sorted(folder.glob("models--*")):
        snap = _snapshot(repo)
        if snap is None:
            continue
        entry = _hf_entry(repo, snap)
        if entry is not None:
            out.append(entry)
    return out


def _snapshot(repo: Path) -> Path | None:
    """The snapshot `refs/main` points to, else the most recently modified one; None without weights."""
    snaps = repo / "snapshots"
    if not snaps.is_dir():
        return None
    ref = repo / "refs" / "main"
    candidates = [snaps / ref.read_text(encoding="utf-8").strip()] if ref.is_file() else []
    candidates += sorted((p for p in snaps.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime,
                         reverse=True)
    for snap in candidates:
        if snap.is_dir() and _weights_of(snap):
            return snap
    return None


def _weights_of(snap: Path) -> list[Path]:
    files = [snap / n for n in HF_WEIGHT_NAMES if (snap / n).exists()]
    if (snap / "model.safetensors.index.json").exists():
        files += sorted(snap.glob("model-*.safetensors"))
    if not files:
        files = sorted(p for p in snap.iterdir() if p.suffix in (".safetensors", ".bin", ".pth") and p.exists())
    return files


def _hf_entry(repo: Path, snap: Path) -> CatalogEntry | None:
    repo_id = repo.name[len("models--"):].replace("--", "/")
    config = _read_json(snap / "config.json") or {}
    family, detail = _family_from_config(config)
    if family is None:
        family = guess_family_from_name(repo_id)
        if family is None:
            return None
    size = sum(p.stat().st_size for p in _weights_of(snap) if not p.name.endswith(".json"))
    return CatalogEntry(repo_id, snap, "hugging face", family, size, detail)


def _family_from_config(config: dict[str, Any]) -> tuple[str | None, str]:
    """(family, detail) from an HF or timm hub config.json; family None when the config is not a ViT."""
    arch = config.get("architecture")
    if isinstance(arch, str):  # timm hub
        fam = guess_family_from_name(arch)
        classes = config.get("num_classes")
        return fam, f"timm {arch}" + (f", {classes} classes" if classes else "")
    model_type = config.get("model_type")
    if isinstance(model_type, str):
        fam = HF_VIT_TYPES.get(model_type)
        labels = config.get("id2label") or {}
        return fam, f"transformers {model_type}" + (f", {len(labels)} classes" if len(labels) > 2 else "")
    return None, ""


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def scan_recent(paths: Iterable[str | os.PathLike]) -> list[CatalogEntry]:
    """Entries for recently opened files or folders that still exist, in the order given."""
    out = []
    for raw in paths:
        p = Path(raw).expanduser()
        if p.is_file():
            entry = _file_entry(p, "recent", keep_unknown=True)
            if entry is not None and entry.family == "unknown":
                cfg_family = _family_from_config(_read_json(p.parent / "config.json") or {})[0]
                entry = CatalogEntry(entry.name, p, "recent", cfg_family or "unknown", entry.size)
            out.append(entry)  # type: ignore[arg-type]
        elif p.is_dir():
            config = _read_json(p / "config.json") or {}
            family, detail = _family_from_config(config)
            weights = _weights_of(p)
            size = sum(w.stat().st_size for w in weights if not w.name.endswith(".json"))
            out.append(CatalogEntry(p.name, p, "recent", family or guess_family_from_name(p.name) or "unknown",
                                    size, detail))
    return out


# -------------------------------------------------------------------------------------------- named models
def is_named_model(text: str) -> bool:
    """Whether `text` names a model (`torchvision:...`) rather than a path."""
    return str(text).startswith(NAMED_PREFIX)


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
    """The cached file of a named model, or None when it has not been downloaded."""
    nw = lookup_named(text)
    path = (torch_hub_dir() if cache_dir is None else Path(cache_dir)) / nw.file_name
    return path if path.is_file() and path.stat().st_size > 0 else None


def resolve_named(text: str, cache_dir: Path | None = None, progress: Progress | None = None,
                  url: str | None = None, check_hash: bool = True, timeout: float = 30.0) -> Path:
    """The local file of a named model: the cached one, else downloaded into the cache first.

    Args:
        text: 'torchvision:vit_b_16' or 'torchvision:vit_b_16:IMAGENET1K_SWAG_E2E_V1'.
        cache_dir: where to look and download to (default: the torch hub checkpoints folder).
        progress: called as progress(done_bytes, total_bytes_or_None) while downloading.
        url: download from here instead of torchvision's URL (a mirror, or a file:// URL in tests); the
            file still gets torchvision's name.
        check_hash: compare the SHA-256 prefix in torchvision's file name (`-c867db91.pth`) with the data.

    Raises:
        DownloadError: offline or failed download, naming the file, its URL and the folder to put it in.
    """
    nw = lookup_named(text)
    folder = torch_hub_dir() if cache_dir is None else Path(cache_dir)
    dest = folder / nw.file_name
    if dest.is_file() and dest.stat().st_size > 0:
        return dest
    _download(url or nw.url, dest, progress, timeout)
    if check_hash:
        _check_hash(dest)
    return dest


def resolve_model_arg(text: str, progress: Progress | None = None) -> str:
    """A `--model` argument as something `vitviz.load` accepts: named models resolved, paths unchanged."""
    return str(resolve_named(text, progress=progress)) if is_named_model(text) else text


def _download(url: str, dest: Path, progress: Progress | None, timeout: float) -> None:
    """Stream `url` into `dest` through a `.partial` file, so an interrupted download leaves nothing behind."""
    tmp = dest.with_name(dest.name + ".partial")
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        with urllib.request.urlopen(url, timeout=timeout) as response, open(tmp, "wb") as out:
            length = response.headers.get("Content-Length")
            total = int(length) if length and length.isdigit() else None
            done = 0
            if progress:
                progress(0, total)
            while chunk := response.read(_CHUNK):
                out.write(chunk)
                done += len(chunk)
                if progress:
                    progress(done, total)
        os.replace(tmp, dest)
    except (urllib.error.URLError, OSError, ValueError) as e:
        tmp.unlink(missing_ok=True)
        reason = getattr(e, "reason", None) or e
        raise DownloadError(
            f"{dest.name} is not in {dest.parent} and could not be downloaded from {url} ({reason}). "
            f"Download it on a computer with internet access and put it in {dest.parent}, "
            "then open it again (or open the file directly)") from e


def _check_hash(path: Path) -> None:
    m = re.search(r"-([0-9a-f]{6,})\.[a-z]+$", path.name)
    if not m:
        return
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    if not digest.hexdigest().startswith(m.group(1)):
        path.unlink(missing_ok=True)
        raise DownloadError(f"{path.name}: downloaded data has SHA-256 {digest.hexdigest()[:12]}..., expected "
                            f"{m.group(1)}...; the download was damaged or is not this file. Try again, or "
                            f"put the right file in {path.parent}")


# ------------------------------------------------------------------------------------------------------ CLI
def add_models_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add `vitviz models` to the CLI's subparsers."""
    p = subparsers.add_parser("models", help="list ViT checkpoints on this computer; download named models",
                              description="List the ViT checkpoints in the torch hub and Hugging Face caches, "
                              "or fetch a named model (torchvision:ARCH[:WEIGHTS]) into the torch hub cache.")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--named", action="store_true", help="list the named models and whether each is cached")
    p.add_argument("--get", metavar="NAME", help="download a named model (if not cached) and print its path")
    p.add_argument("--recent", metavar="PATH", action="append", default=[], help="also list this file or folder")
    return p


def run_models_command(args: argparse.Namespace) -> int:
    """`vitviz models`: 0 on success; VitvizError propagates to the CLI's handler."""
    if args.get:
        path = resolve_named(args.get, progress=_ProgressBar(sys.stderr))
        print(path)
        return 0
    if args.named:
        rows = [{"name": n, "cached": str(cached_named(n) or "")} for n in named_models()]
        if args.json:
            print(json.dumps(rows, indent=2))
        else:
            for row in rows:
                print(f"{row['name']:<48} {row['cached'] or 'not downloaded'}")
        return 0
    entries = scan(args.recent)
    if args.json:
        print(json.dumps([e.to_dict() for e in entries], indent=2))
        return 0
    if not entries:
        print(f"no ViT checkpoints found in {torch_hub_dir()} or {hf_hub_dir()}.\n"
              "Try `vitviz models --named`, then `vitviz --model torchvision:vit_b_16`.")
        return 0
    for e in entries:
        print(f"{e.name:<44} {e.family:<12} {e.size_text:>8}  {e.source:<12} {e.path}")
    return 0


class _ProgressBar:
    """A one-line text progress bar on a stream (the CLI's `progress` callback)."""

    def __init__(self, stream: Any, width: int = 30) -> None:
        self.stream, self.width, self.last = stream, width, -1

    def __call__(self, done: int, total: int | None) -> None:
        if total:
            pct = int(100 * done / total)
            if pct == self.last:
                return
            self.last = pct
            bar = "#" * (self.width * done // total)
            self.stream.write(f"\r[{bar:<{self.width}}] {pct:3d}% {format_size(done)} / {format_size(total)}")
        else:
            self.stream.write(f"\r{format_size(done)}")
        if total and done >= total:
            self.stream.write("\n")
        self.stream.flush()
