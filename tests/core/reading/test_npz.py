"""JAX / big_vision `.npz` checkpoints read as safely as the others (`vitviz.core.reading.npz`, issue 20): a member
that is a pickle, no NumPy array, or an array of integers, booleans or records is refused naming it, and a header
that declares far more than the member holds is corrupt, said with both sizes (not as a lack of memory). The parity
of `.npz` models with their originals is in tests/parity/test_parity_jax.py."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import vitviz


def _npz(path: Path, members: dict[str, bytes]) -> Path:
    import zipfile

    with zipfile.ZipFile(path, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    return path


def _npy(array: "np.ndarray") -> bytes:
    import io

    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def test_npz_members_that_are_no_float_arrays(tmp_path: Path) -> None:
    import pickle

    from vitviz.errors import CorruptCheckpointError, UnsafeCheckpointError

    kernel = _npy(np.zeros((4, 4), np.float32))
    cases = [
        ({"Transformer/kernel.npy": kernel, "evil.npy": pickle.dumps({"a": 1})}, UnsafeCheckpointError,
         "member 'evil' of the .npz is a pickle"),
        ({"Transformer/kernel.npy": kernel, "notes.npy": b"just some text"}, CorruptCheckpointError,
         "member 'notes' of the .npz is not a NumPy array"),
        ({"embedding/kernel.npy": _npy(np.zeros((4, 4), np.int8))}, CorruptCheckpointError,
         "array 'embedding/kernel' \\(4, 4\\) holds integers \\(int8\\)"),
        ({"embedding/kernel.npy": _npy(np.zeros((4,), bool))}, CorruptCheckpointError, "holds booleans"),
        ({"embedding/kernel.npy": _npy(np.zeros((4,), [("a", "i1"), ("b", "i1")]))}, CorruptCheckpointError,
         "holds structured records"),
    ]
    for i, (members, error, needle) in enumerate(cases):
        with pytest.raises(error, match=needle):
            vitviz.load(_npz(tmp_path / f"case{i}.npz", members))


def test_npz_header_declaring_absurd_sizes_is_corrupt(tmp_path: Path) -> None:
    import io

    from vitviz.errors import CorruptCheckpointError

    buffer = io.BytesIO()
    np.lib.format.write_array_header_1_0(buffer, {"descr": "<f4", "fortran_order": False,
                                                  "shape": (100000, 100000)})
    absurd = buffer.getvalue() + b"\0" * 64            # declaring 40 GB over 64 bytes
    path = _npz(tmp_path / "absurd.npz", {"head/bias.npy": _npy(np.zeros((1,), np.float32)),
                                          "embedding/kernel.npy": absurd})
    with pytest.raises(CorruptCheckpointError) as info:
        vitviz.load(path)
    text = str(info.value)
    assert "declares shape (100000, 100000) float32 (40,000,000,000 bytes) but holds 64 bytes" in text
    assert "memory" not in text
