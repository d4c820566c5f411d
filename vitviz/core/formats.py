"""The file names and suffixes vitviz recognises as model files: the one list every reader, scanner and dialog uses.

Torch-free, so the window can sort dropped files without importing torch.
"""
from __future__ import annotations

# Weight files vitviz reads itself (`vitviz.core.checkpoint`).
WEIGHT_SUFFIXES = (".safetensors", ".pth", ".pt", ".bin", ".ckpt", ".tar", ".npz")   # .npz: JAX (core/npz.py)
# Weight files of other frameworks: recognised as model files, so opening one gives a clear message about the format.
FOREIGN_WEIGHT_SUFFIXES = (".h5", ".msgpack")
MODEL_FILE_SUFFIXES = WEIGHT_SUFFIXES + FOREIGN_WEIGHT_SUFFIXES
# The weights file of a model folder (Hugging Face / timm hub / open_clip layouts), most preferred first.
WEIGHT_NAMES = ("model.safetensors", "pytorch_model.bin", "pytorch_model.pth", "model.pth",
                "open_clip_model.safetensors", "open_clip_pytorch_model.bin")
# A folder holding any of these is a model folder.
MODEL_FOLDER_MARKERS = ("config.json", "model.safetensors", "pytorch_model.bin", "model.safetensors.index.json",
                        "open_clip_config.json")


def dialog_filter() -> str:
    """The model-file filter of an Open dialog, e.g. 'Checkpoints (*.safetensors *.pth ...);;All files (*)'."""
    return f"Checkpoints ({' '.join('*' + s for s in MODEL_FILE_SUFFIXES)});;All files (*)"
