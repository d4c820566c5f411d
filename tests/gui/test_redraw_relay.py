"""The redraw relay (`vitviz.gui.panels.base.RedrawRelay`): redraws asked for in one event-loop turn run once, at
the next turn, after a held forward; the interventions' panels use it (an ablate click emits `changed` several
times), and the image list re-makes only the texts whose runs changed. Counted, never timed."""
from __future__ import annotations

from _gui import wait_idle


def test_many_asks_in_one_turn_run_once_at_the_next(qtbot) -> None:  # noqa: ANN001
    from vitviz.gui.panels.base import RedrawRelay

    relay, calls = RedrawRelay(), []

    def redraw() -> None:
        calls.append(1)

    for _ in range(5):
        relay.later(redraw)
    assert calls == [] and relay.pending()          # nothing draws inside the turn that asked
    qtbot.waitUntil(lambda: not relay.pending())
    assert calls == [1]
    relay.later(redraw)
    relay.flush()                                    # flush: now, once
    assert calls == [1, 1] and not relay.pending()


def test_a_hold_makes_the_redraws_wait_for_the_forward(qtbot, monkeypatch) -> None:  # noqa: ANN001
    from PySide6.QtCore import QCoreApplication

    from vitviz.gui.panels.base import RedrawRelay

    relay, calls, busy = RedrawRelay(), [], [True]
    monkeypatch.setattr(relay, "HOLD_MS", 1e9)       # no time limit: the hold alone decides
    relay.hold_while(lambda: busy[0])
    relay.later(lambda: calls.append(1))
    for _ in range(20):
        QCoreApplication.processEvents()
    assert calls == [] and relay.pending()
    busy[0] = False                                  # the forward answered
    qtbot.waitUntil(lambda: not relay.pending())
    assert calls == [1]


def test_changed_many_times_in_one_turn_refreshes_the_interventions_panel_once(qtbot, loaded,
                                                                               monkeypatch) -> None:  # noqa: ANN001
    from vitviz.gui.panels.base import redraws_pending

    window = loaded
    iv = window.interventions
    dock = window.dock("interventionsDock")
    dock.show()
    panel = dock.widget()
    qtbot.waitUntil(lambda: panel.isVisible() and not redraws_pending())
    counts = {"panel": 0, "banner": 0, "list": 0}
    for name, obj, method in (("panel", panel, "refresh"), ("banner", window.intervention_banner, "refresh"),
                              ("list", window.images, "show_intervened")):
        original = getattr(obj, method)
        monkeypatch.setattr(obj, method, lambda *a, n=name, f=original: (counts.__setitem__(n, counts[n] + 1),
                                                                         f(*a))[1])
    for _ in range(5):
        iv.changed.emit()
    window.session.image_list.current_changed.emit(window.session.image_list.current_maps)
    assert counts == {"panel": 0, "banner": 0, "list": 0}
    qtbot.waitUntil(lambda: not redraws_pending())
    assert counts == {"panel": 1, "banner": 1, "list": 1}


def test_the_image_list_remakes_only_the_texts_whose_runs_changed(qtbot, loaded, images,
                                                                 monkeypatch) -> None:  # noqa: ANN001
    from vitviz.gui.panels.base import redraws_pending

    window = loaded
    iv, listed = window.interventions, window.images
    iv.toggle(0, 1)
    wait_idle(qtbot, window)
    qtbot.waitUntil(lambda: all(iv.probabilities(str(p)) is not None for p in images) and not redraws_pending(),
                    timeout=20000)
    assert all("→" in listed.top_text(str(p)) for p in images)
    made = []
    original = listed.set_predictions
    monkeypatch.setattr(listed, "set_predictions", lambda path, *a: (made.append(path), original(path, *a))[1])
    listed.show_intervened()
    assert made == []                                # nothing changed: no text made again
    del iv.answers[str(images[1])]                   # one image's run is gone (as after new steps)
    listed.show_intervened()
    assert made == [str(images[1])] and "→" not in listed.top_text(str(images[1]))
    iv.clear_heads()
    wait_idle(qtbot, window)


def test_the_matrix_sets_its_colorbar_and_placement_again_only_when_they_change(qtbot, loaded,
                                                                              monkeypatch) -> None:  # noqa: ANN001
    from _gui import show_dock

    window = loaded
    panel = show_dock(qtbot, window, "matrixDock")
    window.state.update(layer=0, head=0)
    assert panel.matrix is not None
    maps, sets = [], []
    original_map, original_rect = panel.colorbar.setColorMap, panel.image_item.setRect
    monkeypatch.setattr(panel.colorbar, "setColorMap", lambda cmap: (maps.append(cmap), original_map(cmap))[1])
    monkeypatch.setattr(panel.image_item, "setRect", lambda rect: (sets.append(rect), original_rect(rect))[1])
    window.state.update(head=1)
    window.state.update(layer=1)
    assert maps == [] and sets == []                 # a new picture of the same model: only it and its levels
    assert panel.title.text.startswith("layer 1 · head 1")
    window.state.update(colormap="magma")
    assert len(maps) == 1 and sets == []
    window.state.update(matrix_log=True)
    assert len(maps) == 2 and "log10" in panel.colorbar.axis.labelText


def test_a_hold_does_not_keep_its_owner_alive(qtbot) -> None:  # noqa: ANN001
    """The relay lives as long as the application: a hold kept strongly kept a closed window's interventions, its
    session and its worker thread alive (tests/gui/test_worker_shutdown.py saw the thread never destroyed)."""
    import gc
    import weakref

    from PySide6.QtCore import QObject

    from vitviz.gui.panels.base import relay

    class Busy(QObject):
        def running(self) -> bool:
            return True

    owner = Busy()
    relay().hold_while(owner.running)
    gone = weakref.ref(owner)
    del owner
    gc.collect()
    assert gone() is None
    relay().later(lambda: None)
    relay().flush()
    assert not relay().pending()


def test_the_other_images_run_after_the_clicks_answer_is_drawn(qtbot, loaded, monkeypatch) -> None:  # noqa: ANN001
    """The click's forward is asked for first; the Overview's marks of it are made with its answer (held by the
    relay, painted once with the tiles they frame); the other images' runs (the list's top-5) only once the current
    image's answer is in the panels and the relay's redraws have run: their forwards do not share the CPU (and
    Python's lock) with the window drawing the answer. Counted in order, never timed."""
    from vitviz.gui.interventions import Intervene
    from vitviz.gui.panels.base import relay

    window = loaded
    iv, s = window.interventions, window.session
    current = s.image_list.current
    events: list[tuple] = []
    submit, mark, flush = s.client.submit, window.overview.mark, relay().flush
    monkeypatch.setattr(relay(), "HOLD_MS", 1e9)      # the hold outlasts the run however loaded the machine

    def counted(kind, *args, **kw):  # noqa: ANN001, ANN002, ANN003, ANN202
        if kind is Intervene:
            events.append(("run", kw["image"] == current, kw.get("maps", True)))
        return submit(kind, *args, **kw)

    monkeypatch.setattr(s.client, "submit", counted)
    monkeypatch.setattr(window.overview, "mark", lambda *a, **kw: (events.append(("mark",)), mark(*a, **kw))[1])
    monkeypatch.setattr(relay(), "flush", lambda: (flush(), events.append(("flush",)))[0])
    s.image_list.current_changed.connect(
        lambda maps: events.append(("shown", iv.current() is not None and maps is iv.current().maps)))
    iv.toggle(0, 1)
    qtbot.waitUntil(lambda: all(iv.probabilities(p) is not None for p in s.image_list.paths), timeout=20000)
    runs = [i for i, e in enumerate(events) if e[0] == "run"]
    assert events[runs[0]] == ("run", True, True)
    others = [i for i in runs if events[i] == ("run", False, False)]
    assert len(others) == len(s.image_list.paths) - 1
    shown = events.index(("shown", True))
    drawn = next(i for i, e in enumerate(events) if e == ("flush",) and i > shown)
    assert runs[0] < shown < events.index(("mark",)) < drawn < others[0], events
