"""The view state's rules (`vitviz.gui.state`), tested without Qt: what the window shows when a model loads
(`view_for_model`)."""
from __future__ import annotations

from _windowed import swin_spec

from vitviz.core.spec import ModelSpec
from vitviz.gui.state import ViewState, view_for_model


def plain(**fields: object) -> ModelSpec:
    base: dict[str, object] = dict(family="test", source="x", image_size=(32, 32), patch_size=8, embed_dim=32,
                                   depth=4, num_heads=4)
    base.update(fields)
    return ModelSpec(**base)  # type: ignore[arg-type]


def test_the_last_layer_stays_the_last_and_other_layers_are_clamped() -> None:
    view = view_for_model(ViewState(layer=11, head=2), plain(depth=24), None, previous_depth=12, query=None)
    assert view.changes["layer"] == 23 and view.changes["head"] == 2 and not view.notes
    view = view_for_model(ViewState(layer=5), plain(depth=24), None, previous_depth=12, query=None)
    assert view.changes["layer"] == 5                   # another layer keeps its index
    view = view_for_model(ViewState(layer=10, head=7), plain(depth=4), None, previous_depth=12, query=None)
    assert view.changes["layer"] == 3 and view.changes["head"] == 3     # nearest valid index, not the last rule


def test_a_windowed_model_has_no_mean_over_blocks_and_says_so() -> None:
    spec = swin_spec()
    view = view_for_model(ViewState(layer="mean"), spec, None, previous_depth=4, query=None)
    assert view.changes["layer"] == spec.depth - 1
    assert any("no mean over blocks" in n for n in view.notes)
    assert view.changes["source"] == "received"      # CLS is the other lane's map: switched without a note
    assert not any("Showing" in n for n in view.notes)


def test_a_map_the_model_cannot_give_falls_back_and_is_said_unless_the_command_line_asked() -> None:
    state = ViewState(source="pool")                   # a MAP head's attention: this model has none
    view = view_for_model(state, plain(), None, previous_depth=4, query=None)
    assert view.changes["source"] == "cls" and any(n.startswith("Showing") for n in view.notes)
    told = view_for_model(state, plain(), None, previous_depth=4, query=None, told=True)
    assert told.changes["source"] == "cls" and not told.notes


def test_a_query_map_follows_the_query_or_falls_back_without_one() -> None:
    state = ViewState(source="token", query=5)
    assert view_for_model(state, plain(), None, 4, query=5).changes["source"] == "token"
    assert view_for_model(state, plain(), None, 4, query=None).changes["source"] == "cls"
    windowed = view_for_model(state, swin_spec(), None, 4, query=5)
    assert windowed.changes["source"] == "query" and windowed.changes["query"] == 5


def test_the_state_is_not_changed_by_the_rules() -> None:
    state = ViewState(layer=11, source="pool")
    view_for_model(state, plain(), None, previous_depth=12, query=None)
    assert (state.layer, state.source) == (11, "pool")
