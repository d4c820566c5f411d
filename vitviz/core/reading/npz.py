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
    """Every array of an `.npz` as float32 tensors (names unchanged, without `.npy`).

    Each member's header is read before its data: a member that is no NumPy array (a raw pickle among them), an
    array whose header declares more data than the member holds (a corrupt file, not a memory problem), and
    arrays of integers, booleans or structured records (no weights of a float model) are refused naming the
    member. 0-d integer arrays (a step counter) are kept as they are.

    Raises:
        UnsafeCheckpointError: an array that would need pickle (object arrays, a pickled member).
        CorruptCheckpointError: a damaged archive, a header that does not match its data, or an array that is not
            float weights.
    """
    tensors: dict[str, torch.Tensor] = {}
    try:
        with zipfile.ZipFile(path) as archive:
            for info in archive.infolist():
                if info.is_dir():
                    continue
                name = info.filename[:-4] if info.filename.endswith(".npy") else info.filename
                tensors[name] = _read_member(archive, info, name, path)
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as e:
        raise CorruptCheckpointError(f"{path}: a damaged .npz archive ({e}); expected NumPy arrays of weights") \
            from None
    if not tensors:
        raise CorruptCheckpointError(f"{path}: an .npz without arrays; expected JAX weights")
    return tensors


def _read_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo, name: str, path: Path) -> torch.Tensor:
    """One member: its header checked against its size and dtype, then its array as a tensor."""
    fmt = np.lib.format
    with archive.open(info) as f:
        magic = f.read(len(fmt.MAGIC_PREFIX))
        if magic != fmt.MAGIC_PREFIX:
            if magic[:1] == b"\x80":
                raise UnsafeCheckpointError(f"{path}: member {name!r} of the .npz is a pickle, not a NumPy array; "
                                            "vitviz reads only .npy arrays (np.load with allow_pickle=False)")
            raise CorruptCheckpointError(f"{path}: member {name!r} of the .npz is not a NumPy array (it starts "
                                         f"with {magic[:6]!r}); expected .npy arrays of weights")
        f.seek(0)
        try:
            version = fmt.read_magic(f)
            shape, _fortran, dtype = (fmt.read_array_header_1_0(f) if version == (1, 0) else
                                      fmt.read_array_header_2_0(f))
        except (ValueError, SyntaxError, TypeError) as e:
            raise CorruptCheckpointError(f"{path}: member {name!r} has a damaged .npy header ({e}); expected a "
                                         "NumPy array") from None
        if dtype.hasobject:
            raise UnsafeCheckpointError(f"{path}: an .npz holding pickled Python objects (member {name!r}, dtype "
                                        f"{dtype}); vitviz reads only numeric arrays (np.load with allow_pickle=False)")
        count = 1
        for n in shape:
            count *= int(n)
        declared, held = count * dtype.itemsize, info.file_size - f.tell()
        if declared > held:
            raise CorruptCheckpointError(f"{path}: member {name!r} declares shape {tuple(shape)} {dtype} "
                                         f"({declared:,} bytes) but holds {max(held, 0):,} bytes; a corrupt or "
                                         "truncated file, expected an array with its data")
        _check_dtype(dtype, shape, name, path)
        f.seek(0)
        array = fmt.read_array(f, allow_pickle=False)
    return _as_tensor(array, name, path)


def _check_dtype(dtype: np.dtype, shape: tuple[int, ...], name: str, path: Path) -> None:
    """Float arrays and bfloat16 (2-byte void without fields) are weights; a 0-d integer may be a step counter;
    anything else is refused naming the member."""
    if dtype.kind == "f" or (dtype.kind == "V" and dtype.itemsize == 2 and dtype.names is None):
        return
    if dtype.kind in "iu" and len(shape) == 0:
        return
    what = ("structured records" if dtype.names is not None else "booleans" if dtype.kind == "b" else
            "integers" if dtype.kind in "iu" else "complex numbers" if dtype.kind == "c" else f"dtype {dtype}")
    raise CorruptCheckpointError(f"{path}: array {name!r} {tuple(shape)} holds {what} ({dtype}); expected float "
                                 "weights (float32, float16 or bfloat16)")


def _as_tensor(a: np.ndarray, name: str, path: Path) -> torch.Tensor:
    """One array as a float32 tensor; bfloat16 (stored as 2-byte void) widened exactly; a 0-d integer kept."""
    if a.dtype.kind == "V" and a.dtype.itemsize == 2:
        bits = a.view(np.uint16).astype(np.uint32) << 16  # bfloat16 -> the high half of a float32
        return torch.from_numpy(np.ascontiguousarray(bits).view(np.float32).copy())
    if a.dtype.kind in "iu" and a.ndim == 0:
        return torch.tensor(int(a))
    if a.dtype.kind != "f":
        raise CorruptCheckpointError(f"{path}: array {name!r} has dtype {a.dtype}; expected float weights")
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32).copy())
