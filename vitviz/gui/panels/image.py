"""The image panel: the image as the model saw it, the current attention map over it with its title and colour
scale, the patch grid and the selected query patch.

For a windowed model (Swin, SAM / ViTDet: a `vitviz.core.analyses.winview.WindowedMaps` result) the layer selection is a
block over all stages: the block's map is drawn at its stage's resolution (cells of the stage's stride) with the
block's window outlines over it (`WindowOutlineItem`; a shifted block's windows as they lie after the shift) and,
with a query patch, its window highlighted.

It draws itself, built from the parts it shows: it follows the image list's current result (`current_changed`) and
the view state, and shows what is happening instead (no model, loading, no image, running, failed: the model part
and the image list say) while there is no result.
"""
from __future__ import annotations

from pathlib import Path
import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QPointF, QRectF, Qt, Signal
from PySide6.QtGui import QPainterPath
from PySide6.QtWidgets import QGraphicsPathItem, QGraphicsRectItem, QVBoxLayout, QWidget

from vitviz.core.drawing import render
from vitviz.core.analyses.maps import ImageMaps, ResultMaps
from vitviz.gui import colors
from vitviz.gui.panels import base, blit
from vitviz.gui.panels.windows import WindowOutlineItem
from vitviz.gui.images import ImageList
from vitviz.gui.model_slot import ModelSlot
from vitviz.gui.state import QUERY_SOURCES, ROLLOUT_FIELDS, ViewState, map_kind, view_of
from vitviz.gui.numbers import number, number_range

MAP_FIELDS = {"source", "layer", "head", "query", "normalize", "colormap", "smooth", "image",   # "image": a new result
              "relevance_method", "relevance_class", "relevance_prompt", "rollout_pool"}


class ImagePanel(QWidget):
    """Shows the current image with its attention map.

    Attributes:
        values: the (gh, gw) map shown now (before smoothing), or None.

    Signals:
        hovered(row, col): the patch under the mouse, (-1, -1) when the mouse leaves the patch grid.
        clicked(row, col): a left click on a patch.
        query_clicked(token): the token of the clicked patch (prefix tokens counted).
        values_changed(): the map shown changed (another query, layer, source...): the hover readout of the
            patch under the mouse is out of date.
    """

    hovered = Signal(int, int)
    values_changed = Signal()
    clicked = Signal(int, int)
    query_clicked = Signal(int)

    def __init__(self, state: ViewState, model: ModelSlot, images: ImageList, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("imagePanel")
        self.scale_text = ""          # which colour scale the map is on (the colorbar's label)
        self.state, self.model, self.images = state, model, images
        self.values: np.ndarray | None = None
        self._maps: ResultMaps | None = images.current_maps
        self._grid: tuple[int, int] = (0, 0)
        self._patch = 1
        self._last_hover = (-1, -1)
        self._cmap_name = "viridis"
        self._levels: tuple[float, float] = (0.0, 1.0)
        self._image_rect, self._overlay_rect = QRectF(), None   # what the image and map items were last placed at
        self._photo: np.ndarray | None = None      # the image the image item shows (not set again when the same)
        self._scale_label = ""                     # the colorbar's label as last set
        self._build()
        self.clicked.connect(self._on_patch_clicked)
        state.subscribe(self.refresh)
        images.current_changed.connect(self._on_current_changed)
        model.loading_changed.connect(self._on_loading_changed)
        self.refresh(MAP_FIELDS)

    def _build(self) -> None:
        self.view_widget = pg.GraphicsLayoutWidget()
        self.view_widget.setBackground(base.BACKGROUND)
        self.view_widget.ci.setContentsMargins(4, 4, 4, 4)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.view_widget)
        self.title = base.TitleLabel("Open a model and drop images here", lines=2, color=base.TEXT,
                                     size="11pt")          # two lines kept: the image stays put as titles wrap
        self.view_widget.addItem(self.title, row=0, col=0, colspan=2)
        self.view = self.view_widget.addViewBox(row=1, col=0, lockAspect=True, invertY=True, enableMenu=False)
        self.image_item = blit.ImageItem()
        self.overlay_item = blit.ImageItem()
        self.overlay_item.setZValue(1)
        self.grid_item = QGraphicsPathItem()
        self.grid_item.setPen(base.pen("#ffffff", 90))
        self.grid_item.setZValue(2)
        self.grid_item.setVisible(False)
        self.highlight_item = QGraphicsRectItem()
        self.highlight_item.setPen(base.pen(base.SELECT, 255, 2.0))
        self.highlight_item.setZValue(3)
        self.highlight_item.setVisible(False)
        self.outline_item = WindowOutlineItem(color="#ffffff", alpha=170, width=1.0)   # a windowed block's windows
        self.outline_item.setVisible(False)
        for item in (self.image_item, self.overlay_item, self.grid_item, self.outline_item, self.highlight_item):
            self.view.addItem(item)
        self.colorbar = pg.ColorBarItem(values=(0.0, 1.0), colorMap=colors.colormap("viridis"),
                                        interactive=False, width=14)
        self.view_widget.addItem(self.colorbar, row=1, col=1)
        self.colorbar.setVisible(False)
        scene = self.view_widget.scene()
        scene.sigMouseMoved.connect(self._on_mouse_moved)
        scene.sigMouseClicked.connect(self._on_mouse_clicked)

    # ------------------------------------------------------------------------------------------ inputs

    def _on_loading_changed(self, _loading: bool) -> None:
        if self._maps is None:
            self.clear(self.placeholder())

    def _on_current_changed(self, maps: ResultMaps | None) -> None:
        self._maps = maps
        self.refresh(MAP_FIELDS)

    def refresh(self, changed: set[str]) -> None:
        """Redraw what the changed view fields (or 'image': a new result) affect; cheap enough for one frame (maps
        are cached per result)."""
        maps, state = self._maps, self.state
        rollout_changed = bool(changed & ROLLOUT_FIELDS) and state.source == "rollout"
        if maps is None:
            self.clear(self.placeholder())
            self.values = None
            self.values_changed.emit()
        elif changed & MAP_FIELDS or rollout_changed:
            self._draw_map(maps, image_changed="image" in changed)
        else:
            self.set_opacity(state.opacity)
        self.set_grid_visible(state.show_grid and maps is not None)

    def placeholder(self) -> str:
        """What the panel says while there is no result to show."""
        model, path = self.model, self.images.current
        if model.spec is None:
            return base.waiting_text(model, "Open a model (File › Open model) or drop a checkpoint on the window")
        if not path:
            return "Drop images or folders on the window (or File › Open images)"
        if path in self.images.failed:
            return f"{Path(path).name}: {base.failure_reason(path, self.images.failed[path])}"
        if model.awaiting_answers:
            return "Waiting for the settings the file does not say"
        return f"Running {Path(path).name}…"

    @property
    def hovered_patch(self) -> tuple[int, int]:
        """The patch under the mouse, (-1, -1) when it is outside the grid."""
        return self._last_hover

    def readout(self, row: int, col: int) -> str:
        """The hover text for a patch ('' outside the grid or without a map); a map on a coarser grid (a windowed
        model's later stage) reads the cell holding the patch."""
        maps, values = self._maps, self.values
        if row < 0 or maps is None or values is None:
            return ""
        token = maps.result.num_prefix + row * maps.grid[1] + col
        if values.shape == tuple(maps.grid):
            return f"row {row}, col {col} · token {token} · value {number(values[row, col])}"
        f_r, f_c = (max(1, -(-maps.grid[i] // values.shape[i])) for i in (0, 1))
        cell = (min(row // f_r, values.shape[0] - 1), min(col // f_c, values.shape[1] - 1))
        where = "" if cell == (row, col) else f" · stage cell {cell[0]}, {cell[1]}"
        return f"patch row {row}, col {col} · patch {token}{where} · value {number(values[cell])}"

    # ------------------------------------------------------------------------------------------ drawing

    def _draw_map(self, maps: ImageMaps, image_changed: bool) -> None:
        """The selected map (`ImageMaps.view`: a windowed model's block at its stage's resolution), its title and
        scale, the query patch, and the layer's window outlines with the query's window where the holder has some."""
        state, result = self.state, maps.result
        if image_changed or self._grid != tuple(maps.grid):
            self.set_image(result.image, tuple(maps.grid), result.spec.patch_size)
        kind = map_kind(state)
        stack, row, head, stride = view_of(maps, state)
        values = stack.select(row, head)
        self.values = values
        self.values_changed.emit()
        levels = stack.levels(values, head, own=state.normalize)
        size = (values.shape[0] * stride, values.shape[1] * stride)
        shown = render.upsample(values, size, True) if state.smooth else values
        self.scale_text = render.scale_label(stack, head, "own" if state.normalize else "shared")
        what, where = maps.caption(kind, state.layer, row, stack)
        parts = [f"{Path(result.source).name} — {what}", where]
        if kind.per_head and not stack.pending:
            parts.append(f"head {head}")
        if not stack.pending:
            parts.append(f"{self.scale_text.split(':')[0]} {number_range(*levels)}")
        self.show_map(shown, levels, state.colormap, state.opacity, " · ".join(parts), extent=(size[1], size[0]))
        if self.scale_text != self._scale_label:       # a new label lays the colorbar's axis out again
            self._scale_label = self.scale_text
            self.colorbar.axis.setLabel(self.scale_text, color=base.TEXT)
        self.overlay_item.setVisible(not stack.pending)     # a class's relevance still being computed: the image
        self.colorbar.setVisible(not stack.pending)
        patch = self._query_patch(maps)
        self.set_highlight(patch)
        outlines = None if kind.kind == "rollout" or stack.pending else maps.outlines(state.layer)
        if outlines is None:
            self.outline_item.setVisible(False)
            return
        self.outline_item.set_outlines(outlines.segments, outlines.stride)
        self.outline_item.set_query_window(None if patch is None else maps.query_outline(state.layer, patch),
                                           outlines.stride)
        self.outline_item.setVisible(True)

    def _query_patch(self, maps: ImageMaps) -> tuple[int, int] | None:
        """The (row, col) of the query patch the map shows (a query token's map, or the rollout from it), or None
        (no query, a prefix token, the rollout of a MAP head's pooling query)."""
        s, result, (gh, gw) = self.state, maps.result, maps.grid
        q, p = s.query, result.num_prefix
        if not (s.source in QUERY_SOURCES or s.source == "rollout") or q is None or not p <= q < p + gh * gw:
            return None
        if s.source == "rollout" and s.rollout_pool and getattr(result, "pool_attention", None) is not None:
            return None                     # the rollout of the pooling query, not of the selected patch
        return divmod(q - p, gw)

    def set_image(self, image: np.ndarray, grid: tuple[int, int], patch: int) -> None:
        """Show an (H, W, 3) uint8 image whose patch grid is `grid` patches of `patch` pixels."""
        resized = (self._grid, self._patch) != (grid, patch)
        self._grid, self._patch = grid, patch
        photo = self._photo
        if photo is None or not (photo is image or photo.shape == image.shape and np.array_equal(photo, image)):
            self._photo = image          # an intervened run of the same image (an ablate click): not drawn anew
            self.image_item.setImage(image, autoLevels=False, levels=(0, 255))
        rect = QRectF(0, 0, image.shape[1], image.shape[0])
        if resized or rect != self._image_rect:      # the same size: its pixels only (no new bounds to measure)
            self._image_rect = rect
            self.image_item.setRect(rect)
        if resized:
            self._build_grid()
            self.view.autoRange(padding=0.01)

    def clear(self, message: str) -> None:
        """Remove the image and the map and show `message` instead."""
        self.image_item.clear()
        self.overlay_item.clear()
        self._photo = None
        self._image_rect, self._overlay_rect = QRectF(), None
        self.outline_item.setVisible(False)
        self.colorbar.setVisible(False)
        self.highlight_item.setVisible(False)
        self.grid_item.setVisible(False)
        self.title.setText(message)

    def show_map(self, values: np.ndarray, levels: tuple[float, float], cmap: str, opacity: float,
                 title: str, extent: tuple[float, float] | None = None) -> None:
        """Overlay a map (any resolution; it is stretched over the patch grid) with the given colour scale; with
        `extent` (width, height in input pixels: a windowed stage's grid times its stride) over that instead."""
        gh, gw = self._grid
        self.overlay_item.setImage(values, autoLevels=False, levels=levels, lut=colors.lut(cmap))
        width, height = extent or (gw * self._patch, gh * self._patch)
        placed = (values.shape, QRectF(0, 0, width, height))    # setRect scales by the image's shape: both
        if placed != self._overlay_rect:
            self._overlay_rect = placed
            self.overlay_item.setRect(placed[1])
        self.overlay_item.setOpacity(opacity)
        if self._cmap_name != cmap:
            self._cmap_name = cmap
            self.colorbar.setColorMap(colors.colormap(cmap))
        if levels != self._levels:
            self._levels = levels
            colors.set_colorbar_levels(self.colorbar, levels)
        self.colorbar.setVisible(True)
        self.title.setText(title)

    def set_opacity(self, opacity: float) -> None:
        self.overlay_item.setOpacity(opacity)

    def set_grid_visible(self, visible: bool) -> None:
        self.grid_item.setVisible(visible)

    def set_highlight(self, patch: tuple[int, int] | None) -> None:
        """Outline one patch (row, col), or nothing."""
        if patch is None:
            self.highlight_item.setVisible(False)
            return
        r, c = patch
        p = self._patch
        self.highlight_item.setRect(QRectF(c * p, r * p, p, p))
        self.highlight_item.setVisible(True)

    def patch_at(self, scene_pos: QPointF) -> tuple[int, int] | None:
        """The (row, col) of the patch under a scene position, or None outside the grid."""
        if self._grid == (0, 0):
            return None
        point = self.view.mapSceneToView(scene_pos)
        col, row = int(np.floor(point.x() / self._patch)), int(np.floor(point.y() / self._patch))
        if 0 <= row < self._grid[0] and 0 <= col < self._grid[1]:
            return row, col
        return None

    def _build_grid(self) -> None:
        gh, gw = self._grid
        p = self._patch
        path = QPainterPath()
        for r in range(gh + 1):
            path.moveTo(0, r * p)
            path.lineTo(gw * p, r * p)
        for c in range(gw + 1):
            path.moveTo(c * p, 0)
            path.lineTo(c * p, gh * p)
        self.grid_item.setPath(path)

    def _on_mouse_moved(self, scene_pos: QPointF) -> None:
        patch = self.patch_at(scene_pos) or (-1, -1)
        if patch != self._last_hover:
            self._last_hover = patch
            self.hovered.emit(*patch)

    def _on_mouse_clicked(self, event: object) -> None:
        if event.button() != Qt.MouseButton.LeftButton or event.double():
            return
        patch = self.patch_at(event.scenePos())
        if patch is not None:
            self.clicked.emit(*patch)

    def _on_patch_clicked(self, row: int, col: int) -> None:
        maps = self._maps
        if maps is not None:
            self.query_clicked.emit(maps.result.num_prefix + row * maps.grid[1] + col)
