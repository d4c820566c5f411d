"""vitviz: see what a Vision Transformer attends to.

The public API is small::

    import vitviz
    model = vitviz.load("vit_b_16.pth")     # overrides: heads=, family=, image_size=, device=, eps=, mean=, std=
    result = model.run("cat.jpg")           # a path, PIL image, HxWxC array or a (1, C, H, W) tensor
    result.attentions.shape                 # (L, H, T, T)

`vitviz.load` imports torch on first use, so importing this package stays cheap (the GUI relies on that).
"""
from __future__ import annotations

from typing import Any

from vitviz.errors import (
    CheckpointError,
    CheckpointNotFoundError,
    CorruptCheckpointError,
    DeviceError,
    ImageError,
    InconsistentCheckpointError,
    NoWeightsError,
    UnknownLayoutError,
    UnsafeCheckpointError,
    VitvizError,
)

__version__ = "0.1.0"

__all__ = [
    "load", "VitvizError", "CheckpointError", "CheckpointNotFoundError", "CorruptCheckpointError",
    "DeviceError", "ImageError", "InconsistentCheckpointError", "NoWeightsError", "UnknownLayoutError",
    "UnsafeCheckpointError", "__version__",
]


def load(path: Any, **overrides: Any) -> Any:
    """Load a ViT checkpoint (file, folder, or state dict) into a `vitviz.core.capture.VitModel`."""
    from vitviz.core.load import load as _load

    return _load(path, **overrides)
