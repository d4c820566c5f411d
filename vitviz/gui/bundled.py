"""The bundled demo model and sample images as the window uses them (no Qt, no torch).

`vitviz` with no arguments opens the demo model on the demo images; a model without images gets the sample photos
(or the demo images, when the model is the demo).
"""
from __future__ import annotations

import os

from vitviz.demo import demo_checkpoint, demo_images, sample_photos
from vitviz.errors import CheckpointNotFoundError

DEMO_NAME = "shapes ViT"


def demo_model() -> str | None:
    """The demo model folder, or None when this install lacks it."""
    try:
        return str(demo_checkpoint())
    except CheckpointNotFoundError:
        return None


def is_demo(path: str) -> bool:
    """Whether `path` is the bundled demo model (its folder or a file in it)."""
    demo = demo_model()
    if demo is None or not path:
        return False
    real = os.path.realpath(path)
    return real == os.path.realpath(demo) or os.path.dirname(real) == os.path.realpath(demo)


def images_for(model: str) -> list[str]:
    """The bundled images that suit `model`: the shapes images for the demo, the photographs for anything else."""
    return [str(p) for p in (demo_images() if is_demo(model) else sample_photos())]


def demo_status(grid: tuple[int, int], classes: int, instead_of_model: bool = False) -> str:
    """The status-bar line while the demo model is loaded: what it is and how to open one's own.
    `instead_of_model`: images were named without --model, so the demo model runs them."""
    what = f"{grid[0]}×{grid[1]} patches" + (f", {classes} shape classes" if classes else "")
    if instead_of_model:
        return (f"No model given: running the images on the demo model ({DEMO_NAME}, {what}) — to use your own: "
                "vitviz IMAGES --model CHECKPOINT, File ▸ Open model…, or drop a checkpoint on the window")
    return (f"Demo model loaded ({DEMO_NAME}, {what}) — your own: File ▸ Open model…, or drop a checkpoint "
            "here")


def missing_demo_hint() -> str:
    """The status-bar line when the demo model is not installed."""
    return ("The demo model is not installed — open a checkpoint with File ▸ Open model… (Ctrl+O), pick one in the "
            "Models menu, or drop a checkpoint and images on the window")
