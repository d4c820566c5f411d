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


class MetadataError(CorruptCheckpointError):
    """A config file or metadata entry beside the weights (config.json, preprocessor_config.json, a shard index,
    training args) holds a value of the wrong type or range; the message names the file and the field."""


class UnknownLayoutError(CheckpointError):
    """The file holds tensors, but not in any ViT layout vitviz knows (e.g. a ResNet)."""


class CompositeModelError(UnknownLayoutError):
    """A transformers folder whose config.json names a model vitviz does not convert (a vision-language or depth
    model whose image side it cannot read, or that holds no tower where its config says); the message names the
    model type and the route that works."""


class InconsistentCheckpointError(CheckpointError):
    """A ViT layout whose tensor shapes contradict each other or the metadata."""


class NoWeightsError(CheckpointError):
    """A folder that holds no weights file vitviz can read."""


class OverrideError(VitvizError, ValueError):
    """An override passed to `vitviz.load` (or its command-line option) has the wrong type or range."""


class ImageError(VitvizError):
    """An image could not be read or converted for the model."""


class DeviceError(VitvizError):
    """The requested device is unavailable or too small for the model."""


class DiskFullError(VitvizError):
    """An output folder's disk is full (or over its quota): writing stopped; the message names the folder."""


class NonFiniteError(VitvizError):
    """A forward pass gave NaN or infinite attention; the message names the setting that produced it when known."""
