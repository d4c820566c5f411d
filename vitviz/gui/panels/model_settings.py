"""The Controls dock's model settings: what a checkpoint may not say -- the head count, the norm order, the
activation, the attention scale, the input size, the normalisation mean and std, the resize and crop -- and the
channels it does say, with where each value came from.

A value that is assumed (`ModelSpec.kind_of(name) == 'assumed'`: a guess, a convention, a default of a layout
nobody named) is marked with a '?' whose tooltip says why it was assumed; every label's tooltip names its source.
Editing a value and pressing "Reload with these" asks for the model to be loaded again with those overrides
(`vitviz.load(heads=, block_norm=, act=, attn_scale=, image_size=, mean=, std=, resize=, crop_mode=)`, in the
worker); nothing heavy happens here.
"""
from __future__ import annotations

import html
from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (QCheckBox, QComboBox, QFormLayout, QHBoxLayout, QLabel, QLineEdit, QPushButton, QSpinBox,
                               QToolButton, QVBoxLayout, QWidget)

from vitviz.core.options import CROP_MODE_LABELS, OPTION, setting_fields
from vitviz.core.spec import ModelSpec, parse_size
from vitviz.gui.assumptions import ACTIVATIONS, is_assumed, reason, runs_own_code
from vitviz.gui.dialogs import divisors

GUESS_STYLE = "color: #e37400; font-weight: bold;"   # the '?' of an assumed value
REMEMBERED_PREFIX = "remembered"     # the provenance of an answer remembered for the file (`vitviz.core.options`)
# Each row, keyed by the override it edits (`Option.setting`), -> the spec field whose provenance it shows; the
# channels are read from the patch embedding, no override.
FIELD_SOURCES = {**setting_fields(), "in_chans": "in_chans"}
HEADS_TIP = "Attention heads per layer (they divide the attention width); every per-head map depends on it"
LABELS = {**{name: OPTION[name].setting for name in setting_fields()}, "in_chans": "Channels"}
NORM_TEXTS = {"pre": "pre-norm", "post": "post-norm", "res_post": "norm after each sublayer"}
LIVE_TIP = "Your model's code decides this (it runs as written)"


def format_floats(values: tuple[float, ...]) -> str:
    """(0.485, 0.456, 0.406) -> '0.485, 0.456, 0.406'."""
    return ", ".join(f"{v:g}" for v in values)


def parse_floats(text: str, what: str, channels: int, positive: bool = False) -> tuple[float, ...]:
    """'0.5, 0.5, 0.5' -> (0.5, 0.5, 0.5): 1 value, or one per channel (or per RGB channel).

    Raises:
        ValueError: saying what was expected.
    """
    try:
        values = tuple(float(v) for v in text.replace(";", ",").split(",") if v.strip())
    except ValueError:
        raise ValueError(f"{what}: expected comma-separated numbers, found {text!r}") from None
    if len(values) not in (1, 3, channels):    # 3 values for a 1-channel model are averaged, as for RGB files
        raise ValueError(f"{what}: expected 1 or {max(3, channels)} values (one per channel), found "
                         f"{len(values)}")
    if positive and min(values) <= 0:
        raise ValueError(f"{what}: every value must be above 0, found {text!r}")
    return values


def parse_scale(text: str) -> float:
    """'' or 'auto' -> 0.0 (head_dim**-0.5, as `vitviz.load(attn_scale=0)`); '0.125' -> 0.125.

    Raises:
        ValueError: saying what was expected.
    """
    text = text.strip().lower()
    if text in ("", "auto"):
        return 0.0
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"Attn scale: expected a number, or empty for head_dim^-0.5, found {text!r}") from None
    if not value > 0:
        raise ValueError(f"Attn scale: expected a number above 0 (empty for head_dim^-0.5), found {text!r}")
    return value


class ModelSettings(QWidget):
    """Heads, norm order, activation, attention scale, image size, channels, mean/std, resize and crop of the
    loaded model, editable (a header button folds them away; they unfold by themselves when a value is assumed).

    A value that is an answer remembered for the file (its source 'remembered: ...') is said so in its tooltip, and
    "Forget remembered answers" (shown only then) asks for them to be forgotten.

    Signals:
        overrides_requested(dict): the changed values as `vitviz.load` overrides ({'heads': 4, 'mean': (...)}).
        forget_requested(): forget the answers remembered for this file (the model loads again without them).
        half_maps_changed(bool): keep the maps as float16 or not (no reload: the images run again).
    """

    overrides_requested = Signal(dict)
    forget_requested = Signal()
    half_maps_changed = Signal(bool)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("modelSettings")
        self.spec: ModelSpec | None = None
        self.marks: dict[str, QLabel] = {}
        self.header = QToolButton()
        self.header.setObjectName("modelSettingsHeader")
        self.header.setText("Model settings")
        self.header.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.header.setCheckable(True)
        self.header.setAutoRaise(True)
        self.header.toggled.connect(self._fold)
        self.header.setToolTip("What the checkpoint may not say (a '?' marks an assumed value): change a value and reload")
        self.body = QWidget()
        form = QFormLayout(self.body)
        form.setContentsMargins(0, 0, 0, 0)
        self.heads_combo = QComboBox()
        self.heads_combo.setObjectName("headsCombo")
        self.norm_combo = QComboBox()
        self.norm_combo.setObjectName("normCombo")
        for order, text in NORM_TEXTS.items():
            self.norm_combo.addItem(text, order)
        self.act_combo = QComboBox()
        self.act_combo.setObjectName("actCombo")
        self.scale_edit = QLineEdit()
        self.scale_edit.setObjectName("scaleEdit")
        self.size_edit = QLineEdit()
        self.size_edit.setObjectName("imageSizeEdit")
        self.size_edit.setPlaceholderText("N or H×W")
        self.channels_label = QLabel("–")
        self.mean_edit, self.std_edit = QLineEdit(), QLineEdit()
        self.mean_edit.setObjectName("meanEdit")
        self.std_edit.setObjectName("stdEdit")
        self.resize_spin = QSpinBox()
        self.resize_spin.setObjectName("resizeSpin")
        self.resize_spin.setRange(0, 8192)
        self.resize_spin.setSuffix(" px")
        self.crop_combo = QComboBox()
        self.crop_combo.setObjectName("cropCombo")
        for mode, text in CROP_MODE_LABELS.items():
            self.crop_combo.addItem(text, mode)
        self.heads_combo.setToolTip(HEADS_TIP)
        self.norm_combo.setToolTip("Where each block's LayerNorms sit (block_norm=): pre-norm x + f(norm(x)) as in "
                                   "ViT, or post-norm norm(x + f(x)) as nn.TransformerEncoderLayer's default")
        self.act_combo.setToolTip("The MLP's activation (act=)")
        self.scale_edit.setToolTip("The factor on q·kᵀ before the softmax (attn_scale=); empty: head_dim^-0.5")
        self.size_edit.setToolTip("The model's own input size (image_size=): the crop, and the grid its position "
                                  "embedding is resampled to. 'Input H×W' above runs the images at another size "
                                  "without reloading")
        self.mean_edit.setToolTip("Normalisation mean per channel (mean=), e.g. 0.485, 0.456, 0.406; one value for "
                                  "all channels")
        self.std_edit.setToolTip("Normalisation std per channel (std=), e.g. 0.229, 0.224, 0.225")
        self.resize_spin.setToolTip("The shorter side is resized to this before the centre crop (resize=)")
        self.crop_combo.setToolTip("How an image becomes the input (crop_mode=): resize keeping the aspect ratio "
                                   "and crop the middle, squash the whole image, or squash to the resize and crop")
        widgets = {"heads": self.heads_combo, "block_norm": self.norm_combo, "act": self.act_combo,
                   "attn_scale": self.scale_edit, "image_size": self.size_edit, "in_chans": self.channels_label,
                   "mean": self.mean_edit, "std": self.std_edit, "resize": self.resize_spin,
                   "crop_mode": self.crop_combo}
        for key, widget in widgets.items():
            form.addRow(self._label(key), widget)
        for edit in (self.size_edit, self.mean_edit, self.std_edit, self.scale_edit):
            edit.textEdited.connect(self._on_edited)
        for combo in (self.heads_combo, self.norm_combo, self.act_combo, self.crop_combo):
            combo.activated.connect(self._on_edited)
        self.resize_spin.valueChanged.connect(self._on_edited)
        self.problem = QLabel("")
        self.problem.setObjectName("modelSettingsProblem")
        self.problem.setWordWrap(True)
        self.problem.setStyleSheet("color: #d93025;")
        self.problem.setVisible(False)
        form.addRow(self.problem)
        self.apply_button = QPushButton("Reload with these")
        self.apply_button.setObjectName("reloadWithSettings")
        self.apply_button.setToolTip("Load the model again with these values (the images run again)")
        self.apply_button.clicked.connect(self.apply)
        self.reset_button = QPushButton("Reset")
        self.reset_button.setToolTip("Back to the loaded model's values")
        self.reset_button.clicked.connect(self.reset)
        row = QHBoxLayout()
        row.addWidget(self.reset_button)
        row.addWidget(self.apply_button, 1)
        form.addRow(row)
        self.forget_button = QPushButton("Forget remembered answers")
        self.forget_button.setObjectName("forgetAnswers")
        self.forget_button.clicked.connect(self.forget_requested)
        self.forget_button.setVisible(False)
        form.addRow(self.forget_button)
        self.half_box = QCheckBox("Maps in float16")
        self.half_box.setObjectName("halfMaps")
        self.half_box.setToolTip("Keep each image's attention maps as float16: half the memory per image, each value "
                                 "within 2.4e-4 of float32's (4.9e-4 relative); the images run again")
        self.half_box.toggled.connect(self.half_maps_changed)
        form.addRow(self.half_box)
        column = QVBoxLayout(self)
        column.setContentsMargins(0, 0, 0, 0)
        column.addWidget(self.header)
        column.addWidget(self.body)
        self._fold(False)
        self.setEnabled(False)

    def _label(self, key: str) -> QWidget:
        """A field's label with its guess mark ('?', hidden unless the value is a guess)."""
        box = QWidget()
        row = QHBoxLayout(box)
        row.setContentsMargins(0, 0, 0, 0)
        row.setSpacing(3)
        text = QLabel(LABELS[key])
        mark = QLabel("?")
        mark.setObjectName(f"{key}GuessMark")
        mark.setStyleSheet(GUESS_STYLE)
        mark.setVisible(False)
        row.addWidget(text)
        row.addWidget(mark)
        self.marks[key] = mark
        box.setObjectName(f"{key}Label")
        return box

    def _fold(self, unfolded: bool) -> None:
        self.header.setArrowType(Qt.ArrowType.DownArrow if unfolded else Qt.ArrowType.RightArrow)
        self.body.setVisible(unfolded)

    def unfold(self, unfolded: bool = True) -> None:
        self.header.setChecked(unfolded)
        self._fold(unfolded)

    # ------------------------------------------------------------------------------------------ the model

    def set_spec(self, spec: ModelSpec | None) -> None:
        """Show a loaded model's values and where they came from; an assumed value unfolds the settings."""
        self.spec = spec
        self.setEnabled(spec is not None)
        if spec is None:
            self.forget_button.setVisible(False)
            return
        self.reset()
        live = runs_own_code(spec)           # a model built by its own code: its attention says its heads
        self.heads_combo.setEnabled(not live)
        self.heads_combo.setToolTip("Your model's code decides its heads (read from its attention as it ran)"
                                    if live else HEADS_TIP)
        self.norm_combo.setEnabled(not live)
        self.scale_edit.setEnabled(not live)
        self.act_combo.setEnabled(not live and spec.mlp_kind in ACTIVATIONS and bool(spec.mlp_hidden))
        if live:
            for widget in (self.norm_combo, self.act_combo, self.scale_edit):
                widget.setToolTip(LIVE_TIP)
        self._mark()

    def set_provenance(self, spec: ModelSpec | None) -> None:
        """The same model, its settings' provenance changed (the check verified some): the `?` marks and tooltips
        follow; the values shown, and anything typed, stay."""
        if self.spec is None or spec is None:
            return
        self.spec = spec
        self._mark()

    def _mark(self) -> None:
        """A `?` on every assumed value, its tooltip saying where it came from."""
        spec = self.spec
        assert spec is not None
        guessed = self.guessed()
        for key, mark in self.marks.items():
            name = FIELD_SOURCES[key]
            source = spec.source_of(name)
            tip = (f"Assumed: {html.escape(reason(source))}. If it is wrong, set it here and press Reload with "
                   "these." if key in guessed else f"From: {html.escape(source)}")
            mark.setVisible(key in guessed)
            mark.setToolTip(tip)
            mark.parentWidget().setToolTip(tip)
        self.channels_label.setToolTip("Read from the patch embedding's weights (not an override)")
        remembered = self.remembered()
        self.forget_button.setVisible(bool(remembered))
        self.forget_button.setToolTip(
            f"Remembered for this file: {', '.join(LABELS[k].lower() for k in remembered)}. Forget them and load the "
            "model again with what the file does not say assumed (and marked) again" if remembered else "")
        if guessed:
            self.unfold(True)

    def remembered(self) -> list[str]:
        """The fields whose value is an answer remembered for the file (their source 'remembered: ...')."""
        spec = self.spec
        if spec is None:
            return []
        return [key for key in self.marks if spec.source_of(FIELD_SOURCES[key]).startswith(REMEMBERED_PREFIX)]

    def guessed(self) -> set[str]:
        """The fields whose value is assumed (`ModelSpec.kind_of`), among those that change the computation."""
        spec = self.spec
        if spec is None:
            return set()
        return {key for key in self.marks if is_assumed(spec, FIELD_SOURCES[key])}

    def reset(self) -> None:
        """Put the loaded model's values back into the fields."""
        spec = self.spec
        if spec is None:
            return
        combos = (self.heads_combo, self.norm_combo, self.act_combo, self.resize_spin, self.crop_combo)
        blockers = [w.blockSignals(True) for w in combos]
        self.heads_combo.clear()
        width = spec.attn_width
        for h in divisors(width):
            self.heads_combo.addItem(f"{h} (head dim {width // h})", h)
        self.heads_combo.setCurrentIndex(max(0, self.heads_combo.findData(spec.num_heads)))
        self.norm_combo.setCurrentIndex(max(0, self.norm_combo.findData(spec.block_norm)))
        self.act_combo.clear()
        for act, text in ACTIVATIONS.items():
            self.act_combo.addItem(text, act)
        if spec.mlp_kind not in ACTIVATIONS:      # SwiGLU: read from the MLP's shapes, not a choice of activation
            self.act_combo.addItem(spec.mlp_kind, spec.mlp_kind)
        self.act_combo.setCurrentIndex(max(0, self.act_combo.findData(spec.mlp_kind)))
        self.scale_edit.setText(f"{spec.attn_scale:g}" if spec.attn_scale else "")
        self.scale_edit.setPlaceholderText(f"head_dim^-0.5 = {spec.head_dim ** -0.5:.4g}")
        h, w = spec.image_size
        self.size_edit.setText(str(h) if h == w else f"{h}×{w}")
        self.channels_label.setText(str(spec.in_chans))
        pp = spec.preprocess
        self.mean_edit.setText(format_floats(pp.mean))
        self.std_edit.setText(format_floats(pp.std))
        self.resize_spin.setValue(int(pp.resize))
        self.crop_combo.setCurrentIndex(max(0, self.crop_combo.findData(pp.mode)))
        for widget, blocked in zip(combos, blockers):
            widget.blockSignals(blocked)
        self._on_edited()

    def changes(self) -> dict[str, Any]:
        """The values that differ from the loaded model's, as `vitviz.load` overrides.

        Raises:
            ValueError: a field that does not parse (the message says which and what it expects).
        """
        spec = self.spec
        if spec is None:
            return {}
        pp, out = spec.preprocess, {}
        heads = int(self.heads_combo.currentData() or spec.num_heads)
        if heads != spec.num_heads:
            out["heads"] = heads
        if not runs_own_code(spec):
            norm = str(self.norm_combo.currentData() or spec.block_norm)
            if norm != spec.block_norm:
                out["block_norm"] = norm
            act = str(self.act_combo.currentData() or spec.mlp_kind)
            if act != spec.mlp_kind and spec.mlp_kind in ACTIVATIONS and spec.mlp_hidden:
                out["act"] = act
            scale = parse_scale(self.scale_edit.text())
            if abs(scale - float(spec.attn_scale)) > 1e-12:
                out["attn_scale"] = scale
        try:
            size = parse_size(self.size_edit.text().strip())
        except ValueError as exc:
            raise ValueError(f"Image size: {exc}") from None
        if size != tuple(spec.image_size):
            out["image_size"] = size
        mean = parse_floats(self.mean_edit.text(), "Mean", spec.in_chans)
        std = parse_floats(self.std_edit.text(), "Std", spec.in_chans, positive=True)
        if mean != tuple(pp.mean):
            out["mean"] = mean
        if std != tuple(pp.std):
            out["std"] = std
        if self.resize_spin.value() != int(pp.resize):
            out["resize"] = int(self.resize_spin.value())
        crop = str(self.crop_combo.currentData())
        if crop != pp.mode:
            out["crop_mode"] = crop
        return out

    def _on_edited(self, *_args: object) -> None:
        """Enable Reload when something changed and everything parses; say what does not."""
        try:
            changed = bool(self.changes())
            problem = ""
        except ValueError as exc:
            changed, problem = False, str(exc)
        self.problem.setText(problem)
        self.problem.setVisible(bool(problem))
        self.apply_button.setEnabled(changed)
        self.reset_button.setEnabled(changed or bool(problem))

    def apply(self) -> None:
        """Ask for the model to be loaded again with the changed values."""
        try:
            changes = self.changes()
        except ValueError:
            return
        if changes:
            self.apply_button.setEnabled(False)
            self.overrides_requested.emit(changes)
