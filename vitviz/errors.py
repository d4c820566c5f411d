"""Errors raised by vitviz.

Every error names the file (or input) involved, what was found and what was expected. The GUI shows them
once, at its boundary; the CLI prints them and exits non-zero. Nothing here imports torch or Qt.
"""
from __future__ import annotations


class VitvizError(Exception):
    """Base class of every error vitviz raises on purpose."""


class CheckpointError(VitvizError):
    """A checkpoint could not be turned into a model."""


class CheckpointNotFoundError(CheckpointError):
    """The path does not exist."""


class UnsafeCheckpointError(CheckpointError):
    """The file would need code execution to load (pickled code, TorchScript, a whole pickled module)."""


class CorruptCheckpointError(CheckpointError):
    """The file is empty, truncated or not a checkpoint container at all."""


class UnknownLayoutError(CheckpointError):
    """The file holds tensors, but not in any ViT layout vitviz knows (e.g. a ResNet)."""


class InconsistentCheckpointError(CheckpointError):
    """A ViT layout whose tensor shapes contradict each other or the metadata."""


class NoWeightsError(CheckpointError):
    """A folder that holds no weights file vitviz can read."""


class ImageError(VitvizError):
    """An image could not be read or converted for the model."""


class DeviceError(VitvizError):
    """The requested device is unavailable or too small for the model."""
