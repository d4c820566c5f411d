"""The ViT checkpoints already on this computer: torch hub cache, Hugging Face cache, recent files (Qt-free)."""
from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from vitviz.core.files import read_small_json
from vitviz.core.formats import FOLDER_WEIGHT_NAMES, SHARD_INDEX, WEIGHT_SUFFIXES
from vitviz.catalog.dirs import hf_hub_dir, torch_hub_dir
from vitviz.catalog.named import NAMED_PREFIX

_TV_FILE = re.compile(r"^vit_[blh]_\d+(_swag\w*|_lc\w*)?-[0-9a-f]{8}\.pth$")
# torchvision's ViT weight files as the torch hub names them -> (architecture, Weights enum member, classes, crop
# px): what a listing shows of them, known without importing torchvision (and so torch) -- `vitviz models` stays
# instant. tests/package/test_startup_imports.py checks this against torchvision's own enums (`torchvision_weights`); a
# file that looks like torchvision's but is not here (a newer torchvision's weights) is looked up in torchvision.
_TORCHVISION_FILES = {
    "vit_b_16-c867db91.pth": ("vit_b_16", "ViT_B_16_Weights.IMAGENET1K_V1", 1000, 224),
    "vit_b_16_swag-9ac1b537.pth": ("vit_b_16", "ViT_B_16_Weights.IMAGENET1K_SWAG_E2E_V1", 1000, 384),
    "vit_b_16_lc_swag-4e70ced5.pth": ("vit_b_16", "ViT_B_16_Weights.IMAGENET1K_SWAG_LINEAR_V1", 1000, 224),
    "vit_b_32-d86f8d99.pth": ("vit_b_32", "ViT_B_32_Weights.IMAGENET1K_V1", 1000, 224),
    "vit_l_16-852ce7e3.pth": ("vit_l_16", "ViT_L_16_Weights.IMAGENET1K_V1", 1000, 224),
    "vit_l_16_swag-4f3808c9.pth": ("vit_l_16", "ViT_L_16_Weights.IMAGENET1K_SWAG_E2E_V1", 1000, 512),
    "vit_l_16_lc_swag-4d563306.pth": ("vit_l_16", "ViT_L_16_Weights.IMAGENET1K_SWAG_LINEAR_V1", 1000, 224),
    "vit_l_32-c7638314.pth": ("vit_l_32", "ViT_L_32_Weights.IMAGENET1K_V1", 1000, 224),
    "vit_h_14_swag-80465313.pth": ("vit_h_14", "ViT_H_14_Weights.IMAGENET1K_SWAG_E2E_V1", 1000, 518),
    "vit_h_14_lc_swag-c1eb923e.pth": ("vit_h_14", "ViT_H_14_Weights.IMAGENET1K_SWAG_LINEAR_V1", 1000, 224),
}



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
        named: the name the commands and `vitviz.load` take for it: `torchvision:ARCH:WEIGHTS` for a known
            torchvision download, `hf:ORG/NAME` for a Hugging Face snapshot (`@REF` or `@COMMIT` added when it is
            not the one `main` points to), else ''.
        revision: a Hugging Face snapshot's commit, else ''.
        by_name: the family is a guess from the file name alone (no config, no known download): a hand-written
            `vit_tiny.pth` is named like a timm file and may load as another family; menus mark it 'timm?'.
    """

    name: str
    path: Path
    source: str
    family: str
    size: int
    detail: str = ""
    named: str = ""
    revision: str = ""
    by_name: bool = False

    @property
    def size_text(self) -> str:
        return format_size(self.size)

    @property
    def family_text(self) -> str:
        """The family as menus and `vitviz models` print it: 'timm', or 'timm?' for a guess from the name."""
        return f"{self.family}?" if self.by_name and self.family != "unknown" else self.family

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["path"] = str(self.path)
        return out


@dataclass(frozen=True)
class Skipped:
    """A folder or file the scan could not read (permission denied, I/O error, ...) and left out.

    Attributes:
        path: the folder or file left out (a cache, a Hugging Face repository or snapshot, a recent path).
        reason: the operating system's message, e.g. 'Permission denied', with the file it was about when that is
            not `path` itself.
    """

    path: Path
    reason: str

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"

    def to_dict(self) -> dict[str, str]:
        return {"path": str(self.path), "reason": self.reason}


class ScanResult(list):  # type: ignore[type-arg]
    """The entries a scan found (it is a list of CatalogEntry, equal to a plain list of them), and in `skipped`
    what it could not read: an unreadable folder never fails the whole scan, it is left out and listed there."""

    skipped: list[Skipped]

    def __init__(self, entries: Iterable[CatalogEntry] = (), skipped: Iterable[Skipped] = ()) -> None:
        super().__init__(entries)
        self.skipped = list(skipped)

    def skip(self, path: Path, error: OSError) -> None:
        """Record that `path` was left out because of `error`."""
        reason = error.strerror or str(error) or type(error).__name__
        about = error.filename
        if isinstance(about, (str, bytes, os.PathLike)) and os.fsdecode(about) != os.fsdecode(path):
            reason += f" ({os.fsdecode(about)})"
        self.skipped.append(Skipped(Path(path), reason))

    def add(self, path: Path, read: Callable[..., CatalogEntry | None], *args: Any) -> None:
        """The entry `read(*args)` makes of `path` appended (None: not a ViT, nothing); `path` recorded as skipped
        when reading it fails (`OSError`), so one unreadable file or snapshot never fails the whole scan."""
        try:
            entry = read(*args)
        except OSError as e:
            self.skip(path, e)
            return
        if entry is not None:
            self.append(entry)


def _list_folder(folder: Path, out: ScanResult, skip_as: Path | None = None) -> list[Path]:
    """The entries of `folder`, sorted; none when it is not a folder, and none (recorded in `out.skipped` under
    `skip_as`, default the folder itself) when it cannot be read."""
    try:
        return sorted(folder.iterdir()) if folder.is_dir() else []
    except OSError as e:
        out.skip(folder if skip_as is None else skip_as, e)
        return []


def format_size(n: int) -> str:
    """Bytes as a short human string: '330 MB', '12.4 kB'."""
    value = float(n)
    for unit in ("B", "kB", "MB", "GB"):
        if value < 1000 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" or value >= 100 else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} GB"


# ------------------------------------------------------------------------------------------------- scanning
def scan(recent: Iterable[str | os.PathLike] = (), torch_dir: Path | None = None,
         hf_dir: Path | None = None) -> ScanResult:
    """Every ViT checkpoint in the torch hub cache, the HF hub cache and `recent` (most recent first).

    Recent paths that no longer exist are left out; a recent path that is also in a cache is listed once.
    Files that are clearly not ViTs (resnet50-*.pth, BERT snapshots) are skipped. A folder or file that cannot
    be read (permission denied, I/O error) is left out and listed in the result's `skipped`; the rest is listed.
    """
    parts = [scan_recent(recent), scan_torch_hub(torch_dir), scan_hf_hub(hf_dir)]
    seen: set[str] = set()
    out = ScanResult(skipped=[s for part in parts for s in part.skipped])
    for entry in (e for part in parts for e in part):
        key = os.path.realpath(entry.path)
        if key not in seen:
            seen.add(key)
            out.append(entry)
    return out


def scan_torch_hub(folder: Path | None = None) -> ScanResult:
    """ViT weight files in the torch hub checkpoints folder, sorted by name (unreadable ones in `skipped`)."""
    folder = torch_hub_dir() if folder is None else Path(folder)
    out = ScanResult()
    for f in _list_folder(folder, out):
        if f.suffix in WEIGHT_SUFFIXES:
            out.add(f, _hub_file_entry, f)
    return out


def _hub_file_entry(f: Path) -> CatalogEntry | None:
    return _file_entry(f, "torch hub") if f.is_file() else None


def _file_entry(f: Path, source: str, keep_unknown: bool = False) -> CatalogEntry | None:
    """An entry for one weights file, its family guessed from the name; None for files that are not ViTs."""
    size = f.stat().st_size
    if _TV_FILE.match(f.name):
        tv = _torchvision_info(f.name)
        if tv is not None:
            weights = tv["weights"].split(".")[-1]
            named = f"{NAMED_PREFIX}{tv['arch']}:{weights}"
            detail = f"torchvision {tv['weights']}, {tv['classes']} classes, {tv['crop']} px"
            return CatalogEntry(f"{tv['arch']} · {weights}", f, source, "torchvision", size, detail, named)
    family = guess_family_from_name(f.name)
    if family is None and not keep_unknown:
        return None
    return CatalogEntry(f.name, f, source, family or "unknown", size,
                        "" if family is None else "family guessed from the file name; loading reads its tensors",
                        by_name=family is not None)


def _torchvision_info(file_name: str) -> dict[str, Any] | None:
    """{'arch', 'weights', 'classes', 'crop'} of a torchvision ViT weights file, None for other files; the files
    `_TORCHVISION_FILES` knows without importing torchvision."""
    if file_name in _TORCHVISION_FILES:
        arch, weights, classes, crop = _TORCHVISION_FILES[file_name]
        return {"arch": arch, "weights": weights, "classes": classes, "crop": crop}
    from vitviz.core.reading.metadata import torchvision_weights

    tv = torchvision_weights(file_name)
    if tv is None:
        return None
    return {"arch": tv["arch"], "weights": tv["weights"], "classes": len(tv["categories"]), "crop": tv["crop"]}


def guess_family_from_name(name: str) -> str | None:
    """A family guess from a file or repository name (each family module's `NAME_HINTS`); None when it does not
    look like a ViT. Imports the family modules, which import torch only when they convert weights (so
    `vitviz models` imports no torch; tests/package/test_startup_imports.py)."""
    from vitviz.core.reading.families import family_from_name

    return family_from_name(name)


def scan_hf_hub(folder: Path | None = None) -> ScanResult:
    """ViT model snapshots in the Hugging Face hub cache (`models--ORG--NAME/snapshots/REV/`); repositories and
    snapshots that cannot be read are left out and listed in `skipped`."""
    folder = hf_hub_dir() if folder is None else Path(folder)
    out = ScanResult()
    for repo in (p for p in _list_folder(folder, out) if p.name.startswith("models--")):
        snap = _snapshot(repo, out)
        if snap is not None:
            out.add(snap, _hf_entry, repo, snap)
    return out


def _snapshot(repo: Path, out: ScanResult) -> Path | None:
    """The snapshot `refs/main` points to, else the most recently modified one; None without weights.
    What cannot be read (the repository, refs/main, a snapshot) is recorded in `out.skipped`: an unreadable
    snapshot is passed over for the next one."""
    snaps, ref = repo / "snapshots", repo / "refs" / "main"
    unreadable = len(out.skipped)
    listed = _list_folder(snaps, out, skip_as=repo)
    if len(out.skipped) > unreadable:  # the repository cannot be read: nothing of it is listed
        return None
    try:
        candidates = [snaps / ref.read_text(encoding="utf-8").strip()] if ref.is_file() else []
    except OSError as e:   # the newest readable snapshot is listed instead
        out.skip(ref, e)
        candidates = []
    except ValueError:     # a garbled refs/main: likewise
        candidates = []
    candidates += sorted(listed, key=_mtime, reverse=True)
    tried: set[Path] = set()
    for snap in candidates:
        if snap in tried:
            continue
        tried.add(snap)
        try:
            if snap.is_dir() and _weights_of(snap):
                return snap
        except OSError as e:
            out.skip(snap, e)
    return None


def _mtime(path: Path) -> float:
    """A folder's modification time; 0 (tried last) when it cannot be read, which the snapshot loop records."""
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _weights_of(snap: Path) -> list[Path]:
    """The weights files a model folder is loaded from, in `vitviz.load`'s order of preference: the first of
    FOLDER_WEIGHT_NAMES there (an index with its shards), else every weights file. Only one of model.safetensors and
    pytorch_model.bin counts when a snapshot holds both."""
    for name in FOLDER_WEIGHT_NAMES:
        if (snap / name).exists():
            shards = sorted(snap.glob("model-*.safetensors")) if name == SHARD_INDEX else []
            return [snap / name, *shards]
    return sorted(p for p in snap.iterdir() if p.suffix in WEIGHT_SUFFIXES and p.exists())


def _hf_entry(repo: Path, snap: Path) -> CatalogEntry | None:
    repo_id = repo.name[len("models--"):].replace("--", "/")
    config = _read_json(snap / "config.json") or {}
    family, detail = _family_from_config(config)
    if family is None and (snap / "open_clip_config.json").is_file():   # an open_clip repository, whatever its name
        family, detail = "clip", _open_clip_detail(_read_json(snap / "open_clip_config.json") or {})
    if family is None:
        family = guess_family_from_name(repo_id)
        if family is None:
            return None
    size = sum(p.stat().st_size for p in _weights_of(snap) if not p.name.endswith(".json"))
    return CatalogEntry(repo_id, snap, "hugging face", family, size, detail, _hub_name(repo, repo_id, snap.name),
                        snap.name)


def _hub_name(repo: Path, repo_id: str, commit: str) -> str:
    """The hub name of a cached snapshot as `vitviz.load` takes it: `hf:ORG/NAME` when refs/main points to it,
    else `@` a ref that does (a tag, another branch), else `@COMMIT`; '' for a folder name the hub would refuse."""
    from vitviz.catalog.hub import HubError, check_hub_name

    refs = repo / "refs"
    try:
        pointing = sorted(r.relative_to(refs).as_posix() for r in refs.rglob("*")
                          if r.is_file() and r.read_text(encoding="utf-8").strip() == commit)
    except (OSError, ValueError):
        pointing = []
    name = f"hf:{repo_id}" + ("" if "main" in pointing else f"@{pointing[0]}" if pointing else f"@{commit}")
    try:
        check_hub_name(name)
    except HubError:
        return ""
    return name


def _open_clip_detail(config: dict[str, Any]) -> str:
    """'open_clip, vision width 768' from an `open_clip_config.json` (whatever of it is readable)."""
    model_cfg = config.get("model_cfg") if isinstance(config.get("model_cfg"), dict) else {}
    vision = model_cfg.get("vision_cfg") if isinstance(model_cfg.get("vision_cfg"), dict) else {}
    width = vision.get("width")
    return "open_clip" + (f", vision width {width}" if isinstance(width, int) else "")


def _family_from_config(config: dict[str, Any]) -> tuple[str | None, str]:
    """(family, detail) from an HF or timm hub config.json; family None when the config is not a ViT."""
    arch = config.get("architecture")
    if isinstance(arch, str):  # timm hub
        fam = guess_family_from_name(arch)
        classes = config.get("num_classes")
        return fam, f"timm {arch}" + (f", {classes} classes" if classes else "")
    model_type = config.get("model_type")
    if isinstance(model_type, str):
        from vitviz.core.reading.families import hf_family

        fam = hf_family(model_type)
        labels = config.get("id2label") or {}
        if fam is None:   # a composite model (a VLM, a depth model) whose vision tower vitviz reads alone
            from vitviz.core.reading.towers import listed_tower

            tower = listed_tower(config)
            if tower is not None:
                return tower[0], f"transformers {model_type}, {tower[1]}"
        return fam, f"transformers {model_type}" + (f", {len(labels)} classes" if len(labels) > 2 else "")
    return None, ""


def _read_json(path: Path) -> dict[str, Any] | None:
    """A config's JSON object, or None: missing, not a regular file (a FIFO in a cache must not hang the scan),
    too large, not JSON or nested too deeply (`read_small_json`)."""
    data = read_small_json(path)
    return data if isinstance(data, dict) else None


def scan_recent(paths: Iterable[str | os.PathLike]) -> ScanResult:
    """Entries for recently opened files or folders that still exist, in the order given; those that exist but
    cannot be read are left out and listed in `skipped`."""
    out = ScanResult()
    for raw in paths:
        p = Path(raw).expanduser()
        out.add(p, _recent_entry, p)
    return out


def _recent_entry(p: Path) -> CatalogEntry | None:
    if p.is_file():
        entry = _file_entry(p, "recent", keep_unknown=True)
        if entry is not None and entry.family == "unknown":
            cfg_family = _family_from_config(_read_json(p.parent / "config.json") or {})[0]
            entry = CatalogEntry(entry.name, p, "recent", cfg_family or "unknown", entry.size)
        return entry
    if p.is_dir():
        config = _read_json(p / "config.json") or {}
        family, detail = _family_from_config(config)
        weights = _weights_of(p)
        size = sum(w.stat().st_size for w in weights if not w.name.endswith(".json"))
        return CatalogEntry(p.name, p, "recent", family or guess_family_from_name(p.name) or "unknown", size, detail)
    return None
