"""Work around PySide6 6.12's reference-count bug on CPython < 3.12.

PySide6/shiboken6 6.12.0 drops one reference to `None` for every call of a Qt method that returns nothing (and to
`True`/`False` on some bool paths): `QRectF.setWidth` 1000 times in a fresh CPython 3.11 process is enough for
"Fatal Python error: none_dealloc". From 3.12 these objects are immortal (PEP 683) and the bug is harmless. On
older CPython we give the three singletons a reference count no session can exhaust, which is what 3.12 does.
"""
from __future__ import annotations

import ctypes
import sys
from importlib import metadata

PINNED_REFS = 1 << 40
BROKEN_SHIBOKEN = ("6.12.0",)  # pyproject excludes these; this guards environments installed by other means


def _shiboken_version() -> str:
    try:
        return metadata.version("shiboken6")
    except metadata.PackageNotFoundError:
        return ""


def pin_singletons() -> bool:
    """Make None, True and False effectively immortal on CPython < 3.12 with a broken shiboken6; True when
    something was changed."""
    if sys.implementation.name != "cpython" or sys.version_info >= (3, 12):
        return False
    if _shiboken_version() not in BROKEN_SHIBOKEN:
        return False
    for obj in (None, True, False):
        ctypes.c_ssize_t.from_address(id(obj)).value += PINNED_REFS   # ob_refcnt is PyObject's first field
    return True
