"""Drawing: maps into pictures (render, colormaps, show)."""
