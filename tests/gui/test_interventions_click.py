"""What an ablate click does between the worker's answer and the painted window (`vitviz.gui.interventions`): the
redraws it held run with the answer, the intervened run arrives with only what the panels on show draw (the rest
is made in the worker after the answer is painted), the other images are asked for after that paint, and a title
of the same size lays its plot out no more."""
from __future__ import annotations

import numpy as np
from PySide6.QtCore import QEvent, QObject

from _gui import show_dock, wait_idle


def _on_answer(window, look) -> list:  # noqa: ANN001
    """Call `look(maps)` right after the window has handled the current image's intervened answer (a slot connected
    after the session's, so in the same emission: nothing else has run in between); returns what it gave."""
    from vitviz.gui.interventions import Intervene

    seen: list = []
    s = window.session

    def answered(request, answer) -> None:  # noqa: ANN001
        if request.kind is Intervene and request.maps and request.image == s.image_list.current:
            seen.append(look(answer.maps))

    s.client.answered.connect(answered)
    return seen


def test_the_redraws_the_click_held_run_with_its_answer(qtbot, loaded) -> None:  # noqa: ANN001
    """The Interventions dock's table, the banner and the image list are redrawn when the answer is handled, not a
    turn later (the window paints them with the panels, once)."""
    from vitviz.gui.panels.base import redraws_pending

    window = loaded
    iv = window.interventions
    panel = window.dock("interventionsDock").widget()
    seen = _on_answer(window, lambda maps: (redraws_pending(), window.session.image_list.current_maps is maps,
                                            [panel.table.item(r, 2).text() for r in range(panel.table.rowCount())],
                                            window.intervention_banner.label.toolTip()))
    iv.toggle(0, 1)
    wait_idle(qtbot, window)
    qtbot.waitUntil(lambda: bool(seen), timeout=20000)
    pending, shown, intervened, banner = seen[0]
    assert shown and not pending
    assert intervened and all(text for text in intervened)           # the intervened column is filled
    assert "every panel shows this run" in banner


def test_hidden_panels_maps_are_made_after_the_answer(qtbot, loaded) -> None:  # noqa: ANN001
    """With the head statistics' and the rollout's docks hidden, the answer brings the map on show only; the head
    statistics and the rollout stack are made in the worker after it (`Finish`), before a panel asks."""
    from vitviz.core.analyses.maps import MapKind
    from vitviz.gui.interventions import IntervenedMaps

    window = loaded
    assert not window.headstats.is_shown() and not window.rollout_panel.is_shown()
    seen = _on_answer(window, lambda maps: (maps._stats is not None, set(maps._stacks)))
    window.interventions.toggle(0, 1)
    qtbot.waitUntil(lambda: bool(seen), timeout=20000)
    stats, stacks = seen[0]
    assert not stats and MapKind("rollout") not in stacks and MapKind("cls") in stacks
    maps = window.session.image_list.current_maps
    assert isinstance(maps, IntervenedMaps)
    qtbot.waitUntil(lambda: maps.prepared, timeout=20000)     # asked for once the answer is painted
    wait_idle(qtbot, window)
    assert maps._stats is not None and MapKind("rollout") in maps._stacks


def test_shown_head_statistics_come_with_the_answer(qtbot, loaded) -> None:  # noqa: ANN001
    """The head statistics' panel on show: the worker makes them with the intervened run, not the GUI thread."""
    window = loaded
    show_dock(qtbot, window, "headStatsDock")
    assert window.headstats.is_shown()
    seen = _on_answer(window, lambda maps: maps._stats is not None)
    window.interventions.toggle(1, 0)
    qtbot.waitUntil(lambda: bool(seen), timeout=20000)
    assert seen[0]


class _Order(QObject):
    """Records, in order, the paints of a widget and the other images' intervened runs asked for."""

    def __init__(self, widget, client) -> None:  # noqa: ANN001
        super().__init__()
        self.events: list[str] = []
        self.widget = widget
        widget.installEventFilter(self)
        submit = client.submit

        def recording(kind, *args, **fields):  # noqa: ANN001, ANN002, ANN003, ANN202
            if not fields.get("maps", True):
                self.events.append("other")
            return submit(kind, *args, **fields)

        client.submit = recording

    def eventFilter(self, watched, event) -> bool:  # noqa: ANN001, N802 - Qt override
        if watched is self.widget and event.type() == QEvent.Type.Paint:
            self.events.append("paint")
        return False


def test_the_other_images_are_asked_after_the_answer_is_painted(qtbot, loaded) -> None:  # noqa: ANN001
    """The other images' runs (for the list's top-5) are asked for once the overview showing the answer has been
    painted: their forwards never share the CPU and Python's lock with that paint."""
    window = loaded
    order = _Order(window.overview.widget.viewport(), window.session.client)
    seen = _on_answer(window, lambda maps: len(order.events))
    window.interventions.toggle(0, 1)
    qtbot.waitUntil(lambda: bool(seen) and "other" in order.events, timeout=20000)
    after = order.events[seen[0]:]       # what happened once the answer was handled
    assert "paint" in after and after.index("paint") < after.index("other"), after
    wait_idle(qtbot, window)


def test_a_title_of_the_same_size_lays_nothing_out(qtbot) -> None:  # noqa: ANN001
    """A new title as tall as the last (an intervened run's) leaves the plot's layout alone -- laid out anew, the
    plot was painted twice per click -- and a taller one lays it out."""
    import pyqtgraph as pg

    from vitviz.gui.panels.base import TitleLabel

    widget = pg.GraphicsLayoutWidget()
    qtbot.addWidget(widget)
    widget.resize(320, 200)
    label = TitleLabel("ablated L0.H1 · CLS attention", lines=2, size="10pt")
    widget.addItem(label)
    widget.show()
    qtbot.waitExposed(widget)
    layout = widget.ci.layout
    qtbot.waitUntil(layout.isActivated, timeout=5000)
    label.setText("ablated L0.H2 · CLS attention")
    assert layout.isActivated() and label.text == "ablated L0.H2 · CLS attention"
    label.setText(" · ".join(["ablated L0.H1, L0.H2, L1.H0 (mean over 3 images)"] * 4))
    assert not layout.isActivated()


def test_the_click_run_is_said_by_its_banner_not_the_status_bar(qtbot, loaded, monkeypatch) -> None:  # noqa: ANN001
    """Up to its answer, an ablate click's run lays out and paints no status line or busy bar (the banner and the
    dock say it runs). Its quiet time is set far beyond the run, so a loaded machine's slow run cannot pass it:
    what is checked is that the click's request is quiet, not how fast the machine is."""
    from vitviz.gui import client as client_mod

    monkeypatch.setattr(client_mod, "QUIET_MS", 600_000)
    window = loaded
    said: list = []
    window.session.busy_changed.connect(lambda busy: said.append(busy))
    window.session.status.connect(lambda text: said.append(text))
    seen = _on_answer(window, lambda maps: list(said))
    window.interventions.toggle(0, 1)
    qtbot.waitUntil(lambda: bool(seen), timeout=20000)
    assert seen[0] == []
    wait_idle(qtbot, window)


def test_the_click_runs_the_clean_runs_input_again(qtbot, loaded, tiny_ckpt, monkeypatch) -> None:  # noqa: ANN001
    """The worker runs the click from the clean result's input (`ImageModel.prepare` of a result): the image file is
    not decoded and resized again, and the run is the library's run of the file."""
    import vitviz
    from _gui import HEADS
    from vitviz.core.running import images
    from vitviz.core.running.interventions import Ablate

    window = loaded
    decoded: list = []
    load = images.load_image
    monkeypatch.setattr(images, "load_image", lambda *a, **k: (decoded.append(a[0]), load(*a, **k))[1])
    seen = _on_answer(window, lambda maps: (list(decoded), maps.result))
    window.interventions.toggle(1, 1)
    qtbot.waitUntil(lambda: bool(seen), timeout=20000)
    read, result = seen[0]
    assert read == []
    s = window.session
    want = vitviz.load(tiny_ckpt, heads=HEADS).run(s.image_list.current, intervene=Ablate([(1, 1)]))
    np.testing.assert_allclose(result.attentions, want.attentions, atol=1e-6)
    assert result.source == s.image_list.current
    wait_idle(qtbot, window)


class _Events(QObject):
    """The receivers of every event of one type, in order, while installed (on the application: every widget's;
    on a widget: its own)."""

    def __init__(self, kind: QEvent.Type) -> None:
        super().__init__()
        self.kind = kind
        self.seen: list = []

    def eventFilter(self, obj, event) -> bool:  # noqa: ANN001, N802 - Qt override
        if event.type() == self.kind:
            self.seen.append(obj)
        return False


def _click_counting_layouts(qtbot, window, layer: int, head: int) -> list:  # noqa: ANN001
    """The widgets laid out while an ablate click of (layer, head) is run and its answer drawn."""
    from PySide6.QtWidgets import QApplication

    from vitviz.gui.panels.base import redraws_pending

    iv, app = window.interventions, QApplication.instance()
    counter = _Events(QEvent.Type.LayoutRequest)
    app.installEventFilter(counter)
    try:
        iv.toggle(layer, head)
        qtbot.waitUntil(lambda: iv.current() is not None and window.session.image_list.current_maps is
                        iv.current().maps and not redraws_pending(), timeout=20000)
        for _ in range(3):                 # and the layout requests those layouts post
            app.sendPostedEvents(None, 0)
    finally:
        app.removeEventFilter(counter)
    return counter.seen


def test_a_click_lays_out_no_toolbar_once_the_banner_has_room(qtbot, loaded) -> None:  # noqa: ANN001
    """The banner keeps its room in the toolbar: after the first, a click (the banner shown again, retitled) lays
    the toolbar out no more, and Back to clean hides the banner without laying it out either."""
    window = loaded
    iv, banner = window.interventions, window.intervention_banner
    toolbar = window.menus.toolbar
    _click_counting_layouts(qtbot, window, 0, 1)
    assert banner.isVisible()
    iv.clear_heads()
    qtbot.waitUntil(lambda: not banner.isVisible(), timeout=5000)
    wait_idle(qtbot, window)
    seen = _click_counting_layouts(qtbot, window, 1, 0)
    assert banner.isVisible() and "every panel shows this run" in banner.label.toolTip()
    assert toolbar not in seen, "the toolbar was laid out by the click"
    assert banner.geometry().width() >= banner.sizeHint().width()      # the banner is drawn whole in its room
    wait_idle(qtbot, window)


def test_a_click_lays_out_nothing_in_the_hidden_rollout_panel(qtbot, loaded) -> None:  # noqa: ANN001
    """The rollout panel hidden (a tab behind another), a click's new maps (same model) neither lay out its
    controls nor fill its query list again."""
    window = loaded
    panel = window.rollout_panel
    assert not panel.is_shown()
    removed: list = []
    panel.query_combo.model().rowsRemoved.connect(lambda *args: removed.append(args))
    seen = _click_counting_layouts(qtbot, window, 0, 1)
    assert not [w for w in seen if w is panel or panel.isAncestorOf(w)]
    assert removed == []
    assert panel.query_combo.count() >= 1 and panel.start_spin.maximum() == window.session.model.spec.depth - 1
    wait_idle(qtbot, window)


def test_a_click_measures_no_column_of_the_interventions_table(qtbot, loaded) -> None:  # noqa: ANN001
    """The numbers' columns are as wide as their widest value from the start: a click, which fills them, resizes
    no column (the table was measured and laid out on every click); the class names are measured when they
    change."""
    window = loaded
    iv = window.interventions
    _click_counting_layouts(qtbot, window, 0, 1)         # shows the dock
    iv.clear_heads()
    panel = window.dock("interventionsDock").widget()
    qtbot.waitUntil(lambda: panel.isVisible() and panel.table.item(0, 3).text() == "", timeout=5000)
    wait_idle(qtbot, window)
    header = panel.table.horizontalHeader()
    resized: list = []
    header.sectionResized.connect(lambda *args: resized.append(args))
    _click_counting_layouts(qtbot, window, 1, 0)
    assert panel.table.item(0, 3).text().startswith(("+", "-"))
    assert resized == []
    metrics = panel.table.fontMetrics()
    for j in range(1, 4):                   # each value fits its column
        widest = max(metrics.horizontalAdvance(panel.table.item(i, j).text()) for i in range(panel.table.rowCount()))
        assert header.sectionSize(j) > widest
    assert header.sectionSize(0) > metrics.horizontalAdvance(panel.table.item(0, 0).text())
    wait_idle(qtbot, window)


def test_a_new_heads_line_lays_out_no_dock(qtbot, loaded) -> None:  # noqa: ANN001
    """The Interventions dock's line of what is done, retitled by a click, lays out neither its panel nor the dock
    (nor, through them, the main window: it was on every click) while it takes as many lines; a longer text grows
    its room, and the label is shown whole."""
    window = loaded
    iv = window.interventions
    _click_counting_layouts(qtbot, window, 0, 1)         # shows the dock
    iv.clear_heads()
    dock = window.dock("interventionsDock")
    panel = dock.widget()
    label = panel.heads_label
    qtbot.waitUntil(lambda: label.text().startswith("Clean run"), timeout=5000)
    wait_idle(qtbot, window)
    seen = _click_counting_layouts(qtbot, window, 1, 0)
    assert label.text().startswith("Intervened: ablated L1.H0")
    assert not [w for w in seen if w in (dock, panel)], seen       # (the main window is laid out through them)
    assert label.isVisible() and label.height() >= label.heightForWidth(label.width())
    wait_idle(qtbot, window)          # the other images' answers refresh the line no more
    room = label.parentWidget()
    before = room.minimumHeight()
    label.setText(" · ".join(["ablated L0.H1, L0.H2, L1.H0 (mean over 3 images)"] * 6))
    qtbot.waitUntil(lambda: room.minimumHeight() > before, timeout=5000)
    qtbot.waitUntil(lambda: label.height() >= label.heightForWidth(label.width()) > 0, timeout=5000)


def _axis_drawings(monkeypatch) -> list:  # noqa: ANN001
    """Every axis picture pyqtgraph draws anew from now on (its ticks' labels laid out again), as the axes."""
    from pyqtgraph import AxisItem

    drawn: list = []
    specs = AxisItem.generateDrawSpecs
    monkeypatch.setattr(AxisItem, "generateDrawSpecs", lambda self, p: drawn.append(self) or specs(self, p))
    return drawn


def test_a_click_draws_no_overview_axis_again(qtbot, loaded, monkeypatch) -> None:  # noqa: ANN001
    """The same tiles' layout, an intervened run of the image: only the mosaic's pixels change. The overview's
    axes (their ticks and labels laid out: 0.3-0.5 ms each) are drawn anew neither by the click nor by Back to
    clean (`showAxis` on a shown axis threw its picture away; the run's title prefix read as a new column name
    laid the ticks out again)."""
    window = loaded
    iv = window.interventions
    overview = show_dock(qtbot, window, "overviewDock")
    qtbot.waitUntil(lambda: overview._shape[0] > 0, timeout=5000)
    axes = [overview.plot.getAxis(side) for side in ("left", "bottom")]
    drawn = _axis_drawings(monkeypatch)
    for i, (layer, head) in enumerate(((0, 1), (1, 0), (1, 1))):
        if i == 1:
            drawn.clear()          # the first click shows the Interventions dock: the overview resized
        _click_counting_layouts(qtbot, window, layer, head)
        overview.widget.viewport().repaint()
        iv.clear_heads()
        qtbot.waitUntil(lambda: window.session.image_list.current_maps is window.session.cached(
            window.session.image_list.current), timeout=5000)
        wait_idle(qtbot, window)
        overview.widget.viewport().repaint()
    assert not [a for a in drawn if a in axes]
    assert all(a.isVisible() for a in axes)


def test_an_intervened_whole_model_map_keeps_its_column_name(qtbot, loaded) -> None:  # noqa: ANN001
    """A one-column stack (rollout) of an intervened run: its column is named after the map, not after what was
    done ('ablated L0.H1', the start of every intervened title)."""
    from vitviz.gui.panels.overview import column_name

    window = loaded
    overview = show_dock(qtbot, window, "overviewDock")
    window.state.update(source="rollout", layer=0)
    clean = list(overview._columns)
    assert clean[0][1].startswith("rollout of cls")
    _click_counting_layouts(qtbot, window, 0, 1)
    maps = window.session.image_list.current_maps
    assert maps.stack("rollout").title.startswith("ablated L0.H1 · rollout of cls")
    assert overview._columns == clean
    assert column_name("ablated L0.H1 · rollout of cls (mean)", "ablated L0.H1") == "rollout of cls"
    wait_idle(qtbot, window)


def test_the_overview_paints_once_per_click_with_its_frames(qtbot, loaded, monkeypatch) -> None:  # noqa: ANN001
    """The ablated head's amber frame is drawn with the intervened tiles, in one paint of the Overview (it was
    drawn a round before the answer, and the Overview painted twice per click); Back to clean takes the frames
    away with the clean tiles, at the next turn."""
    from PySide6.QtWidgets import QApplication

    from vitviz.gui.panels.base import relay

    window = loaded
    iv = window.interventions
    monkeypatch.setattr(relay(), "HOLD_MS", 1e9)     # the hold outlasts the run however loaded the machine
    overview = show_dock(qtbot, window, "overviewDock")
    qtbot.waitUntil(lambda: overview._shape[0] > 0, timeout=5000)
    _click_counting_layouts(qtbot, window, 0, 1)       # the first shows the Interventions dock
    iv.clear_heads()
    wait_idle(qtbot, window)
    for _ in range(3):
        QApplication.processEvents()
    framed = _on_answer(window, lambda maps: len(overview.marked()))
    paints = _Events(QEvent.Type.Paint)
    overview.widget.viewport().installEventFilter(paints)
    try:
        _click_counting_layouts(qtbot, window, 1, 0)
        QApplication.sendPostedEvents(None, 0)
    finally:
        overview.widget.viewport().removeEventFilter(paints)
    assert len(overview.marked()) == 1 and overview.marked()[0].isVisible()
    assert len(paints.seen) == 1, f"the Overview painted {len(paints.seen)} times for one click"
    assert framed and framed[0] == 1        # set as the answer was handled, before the paint
    iv.clear_heads()
    QApplication.processEvents()
    assert not overview.marked()
    wait_idle(qtbot, window)
