"""The layer × head overview dock: every layer's and head's map at once as one mosaic image.

One `ImageItem` holds the whole mosaic (rows = layers, columns = heads, then head mean and max), so ViT-L (24 × 18
tiles) costs one texture upload; a layer or head change only moves the selection frame. It is built from the
parts it shows and follows them by itself: the image list's current result, the model part's loading and the view
state's map source.

For a windowed model (Swin, SAM / ViTDet) the rows are the blocks of the selected block's stage (the stages'
grids differ), labelled with their block indices; a click selects that block.

Many heads over few rows (a Swin stage: 2 blocks × 24 heads) would be a strip of 26 columns of tiles a few pixels
wide: the heads of each row are then wrapped into bands (`wrap_layout`), the head mean and max to the right of the
first band, whenever that makes the tiles markedly larger in the dock (chosen again when the dock is resized).
"""
from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QPointF, QRectF, Qt, Signal
from PySide6.QtGui import QColor, QFontMetricsF, QPen
from PySide6.QtWidgets import QGraphicsRectItem, QVBoxLayout, QWidget

from vitviz.core.analyses.maps import MapStack, ResultMaps, mosaic
from vitviz.gui import colors
from vitviz.gui.panels import base, blit
from vitviz.gui.images import ImageList
from vitviz.gui.model_slot import ModelSlot
from vitviz.gui.state import ROLLOUT_FIELDS, ViewState, map_kind, view_of

STACK_FIELDS = {"source", "layer", "head", "query", "colormap", "per_tile",   # what the overview draws from
                "relevance_method", "relevance_class"}

# names of the head mean and max columns and the axis label, from the widest; the first that fits is used
MEAN_MAX = (("mean", "max", "head"), ("μ", "max", "head (μ: head mean)"),
            ("", "", "head (last two columns: head mean, max)"))
WRAP_FROM = 9          # heads per row from which a row may be wrapped into bands
WRAP_GAIN = 1.3        # wrapped only when the tiles get at least this much larger


def wrap_layout(rows: int, heads: int, width: float, height: float) -> int:
    """How many bands to wrap each row's `heads` head columns into (1: none) for a view of width × height px:
    the count that gives the largest tiles (heads ceil(heads / bands) wide, plus the mean and max columns; rows ×
    bands high), when it beats one band by `WRAP_GAIN`. A view not laid out yet counts as 4 : 3."""
    if heads < WRAP_FROM or rows < 1:
        return 1
    if not (width > 0 and height > 0):
        width, height = 4.0, 3.0

    def tile(bands: int) -> float:
        return min(width / (-(-heads // bands) + 2), height / (rows * bands))

    best = max(range(1, heads + 1), key=lambda b: (tile(b), -b))
    return best if tile(best) >= WRAP_GAIN * tile(1) else 1


class OverviewPanel(QWidget):
    """Thumbnails of the current map for every layer and head; click one to select it."""

    tile_clicked = Signal(object, object)   # layer index, head index or 'mean'/'max'
    tile_menu = Signal(object, object, object)   # right-click: layer, head (or 'mean'/'max'), global QPoint

    def __init__(self, state: ViewState, model: ModelSlot, images: ImageList, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("overviewPanel")
        self.state, self.model, self.images = state, model, images
        self._maps: ResultMaps | None = images.current_maps
        self._shape = (0, 0, 0, 0)          # L, C, gh, gw
        self._bands = 1                     # rows of tiles each layer's heads are wrapped into (`wrap_layout`)
        self._stack = None                  # the stack shown (laid out again when the dock's shape changes)
        self._selected: tuple[int | None, int | None] = (None, None)   # the framed (layer, column)
        self._gap = 1
        self._key: tuple[int, bool, str] | None = None
        self._columns: list[tuple[int, str]] = []     # (column, label) of the bottom axis
        self._column_name = "rollout"                  # the label of a stack with one column (its map's name)
        self._label_style = 0                          # how the mean and max columns are named (`MEAN_MAX`)
        self._blocks: list[int] = []                   # the block of each row where rows are not layers
                                                       # (`ImageMaps.row_blocks`: a windowed stage; [] otherwise)
        self._ablated: list[tuple[int, int]] = []      # heads an intervention ablates (marked; gui.interventions)
        self._marks: list[QGraphicsRectItem] = []
        self.widget = pg.GraphicsLayoutWidget()
        self.widget.setBackground("#202124")
        self.title = base.TitleLabel("", color=base.TEXT, size="10pt")     # wraps: never widens the panel
        self.widget.addItem(self.title, row=0, col=0)
        self.plot = self.widget.addPlot(row=1, col=0)
        self.plot.setMenuEnabled(False)
        self.plot.setMouseEnabled(False, False)
        self.plot.hideButtons()
        self.plot.invertY(True)
        self.plot.setAspectLocked(True)
        self.plot.getAxis("left").setLabel("layer")
        self.plot.getAxis("bottom").setLabel("head")
        self.image_item = blit.ImageItem()
        self.plot.addItem(self.image_item)
        self.frame = QGraphicsRectItem()
        pen = QPen(QColor("#ff3b30"))
        pen.setWidthF(2.0)
        pen.setCosmetic(True)
        self.frame.setPen(pen)
        self.frame.setZValue(5)
        self.frame.setVisible(False)
        self.plot.addItem(self.frame)
        self.widget.scene().sigMouseClicked.connect(self._on_clicked)
        self.plot.vb.sigResized.connect(self._fit_labels)
        self.plot.vb.sigResized.connect(self._rewrap)
        self.plot.vb.sigRangeChanged.connect(self._fit_labels)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.widget)
        self._show_axes(False)
        state.subscribe(self.refresh)
        images.current_changed.connect(self._on_current_changed)
        model.loading_changed.connect(lambda _loading: self.clear() if self._maps is None else None)
        self.refresh(STACK_FIELDS)

    def _on_current_changed(self, maps: ResultMaps | None) -> None:
        self._maps = maps
        self.refresh(STACK_FIELDS)

    def refresh(self, changed: set[str]) -> None:
        """Show the stack the view state selects from the current result (rebuilt only when it or its scaling
        changed) and frame the selected layer and head."""
        maps, state = self._maps, self.state
        if maps is None:
            self.clear()
        elif changed & STACK_FIELDS or (changed & ROLLOUT_FIELDS and state.source == "rollout"):
            stack, row, head, _stride = view_of(maps, state)
            self._blocks = list(maps.row_blocks(map_kind(state), state.layer) or ())
            self.show_stack(stack, state.per_tile, state.colormap)
            self.select(None if isinstance(row, str) else int(row), stack.column(head))

    def clear(self) -> None:
        """Nothing to show (no model or no result yet): no tiles, and no empty axes either."""
        self._show_axes(False)
        self.image_item.clear()
        self.frame.setVisible(False)
        for item in self._marks:
            item.setVisible(False)
        self._key = None
        self._shape = (0, 0, 0, 0)
        self._columns = []
        self._stack = None

    def show_stack(self, stack: MapStack, per_tile: bool, cmap: str) -> None:
        """Show every tile of a stack (only rebuilt when the stack or scaling changed)."""
        key = (id(stack), per_tile, cmap)
        if key == self._key:
            return
        self._key = key
        self._stack = stack
        self._show_axes(True)
        scaled = stack.shared_scaled()
        maps = scaled[:, :1] if stack.num_heads == 1 else scaled   # rollout, relevance: one column per layer
        nl, nc, gh, gw = maps.shape
        before = (self._shape, self._bands, self._gap, self._column_name, list(self._blocks))
        self._column_name = column_name(stack.title, self._maps.title if self._maps is not None else "")
        self._gap = max(1, min(gh, gw) // 8)
        self._shape = (nl, nc, gh, gw)
        view = self.plot.vb.size()
        self._bands = wrap_layout(nl, nc - 2, view.width(), view.height()) if nc > 2 else 1
        image = mosaic(self._wrapped(maps), per_tile, self._gap)
        self.image_item.setImage(image, autoLevels=False, levels=(0.0, 1.0), lut=colors.lut(cmap))
        scale = ("" if nl * nc == 1 else " · each tile scaled alone" if per_tile   # one tile: no scale to share
                 else " · one scale per column kind" if nc > 1 else " · one shared scale")
        self.title.setText(stack.title + scale)
        if before != (self._shape, self._bands, self._gap, self._column_name, self._blocks) or not self._columns:
            # another layout of tiles: ticks, range and marks again (the same layout, another image or an
            # intervened run of it: only the mosaic's pixels change, one texture upload and no relayout)
            self.image_item.setRect(QRectF(0, 0, image.shape[1], image.shape[0]))
            self._set_ticks(nl, nc, gh, gw)
            self.plot.autoRange(padding=0.02)
            self._set_bottom_ticks(self._fitting_style())
            self.mark(self._ablated, again=True)

    def _wrapped(self, maps: np.ndarray) -> np.ndarray:
        """(L, C, gh, gw) tiles as laid out: with `_bands` > 1 each layer's heads in that many rows of
        `_per_band()` columns, its mean and max beside the first, NaN (drawn as background) where no tile is."""
        if self._bands == 1:
            return maps
        nl, nc, gh, gw = maps.shape
        per = self._per_band()
        out = np.full((nl * self._bands, per + 2, gh, gw), np.nan, np.float32)
        for col in range(nc):
            row, vcol = self._place(0, col)
            out[row::self._bands, vcol] = maps[:, col]
        return out

    def _per_band(self) -> int:
        return -(-(self._shape[1] - 2) // self._bands)

    def _place(self, layer: int, column: int) -> tuple[int, int]:
        """The (row, column) of the mosaic where a layer's tile of a column (head, or H / H + 1 for mean / max)
        is drawn."""
        if self._bands == 1:
            return layer, column
        heads, per = self._shape[1] - 2, self._per_band()
        if column >= heads:
            return layer * self._bands, per + column - heads
        return layer * self._bands + column // per, column % per

    def _rewrap(self, *_args: object) -> None:
        """Lay the tiles out again when the dock's new shape wants another number of bands."""
        nl, nc = self._shape[:2]
        if self._stack is None or nc <= 2:
            return
        view = self.plot.vb.size()
        if wrap_layout(nl, nc - 2, view.width(), view.height()) != self._bands:
            self._key = None
            self.show_stack(self._stack, self.state.per_tile, self.state.colormap)
            self.select(*self._selected)

    def _show_axes(self, shown: bool) -> None:
        """Axes and title only around tiles (an empty plot used to show axes from -600 to 600)."""
        base.show_axes(self.plot, shown)
        if not shown:
            self.title.setText(self.placeholder())

    def placeholder(self) -> str:
        """What the panel says while it has no tiles."""
        model, current = self.model, self.images.current
        if model.spec is None:
            return base.waiting_text(model, "Open a model to see every layer's and head's map")
        if model.awaiting_answers:
            return "Waiting for the settings the file does not say"
        return "Running the image…" if current and current not in self.images.failed else "No result for this image"

    def select(self, layer: int | None, column: int | None) -> None:
        """Frame the tile of a layer and a column (head, or H for mean, H + 1 for max); None frames a whole row
        or column."""
        self._selected = (layer, column)
        nl, nc, gh, gw = self._shape
        if nl == 0:
            self.frame.setVisible(False)
            return
        if nc == 1:
            column = 0
        if nl == 1:
            layer = 0           # one map of the whole model (relevance, pooling attention): every layer is it
        sy, sx = gh + self._gap, gw + self._gap
        rows, cols = self.image_item.image.shape if self.image_item.image is not None else (0, 0)
        if layer is not None and column is not None:
            row, vcol = self._place(layer, column)
            y0, h, x0, w = row * sy, gh, vcol * sx, gw
        else:           # a whole layer (its bands) or a whole column (every layer)
            y0, h = (layer * self._bands * sy, self._bands * sy - self._gap) if layer is not None else (0, rows)
            x0, w = (0, cols) if column is None or self._bands > 1 else (column * sx, gw)
        self.frame.setRect(QRectF(x0 - 0.5 * self._gap, y0 - 0.5 * self._gap, w + self._gap, h + self._gap))
        self.frame.setVisible(True)

    def tile_at(self, point: QPointF) -> tuple[int, int] | None:
        """(layer, column) of the tile under a point in plot coordinates."""
        nl, nc, gh, gw = self._shape
        if nl == 0:
            return None
        row, col = int(point.y() // (gh + self._gap)), int(point.x() // (gw + self._gap))
        if point.y() < 0 or point.x() < 0:
            return None
        if self._bands > 1:
            per = self._per_band()
            layer, band = divmod(row, self._bands)
            if col >= per:
                row, col = (layer, nc - 2 + col - per) if band == 0 else (nl, nc)   # mean / max: first band only
            else:
                row, col = layer, band * per + col
                if col >= nc - 2:
                    return None                                                  # the last band's empty end
        if 0 <= row < nl and 0 <= col < nc:
            return row, col
        return None

    def _set_ticks(self, nl: int, nc: int, gh: int, gw: int) -> None:
        step = max(1, nl // 12)
        names = [str(b) for b in self._blocks] if len(self._blocks) == nl else [str(i) for i in range(nl)]
        bands, sy = self._bands, gh + self._gap
        left = [((i * bands + 0.5) * sy, names[i]) for i in range(0, nl, step)]
        left += [((i * bands + b + 0.5) * sy, f"+{b * self._per_band()}") for i in range(nl) for b in range(1, bands)]
        what = "block" if self._blocks else "layer"
        self.plot.getAxis("left").setLabel(what if bands == 1 else f"{what} (+n: heads from n)")
        if nl == 1 and self.model.spec is not None and self.model.spec.depth > 1:
            left = [(0.5 * (gh + self._gap), "all")]       # one map of the whole model (relevance, pooling)
        heads = nc - 2 if nc > 2 else nc
        shown = heads if bands == 1 else self._per_band()     # wrapped: one band's columns, then mean and max
        hstep = 1 if shown <= 8 else 2 if shown <= 16 else 4
        names = [(j, str(j)) for j in range(0, shown, hstep)]
        names += [(shown, "mean"), (shown + 1, "max")] if nc > 2 else []
        if nc == 1:
            names = [(0, self._column_name)]
        self._columns = names
        self.plot.getAxis("left").setTicks([left])

    def _set_bottom_ticks(self, style: int) -> None:
        """Head numbers, then the head mean and max columns named as `style` says (an index of `MEAN_MAX`)."""
        self._label_style = style
        mean, top, axis_label = MEAN_MAX[style]
        sx = self._shape[3] + self._gap
        names = {"mean": mean, "max": top}
        self.plot.getAxis("bottom").setTicks([[((j + 0.5) * sx, names.get(name, name)) for j, name in self._columns]])
        self.plot.getAxis("bottom").setLabel(axis_label)

    def _fitting_style(self) -> int:
        """The first of `MEAN_MAX` whose mean and max labels do not run into each other at the current zoom."""
        nl, nc, gh, gw = self._shape
        pixel = self.plot.vb.viewPixelSize()[0]           # view units per screen pixel
        if nc <= 2 or not (np.isfinite(pixel) and pixel > 0):
            return 0
        axis = self.plot.getAxis("bottom")
        width = QFontMetricsF(axis.style.get("tickFont") or axis.font()).horizontalAdvance
        column = (gw + self._gap) / pixel
        for style, (mean, top, _label) in enumerate(MEAN_MAX[:-1]):
            if (width(mean) + width(top) + width(" ")) / 2 <= column:
                return style
        return len(MEAN_MAX) - 1

    def _fit_labels(self, *_args: object) -> None:
        if not self._columns:
            return
        style = self._fitting_style()
        if style != self._label_style:
            self._set_bottom_ticks(style)

    def mark(self, heads: list[tuple[int, int]], again: bool = False) -> None:
        """Outline the tiles of ablated (layer, head)s with a dashed amber frame (plain ViT stacks with head
        columns only); `again`: the tiles were laid out anew, place the frames even if the heads are the same."""
        if list(heads) == self._ablated and not again:
            return
        self._ablated = list(heads)
        nl, nc, gh, gw = self._shape
        shown = [] if nl <= 1 or nc <= 2 or self._blocks else \
            [(layer, head) for layer, head in self._ablated if 0 <= layer < nl and 0 <= head < nc - 2]
        while len(self._marks) < len(shown):      # frames are kept and reused: adding an item to the plot
            item = QGraphicsRectItem()              # makes its view box measure every item again
            pen = QPen(QColor("#ffb000"))
            pen.setWidthF(2.0)
            pen.setCosmetic(True)
            pen.setStyle(Qt.PenStyle.DashLine)
            item.setPen(pen)
            item.setZValue(4)
            self.plot.vb.addItem(item, ignoreBounds=True)
            self._marks.append(item)
        for i, item in enumerate(self._marks):
            if i < len(shown):
                row, col = self._place(*shown[i])
                item.setRect(QRectF(col * (gw + self._gap), row * (gh + self._gap), gw, gh))
            item.setVisible(i < len(shown))

    def marked(self) -> list[QGraphicsRectItem]:
        """The amber frames on show (one per ablated head drawn)."""
        return [item for item in self._marks if item.isVisible()]

    def _on_clicked(self, event: object) -> None:
        if event.button() == Qt.MouseButton.RightButton:
            tile = self.tile_at(self.plot.vb.mapSceneToView(event.scenePos()))
            if tile is not None and not self._blocks and self._shape[0] > 1:
                heads = self._shape[1] - 2
                pick = tile[1] if tile[1] < heads else ("mean" if tile[1] == heads else "max")
                self.tile_menu.emit(tile[0], pick, event.screenPos().toPoint())
            return
        if event.button() != Qt.MouseButton.LeftButton:
            return
        point = self.plot.vb.mapSceneToView(event.scenePos())
        tile = self.tile_at(point)
        if tile is None:
            return
        layer, col = tile
        nc = self._shape[1]
        heads = nc - 2
        head: int | str = col if col < heads else ("mean" if col == heads else "max")
        if len(self._blocks) == self._shape[0]:
            layer = self._blocks[layer]     # a windowed stage's row: its block over the model
        elif self._shape[0] == 1:
            layer = self.state.layer        # one map of the whole model: a click picks a head, not a layer
        self.tile_clicked.emit(layer, None if nc == 1 else head)


def column_name(title: str, prefix: str = "") -> str:
    """The bottom label of a stack with one column: what the map is, from its title ('rollout of cls (mean, ...)'
    -> 'rollout of cls', "class relevance (Chefer) of the top class"), without its settings in brackets at the
    end, nor `prefix`, what an intervened run's titles start with ('ablated L0.H1 · rollout of cls ...')."""
    if prefix:
        title = title.removeprefix(prefix + " · ")
    name = title.split(" · ")[0].strip()
    if name.endswith(")") and " (" in name and name.startswith("rollout"):
        name = name[: name.rindex(" (")]
    return name or "map"
