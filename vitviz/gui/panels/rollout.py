"""The rollout dock: attention rollout with live controls, next to the raw last-layer attention of the same query.

The controls write `ViewState` (so the image panel's 'rollout' source and its export use the same parameters);
writes are coalesced through a zero-delay timer, so dragging a slider computes only the newest setting. The map
here is one row-vector rollout through the last layer (`RolloutEngine.vector`), O(L·T²) on the GUI thread.

A windowed model (`vitviz.core.analyses.winview.WindowedMaps`): SAM / ViTDet roll out through their global blocks (the
library's `rollout(blocks='global')`), beside the last global block's raw attention; across Swin's patch merging
rollout is not defined, and the panel says so instead of drawing anything.
"""
from __future__ import annotations

import time

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QPointF, QRectF, Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QComboBox, QDoubleSpinBox, QFormLayout, QGraphicsRectItem, QHBoxLayout, QLabel, QSlider, QSpinBox, QVBoxLayout,
    QWidget,
)

from typing import TYPE_CHECKING

from vitviz.gui import colors
from vitviz.gui.panels import blit
from vitviz.core.analyses.maps import ResultMaps, pool_vector, rollout_title
from vitviz.core.analyses.rollout import RolloutParams
from vitviz.gui.panels.base import SELECT, TEXT, LazyPanel, TitleLabel, compact, dark_layout, pen
from vitviz.gui.images import ImageList
from vitviz.gui.state import FUSIONS, ROLLOUT_FIELDS, ViewState, rollout_params
from vitviz.gui.numbers import number


if TYPE_CHECKING:
    from vitviz.core.analyses.winview import WindowedMaps

POOL_QUERY = -2     # the query combo's entry for a MAP head's pooling query


class MapView:
    """One view box: the image, a map stretched over its patch grid, and an outlined patch."""

    def __init__(self, widget: pg.GraphicsLayoutWidget, col: int) -> None:
        self.title = TitleLabel("", color=TEXT, size="9pt")         # wraps instead of widening the panel
        widget.addItem(self.title, row=0, col=col)
        widget.ci.layout.setColumnStretchFactor(col, 1)
        self.view = widget.addViewBox(row=1, col=col, lockAspect=True, invertY=True, enableMenu=False)
        self.image_item, self.overlay = blit.ImageItem(), blit.ImageItem()   # 32-bit pictures: painted faster
        self.box = QGraphicsRectItem()
        self.box.setPen(pen(SELECT, 255, 2.0))
        self.overlay.setZValue(1)
        self.box.setZValue(2)
        for item in (self.image_item, self.overlay, self.box):
            self.view.addItem(item)
        self.grid, self.patch = (0, 0), 1

    def show(self, image: np.ndarray, values: np.ndarray, patch: int, cmap: str, opacity: float) -> None:
        """The image with `values` (gh, gw) over it on a 0..max colour scale."""
        resized = (values.shape, patch) != (self.grid, self.patch)
        self.grid, self.patch = values.shape, patch
        self.image_item.setImage(image, autoLevels=False, levels=(0, 255))
        top = float(values.max())
        self.overlay.setImage(values, autoLevels=False, levels=(0.0, top if top > 0 else 1.0), lut=colors.lut(cmap))
        self.overlay.setRect(QRectF(0, 0, values.shape[1] * patch, values.shape[0] * patch))
        self.overlay.setOpacity(opacity)
        if resized:
            self.view.autoRange(padding=0.01)

    def outline(self, patch: tuple[int, int] | None) -> None:
        if patch is not None:
            self.box.setRect(QRectF(patch[1] * self.patch, patch[0] * self.patch, self.patch, self.patch))
        self.box.setVisible(patch is not None)

    def patch_at(self, scene_pos: QPointF) -> tuple[int, int] | None:
        point = self.view.mapSceneToView(scene_pos)
        row, col = int(np.floor(point.y() / self.patch)), int(np.floor(point.x() / self.patch))
        gh, gw = self.grid
        return (row, col) if self.view.sceneBoundingRect().contains(scene_pos) and 0 <= row < gh and 0 <= col < gw \
            else None

    def clear(self) -> None:
        self.image_item.clear()
        self.overlay.clear()
        self.box.setVisible(False)
        self.title.setText("")


class RolloutPanel(LazyPanel):
    """Live rollout controls and the rollout beside the raw attention. Built from the image list it follows
    (`current_changed`: the current image's result as shown) and `maps`, the one shown now.

    Signals:
        query_clicked(token): a patch was clicked in either map.
    """

    query_clicked = Signal(int)

    def __init__(self, state: ViewState, images: ImageList, maps: ResultMaps | None = None,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("rolloutPanel")
        self.state = state
        self._maps: ResultMaps | None = None
        self._pending: dict[str, object] = {}
        self._updating = False
        self.rollout_map: np.ndarray | None = None
        self.raw_map: np.ndarray | None = None
        self.last_update_ms = 0.0
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.setInterval(0)
        self._timer.timeout.connect(self._flush)
        self.widget = dark_layout()
        self.rollout_view, self.raw_view = MapView(self.widget, 0), MapView(self.widget, 1)
        self.widget.scene().sigMouseClicked.connect(self._on_clicked)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(2, 2, 2, 2)
        self.controls = QWidget()               # disabled where rollout is not defined (Swin): they do nothing
        self.controls.setLayout(self._build_controls())
        layout.addWidget(self.controls)
        layout.addWidget(self.widget, 1)
        self.timing = QLabel("")
        self.timing.setWordWrap(True)          # a long line must not widen the dock (and shrink the image)
        layout.addWidget(self.timing)
        state.subscribe(self._on_state)
        images.current_changed.connect(self.set_maps)
        self._sync_controls()
        self.set_maps(maps)

    def _build_controls(self) -> QFormLayout:
        form = QFormLayout()
        form.setContentsMargins(0, 0, 0, 0)
        self.fusion_combo = QComboBox()
        self.fusion_combo.addItems(list(FUSIONS))
        self.fusion_combo.setToolTip("How the heads of a layer are combined before the layers are multiplied")
        self.fusion_combo.activated.connect(lambda _i: self._queue(rollout_fusion=self.fusion_combo.currentText()))
        form.addRow("Head fusion", self.fusion_combo)
        self.discard_spin, row = self._slider_pair(0.0, 0.99, "rollout_discard",
                                                   "Zero the lowest fraction of each row's patch attention")
        form.addRow("Discard ratio", row)
        self.residual_spin, row = self._slider_pair(0.0, 1.0, "rollout_residual",
                                                    "Weight of the identity (skip connection): 0.5 is (A + I) / 2")
        form.addRow("Residual weight", row)
        self.start_spin = QSpinBox()
        self.start_spin.setToolTip("First layer multiplied into the rollout")
        self.start_spin.valueChanged.connect(lambda v: self._queue(rollout_start=int(v)))
        self.query_combo = QComboBox()
        compact(self.query_combo)
        self.query_combo.setToolTip("The token whose rollout is shown; click a patch in a map to pick one. A model "
                                    "with a MAP pooling head (SigLIP, PE) can roll out its pooling query instead")
        self.query_combo.activated.connect(self._on_query_chosen)
        pair = QHBoxLayout()
        pair.addWidget(self.start_spin)
        pair.addWidget(QLabel("Query"))
        pair.addWidget(self.query_combo, 1)
        form.addRow("Start layer", pair)
        return form

    def _on_query_chosen(self, _index: int) -> None:
        """A token (or none: CLS / the patch mean) -> the window's query; POOL_QUERY -> the pooling query."""
        data = int(self.query_combo.currentData())
        if data == POOL_QUERY:
            self.state.update(rollout_pool=True)
            return
        self.state.update(rollout_pool=False)
        self.query_clicked.emit(data if data >= 0 else -1)

    def _slider_pair(self, lo: float, hi: float, field: str, tip: str) -> tuple[QDoubleSpinBox, QHBoxLayout]:
        spin, slider = QDoubleSpinBox(), QSlider(Qt.Orientation.Horizontal)
        spin.setRange(lo, hi)
        spin.setSingleStep(0.05)
        spin.setDecimals(2)
        slider.setRange(int(lo * 100), int(hi * 100))
        for w in (spin, slider):
            w.setToolTip(tip)
        slider.valueChanged.connect(lambda v: spin.setValue(v / 100.0))
        spin.valueChanged.connect(lambda v: slider.setValue(int(round(v * 100))))
        spin.valueChanged.connect(lambda v: self._queue(**{field: float(v)}))
        row = QHBoxLayout()
        row.addWidget(slider, 1)
        row.addWidget(spin)
        spin.setObjectName(field)
        return spin, row

    # ------------------------------------------------------------------------------------------ state

    def _queue(self, **values: object) -> None:
        """Coalesce control changes: the newest values reach the state on the next event-loop turn."""
        if not self._updating:
            self._pending.update(values)
            self._timer.start()

    def _flush(self) -> None:
        values, self._pending = self._pending, {}
        if values:
            self.state.update(**values)

    def _on_state(self, changed: set[str]) -> None:
        self._sync_controls()
        if changed & (ROLLOUT_FIELDS | {"query", "colormap", "opacity"}):
            self.request_redraw()

    def _sync_controls(self) -> None:
        self._updating = True
        try:
            s = self.state
            self.fusion_combo.setCurrentText(s.rollout_fusion)
            self.discard_spin.setValue(s.rollout_discard)
            self.residual_spin.setValue(s.rollout_residual)
            self.start_spin.setValue(s.rollout_start)
            self._fill_queries()
        finally:
            self._updating = False

    def _fill_queries(self) -> None:
        """The query choices of the shown result; filled again only when they differ (a refill changes the combo's
        size hint: the controls laid out again on every ablate click, the panel hidden or not)."""
        combo, spec = self.query_combo, self._maps.result.spec if self._maps else None
        default = "CLS" if spec is None or (spec.cls_token and spec.num_prefix) else "mean of the patches"
        items = [(f"{default} (no token selected)", -1)]
        items += [(f"{name} token", i) for i, name in enumerate(spec.prefix_names if spec else ())]
        q = self.state.query
        if spec is not None and q is not None and q >= spec.num_prefix:
            items.append((f"{spec.token_name(q)} · token {q}", q))
        if self._has_pool():
            items.append(("pooling query (MAP head)", POOL_QUERY))
        if items != [(combo.itemText(i), combo.itemData(i)) for i in range(combo.count())]:
            combo.clear()
            for text, data in items:
                combo.addItem(text, data)
        chosen = POOL_QUERY if self._pooled() else -1 if q is None else q
        combo.setCurrentIndex(max(0, combo.findData(chosen)))

    def _has_pool(self) -> bool:
        return self._maps is not None and getattr(self._maps.result, "pool_attention", None) is not None

    def _pooled(self) -> bool:
        """Whether the rollout starts from the MAP head's pooling query (asked for, and this result has one)."""
        return self.state.rollout_pool and self._has_pool()

    # ------------------------------------------------------------------------------------------ drawing

    def set_maps(self, maps: ResultMaps | None) -> None:
        """Show the rollout of another result (None: nothing); the image list's `current_changed` calls this."""
        if maps is not self._maps:
            self._maps = maps
            if maps is not None and self.start_spin.maximum() != maps.rollout_depth - 1:   # a new range relays out
                self._updating = True
                self.start_spin.setMaximum(maps.rollout_depth - 1)
                self._updating = False
            self._sync_controls()
            self.request_redraw()

    def params(self) -> RolloutParams:
        """The state's rollout parameters, with the start layer clamped to the model's depth."""
        params = rollout_params(self.state)
        depth = self._maps.rollout_depth if self._maps else 1
        q = params.query
        t = self._maps.query_count if self._maps else 0        # a windowed model's: its first stage's patches
        return RolloutParams(params.fusion, params.discard, min(params.start, depth - 1), params.residual,
                             q if q is not None and q < t else None)

    def redraw(self) -> None:
        maps = self._maps
        if maps is None:
            self.rollout_view.clear()
            self.raw_view.clear()
            self.rollout_map = self.raw_map = None
            return
        t0 = time.perf_counter()
        params = self.params()
        self.controls.setEnabled(True)
        if maps.why_not("matrix") is not None:     # no whole token matrices to roll out here (a windowed model's)
            self._redraw_windowed(maps, params, t0)
            return
        r = maps.result
        p, grid = r.num_prefix, r.grid
        pooled = self._pooled()
        if pooled:
            assert r.pool_attention is not None
            params = RolloutParams(params.fusion, params.discard, params.start, params.residual)
            row = maps.rollout.pull(pool_vector(r.pool_attention, params.fusion), params)
            self.rollout_map = row[p:].reshape(grid)                                 # (N,) -> (gh, gw)
            self.raw_map = r.pool_map("mean")
        else:
            self.rollout_map = maps.rollout.vector(params)[p:].reshape(grid)        # (N,) -> (gh, gw)
            self.raw_map = self._raw(maps, params.query)
        s = self.state
        for view, values in ((self.rollout_view, self.rollout_map), (self.raw_view, self.raw_map)):
            view.show(r.image, values, r.spec.patch_size, s.colormap, s.opacity)
            view.outline(None if params.query is None or params.query < p else divmod(params.query - p, grid[1]))
        who = "the pooling query" if pooled else ""
        self.rollout_view.title.setText(rollout_title(params, r.spec, who)
                                        + f" · max {number(self.rollout_map.max(), 3)}")
        if pooled:
            self.raw_view.title.setText(f"the MAP head's attention · head mean · max {number(self.raw_map.max(), 3)}")
        else:
            who = r.spec.token_name(params.query) if params.query is not None else self._default_name(maps)
            self.raw_view.title.setText(f"raw attention of {who} · last layer · head mean · "
                                        f"max {number(self.raw_map.max(), 3)}")
        self.last_update_ms = (time.perf_counter() - t0) * 1000
        self.timing.setText(f"Rollout updated in {self.last_update_ms:.1f} ms (T = {r.attentions.shape[-1]}); "
                            "the image panel's 'Attention rollout' map uses these settings")

    def _redraw_windowed(self, maps: "WindowedMaps", params: RolloutParams, t0: float) -> None:
        """SAM / ViTDet: the library's rollout through the global blocks (`WindowedMaps.view`) beside the last
        one's raw attention; Swin: why rollout is not defined across its patch merging."""
        from vitviz.core.analyses.maps import MapKind

        why = maps.unshown(MapKind("rollout"))
        if why is not None:      # the library's way out (a stage of its own) has no control here yet: said so
            why = why.replace("; pick a stage to roll out within it", "; the window does not roll out within one "
                              "stage yet (in Python: WindowedMaps.rollout(stage=S) does)")
            self.rollout_view.clear()
            self.raw_view.clear()
            self.rollout_map = self.raw_map = None
            self.rollout_view.title.setText(f"Rollout is not defined for this model: {why}")
            self.timing.setText("")              # said once, above; the settings do nothing here
            self.controls.setEnabled(False)
            return
        r, s = maps.result, self.state
        stack, row, stride = maps.view(MapKind("rollout", rollout=params), -1)    # on the first stage's grid
        self.rollout_map = stack.select(row, "mean")
        blocks = maps.layers("rollout", 0, maps.rollout_blocks())
        last = maps.geometry[blocks[row]]
        kind = MapKind("received") if params.query is None else MapKind("query", params.query)
        self.raw_map = maps.stack(kind, last.stage).select(last.index, "mean")
        query = None if params.query is None else divmod(params.query, maps.grid[1])
        for view, values in ((self.rollout_view, self.rollout_map), (self.raw_view, self.raw_map)):
            view.show(r.image, values, stride, s.colormap, s.opacity)
            view.outline(query)
        which = "global blocks " if maps.rollout_blocks() == "global" else "blocks "
        self.rollout_view.title.setText(f"{stack.title} · through {which}{', '.join(map(str, blocks))} · "
                                        f"max {number(self.rollout_map.max(), 3)}")
        who = r.spec.token_name(params.query) if params.query is not None else "every patch (received)"
        self.raw_view.title.setText(f"raw attention of {who} · block {last.block} ({last.describe()}) · head mean · "
                                    f"max {number(self.raw_map.max(), 3)}")
        self.last_update_ms = (time.perf_counter() - t0) * 1000
        self.timing.setText(f"Rollout updated in {self.last_update_ms:.1f} ms; the image panel's 'Attention "
                            "rollout' map uses these settings")

    @staticmethod
    def _default_name(maps: ResultMaps) -> str:
        spec = maps.result.spec
        return "cls" if spec.cls_token and spec.num_prefix else "the mean of the patches"

    @staticmethod
    def _raw(maps: ResultMaps, query: int | None) -> np.ndarray:
        if query is None:
            return maps.stack("cls").select(-1, "mean")
        r = maps.result
        row = np.asarray(r.attentions[-1, :, query, r.num_prefix:], dtype=np.float32).mean(axis=0)   # (H, N) -> (N,)
        return row.reshape(r.grid)

    def _on_clicked(self, event: object) -> None:
        if event.button() != Qt.MouseButton.LeftButton or event.double() or self._maps is None:
            return
        for view in (self.rollout_view, self.raw_view):
            patch = view.patch_at(event.scenePos())
            if patch is not None:
                r = self._maps.result
                self.query_clicked.emit(r.num_prefix + patch[0] * r.grid[1] + patch[1])
                return
