"""The file names and suffixes vitviz recognises as model files: the one list every reader, scanner and dialog uses.

Torch-free, so the window can sort dropped files without importing torch.
"""
from __future__ import annotations

# Weight files vitviz reads itself (`vitviz.core.reading.checkpoint`).
WEIGHT_SUFFIXES = (".safetensors", ".pth", ".pt", ".bin", ".ckpt", ".tar", ".npz")   # .npz: JAX (core/reading/npz.py)
# Weight files of other frameworks: recognised as model files, so opening one gives a clear message about the format.
FOREIGN_WEIGHT_SUFFIXES = (".h5", ".msgpack")
MODEL_FILE_SUFFIXES = WEIGHT_SUFFIXES + FOREIGN_WEIGHT_SUFFIXES
# The weights file of a model folder (Hugging Face / timm hub / open_clip layouts), most preferred first.
WEIGHT_NAMES = ("model.safetensors", "pytorch_model.bin", "pytorch_model.pth", "model.pth",
                "open_clip_model.safetensors", "open_clip_pytorch_model.bin")
# The index of a sharded safetensors model (its shards are `model-0000N-of-0000M.safetensors` beside it).
SHARD_INDEX = "model.safetensors.index.json"
# What opening a model folder takes (`vitviz.core.reading.checkpoint`) and the catalog sizes, in that order: a single
# weights file before a sharded model's index.
FOLDER_WEIGHT_NAMES = WEIGHT_NAMES + (SHARD_INDEX,)


def _hub_rank(name: str) -> tuple[bool, bool]:
    """Safetensors before pickles; a transformers / timm file before open_clip's own copy of the same weights."""
    return not name.endswith((".safetensors", ".index.json")), name.startswith("open_clip")


# What a hub repository is asked for, first found wins (`vitviz.catalog.hub`): the folder's names a hub repository
# publishes (no `.pth`), safetensors before pickles, a sharded transformers model before open_clip's file.
HUB_WEIGHT_NAMES = tuple(sorted((n for n in FOLDER_WEIGHT_NAMES if not n.endswith(".pth")), key=_hub_rank))
# A folder holding any of these is a model folder.
MODEL_FOLDER_MARKERS = ("config.json", "model.safetensors", "pytorch_model.bin", SHARD_INDEX, "open_clip_config.json")


def dialog_filter() -> str:
    """The model-file filter of an Open dialog, e.g. 'Checkpoints (*.safetensors *.pth ...);;All files (*)'."""
    return f"Checkpoints ({' '.join('*' + s for s in MODEL_FILE_SUFFIXES)});;All files (*)"
