"""Drawing of the main window: the attention map with its title and scale, the overview, the analysis panels,
the placeholder text and the hover/click readouts of the image panel.

Mixed into `MainWindow`; every redraw starts at `_refresh(changed)`, which the view state calls with the names
of the fields that changed.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from vitviz.core import render
from vitviz.gui.panels.info import ModelInfo
from vitviz.core.maps import levels_for
from vitviz.gui.state import ROLLOUT_FIELDS

if TYPE_CHECKING:
    from vitviz.gui.window import MainWindow

MAP_FIELDS = {"source", "layer", "head", "query", "normalize", "colormap", "smooth", "image"}


class DrawingMixin:
    """Mixed into `MainWindow`; uses its state, session, panels and `refreshed` signal."""

    def _refresh(self: "MainWindow", changed: set[str]) -> None:
        """Redraw what the changed fields affect; cheap enough for one frame (maps are cached per result)."""
        maps = self.session.result(self.session.current)
        rollout_changed = bool(changed & ROLLOUT_FIELDS) and self.state.source == "rollout"
        if maps is None:
            self._show_placeholder()
        elif changed & MAP_FIELDS or rollout_changed:
            self._draw_map(maps, image_changed="image" in changed)
        else:
            self.panel.set_opacity(self.state.opacity)
            if "per_tile" in changed:
                stack = maps.stack_for(self.state)
                self.overview.show_stack(stack, self.state.per_tile, self.state.colormap)
        self.panel.set_grid_visible(self.state.show_grid and maps is not None)
        self._refresh_analysis(maps, changed)
        self.refreshed.emit()

    def _refresh_analysis(self: "MainWindow", maps: Any, changed: set[str]) -> None:
        """Hand the current result to the analysis panels (each redraws only what it needs, and only when
        visible)."""
        self.matrix.set_maps(maps)
        self.rollout_panel.set_maps(maps)
        self.headstats.set_current(self.session.current if maps is not None else "")
        if "colormap" in changed:
            self.posembed.set_colormap(self.state.colormap)

    def _update_info(self: "MainWindow") -> None:
        s = self.session
        maps = s.result(s.current) if s.current else None
        self.info.show_info(ModelInfo(
            spec=s.spec, device=s.device, path=s.model_path, param_counts=dict(s.param_counts),
            cache_bytes=s.cache_nbytes, cached_images=len(s.cached_paths()), image=Path(s.current).name
            if s.current else "", top5=maps.result.top_k(5) if maps is not None else [], image_size=s.image_size))

    def _show_placeholder(self: "MainWindow") -> None:
        path, s = self.session.current, self.session
        if s.spec is None:
            text = "Open a model (File › Open model) or drop a checkpoint on the window"
        elif not path:
            text = "Drop images or folders on the window (or File › Open images)"
        elif path in s.failed:
            text = f"{Path(path).name}: {s.failed[path]}"
        else:
            text = f"Running {Path(path).name}…"
        self.panel.clear(text)
        self.overview.clear()
        self._values = None

    def _draw_map(self: "MainWindow", maps: Any, image_changed: bool) -> None:
        state, result = self.state, maps.result
        if image_changed:
            self.panel.set_image(result.image, result.grid, result.spec.patch_size)
        values, stack = maps.current(state)
        self._values = values
        levels = levels_for(state, values, stack)
        shown = render.upsample(values, _grid_pixels(result), True) if state.smooth else values
        title = f"{self._title(stack.title, result)} · scale {levels[0]:.3g}–{levels[1]:.3g}"
        self.panel.show_map(shown, levels, state.colormap, state.opacity, title)
        self.panel.set_highlight(self._query_patch(result))
        self.overview.show_stack(stack, state.per_tile, state.colormap)
        layer = None if state.layer == "mean" else int(state.layer)
        self.overview.select(layer, stack.column(state.head))

    def _title(self: "MainWindow", what: str, result: Any) -> str:
        s = self.state
        if s.source == "token" and s.query is not None:
            what = f"attention of {result.spec.token_name(s.query)} (token {s.query})"
        head = "" if s.source == "rollout" else f" · head {s.head}"
        layer = f"through layer {s.layer}" if s.source == "rollout" else f"layer {s.layer}"
        return f"{Path(result.source).name} — {what} · {layer}{head}"

    def _query_patch(self: "MainWindow", result: Any) -> tuple[int, int] | None:
        q, p = self.state.query, result.num_prefix
        if self.state.source not in ("token", "rollout") or q is None or q < p:
            return None
        return divmod(q - p, result.grid[1])

    def _on_hover(self: "MainWindow", row: int, col: int) -> None:
        maps = self.session.result(self.session.current)
        if row < 0 or maps is None or self._values is None:
            self.hover_label.setText("")
            return
        token = maps.result.num_prefix + row * maps.result.grid[1] + col
        self.hover_label.setText(f"row {row}, col {col} · token {token} · value {self._values[row, col]:.4g}")

    def _on_patch_clicked(self: "MainWindow", row: int, col: int) -> None:
        maps = self.session.result(self.session.current)
        if maps is not None:
            self.select_query(maps.result.num_prefix + row * maps.result.grid[1] + col)

    def _on_tile_clicked(self: "MainWindow", layer: int, head: int | str | None) -> None:
        self.state.update(layer=layer, **({} if head is None else {"head": head}))


def _grid_pixels(result: Any) -> tuple[int, int]:
    """Pixel size of the area the patch grid covers."""
    gh, gw = result.grid
    p = result.spec.patch_size
    return gh * p, gw * p
