"""The controls dock: model summary, device and input size (asked of the session), and every view setting, bound to
`ViewState`."""
from __future__ import annotations

import html

from PySide6.QtCore import QEvent, QObject, Qt, Signal
from PySide6.QtWidgets import (
    QCheckBox, QComboBox, QFormLayout, QGroupBox, QHBoxLayout, QLabel, QPushButton, QSlider, QSpinBox,
    QVBoxLayout, QWidget,
)

from vitviz.core.analyses.mapkinds import KINDS, unavailable
from vitviz.core.spec import ModelSpec
from vitviz.gui.panels.base import compact, display_name, plural
from vitviz.gui.panels.model_settings import ModelSettings
from vitviz.gui.panels.relevance import RelevancePicker
from vitviz.gui.session import Session
from vitviz.gui.signals import wire
from vitviz.gui.state import (COLORMAPS, QUERY_SOURCES, SOURCES, ViewState, default_source, map_kind, query_source,
                              resolve_index)

# the map sources the selector offers, named and explained by the table of map kinds (a new attention kind there
# appears here by itself); 'relevance' stands for all the gradient maps and the text prompt, picked below it
SOURCE_LABELS = {key: KINDS[key].label for key in SOURCES}
SOURCE_TIPS = {key: f"{KINDS[key].help[:1].upper()}{KINDS[key].help[1:]} (--map {KINDS[key].syntax})"
               for key in SOURCES}
for _key in QUERY_SOURCES:      # the maps of one query token (the table's kinds that need one)
    SOURCE_TIPS[_key] += "; click a patch to pick one"
SOURCE_TIPS["query"] += " (its window is outlined)"
SOURCE_TIPS["received"] = SOURCE_TIPS["received"].replace(" (--map", ", drawn with the block's window outlines (--map")
WINDOWED_SETTINGS = ("A windowed model (Swin, SAM / ViTDet): its stages, heads and windows are read from the file; "
                     "load it with window= / global_blocks= overrides (vitviz --window N --global-blocks I,J) to "
                     "change them")
SOURCE_TIPS["relevance"] = ("What the model looks at for one class, from attention gradients (a backward pass per "
                            "image and class; --map relevance:CLASS), or for a text prompt: pick the method and "
                            "class below")
NO_MODEL_TEXT = "No model loaded.\nFile › Open model, or drop a checkpoint on the window."
LAYER_SPECIALS = {-1: "mean"}
HEAD_SPECIALS = {-2: "max", -1: "mean"}


class SelectorSpinBox(QSpinBox):
    """A spin box whose lowest values read as words ('mean', 'max') and that accepts those words."""

    def __init__(self, specials: dict[int, str], parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._specials = specials
        self._by_text = {v: k for k, v in specials.items()}
        self.setMinimum(min(specials))

    def textFromValue(self, value: int) -> str:  # noqa: N802 - Qt override
        return self._specials.get(value, str(value))

    def valueFromText(self, text: str) -> int:  # noqa: N802 - Qt override
        text = text.strip().lower()
        return self._by_text[text] if text in self._by_text else int(text or 0)

    def validate(self, text: str, pos: int) -> object:
        from PySide6.QtGui import QValidator

        t = text.strip().lower()
        if t in self._by_text or (t.lstrip("-").isdigit() and self.minimum() <= int(t) <= self.maximum()):
            return QValidator.State.Acceptable
        if any(word.startswith(t) for word in self._by_text) or t in ("", "-"):
            return QValidator.State.Intermediate
        return QValidator.State.Invalid


class IndexSlider(QSlider):
    """The slider beside a selector spin box: indices 0..N-1 only. While the box shows a word ('mean', 'max') the
    slider is greyed out instead of sitting at a position that reads as an index; a click on it picks the index
    it shows again (`reactivated`)."""

    reactivated = Signal(int)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(Qt.Orientation.Horizontal, parent)
        self.setRange(0, 0)
        self.special = False        # the selection is a word, not an index
        self.allowed = True         # False: the whole selector is off (e.g. head under rollout)
        self.installEventFilter(self)

    def show_special(self, special: bool, allowed: bool = True) -> None:
        """Grey out for a word selection; `allowed` False: the whole selector is off (e.g. head under rollout)."""
        self.special, self.allowed = special, allowed
        self.setEnabled(allowed and not special)

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:  # noqa: N802 - Qt override
        if watched is self and self.special and self.allowed and event.type() == QEvent.Type.MouseButtonPress:
            self.reactivated.emit(self.value())
            return True
        return super().eventFilter(watched, event)


def sel_to_int(sel: int | str, specials: dict[int, str], count: int) -> int:
    """A layer/head selection as a spin-box value."""
    if isinstance(sel, str):
        return {v: k for k, v in specials.items()}[sel]
    return int(resolve_index(sel, count))


def int_to_sel(value: int, specials: dict[int, str]) -> int | str:
    return specials.get(value, value)


class ControlsPanel(QWidget):
    """Widgets that edit the view state, plus the model-level requests (device, input size) they make of the
    session, whose model, devices and input size they show.

    Signals:
        device_requested(device): the user picked a device (the session moves the model there).
        size_requested(height, width): the user asked for an input size (the session runs every image at it).
        overrides_requested(changes): the user changed the model settings (heads, image size, mean/std, resize,
            crop): the window loads the model again with them.
    """

    device_requested = Signal(str)
    size_requested = Signal(int, int)
    overrides_requested = Signal(dict)

    def __init__(self, state: ViewState, session: Session, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("controlsPanel")
        self.state, self.session = state, session
        self._spec: ModelSpec | None = None
        self._updating = False
        layout = QVBoxLayout(self)
        layout.addWidget(self._build_model_box())
        layout.addWidget(self._build_view_box())
        layout.addStretch(1)
        state.subscribe(self._on_state_changed)
        self._on_state_changed(set(state.snapshot()))
        self.device_requested.connect(session.set_device)
        self.size_requested.connect(self._on_size_requested)
        session.devices_found.connect(self.set_devices)
        wire(session.model, model_loaded=self._on_model_loaded, device_changed=self.set_device,
             size_changed=self.show_size, loading_changed=self._on_loading_changed,
             verification_changed=self._on_verified)

    def _on_verified(self) -> None:
        """The check confirmed some settings: Model settings' `?` marks follow the verified spec."""
        spec = self.session.model.spec
        if spec is not None and spec is not self.model_settings.spec and spec.traits.plain_settings:
            self.model_settings.set_provenance(spec)

    def _on_size_requested(self, height: int, width: int) -> None:
        self.session.set_image_size((height, width))

    def _on_model_loaded(self, spec: ModelSpec, device: str) -> None:
        self.set_spec(spec, device)
        if self.session.model.image_size is not None:     # the command line's --size, applied with the model
            self.show_size(self.session.model.image_size)

    def _on_loading_changed(self, _loading: bool) -> None:
        """Until the first model has loaded, say that it is loading (not that there is none)."""
        if self._spec is None:
            loading = self.session.model.loading
            self.model_label.setText(f"Loading model {display_name(loading)}…" if loading else NO_MODEL_TEXT)

    def _build_model_box(self) -> QGroupBox:
        box = QGroupBox("Model")
        column = QVBoxLayout(box)          # not a spanning QFormLayout row: that one cut wrapped lines off
        self.model_label = QLabel(NO_MODEL_TEXT)
        self.model_label.setObjectName("modelSummary")
        self.model_label.setWordWrap(True)
        self.model_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        column.addWidget(self.model_label)
        form = QFormLayout()
        column.addLayout(form)
        self.device_combo = QComboBox()
        self.device_combo.addItem("cpu")
        self.device_combo.setToolTip("Where the model runs; CUDA appears when a GPU is available")
        self.device_combo.activated.connect(lambda _i: self.device_requested.emit(self.device_combo.currentText()))
        form.addRow("Device", self.device_combo)
        self.height_spin, self.width_spin = QSpinBox(), QSpinBox()
        for spin in (self.height_spin, self.width_spin):
            spin.setRange(1, 4096)
            spin.setSpecialValueText("–")     # no model yet: no size to show (not a made-up 16)
            spin.setValue(1)
            spin.setEnabled(False)
            spin.setSingleStep(16)
            spin.setToolTip("Input size in pixels, in whole patches (other sizes are rounded down). The "
                            "position embedding is interpolated for sizes the model was not trained at.")
        self.apply_size = QPushButton("Run at size")
        self.apply_size.setEnabled(False)
        self.apply_size.clicked.connect(
            lambda: self.size_requested.emit(self.height_spin.value(), self.width_spin.value()))
        row = QHBoxLayout()
        row.addWidget(self.height_spin)
        row.addWidget(QLabel("×"))
        row.addWidget(self.width_spin)
        row.addWidget(self.apply_size)
        form.addRow("Input H×W", row)
        self.model_settings = ModelSettings()
        self.model_settings.overrides_requested.connect(self.overrides_requested)
        column.addWidget(self.model_settings)
        return box

    def _build_view_box(self) -> QGroupBox:
        box = QGroupBox("Attention map")
        form = QFormLayout(box)
        self.source_combo = QComboBox()
        self._fill_sources(None)
        self.source_combo.activated.connect(lambda _i: self._set(source=self.source_combo.currentData()))
        form.addRow("Map", self.source_combo)
        self.relevance_picker = RelevancePicker(self.state, self.session.model)
        form.addRow(self.relevance_picker)
        self.layer_spin, self.layer_slider = self._selector(LAYER_SPECIALS, "layer")
        self._layer_tip = self.layer_spin.toolTip()
        self.layer_label = QLabel("Layer")
        form.addRow(self.layer_label, _pair(self.layer_slider, self.layer_spin))
        self.block_label = QLabel("")       # a windowed model's block: its stage, place and attention
        self.block_label.setObjectName("blockLabel")
        self.block_label.setWordWrap(True)
        self.block_label.setVisible(False)
        form.addRow(self.block_label)
        self.head_spin, self.head_slider = self._selector(HEAD_SPECIALS, "head")
        form.addRow("Head", _pair(self.head_slider, self.head_spin))
        self.query_combo = compact(QComboBox(), 12)
        self.query_combo.setToolTip("The query token of 'Attention of query token'; click a patch to pick one")
        self.query_combo.activated.connect(self._on_query_chosen)
        form.addRow("Query", self.query_combo)
        self.cmap_combo = QComboBox()
        self.cmap_combo.addItems(list(COLORMAPS))
        self.cmap_combo.activated.connect(lambda _i: self._set(colormap=self.cmap_combo.currentText()))
        form.addRow("Colormap", self.cmap_combo)
        self.opacity_slider = QSlider(Qt.Orientation.Horizontal)
        self.opacity_slider.setRange(0, 100)
        self.opacity_slider.valueChanged.connect(lambda v: self._set(opacity=v / 100.0))
        form.addRow("Opacity", self.opacity_slider)
        self.smooth_check = self._check("Smooth upsampling", "smooth", "Bilinear instead of one block per patch")
        self.normalize_check = self._check("Normalise each map", "normalize",
                                           "Stretch each map to its own range instead of one scale for all "
                                           "layers and heads")
        self.grid_check = self._check("Show patch grid", "show_grid", "Draw the model's patch grid")
        self.per_tile_check = self._check("Scale overview tiles separately", "per_tile",
                                          "Each thumbnail of the layer × head overview gets its own range")
        for check in (self.smooth_check, self.normalize_check, self.grid_check, self.per_tile_check):
            form.addRow(check)
        return box

    def _fill_sources(self, spec: ModelSpec | None) -> None:
        """The map sources the model can give (the table of map kinds, `unavailable`): the pooling attention only
        for a model with a MAP head, the class relevance not for a model run from its own code (its attention
        gradients are not exposed), a windowed model's maps only for one; without a model, a plain ViT's maps but
        the pooling attention."""
        self.source_combo.clear()
        can = self.session.model.capabilities or None   # none known yet (no model answered): from the spec
        for key, label in SOURCE_LABELS.items():
            if spec is None and (key == "pool" or "windowed" in KINDS[key].needs):
                continue         # no model yet: a plain ViT's maps, and no MAP head
            if spec is not None and unavailable(key, spec, can) is not None:
                continue
            self.source_combo.addItem(label, key)
            self.source_combo.setItemData(self.source_combo.count() - 1, SOURCE_TIPS[key],
                                          Qt.ItemDataRole.ToolTipRole)

    def _selector(self, specials: dict[int, str], name: str) -> tuple[SelectorSpinBox, IndexSlider]:
        spin = SelectorSpinBox(specials)
        spin.setMaximum(0)
        spin.setMinimumWidth(72)
        spin.setObjectName(f"{name}Spin")
        slider = IndexSlider()
        slider.setObjectName(f"{name}Slider")
        spin.valueChanged.connect(lambda v: slider.setValue(v) if v >= 0 else None)
        slider.valueChanged.connect(lambda v: spin.setValue(v) if not slider.special else None)
        slider.reactivated.connect(lambda v: self._set(**{name: v}))
        spin.valueChanged.connect(lambda v: self._set(**{name: int_to_sel(v, specials)}))
        words = " / ".join(specials[k] for k in sorted(specials, reverse=True))
        spin.setToolTip(f"0-based index, or {words} (type it, or step below 0)")
        slider.setToolTip(f"0-based index; greyed out while the box shows {words} (click it to pick a single {name})")
        return spin, slider

    def _check(self, text: str, field_name: str, tip: str) -> QCheckBox:
        check = QCheckBox(text)
        check.setToolTip(tip)
        check.toggled.connect(lambda on: self._set(**{field_name: bool(on)}))
        return check

    def _set(self, **values: object) -> None:
        if not self._updating:
            self.state.update(**values)

    def _on_query_chosen(self, _index: int) -> None:
        token = self.query_combo.currentData()
        spec, can = self._spec, self.session.model.capabilities or None
        chosen = QUERY_SOURCES[0] if spec is None else query_source(self.state.source, spec, can)
        if token is None or token < 0:
            fallback = "cls" if spec is None else default_source(spec, can)
            self._set(query=None, source=fallback if self.state.source == chosen else self.state.source)
        else:
            self._set(query=int(token), source=chosen)

    def set_spec(self, spec: ModelSpec, device: str) -> None:
        """Show a newly loaded model and size the layer/head ranges to it."""
        self._spec = spec
        self._updating = True
        self._fill_sources(spec)
        traits = spec.traits     # Swin, SAM / ViTDet: blocks over all stages, windows, no plain-ViT settings
        blocks = traits.blocks
        self.model_settings.set_spec(spec if traits.plain_settings else None)   # its fields are a plain ViT's
        self.model_settings.setToolTip("" if traits.plain_settings else WINDOWED_SETTINGS)
        self.layer_label.setText("Block" if blocks else "Layer")
        self.relevance_picker.setVisible(not blocks)   # no class relevance: its passes are the reference ViT's
        self.block_label.setVisible(blocks)
        self.layer_spin.setMinimum(0 if blocks else min(LAYER_SPECIALS))   # no mean over stages' grids
        self.layer_spin.setToolTip("The block's index over all stages (its stage and place are named below)"
                                   if blocks else self._layer_tip)
        self.layer_spin.setMaximum(spec.depth - 1)
        self.layer_slider.setMaximum(spec.depth - 1)
        self.head_spin.setMaximum(spec.num_heads - 1)
        self.head_slider.setMaximum(spec.num_heads - 1)
        for spin in (self.height_spin, self.width_spin):
            spin.setSpecialValueText("")
            spin.setMinimum(spec.patch_size)
            spin.setSingleStep(spec.patch_size)
            spin.setEnabled(True)
        self.apply_size.setEnabled(True)
        self.height_spin.setValue(spec.image_size[0])
        self.width_spin.setValue(spec.image_size[1])
        self._updating = False
        self.model_label.setText(model_summary(spec))
        self.set_device(device)
        self._on_state_changed(set(self.state.snapshot()))

    def show_size(self, size: tuple[int, int]) -> None:
        """Show the input size the images run at."""
        self._updating = True
        self.height_spin.setValue(size[0])
        self.width_spin.setValue(size[1])
        self._updating = False
        if self._spec is not None:
            self.model_label.setText(model_summary(self._spec, size))

    def set_devices(self, devices: list[str]) -> None:
        current = self.device_combo.currentText()
        self.device_combo.clear()
        self.device_combo.addItems(devices)
        self.set_device(current)

    def set_device(self, device: str) -> None:
        kind = device.split(":")[0]
        for i in range(self.device_combo.count()):
            if self.device_combo.itemText(i) in (device, kind):
                self.device_combo.setCurrentIndex(i)
                return
        self.device_combo.addItem(device)
        self.device_combo.setCurrentIndex(self.device_combo.count() - 1)

    def _on_state_changed(self, changed: set[str]) -> None:
        self._updating = True
        try:
            s, spec = self.state, self._spec
            depth, heads = (spec.depth, spec.num_heads) if spec else (1, 1)
            if spec is not None and spec.traits.blocks:     # heads per stage: the block's own
                heads = self._show_block(spec)
            self.source_combo.setCurrentIndex(self.source_combo.findData(s.source))
            self.layer_spin.setValue(sel_to_int(s.layer, LAYER_SPECIALS, depth))
            self.head_spin.setValue(sel_to_int(s.head, HEAD_SPECIALS, heads))
            # the table of map kinds says whether the map has a layer and a head to pick (a map of the whole
            # model has no layer; rollout fuses the heads; a text prompt's map has neither)
            kind = map_kind(s)
            self.layer_spin.setEnabled(kind.per_layer)
            self.layer_slider.show_special(isinstance(s.layer, str), allowed=kind.per_layer)
            self.head_spin.setEnabled(kind.per_head)
            self.head_slider.show_special(isinstance(s.head, str), allowed=kind.per_head)
            self.cmap_combo.setCurrentText(s.colormap)
            self.opacity_slider.setValue(int(round(s.opacity * 100)))
            self.smooth_check.setChecked(s.smooth)
            self.normalize_check.setChecked(s.normalize)
            self.grid_check.setChecked(s.show_grid)
            self.per_tile_check.setChecked(s.per_tile)
            if changed & {"query"} or self.query_combo.count() == 0:
                self._fill_queries()
        finally:
            self._updating = False

    def _show_block(self, spec: ModelSpec) -> int:
        """A windowed model's selected block: its stage, place and attention under the selector, the head range
        of its stage; returns the stage's head count."""
        layer = self.state.layer
        block = spec.depth - 1 if isinstance(layer, str) else int(resolve_index(layer, spec.depth))
        stage, index = spec.stage_of(block)
        heads = spec.heads[stage]
        g = geometry_at(spec, self.session.model.image_size)[block]
        self.block_label.setText(f"stage {stage} · block {index} of {spec.depths[stage]} · {g.describe()} · "
                                 f"{g.grid[0]}×{g.grid[1]} cells of {g.stride} px · {plural(heads, 'head')}")
        self.head_spin.setMaximum(heads - 1)
        self.head_slider.setMaximum(heads - 1)
        return heads

    def _fill_queries(self) -> None:
        self.query_combo.clear()
        self.query_combo.addItem("none (click a patch)", -1)
        spec, query = self._spec, self.state.query
        names = spec.prefix_names if spec else ()
        for i, name in enumerate(names):
            self.query_combo.addItem(f"{name} token", i)
        if spec is not None and query is not None and query >= len(names):
            self.query_combo.addItem(f"{spec.token_name(query)} · token {query}", query)
        index = self.query_combo.findData(-1 if query is None else query)
        self.query_combo.setCurrentIndex(max(0, index))


def model_summary(spec: ModelSpec, size: tuple[int, int] | None = None) -> str:
    """A few lines that tell a user what was loaded, at the input size the images run at (default: native)."""
    if spec.traits.blocks:
        return windowed_summary(spec, size)
    h, w = size or spec.image_size
    grid = (h // spec.patch_size, w // spec.patch_size)
    prefix = ", ".join(spec.prefix_names) or "none"
    n = spec.num_params
    params = f"{n / 1e6:.1f} M parameters" if n >= 1e5 else (f"{n / 1e3:.1f} k parameters" if n else "")
    size = f"{plural(spec.depth, 'layer')} × {plural(spec.num_heads, 'head')}"
    lines = [[f"<b>{html.escape(spec.family)}</b>", params, size],
             [f"{h}×{w} px", f"patch {spec.patch_size}", f"grid {grid[0]}×{grid[1]}",
              f"prefix tokens: {prefix}"]]
    # a line may wrap between its phrases, never inside one ("12 layers × 12 / heads")
    text = "<br>".join((" · " if i == 0 else ", ").join(_nowrap(p) for p in line if p)
                       for i, line in enumerate(lines))
    return f"{text}<br><small>{html.escape(spec.source)}</small>"


def geometry_at(spec: ModelSpec, size: tuple[int, int] | None) -> tuple:
    """A windowed spec's block geometry at input `size` (None: native), or at the native size where the original
    cannot run that size (the run says why)."""
    try:
        return spec.geometry(size or spec.image_size)
    except ValueError:
        return spec.geometry()


def windowed_summary(spec: ModelSpec, size: tuple[int, int] | None = None) -> str:
    """`model_summary` of a windowed model (Swin, SAM / ViTDet): its stages (blocks × heads) and windows."""
    h, w = size or spec.image_size
    geo = geometry_at(spec, (h, w))
    n = spec.num_params
    params = f"{n / 1e6:.1f} M parameters" if n >= 1e5 else (f"{n / 1e3:.1f} k parameters" if n else "")
    stages = " + ".join(f"{d}×{spec.heads[s]}" for s, d in enumerate(spec.depths))
    n_global = sum(g.is_global for g in geo)
    windows = sorted({f"{g.window[0]}×{g.window[1]}" for g in geo if not g.is_global})
    attention = (f"windows {', '.join(windows)}" if windows else "") + (f", {n_global} global" if n_global else "")
    lines = [[f"<b>{html.escape(spec.family)}</b>", params,
              f"{plural(spec.num_stages, 'stage')}: {stages} blocks × heads"],
             [f"{h}×{w} px", f"patch {spec.patch_size}", f"grid {geo[0].grid[0]}×{geo[0].grid[1]}", attention,
              "windowed attention, no prefix tokens"]]
    text = "<br>".join((" · " if i == 0 else ", ").join(_nowrap(p) for p in line if p)
                       for i, line in enumerate(lines))
    return f"{text}<br><small>{html.escape(spec.source)}</small>"


def _nowrap(phrase: str) -> str:
    return phrase if phrase.startswith("<b>") else html.escape(phrase).replace(" ", "&nbsp;")


def _pair(slider: QSlider, spin: QSpinBox) -> QWidget:
    widget = QWidget()
    row = QHBoxLayout(widget)
    row.setContentsMargins(0, 0, 0, 0)
    row.addWidget(slider, 1)
    row.addWidget(spin)
    return widget
