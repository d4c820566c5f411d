"""The window's --map parses with export's parser (`MapKind.parse`) and the controls follow the table of map kinds."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from _gui import random_result

from vitviz.batch.plan import parse_maps
from vitviz.core.analyses.maps import MapKind, ResultMaps, map_stack
from vitviz.gui.state import MAP_CHOICES, ViewState, current_map, map_kind, parse_map_arg

SHOWN = ("cls", "mean", "max", "rollout", "rollout:5", "token:3", "pool", "rollout:pool", "relevance", "relevance:3",
         "gradrollout", "attngrad:7", "text:A photo of a cat", "prompt: a  dog", "received", "query:3", "key:4")


@pytest.mark.parametrize("name", SHOWN)
def test_window_map_is_exports_map(name: str) -> None:
    """What --map shows is the map `vitviz export --maps NAME` writes: the same kind, so the same file name."""
    state = ViewState(**parse_map_arg(name))  # type: ignore[arg-type]
    (exported,) = parse_maps(name)
    assert map_kind(state) == exported == MapKind.parse(name)
    assert map_kind(state).label == exported.label


@pytest.mark.parametrize(("name", "why"), [("relevance:tabby", "class as an index"),
                                           ("attngrad:tabby cat", "class as an index"),
                                           ("pca", "Features dock"), ("norms", "Features dock")])
def test_window_refuses_what_it_cannot_show_yet_saying_so(name: str, why: str) -> None:
    parse_maps(name)                         # export takes it
    with pytest.raises(ValueError, match=why):
        parse_map_arg(name)


def test_window_cli_accepts_rollout_token_and_text() -> None:
    import argparse

    from vitviz.cli.window import add_window_arguments

    parser = argparse.ArgumentParser()
    add_window_arguments(parser)
    for name in ("rollout:5", "text:a cat", "attngrad:3"):
        assert parser.parse_args(["--map", name]).map == name
    with pytest.raises(SystemExit):
        parser.parse_args(["--map", "relevance:tabby"])


def test_controls_disable_the_selectors_a_text_map_lacks(window) -> None:  # noqa: ANN001
    """A text prompt's map is one map of the whole model: no layer and no head, whatever the gradient method."""
    controls = window.controls
    window.state.update(source="relevance", relevance_method="attngrad", relevance_prompt="")
    assert controls.layer_spin.isEnabled() and controls.head_spin.isEnabled()     # attention x gradient has both
    window.state.update(relevance_prompt="a cat")
    assert not controls.layer_spin.isEnabled() and not controls.head_spin.isEnabled()
    window.state.update(source="rollout", relevance_prompt="")
    assert controls.layer_spin.isEnabled() and not controls.head_spin.isEnabled()
    window.state.update(source="pool")
    assert not controls.layer_spin.isEnabled() and controls.head_spin.isEnabled()


def test_controls_offer_the_sources_the_table_says_the_model_gives(window) -> None:  # noqa: ANN001
    from _gui import random_result

    controls = window.controls
    spec = random_result().spec
    offered = lambda: [controls.source_combo.itemData(i) for i in range(controls.source_combo.count())]  # noqa: E731
    controls.set_spec(spec, "cpu")
    assert "relevance" in offered() and "pool" not in offered()
    controls.set_spec(dataclasses.replace(spec, pooling="map"), "cpu")
    assert "pool" in offered()
    controls.set_spec(dataclasses.replace(spec, family="live"), "cpu")
    assert "relevance" not in offered() and "pool" not in offered() and "rollout" in offered()


def test_window_args_show_rollout_of_a_token_and_note_a_head_a_map_lacks(window) -> None:  # noqa: ANN001
    from _gui import parse

    from vitviz.gui.app import apply_args

    apply_args(window, parse("--map", "rollout:5"))
    assert (window.state.source, window.state.query) == ("rollout", 5)
    window.notes.clear()
    apply_args(window, parse("--map", "text:a cat", "--head", "2"))
    assert any(n.startswith("--head 2 is ignored") and "without heads" in n for n in window.notes), window.notes
    window.notes.clear()
    apply_args(window, parse("--map", "attngrad:3", "--head", "2"))
    assert not any("ignored" in n for n in window.notes)


def test_a_map_the_model_cannot_give_is_said_not_silently_replaced(qtbot, window, tiny_ckpt, images) -> None:  # noqa: ANN001
    """--map pool on a model without a MAP head: the view shows CLS attention and the command-line report says why
    (a --screenshot then exits non-zero); chosen in the window before a model loads, a note says it."""
    from _gui import HEADS, parse

    from vitviz.gui.app import apply_args

    apply_args(window, parse("--map", "pool"))
    with qtbot.waitSignal(window.session.model.model_loaded, timeout=20000):
        window.load_model(str(tiny_ckpt), heads=HEADS)
    assert window.state.source == "cls"
    assert any("--map pool" in summary and "MAP pooling head" in summary for _t, summary in window.reporter.errors)
    window.reporter.errors.clear()
    window.state.update(source="pool")
    window.notes.clear()
    with qtbot.waitSignal(window.session.model.model_loaded, timeout=20000):
        window.load_model(str(tiny_ckpt), heads=HEADS)
    assert window.state.source == "cls" and any("MAP pooling head" in n for n in window.notes), window.notes


def test_the_map_on_show_is_made_in_the_worker_for_new_images(qtbot, window, tiny_ckpt, images) -> None:  # noqa: ANN001
    """With the entropy map on show, a new image's run makes its entropy stack in the worker (`Run.also`): the
    result arrives holding it, so showing it computes nothing on the GUI thread."""
    from _gui import HEADS

    from vitviz.core.analyses.maps import MapKind
    from vitviz.gui.protocol import Run

    window.state.update(source="entropy")
    assert window.session.precompute == (MapKind("entropy"),)
    with qtbot.waitSignal(window.session.model.model_loaded, timeout=20000):
        window.load_model(str(tiny_ckpt), heads=HEADS)
    asked: list[Run] = []
    window.session.client.answered.connect(lambda r, a: asked.append(r) if isinstance(r, Run) else None)
    with qtbot.waitSignal(window.session.image_list.result_ready, timeout=20000):
        window.session.add_images([str(images[0])])
    assert asked and asked[0].also == (MapKind("entropy"),)
    assert MapKind("entropy") in window.session.cached(str(images[0]))._stacks   # made before it reached the GUI
    from types import SimpleNamespace

    ctx = SimpleNamespace(model=window.session.client._worker.model, slots={})
    made = Run(image=str(images[1]), also=(MapKind("entropy"),))(ctx).maps      # the work itself, in this thread
    assert MapKind("entropy") in made._stacks and MapKind("entropy") not in Run(image=str(images[1]))(ctx).maps._stacks


def test_a_key_map_is_offered_drawn_followed_by_a_click_timeline_and_compare(qtbot, loaded) -> None:  # noqa: ANN001
    """key:N is one row of the table: the window offers it, draws the library's map, keeps it when another patch is
    clicked, and the Timeline and Compare docks draw it (the query token picks N)."""
    from vitviz.gui.compare import compared_kind
    from vitviz.gui.panels.timeline import timeline_kind

    controls, state = loaded.controls, loaded.state
    offered = [controls.source_combo.itemData(i) for i in range(controls.source_combo.count())]
    assert "key" in offered and "click a patch" in controls.source_combo.itemData(offered.index("key"), 3)
    state.update(source="key", query=5, layer=1, head=0)
    maps = loaded.session.image_list.current_maps
    np.testing.assert_array_equal(loaded.panel.values, maps.stack("key:5").select(1, 0))
    assert "attention paid to token 5" in loaded.panel.title.text and state.normalize   # own scale, as token:N
    loaded.select_query(7)                              # a click on another patch: still the key map, of token 7
    assert (state.source, state.query) == ("key", 7)
    np.testing.assert_array_equal(loaded.panel.values, maps.stack("key:7").select(1, 0))
    assert timeline_kind(state) == (MapKind("key", 7), "")
    assert compared_kind(state) == (MapKind("key", 7), 7, "")
    loaded.select_query(7)                              # the same patch again: the query goes, the map before it
    assert state.query is None and state.source == "cls"


@pytest.mark.parametrize("name", ["mean", "max"])
def test_map_mean_max_are_exports_maps(name: str) -> None:
    """--map mean/max is the attention received over the patch queries, as `vitviz export --maps mean,max`
    (it used to be the CLS map with --head mean/max)."""
    result = random_result()
    stack = ResultMaps(result).stack(parse_map_arg(name)["source"])
    expected = map_stack(result.attentions, MapKind(name), result.spec).maps
    np.testing.assert_allclose(stack.maps, expected, rtol=1e-5, atol=1e-7)
    cls = ResultMaps(result).stack("cls").maps
    assert not np.allclose(stack.maps, cls)
    state = ViewState(source=name, head=1)
    assert current_map(ResultMaps(result), state)[0].shape == result.grid


def test_map_choices_are_listed() -> None:
    with pytest.raises(ValueError, match=r"cls, mean, max, rollout\[:N\], token:N, entropy"):
        parse_map_arg("pca")
    # the window lists every map of the table it can show (with export's syntax), and not the ones it cannot
    assert list(MAP_CHOICES)[:6] == ["cls", "mean", "max", "rollout[:N]", "token:N", "entropy"]
    assert {"relevance[:CLASS]", "attngrad[:CLASS]", "pool", "rollout:pool", "text:PROMPT"} <= set(MAP_CHOICES)
    assert {"received", "query:N"} <= set(MAP_CHOICES)                  # a windowed model's, shown since
    assert not {"pca", "norms"} & set(MAP_CHOICES)
