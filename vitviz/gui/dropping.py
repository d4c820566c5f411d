"""Sorting dropped or opened paths into checkpoints and images (no Qt here)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from vitviz.core.formats import MODEL_FILE_SUFFIXES, MODEL_FOLDER_MARKERS
from vitviz.core.running.images import find_images, is_image_file

CHECKPOINT_SUFFIXES = frozenset(MODEL_FILE_SUFFIXES) | {".json"}   # a lone config.json names its folder


@dataclass
class Dropped:
    """Paths sorted by what they are."""

    models: list[str] = field(default_factory=list)
    images: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)


def is_model_folder(folder: Path) -> bool:
    """A folder that holds a checkpoint (Hugging Face / timm hub layout, or a lone weights file)."""
    if any((folder / marker).exists() for marker in MODEL_FOLDER_MARKERS):
        return True
    return any(p.suffix.lower() in CHECKPOINT_SUFFIXES - {".json"} for p in folder.iterdir() if p.is_file())


def classify(paths: list[str]) -> Dropped:
    """Folders of images and image files become images; checkpoint files and model folders become models."""
    out = Dropped()
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found = [str(p) for p in find_images(path)]
            if found and not (path / "config.json").exists():
                out.images.extend(found)
            elif is_model_folder(path):
                out.models.append(str(path))
            else:
                out.ignored.append(str(path))
        elif is_image_file(path):
            out.images.append(str(path))
        elif path.suffix.lower() in CHECKPOINT_SUFFIXES:
            out.models.append(str(path))
        else:
            out.ignored.append(str(path))
    return out
