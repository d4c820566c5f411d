"""Reading JAX / Flax `.npz` checkpoints (vit_jax, big_vision) with NumPy alone: `np.load(allow_pickle=False)`.

The arrays keep their `/`-separated names (`Transformer/encoderblock_0/LayerNorm_0/scale`, `params/img/...`); the
`jax` family converts them. bfloat16 arrays, which NumPy has no type for, are stored as 2-byte void and are
widened here to float32 by shifting the 16 bits into the high half of a float32 (exact).
"""
from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
import torch

from vitviz.errors import CorruptCheckpointError, UnsafeCheckpointError


def read_npz(path: Path) -> dict[str, torch.Tensor]:
    """Every array of an `.npz` as float32 tensors (names unchanged).

    Raises:
        UnsafeCheckpointError: an array that would need pickle (object arrays).
        CorruptCheckpointError: a damaged archive or an array that is not numeric.
    """
    tensors: dict[str, torch.Tensor] = {}
    try:
        with np.load(path, allow_pickle=False) as data:
            for name in data.files:
                tensors[name] = _as_tensor(data[name], name, path)
    except ValueError as e:
        if "allow_pickle" in str(e) or "Object arrays" in str(e):
            raise UnsafeCheckpointError(f"{path}: an .npz holding pickled Python objects; vitviz reads only numeric "
                                        "arrays (np.load with allow_pickle=False)") from None
        raise CorruptCheckpointError(f"{path}: not a readable .npz ({e}); expected NumPy arrays of weights") from None
    except (zipfile.BadZipFile, OSError, EOFError) as e:
        raise CorruptCheckpointError(f"{path}: a damaged .npz archive ({e}); expected NumPy arrays of weights") \
            from None
    if not tensors:
        raise CorruptCheckpointError(f"{path}: an .npz without arrays; expected JAX weights")
    return tensors


def _as_tensor(a: np.ndarray, name: str, path: Path) -> torch.Tensor:
    """One array as a float32 tensor; bfloat16 (stored as 2-byte void) widened exactly."""
    if a.dtype.kind == "V" and a.dtype.itemsize == 2:
        bits = a.view(np.uint16).astype(np.uint32) << 16  # bfloat16 -> the high half of a float32
        return torch.from_numpy(np.ascontiguousarray(bits).view(np.float32).copy())
    if a.dtype.kind not in "fiub":
        raise CorruptCheckpointError(f"{path}: array {name!r} has dtype {a.dtype}; expected numeric weights")
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32).copy())
