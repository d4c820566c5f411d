"""The bundled demo: a small ViT this project trains itself, and the sample images shipped beside it.

Qt-free and torch-free at import, for the window's first run::

    from vitviz.demo import demo_checkpoint, demo_images, sample_photos
    model_path = demo_checkpoint()      # folder: model.safetensors + config.json (timm hub layout)
    images = demo_images()              # generated shapes images the demo model classifies
    photos = sample_photos()            # real photographs for ImageNet models

`vitviz.demo.shapes` draws the task, `vitviz.demo.train` trains the model, `vitviz.demo.evaluate` measures it.
"""
from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

from vitviz.errors import CheckpointNotFoundError
from vitviz.resources_path import resource

DEMO_FOLDER = "demo"
SAMPLES_FOLDER = "samples"
DEMO_IMAGE_PREFIX = "shapes_"


def demo_checkpoint() -> Path:
    """The shipped demo model folder (load it with `vitviz.load`); raises if the install lacks it."""
    folder = resource(DEMO_FOLDER)
    if not (folder / "model.safetensors").is_file() or not (folder / "config.json").is_file():
        raise CheckpointNotFoundError(
            f"{folder}: the demo model is missing (expected model.safetensors and config.json); "
            "regenerate it with `python -m vitviz.demo.train --out resources/demo`")
    return folder


def _samples(prefix: str, exclude: bool) -> list[Path]:
    folder = resource(SAMPLES_FOLDER)
    if not folder.is_dir():
        return []
    files = sorted(p for p in folder.iterdir() if p.suffix.lower() in (".png", ".jpg", ".jpeg") and p.is_file())
    return [p for p in files if p.name.startswith(prefix) != exclude]


def demo_images() -> list[Path]:
    """Generated shapes images for the demo model (`resources/samples/shapes_*.png`), sorted by name."""
    return _samples(DEMO_IMAGE_PREFIX, exclude=False)


def sample_photos() -> list[Path]:
    """Redistributable real photographs (`resources/samples/*.jpg`, see resources/LICENSES.md), sorted."""
    return _samples(DEMO_IMAGE_PREFIX, exclude=True)


class TeeLog:
    """A training log written to its file and, line by line as it grows, to a stream (stderr): the training
    scripts run for minutes, and their progress lines should be seen while they run, not only at the end."""

    def __init__(self, file: TextIO, stream: TextIO) -> None:
        self.file, self.stream = file, stream

    def write(self, text: str) -> int:
        self.stream.write(text)
        self.stream.flush()
        return self.file.write(text)

    def flush(self) -> None:
        self.file.flush()
        self.stream.flush()


@contextmanager
def training_log(out: Path, name: str, header: str) -> Iterator[TeeLog]:
    """A training script's log: the folder `out` made, `out / name` written and shown on stderr as it grows
    (`TeeLog`), `header` (what ran, with which versions) its first line."""
    out.mkdir(parents=True, exist_ok=True)
    with open(out / name, "w", encoding="utf-8") as log_file:
        log = TeeLog(log_file, sys.stderr)
        log.write(header)
        yield log


__all__ = ["demo_checkpoint", "demo_images", "sample_photos", "TeeLog", "training_log"]
