"""The class picker of the 'Class relevance' map source: which gradient map (Chefer relevance, gradient rollout,
attention x gradient) of which class (the image's top class, or any label, found by typing part of it), bound to
`ViewState.relevance_method` / `relevance_class`. It sits in the controls dock under the map choice."""
from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QComboBox, QCompleter, QFormLayout, QLineEdit, QWidget

from vitviz.core.spec import ModelSpec
from vitviz.gui.model_slot import ModelSlot
from vitviz.gui.state import RELEVANCE_FIELDS, RELEVANCE_METHODS, ViewState

METHOD_TIPS = {
    "relevance": "Chefer et al. 2021, generic attention explainability: gradient-weighted attention propagated "
                 "through every layer (--maps relevance:CLASS)",
    "gradrollout": "vit-explain's gradient rollout: attention rollout with each layer weighted by its gradient "
                   "(--maps gradrollout:CLASS)",
    "attngrad": "attention × gradient of the selected layer and head, signed (--maps attngrad:CLASS)",
}
PROMPT_TIP = ("LeGrad of a text prompt (Enter computes it): how much each patch makes the image match the "
              "prompt's text embedding; needs the file's text tower and tokenizer (--maps 'text:PROMPT')")
TOP_CLASS = "top class of each image"


def class_names(spec: ModelSpec | None) -> list[str]:
    """'index · label' for every class of the model ('index' alone without labels)."""
    if spec is None:
        return []
    labels = spec.labels
    return [f"{i} · {labels[i]}" if i < len(labels) else str(i) for i in range(spec.num_classes)]


CLASS_TIP = ("The class the map explains: the top class of each image, or any class (type part of its name); a "
             "click on one of the top 5 in Model info picks it too")


class RelevancePicker(QWidget):
    """Method and class of the relevance source (choosing either shows it). The class box is editable: typing
    part of a label offers the matching classes; the first entry is the image's top class. Built from the model
    part it follows (its classes and prompts are the loaded model's)."""

    def __init__(self, state: ViewState, model: ModelSlot, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("relevancePicker")
        self.state = state
        self._updating = False
        form = QFormLayout(self)
        form.setContentsMargins(0, 0, 0, 0)
        self.method_combo = QComboBox()
        self.method_combo.setObjectName("relevanceMethod")
        for key, label in RELEVANCE_METHODS.items():
            self.method_combo.addItem(label, key)
            self.method_combo.setItemData(self.method_combo.count() - 1, METHOD_TIPS[key],
                                          Qt.ItemDataRole.ToolTipRole)
        self.method_combo.activated.connect(
            lambda _i: self._set(source="relevance", relevance_prompt="",
                                 relevance_method=self.method_combo.currentData()))
        form.addRow("Method", self.method_combo)
        self.class_combo = QComboBox()
        self.class_combo.setObjectName("relevanceClass")
        self.class_combo.setEditable(True)
        self.class_combo.setInsertPolicy(QComboBox.InsertPolicy.NoInsert)
        self.class_combo.setToolTip(CLASS_TIP)
        completer = QCompleter(self.class_combo.model(), self.class_combo)
        completer.setFilterMode(Qt.MatchFlag.MatchContains)
        completer.setCaseSensitivity(Qt.CaseSensitivity.CaseInsensitive)
        completer.setCompletionMode(QCompleter.CompletionMode.PopupCompletion)
        self.class_combo.setCompleter(completer)
        self.class_combo.activated.connect(self._on_class_chosen)
        form.addRow("Class", self.class_combo)
        self.prompt_edit = QLineEdit()
        self.prompt_edit.setObjectName("relevancePrompt")
        self.prompt_edit.setPlaceholderText("a photo of a cat")
        self.prompt_edit.setClearButtonEnabled(True)
        self.prompt_edit.returnPressed.connect(self._on_prompt_entered)
        form.addRow("Text prompt", self.prompt_edit)
        self.set_spec(model.spec)
        model.model_loaded.connect(self._on_model_loaded)
        state.subscribe(self._on_state_changed)

    def set_spec(self, spec: ModelSpec | None) -> None:
        """Offer the classes of a newly loaded model (a model without a classifier has none to explain)."""
        self._updating = True
        self.class_combo.clear()
        self.class_combo.addItem(TOP_CLASS, -1)
        for i, name in enumerate(class_names(spec)):
            self.class_combo.addItem(name, i)
        self._updating = False
        clip_like = spec is not None and getattr(spec, "embed_out", 0) > 0   # a windowed spec has none
        self._has_classes = spec is None or spec.num_classes > 0
        self.setEnabled(self._has_classes or clip_like)
        self.setToolTip("" if spec is None or spec.num_classes else "This model has no classifier: no class to "
                        "explain")
        self.prompt_edit.setEnabled(clip_like)
        self.prompt_edit.setToolTip(PROMPT_TIP if clip_like else "Text prompts need a CLIP-like model: this one has "
                                    "no image-embedding projection to compare with a text embedding")
        self._on_state_changed(RELEVANCE_FIELDS | {"source"})

    def _on_model_loaded(self, spec: ModelSpec, _device: str) -> None:
        self.set_spec(spec)

    def _set(self, **values: object) -> None:
        if not self._updating:
            self.state.update(**values)

    def _on_prompt_entered(self) -> None:
        prompt = " ".join(self.prompt_edit.text().split())
        self._set(source="relevance", relevance_prompt=prompt)

    def _on_class_chosen(self, index: int) -> None:
        data = self.class_combo.itemData(index)
        if data is None:     # typed text that names no entry: back to the state's class
            self._on_state_changed(RELEVANCE_FIELDS)
            return
        self._set(source="relevance", relevance_prompt="", relevance_class=None if data < 0 else int(data))

    def _on_state_changed(self, changed: set[str]) -> None:
        if not changed & (RELEVANCE_FIELDS | {"source"}):
            return
        self._updating = True
        try:
            s = self.state
            self.method_combo.setCurrentIndex(max(0, self.method_combo.findData(s.relevance_method)))
            target = -1 if s.relevance_class is None else s.relevance_class
            self.class_combo.setCurrentIndex(max(0, self.class_combo.findData(target)))
            if " ".join(self.prompt_edit.text().split()) != s.relevance_prompt:
                self.prompt_edit.setText(s.relevance_prompt)
            # method and class only do something for a class-relevance map: elsewhere (CLS attention, rollout, a
            # text prompt's map) they are off, saying how to use them; the prompt field stays a way into text maps
            used = self._has_classes and s.source == "relevance" and not s.relevance_prompt
            for combo in (self.method_combo, self.class_combo):
                combo.setEnabled(used)
            why = ("" if used else "This model has no classifier: no class to explain" if not self._has_classes
                   else "Used by the text prompt's map: clear the prompt to explain a class" if s.relevance_prompt
                   else "Used by Map › Class relevance only: choose it above to explain a class")
            self.method_combo.setToolTip(why)
            self.class_combo.setToolTip(why or CLASS_TIP)
        finally:
            self._updating = False
