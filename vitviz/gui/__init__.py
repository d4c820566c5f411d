"""The desktop window (PySide6 + pyqtgraph); see DESIGN.md. Importing it pins None/True/False (see `compat`)."""
from vitviz.gui.compat import pin_singletons as _pin_singletons

_PINNED = _pin_singletons()
