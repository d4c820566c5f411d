"""The Controls panel (`vitviz.gui.panels.controls`): what is on or off for the map shown, and the notes that say
how to use what is off."""
from __future__ import annotations


def test_method_and_class_are_off_where_the_map_does_not_use_them(loaded) -> None:  # noqa: ANN001
    """Method and Class do nothing for CLS attention or rollout: they are off there, saying how to use them, and on
    for a class-relevance map."""
    window = loaded
    picker = window.controls.relevance_picker
    for source in ("cls", "rollout"):
        window.state.update(source=source)
        assert not picker.method_combo.isEnabled() and not picker.class_combo.isEnabled()
        assert "Class relevance" in picker.method_combo.toolTip()
    window.state.update(source="relevance")
    assert picker.method_combo.isEnabled() and picker.class_combo.isEnabled()
    window.state.update(source="cls")
    assert not picker.class_combo.isEnabled()


def test_the_query_scale_note_says_how_to_pick_a_query_and_goes_when_the_map_changes(loaded) -> None:  # noqa: ANN001
    """Choosing 'Attention of query token' with no query: the note says to click a patch (the map is CLS attention
    until then); choosing another map takes the note back (it said 'Normalise each map is on' over the entropy
    map with the box unticked again)."""
    from vitviz.gui.state import QUERY_SCALE_NOTE

    window = loaded
    window.state.update(query=None)
    window.state.update(source="token")
    message = window.statusBar().currentMessage()
    assert QUERY_SCALE_NOTE in message and "Click a patch" in message and "CLS attention" in message
    window.state.update(source="entropy")
    assert not window.state.normalize
    assert QUERY_SCALE_NOTE not in window.statusBar().currentMessage()
    assert window.status.idle_message() == window.status.ready_message
    window.note("Input size 100×72 is not a multiple of the 8 px patch; using 96×72")   # another note stays
    window.state.update(source="cls")
    assert window.statusBar().currentMessage().startswith("Input size 100×72")


def test_sliders_are_greyed_out_on_mean(qtbot, loaded) -> None:  # noqa: ANN001
    from PySide6.QtCore import QPoint, Qt

    c = loaded.controls
    loaded.state.update(layer="mean", head=1)
    assert not c.layer_slider.isEnabled() and c.layer_spin.text() == "mean"
    assert c.head_slider.isEnabled() and c.head_slider.value() == 1
    loaded.state.update(layer=0, head="max")
    assert c.layer_slider.isEnabled() and c.layer_slider.value() == 0 and not c.head_slider.isEnabled()
    loaded.state.update(layer="mean")
    qtbot.mouseClick(c.layer_slider, Qt.MouseButton.LeftButton, pos=QPoint(5, c.layer_slider.height() // 2))
    assert loaded.state.layer == 0 and c.layer_slider.isEnabled()            # a click picks a layer again
    loaded.state.update(source="rollout", head="mean")
    qtbot.mouseClick(c.head_slider, Qt.MouseButton.LeftButton, pos=QPoint(5, c.head_slider.height() // 2))
    assert loaded.state.head == "mean" and not c.head_slider.isEnabled()    # rollout: heads stay off


def test_the_relevance_picker_is_built_from_the_model_part_alone(qtbot) -> None:  # noqa: ANN001
    """No session or window: the picker offers the classes of the model its part says has loaded."""
    from vitviz.core.spec import ModelSpec
    from vitviz.gui.model_slot import ModelSlot
    from vitviz.gui.panels.relevance import TOP_CLASS, RelevancePicker
    from vitviz.gui.state import ViewState

    model = ModelSlot()
    picker = RelevancePicker(ViewState(), model)
    qtbot.addWidget(picker)
    assert [picker.class_combo.itemText(i) for i in range(picker.class_combo.count())] == [TOP_CLASS]
    spec = ModelSpec(family="vit", source="x", image_size=(32, 32), patch_size=8, embed_dim=16, depth=2, num_heads=2,
                     num_classes=3)
    model.model_loaded.emit(spec, "cpu")
    assert picker.class_combo.count() == 1 + 3 and picker.isEnabled()
    model.model_loaded.emit(ModelSpec(family="vit", source="x", image_size=(32, 32), patch_size=8, embed_dim=16,
                                      depth=2, num_heads=2, num_classes=0), "cpu")
    assert picker.class_combo.count() == 1 and not picker.isEnabled()     # no classifier: nothing to explain
