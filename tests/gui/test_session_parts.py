"""The session's parts alone, without a worker, a model or a window: the image list's ordering rules, its given-up
runs and run progress (`ImageList`), the loaded model's state and rules (`ModelSlot`), the signals each part owns,
the one test of "runs from its own code", and the query map's scale rule beside the view state (`QueryScaleRule`)."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
from PySide6.QtCore import Signal

from vitviz.core.spec import ModelSpec
from vitviz.gui.assumptions import LIVE_LINE, runs_own_code, verdict_line
from vitviz.gui.images import ImageList
from vitviz.gui.model_slot import ModelSlot
from vitviz.gui.protocol import Load, Loaded, PosEmbedded
from vitviz.gui.session import Session
from vitviz.gui.state import QUERY_SCALE_NOTE, QueryScaleRule, ViewState

A, B, C, D = (str(Path(f"/imgs/{n}.png")) for n in "abcd")


def _spec(family: str = "vit", heads_source: str = "read: qkv") -> ModelSpec:
    return ModelSpec(family=family, source="x", image_size=(32, 32), patch_size=8, embed_dim=32, depth=2,
                     num_heads=2, provenance=(("num_heads", heads_source),))


# ---------------------------------------------------------------------------------------------- ImageList


def test_adding_makes_the_first_new_image_current_only_when_none_is() -> None:
    images = ImageList()
    assert images.add([A, B]) == ([A, B], A)
    images.current = A
    assert images.add([C, A]) == ([C], None)                 # one is current: it stays
    assert images.add([B, "/imgs/./d.png"]) == ([D], None)   # paths are normalised; a listed one is not added twice
    assert images.paths == [A, B, C, D]
    assert images.add([]) == ([], None)


def test_adding_with_show_makes_the_first_named_current_even_when_listed() -> None:
    images = ImageList()
    images.add([A, B])
    images.current = A
    assert images.add([B, C], show=True) == ([C], B)         # the user opened B again: B is shown
    assert images.add([D], show=True) == ([D], D)
    assert images.paths == [A, B, C, D]


def test_removing_the_current_image_picks_the_next_then_the_previous() -> None:
    images = ImageList()
    images.add([A, B, C, D])
    images.current = B
    images.failed.update({B: "broken", D: "broken"})
    assert images.remove([B, C]) == ([B, C], D)              # the next one not removed
    assert images.paths == [A, D] and images.failed == {D: "broken"}
    images.current = D
    assert images.remove([D]) == ([D], A)                    # the last: the previous one
    images.current = A
    assert images.remove([A, "/imgs/x.png"]) == ([A], "")    # none left; an unlisted path is ignored
    assert images.remove([A]) == ([], None)


def test_removing_another_image_keeps_the_current_one() -> None:
    images = ImageList()
    images.add([A, B, C])
    images.current = B
    images.failed[C] = "broken"
    assert images.failed_paths() == [C]
    assert images.remove(images.failed_paths()) == ([C], None) and images.paths == [A, B]


def test_given_up_runs_hold_for_the_same_model_and_not_for_another() -> None:
    images = ImageList()
    images.add([A, B])
    images.give_up(A, "stopped waiting", model="m.py:build")
    assert images.failed == {A: "stopped waiting"} and images.batch_done == 1
    images.forget_failures()                                 # the model loads again...
    images.restore_given_up("m.py:build")
    assert images.failed == {A: "stopped waiting"}           # ...and A is not run again (it would hang again)
    images.give_up(B, "stopped waiting", model="other.pth")  # given up for another model: A's is forgotten
    assert images.given_up == {B: "stopped waiting"}
    images.forget_failures()
    images.restore_given_up("third.pth")
    assert images.failed == {} and images.given_up == {} and images.given_up_model == ""
    images.restore_given_up("other.pth")
    assert images.failed == {}


def test_run_progress_counts_and_estimates_the_seconds_left() -> None:
    now = [100.0]
    images = ImageList(clock=lambda: now[0])
    images.begin_runs()
    done, total, left = images.progress(pending=4)
    assert (done, total) == (0, 4) and math.isnan(left)      # nothing answered yet: no estimate
    now[0] = 106.0
    images.answered()
    images.fail(A, "broken")                                 # a failed run counts as answered
    assert images.counts(pending=2) == (2, 4)
    assert images.progress(pending=2) == (2, 4, 6.0)         # 3 s a run, 2 to go
    now[0] = 112.0
    images.answered()
    images.answered()
    assert images.progress(pending=0) == (4, 4, 0.0)
    assert images.batch_done == 0                            # all answered: the next run of images counts anew


# ---------------------------------------------------------------------------------------------- ModelSlot


def test_a_loaded_answer_replaces_the_model_and_its_state() -> None:
    slot = ModelSlot()
    slot.verification, slot.verify_failure, slot.verify_asked = object(), "old", True
    slot.image_size, slot.pos_grid, slot.pos_embed = (16, 16), (2, 2), object()
    request = Load.make("/m/tiny.pth", "cpu", heads=2, mean=None)
    answer = Loaded(_spec(), "cpu", {"blocks": 10}, library_layout=False, described=(("eps", "guessed"),),
                    capabilities=frozenset({"features"}))
    slot.loaded(request, answer)
    assert slot.spec is answer.spec and slot.device == "cpu" and slot.model_path == "/m/tiny.pth"
    assert slot.load_overrides == {"heads": 2} and slot.model_code == ""            # None is no override
    assert slot.param_counts == {"blocks": 10} and slot.described == {"eps": "guessed"}
    assert slot.capabilities == {"features"} and not slot.library_layout
    assert (slot.verification, slot.verify_failure, slot.verify_asked) == (None, "", False)
    assert slot.image_size is None and (slot.pos_grid, slot.pos_embed, slot.rope) == (None, None, None)
    assert slot.verify_due and not slot.built_by_code and not slot.awaiting_answers   # nobody asks by default
    assert slot.reload_args({"heads": None, "mean": (0.5,)}) == ("/m/tiny.pth", {"mean": (0.5,)})


def test_the_question_is_asked_once_per_model() -> None:
    slot = ModelSlot()
    slot.ask_assumptions = True
    guessed = Loaded(_spec(heads_source="guess: 64 per head"), "cpu", {})
    slot.loaded(Load.make("/m/a.pth"), guessed)
    assert slot.awaiting_answers
    slot.kept.add(slot.model_path)                           # answered: not asked again when it reloads
    slot.loaded(Load.make("/m/a.pth"), guessed)
    assert not slot.awaiting_answers
    slot.loaded(Load.make("/m/b.pth"), Loaded(_spec(), "cpu", {}))    # heads read, a library layout: not asked
    assert not slot.awaiting_answers
    slot.load_overrides = {"heads": 4}
    assert slot.changes_anything({"heads": 2}) and not slot.changes_anything({"heads": 4})
    assert not slot.changes_anything(None) and not slot.changes_anything({})


def test_a_model_built_by_code_reloads_by_its_code() -> None:
    slot = ModelSlot()
    slot.loaded(Load.make(None, code="my_vit.py:build"), Loaded(_spec(), "cpu", {}))
    assert slot.model_path == slot.model_code == "my_vit.py:build" and slot.built_by_code
    assert not slot.runs_own_code and slot.verify_due                 # converted: checked against its code
    assert slot.reload_args({}) == (None, {"code": "my_vit.py:build"})


def test_the_live_path_is_one_rule() -> None:
    live, converted = _spec(family="live"), _spec()
    assert runs_own_code(live) and not runs_own_code(converted) and not runs_own_code(None)
    slot = ModelSlot()
    assert not slot.runs_own_code and not slot.built_by_code and not slot.verify_due   # no model
    slot.loaded(Load.make("/m/net.py"), Loaded(live, "cpu", {}))
    assert slot.runs_own_code and slot.built_by_code and not slot.verify_due   # the original itself: no check
    assert verdict_line(live, checking=True, original=slot.original_name()).text == LIVE_LINE
    # a timm module built by the user's code: verify compares it with timm's own record, whatever the code was
    slot.loaded(Load.make(None, code="my_timm.py:build"), Loaded(live, "cpu", {}, own_original="timm"))
    assert slot.verify_due and slot.checks_against == ("auto", "") and slot.original_name() == "timm"
    assert verdict_line(live, checking=True, original=slot.original_name()).text == "Checking against timm…"
    assert verdict_line(live, failure="no timm", original="timm").text == LIVE_LINE


def test_sizes_round_to_whole_patches_and_say_so() -> None:
    slot = ModelSlot()
    assert slot.whole_patches((30, 33)) == ((30, 33), "") and slot.run_size() is None    # no model: as given
    slot.loaded(Load.make("/m/a.pth"), Loaded(_spec(), "cpu", {}))
    assert slot.run_size() == (32, 32)
    assert slot.whole_patches((40, 48)) == ((40, 48), "")
    assert slot.whole_patches((33, 47)) == ((32, 40), "Input size 33×47 is not a multiple of the 8 px patch; "
                                                      "using 32×40")
    assert slot.whole_patches((4, 20))[1].startswith("Input size 4×20 is smaller than one 8 px patch")
    slot.pending_size = (64, 64)
    assert slot.take_pending_size() == (64, 64) and slot.take_pending_size() is None
    slot.position(PosEmbedded((5, 6), None))
    assert slot.pos_grid == (5, 6)
    slot.forget_position()
    assert slot.pos_grid is None


# ---------------------------------------------------------------------------------------------- the session


def test_the_sessions_parts_are_its_surface(session) -> None:  # noqa: ANN001
    """The parts' fields are read where they are defined (`session.model.spec`, `session.image_list.paths`): the
    session forwards none of them, and only `set_current` changes the current image (it also shows it)."""
    assert isinstance(session.model, ModelSlot) and isinstance(session.image_list, ImageList)
    for name in ("spec", "device", "image_size", "pos_grid", "ask_assumptions", "images", "paths", "failed",
                 "current", "verification", "current_maps"):
        assert not hasattr(session, name), name
    session.model.image_size = (16, 24)
    assert session.model.image_size == (16, 24)
    session.set_current(A)                     # no model: nothing runs, the image is shown
    assert session.image_list.current == A


MODEL_SIGNALS = ("model_loaded", "loading_changed", "device_changed", "assumptions_asked", "verification_changed",
                 "size_changed", "pos_embed_ready")
IMAGE_SIGNALS = ("images_added", "images_removed", "current_changed", "run_started", "result_ready", "run_failed",
                 "run_progress")
SESSION_SIGNALS = ("error", "note", "status", "busy_changed", "progress", "stuck", "devices_found", "catalog_ready",
                   "catalog_failed")


def test_each_signal_has_one_owner() -> None:
    """A signal about the model is the model part's, one about the images the image list's; the session keeps only
    its own (the worker's state, errors, notes, devices, the catalog): one name per thing, no forwarding."""
    for owner, names in ((ModelSlot, MODEL_SIGNALS), (ImageList, IMAGE_SIGNALS), (Session, SESSION_SIGNALS)):
        for name in names:
            assert isinstance(getattr(owner, name), Signal), (owner.__name__, name)
            for other in {ModelSlot, ImageList, Session} - {owner}:
                assert not isinstance(getattr(other, name, None), Signal), (other.__name__, name)
    mine = {name for name, value in vars(Session).items() if isinstance(value, Signal)}
    assert mine == set(SESSION_SIGNALS)                      # none left behind as a forwarding alias


def test_the_parts_say_their_own_changes() -> None:
    """Without a session or an application: adding images says which were new, a load on its way says so, a
    position embedding answered says it is ready."""
    images, slot, heard = ImageList(), ModelSlot(), []
    images.images_added.connect(lambda paths: heard.append(("added", paths)))
    slot.loading_changed.connect(lambda on: heard.append(("loading", on)))
    slot.pos_embed_ready.connect(lambda: heard.append(("pos", slot.pos_grid)))
    images.add([A, B])
    images.add([A])                                          # nothing new: nothing said
    slot.set_loading("/m/tiny.pth")
    assert slot.loading == "/m/tiny.pth"
    slot.set_loading("")
    slot.position(PosEmbedded((3, 4), None))
    assert heard == [("added", [A, B]), ("loading", True), ("loading", False), ("pos", (3, 4))]


def test_the_image_list_keeps_what_the_current_image_shows() -> None:
    """`current_maps` is what `current_changed` last said, already when any other slot hears it: a panel built
    from the image list alone reads the current result there, from its one owner."""
    images, seen = ImageList(), []
    assert images.current_maps is None
    images.current_changed.connect(lambda maps: seen.append(images.current_maps is maps))
    shown = object()
    images.current_changed.emit(shown)
    assert images.current_maps is shown
    images.current_changed.emit(None)
    assert images.current_maps is None and seen == [True, True]


def test_the_session_emits_through_its_parts(session) -> None:  # noqa: ANN001
    """The session's intents reach the panels through its parts' signals: adding, showing and removing images."""
    heard: list[tuple[str, object]] = []
    parts = session.image_list
    parts.images_added.connect(lambda paths: heard.append(("added", paths)))
    parts.current_changed.connect(lambda maps: heard.append(("current", maps)))
    parts.images_removed.connect(lambda paths: heard.append(("removed", paths)))
    session.add_images([A, B])                  # no model: nothing runs
    session.remove_images([A])
    assert heard == [("added", [A, B]), ("current", None), ("removed", [A]), ("current", None)]
    assert parts.current == B


# ---------------------------------------------------------------------------------------------- the query scale


def test_the_query_map_is_drawn_on_its_own_scale_until_left() -> None:
    state, notes = ViewState(), []
    rule = QueryScaleRule(state, note=notes.append)
    state.subscribe(rule)
    seen: list[tuple[str, bool]] = []
    state.subscribe(lambda _changed: seen.append((state.source, state.normalize)))   # a panel, after the rule
    state.update(source="token", query=3)
    assert state.normalize and notes == [QUERY_SCALE_NOTE]
    assert seen and all(normalized for _source, normalized in seen)   # the panel never draws it on the shared scale
    state.update(source="cls")
    assert not state.normalize and notes == [QUERY_SCALE_NOTE]
    state.update(source="query")                                    # a windowed model's query map too
    assert state.normalize and len(notes) == 2
    state.update(source="received")
    assert not state.normalize


def test_the_users_own_scale_choice_is_kept() -> None:
    state, notes = ViewState(), []
    state.subscribe(QueryScaleRule(state, note=notes.append))
    state.update(source="token")
    state.update(normalize=False)                  # the user wants the shared scale on the query map...
    state.update(source="token", query=5)
    assert not state.normalize and len(notes) == 1
    state.update(source="mean")
    assert not state.normalize
    state.update(source="token")                   # entering again: on again
    assert state.normalize and len(notes) == 2
    state.update(normalize=False)
    state.update(normalize=True)                   # ...or ticks it again himself: leaving keeps it
    state.update(source="cls")
    assert state.normalize
    state.update(source="token")                   # already on: nothing to do, nothing said
    assert state.normalize and len(notes) == 2


@pytest.mark.parametrize("source", ["mean", "rollout"])
def test_other_maps_are_left_alone(source: str) -> None:
    state, notes = ViewState(), []
    state.subscribe(QueryScaleRule(state, note=notes.append))
    state.update(source=source)
    assert not state.normalize and notes == []


# ------------------------------------------------------------------------------------------- FeatureAnalyses

def test_analyses_answer_for_the_size_shown_and_fail_to_the_panel_and_the_user(session, qtbot) -> None:  # noqa: ANN001
    """The Features dock's analyses are a part routed by `Session.route`: an answer for the input size shown reaches
    its signal, one for another size is dropped, a failure says so to the panel and shows the error."""
    from vitviz.gui.protocol import Pca, Share, Similarity

    got: list[tuple[str, object]] = []
    parts = session.analyses
    parts.pca_ready.connect(lambda a: got.append(("pca", a)))
    parts.share_ready.connect(lambda a: got.append(("share", a)))
    parts.analysis_failed.connect(lambda kind, summary: got.append(("failed", (kind, summary))))
    session.error.connect(lambda title, summary, details: got.append(("error", (title, summary))))
    session.model.image_size = None
    session._on_answered(Pca(image_size=None), "fit")
    session._on_answered(Pca(image_size=(64, 64)), "stale fit")           # asked at a size no longer shown
    session._on_answered(Share(image_size=None), "shares")
    session._on_failed(Similarity(image_size=None), "out of memory", "details")
    assert got == [("pca", "fit"), ("share", "shares"), ("failed", (Similarity, "out of memory")),
                   ("error", (Similarity.title, "out of memory"))]
    # nothing cached: nothing to analyse, nothing asked of the worker
    assert not parts.fit_pca(["/no/such.png"], 0) and not parts.compare_patches("/no/such.png", "", 0)
    assert not parts.measure_share("/no/such.png", 0, 1.0) and not session.client.pending(Pca)
