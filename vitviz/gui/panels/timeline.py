"""The Timeline dock: a training run's checkpoints on the current image, scrubbed with a slider or played.

The slider runs over the run's checkpoints in the run's order (by the step or epoch in their names, else by file
time: the dock says which), labelled with each checkpoint's name and number. The map is the current image's at the
checkpoint shown, for the view state's layer, head and map (linked to the main controls), on that checkpoint's own
shared scale (all its layers); the plots give, against the training step, the head-mean attention distance and
entropy of the selected layer (the layer mean for 'mean'), the CLS attention inside a box drawn on the map (tick
"Box" and drag or resize the rectangle) and the top class's probability, with the shown checkpoint marked.

Moving the slider never waits: a checkpoint held is drawn at once (`TimelineStore.peek`), any other is asked of the
worker, the newest position winning (`vitviz.gui.timeline.TimelineSession`). A checkpoint that cannot be used
(another layout than the run's, an unreadable file) is named in red under the slider.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QRectF, Qt, QTimer
from PySide6.QtWidgets import (QCheckBox, QFrame, QHBoxLayout, QPushButton, QScrollArea, QSlider, QVBoxLayout,
                               QWidget)

from vitviz.core.drawing.colormaps import colormap
from vitviz.core.analyses.mapkinds import of_source
from vitviz.core.analyses.maps import MapKind
from vitviz.gui.panels.base import (LazyPanel, TEXT, dark_layout, image_view, pen, push_button, style_plot,
                                    wrapped_label)
from vitviz.gui.state import ViewState, map_kind
from vitviz.gui.timeline import TimelineSession
from vitviz.gui.numbers import number, number_range

PLAY_MS = 600
REDRAW_FIELDS = {"layer", "head", "query", "source", "colormap", "normalize", "opacity", "rollout_fusion", "rollout_discard",
                 "rollout_start", "rollout_residual"}
TIMELINE_SOURCES = of_source("attention")   # the attention maps (the table of map kinds): one captured pass each
PLOTS = (("distance", "distance (px)", "Mean attention distance"), ("entropy", "entropy (nats)", "Attention entropy"),
         ("box", "share", "CLS attention inside the box"), ("top", "probability", "Top class's probability"))
UNIT_PLOTS = ("box", "top")   # plots of values in [0, 1]
PLOT_MIN_HEIGHT = 110         # px per plot: title, three tick labels and the step axis readable
PLOT_SPACING = 16             # px the plots' layout puts between and around its two rows


def three_ticks(values: np.ndarray) -> list[tuple[float, str]]:
    """Ticks at the lowest, middle and highest value plotted (one when they are equal): a plot ~60 px high has room
    for three labels, and pyqtgraph's own spacing piled five onto each other ('16.08 16.06 16.04 ...')."""
    finite = values[np.isfinite(values)]
    if finite.size == 0:
        return []
    lo, hi = float(finite.min()), float(finite.max())
    points = (lo,) if hi - lo <= 1e-12 * max(1.0, abs(hi)) else (lo, (lo + hi) / 2, hi)
    return [(v, number(v)) for v in points]


def class_text(index: int, name: str) -> str:
    """'cat (class 3)'; a model without class names: 'class 3' (not 'class 3 (class 3)')."""
    return name if name == f"class {index}" else f"{name} (class {index})"


def timeline_kind(state: ViewState) -> tuple[MapKind, str]:
    """The map the timeline draws for the view state, and a note when it is not the state's own (class relevance
    and pooling heads need passes the timeline does not run: CLS attention instead)."""
    if state.source not in TIMELINE_SOURCES or state.rollout_pool:
        return MapKind("cls"), f"the timeline draws attention maps; CLS attention instead of {state.source}"
    return map_kind(state), ""


def checkpoint_text(store: object, k: int) -> str:
    """'checkpoint 3 of 10: step-300 (step 300)' / '(epoch 2, step 1200)'."""
    c = store.run.checkpoints[k]                          # type: ignore[attr-defined]
    name = c.path.name.lower()
    word = "step" if ("step" in name or "checkpoint" in name or "iter" in name) else \
        "epoch" if "epoch" in name else "number"
    number = "" if c.number is None else (f" (epoch {c.epoch}, step {c.number})" if c.epoch is not None
                                          else f" ({word} {c.number})")
    return f"checkpoint {k + 1} of {len(store)}: {c.label}{number}"  # type: ignore[arg-type]


class TimelinePanel(LazyPanel):
    """The slider, the map at the checkpoint shown and the plots against step (see the module docstring)."""

    def __init__(self, state: ViewState, timeline: TimelineSession, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("timelinePanel")
        self.state, self.timeline, self.session = state, timeline, timeline.session
        self.values: np.ndarray | None = None           # the map drawn (None: none)
        self.shown_k: int | None = None                 # the checkpoint whose map is drawn
        self.run_label = wrapped_label(
            "timelineRun", "No training run. Models › Open training run… opens a folder of checkpoints.")
        self.play_button = QPushButton("Play")
        self.play_button.setObjectName("timelinePlay")
        self.play_button.setCheckable(True)
        self.play_button.toggled.connect(self._on_play)
        self.slider = QSlider(Qt.Orientation.Horizontal)
        self.slider.setObjectName("timelineSlider")
        self.slider.setRange(0, 0)
        self.slider.setPageStep(1)
        self.slider.valueChanged.connect(self._on_slider)
        self.reload_button = push_button("Reload", timeline.reload, "Open the run again with the checkpoints written "
                                         "since it was opened", "timelineReload")
        self.reload_button.hide()
        self.close_button = push_button("Close run", timeline.close)
        self.box_check = QCheckBox("Box")
        self.box_check.setToolTip("Draw a box on the map (drag or resize it): the plot gives the CLS attention inside "
                                  "it at every checkpoint")
        self.box_check.toggled.connect(self._on_box_toggled)
        self.checkpoint_label = wrapped_label("timelineCheckpoint")
        self.failed_label = wrapped_label("timelineFailed")
        self.failed_label.setStyleSheet("color: #f28b82;")
        self.prediction = wrapped_label("timelinePrediction")
        self.widget = dark_layout()
        self.widget.setMinimumHeight(160)
        self.map_title = self.widget.addLabel("", row=0, col=0, color=TEXT)
        self.view, self.base = image_view(self.widget, 1, 0)       # the checkpoint's input image under the map
        self.item = pg.ImageItem()
        self.item.setZValue(1)
        self.view.addItem(self.item)
        self.roi: pg.RectROI | None = None
        self.box: tuple[float, float, float, float] | None = None
        self.plots, self.curves, self.marks = {}, {}, {}
        self.plot_widget = dark_layout()
        self.plot_widget.setMinimumHeight(2 * PLOT_MIN_HEIGHT + PLOT_SPACING)   # the lower step axis whole
        for i, (name, left, title) in enumerate(PLOTS):
            plot = self.plot_widget.addPlot(row=i // 2, col=i % 2, title=title)
            style_plot(plot, left, "step")
            plot.setMinimumHeight(PLOT_MIN_HEIGHT)
            plot.getAxis("left").setStyle(maxTickLevel=0)   # major ticks only: labels never overlap on a short plot
            if i:
                plot.setXLink(self.plots[PLOTS[0][0]])       # one step axis: an empty plot has the others' range
            if name in UNIT_PLOTS:     # a share, a probability: always 0-1, three ticks that fit a short plot
                plot.setYRange(0.0, 1.0, padding=0.05)
                plot.getAxis("left").setTicks([[(0.0, "0"), (0.5, "0.5"), (1.0, "1")]])
            self.plots[name] = plot
            self.curves[name] = plot.plot([], [], pen=pen("#8ab4f8", width=2), symbol="o", symbolSize=5,
                                          symbolBrush="#8ab4f8")
            self.marks[name] = pg.InfiniteLine(angle=90, movable=False, pen=pen("#fbbc04", 200, 1.5, dashed=True))
            plot.addItem(self.marks[name])
        top = QHBoxLayout()
        for w in (self.play_button, self.slider, self.box_check, self.reload_button, self.close_button):
            top.addWidget(w, 1 if w is self.slider else 0)
        content = QWidget()
        layout = QVBoxLayout(content)
        layout.setContentsMargins(1, 1, 1, 1)
        layout.addWidget(self.run_label)
        layout.addLayout(top)
        layout.addWidget(self.checkpoint_label)
        layout.addWidget(self.failed_label)
        left = QVBoxLayout()
        left.addWidget(self.widget, 1)
        left.addWidget(self.prediction)
        body = QHBoxLayout()
        body.addLayout(left, 2)
        body.addWidget(self.plot_widget, 3)
        layout.addLayout(body, 1)
        self.body = QScrollArea()     # on a short screen the dock scrolls: the window stays within the screen (the
        self.body.setObjectName("timelineScroll")     # plots' minimum heights made it 817 px high at 1280 x 800)
        self.body.setWidgetResizable(True)
        self.body.setFrameShape(QFrame.Shape.NoFrame)
        self.body.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.body.setWidget(content)
        outer = QVBoxLayout(self)
        outer.setContentsMargins(1, 1, 1, 1)    # a margin of the panel's own: `is_shown` reads its visible region
        outer.addWidget(self.body)
        self.timer = QTimer(self)
        self.timer.setInterval(PLAY_MS)
        self.timer.timeout.connect(self._advance)
        state.subscribe(self._on_state)
        timeline.opened.connect(self._on_opened)
        timeline.shown.connect(lambda _k: self.request_redraw())
        timeline.figures.connect(self.request_redraw)
        self.session.image_list.current_changed.connect(lambda _maps: self.request_redraw())
        self._on_opened()

    # ------------------------------------------------------------------------------------------ inputs
    def _on_opened(self) -> None:
        t = self.timeline
        store = t.store
        self.play_button.setChecked(False)
        for w in (self.play_button, self.slider, self.box_check, self.close_button):
            w.setEnabled(store is not None)
        self.close_button.setEnabled(store is not None or t.opening)
        self.reload_button.setVisible(store is not None and t.new_checkpoints > 0)
        self.reload_button.setText(f"Reload (+{t.new_checkpoints})")
        for w in (self.widget, self.plot_widget):      # no run: the message alone, not empty plots
            w.setVisible(store is not None)
        if store is None:
            self.run_label.setText(f"Opening {Path(t.folder).name}…" if t.opening else
                                   (f"Could not open the run: {t.error}" if t.error else
                                    "No training run. Models › Open training run… opens a folder of checkpoints."))
            self.slider.blockSignals(True)
            self.slider.setRange(0, 0)
            self.slider.blockSignals(False)
        else:
            given = ", ".join(f"{k}={v}" for k, v in t.overrides.items() if v is not None)
            self.run_label.setText(f"Run {t.folder}: {len(store)} checkpoints, {store.order_note}"
                                   + (f" · loaded with {given}" if given else "")
                                   + (f" · {t.new_checkpoints} new in the folder since it was opened"
                                      if t.new_checkpoints else ""))
            self.slider.blockSignals(True)
            self.slider.setRange(0, len(store) - 1)
            self.slider.setValue(t.k)
            self.slider.blockSignals(False)
        self.request_redraw()

    def _on_slider(self, k: int) -> None:
        self.timeline.show(int(k))
        self.request_redraw()

    def set_checkpoint(self, k: int) -> None:
        """Move the slider to checkpoint k (what dragging it does)."""
        self.slider.setValue(int(k))

    def _on_play(self, playing: bool) -> None:
        self.play_button.setText("Pause" if playing else "Play")
        if playing:
            if self.slider.value() >= self.slider.maximum():
                self.slider.setValue(0)
            self.timer.start()
        else:
            self.timer.stop()

    def _advance(self) -> None:
        if self.timeline.maps() is None and self.timeline.store is not None \
                and self.timeline.k not in self.timeline.store.failed:
            return                          # the frame shown is still on its way: wait for it
        if self.slider.value() >= self.slider.maximum():
            self.play_button.setChecked(False)
            return
        self.slider.setValue(self.slider.value() + 1)

    def _on_state(self, changed: set[str]) -> None:
        if changed & REDRAW_FIELDS:
            self.request_redraw()

    def _on_box_toggled(self, on: bool) -> None:
        if on and self.roi is None:
            gh, gw = self.values.shape if self.values is not None else (4, 4)
            self.roi = pg.RectROI([gw * 0.25, gh * 0.25], [gw * 0.5, gh * 0.5], pen=pen("#ff3b30", width=2))
            self.roi.sigRegionChanged.connect(self._on_roi)
            self.view.addItem(self.roi)
            self._on_roi()
        elif not on and self.roi is not None:
            self.view.removeItem(self.roi)
            self.roi, self.box = None, None
            self.request_redraw()

    def set_box(self, box: tuple[float, float, float, float] | None) -> None:
        """The box (left, top, right, bottom), fractions of the image, whose CLS share is plotted (None: none)."""
        self.box = None if box is None else tuple(float(v) for v in box)   # type: ignore[assignment]
        self.request_redraw()

    def _on_roi(self) -> None:
        if self.roi is None or self.values is None:
            return
        gh, gw = self.values.shape
        (x, y), (w, h) = self.roi.pos(), self.roi.size()
        left, right = np.clip([x / gw, (x + w) / gw], 0.0, 1.0)
        top, bottom = np.clip([y / gh, (y + h) / gh], 0.0, 1.0)
        self.set_box((left, top, right, bottom) if right > left and bottom > top else None)

    # ------------------------------------------------------------------------------------------ drawing
    def redraw(self) -> None:
        t, store = self.timeline, self.timeline.store
        if store is None or not self.session.image_list.current:
            self.item.clear()
            self.base.clear()
            self.values, self.shown_k = None, None
            self.map_title.setText("")
            self.checkpoint_label.setText("" if store is None else "Open images to see the run on them.")
            self.failed_label.setText("")
            self.prediction.setText("")
            for curve in self.curves.values():
                curve.setData([], [])
            return
        k = t.k
        failed = store.failed
        self.checkpoint_label.setText(checkpoint_text(store, k))
        self.failed_label.setText(" · ".join(f"Not used: {why}" for _j, why in sorted(failed.items())))
        kind, note = timeline_kind(self.state)
        maps = t.maps(k)
        if k in failed:
            self.item.clear()
            self.values, self.shown_k = None, None
            self.map_title.setText(f"checkpoint {k + 1} cannot be shown: {failed[k]}")
        elif maps is None:
            self.map_title.setText(f"checkpoint {k + 1}: computing…" + (f" (showing {self.shown_k + 1})"
                                                                        if self.shown_k is not None else ""))
        else:
            self._draw_map(maps, kind, note, k)
        self._draw_plots(k)

    def _draw_map(self, maps: object, kind: MapKind, note: str, k: int) -> None:
        try:
            stack = maps.stack(kind)                                     # type: ignore[attr-defined]
            values = stack.select(self.state.layer, self.state.head)
        except Exception as exc:  # noqa: BLE001 - a selection this model cannot show: said in the title
            self.map_title.setText(f"checkpoint {k + 1}: {exc}")
            return
        lo, hi = stack.levels(values, self.state.head, own=self.state.normalize)
        self.item.setImage(np.nan_to_num(values, nan=lo), levels=(lo, hi), lut=colormap(self.state.colormap))
        self.item.setOpacity(float(self.state.opacity))
        gh, gw = values.shape
        image = maps.result.image                                        # type: ignore[attr-defined]
        if self.base.image is None or self.base.image.shape != image.shape or not np.array_equal(self.base.image,
                                                                                                image):
            self.base.setImage(image)
        if self.values is None or self.values.shape != values.shape:
            self.item.setRect(QRectF(0, 0, gw, gh))
            self.base.setRect(QRectF(0, 0, gw, gh))
            self.view.setRange(xRange=(0, gw), yRange=(0, gh), padding=0)
        self.values, self.shown_k = values, k
        scale = "own scale" if self.state.normalize else "this checkpoint's shared scale"
        self.map_title.setText(f"{stack.title} · layer {self.state.layer} · head {self.state.head} · {scale} "
                               f"{number_range(lo, hi)}" + (f" · {note}" if note else ""))

    def _draw_plots(self, k: int) -> None:
        store = self.timeline.store
        if self.session.image_list.current not in store.images:
            return
        series = store.series(self.session.image_list.current, box=self.box)
        steps = series.steps
        x = steps if np.isfinite(steps).all() else np.arange(len(steps), dtype=np.float64)
        for plot in self.plots.values():
            plot.getAxis("bottom").setLabel("step" if np.isfinite(steps).all() else "checkpoint", color=TEXT)
        layer = self.state.layer

        def at_layer(values: np.ndarray | None) -> np.ndarray | None:
            if values is None or values.size == 0:
                return None
            if isinstance(layer, int):
                return values[:, layer % values.shape[1]]
            with np.errstate(all="ignore"):
                return np.nanmean(values, axis=1) if np.isfinite(values).any() else values[:, 0]

        done = series.done if series.done is not None else np.ones(len(x), bool)
        for name, values in (("distance", at_layer(series.distance)), ("entropy", at_layer(series.entropy)),
                             ("box", at_layer(series.box_share)), ("top", series.top_probability)):
            if values is None:
                self.curves[name].setData([], [])
            else:
                keep = done & np.isfinite(values)
                self.curves[name].setData(x[keep], values[keep])
            if name not in UNIT_PLOTS:
                self.plots[name].getAxis("left").setTicks(
                    [three_ticks(values[keep]) if values is not None else []])
            self.marks[name].setValue(float(x[k]))
        if self.box is None:
            self.plots["box"].setTitle("CLS attention inside the box (tick Box)")
        else:
            self.plots["box"].setTitle("CLS attention inside the box ({:.2f}, {:.2f})–({:.2f}, {:.2f})"
                                       .format(*self.box))
        pred = series.predictions[k]
        measured = int(done.sum())
        self.prediction.setText((f"Prediction at this checkpoint: {class_text(pred[0], pred[1])}, p = {pred[2]:.3f}"
                                 if pred is not None else "Prediction at this checkpoint: not measured yet")
                                + f" · {measured} of {len(x)} checkpoints measured")
