"""Wiring a part's signals to their slots from one table: `wire(session.model, model_loaded=self._on_model_loaded, ...)`
instead of one `.connect` line a signal, so a panel's or client's wiring reads as the list of what it follows."""
from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import QObject


def wire(source: QObject, **slots: Callable[..., object]) -> None:
    """Connect each signal of `source` named in `slots` to its slot (a name `source` lacks is a bug: AttributeError)."""
    for name, slot in slots.items():
        getattr(source, name).connect(slot)
