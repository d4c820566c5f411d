"""Nothing clipped at the default layout (1600 × 1000 and 1280 × 800 screens): every panel's titles and labels fit
their widgets, the graphics of a panel fit its view, dock tabs are not elided and name their panel in a tooltip,
switching tabs never resizes the docks, and the matrix's axis labels never run into each other."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pyqtgraph as pg
import pytest
from _gui import HEADS, SCREENS, open_at, settle, show_dock, wait_idle
from _plot_text import plot_text_problems
from _tiny import write_tiny_checkpoint
from PySide6.QtCore import QPoint, QRect, QRectF
from PySide6.QtGui import QFontMetricsF
from PySide6.QtWidgets import QApplication, QLabel, QTabBar, QWidget

from vitviz.gui.panels.matrix import MatrixPanel
from vitviz.gui.window import DOCKS, default_size

TABBED = ["overviewDock", "matrixDock", "rolloutDock", "posEmbedDock", "headStatsDock", "featuresDock"]
WIDE_HEADS = 12


@pytest.fixture(scope="module")
def wide_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """DINOv2-with-registers-shaped (cls + reg0-3, a 16 × 16 grid, 12 layers × 12 heads) but tiny: the shapes that
    made the panels clip."""
    return write_tiny_checkpoint(tmp_path_factory.mktemp("wide") / "wide_reg4.pth", embed_dim=48, depth=12,
                                 patch=4, grid=(16, 16), reg_tokens=4)


def _loaded_at(qtbot, window, screen: tuple[int, int], ckpt: Path, images: list[Path]) -> None:  # noqa: ANN001
    window.use_size(default_size(QRect(0, 0, *screen)))
    qtbot.waitUntil(lambda: window.width() == default_size(QRect(0, 0, *screen)).width(), timeout=5000)
    with qtbot.waitSignal(window.session.model.model_loaded, timeout=30000):
        window.load_model(str(ckpt), heads=WIDE_HEADS)
    window.session.add_images([str(p) for p in images])
    qtbot.waitUntil(window.is_idle, timeout=60000)
    window.select_query(window.session.model.spec.num_prefix + 5)       # the longest titles: a query token's


def clipped_graphics(widget: pg.GraphicsLayoutWidget) -> list[str]:
    """What of a pyqtgraph layout widget lies outside its viewport: the layout itself, and any label whose text is
    wider than the room it was given."""
    view = QRectF(widget.viewport().rect()).adjusted(-1, -1, 1, 1)
    problems = []
    layout = widget.ci.mapRectToScene(widget.ci.boundingRect())
    if not view.contains(widget.mapFromScene(layout).boundingRect()):
        problems.append(f"layout {layout} outside the view {view}")
    for item in widget.scene().items():
        if isinstance(item, pg.LabelItem) and item.isVisible() and item.text:
            text = item.item.mapRectToScene(item.item.boundingRect())
            if text.width() > item.sceneBoundingRect().width() + 1:
                problems.append(f"label {item.text!r}: text {text.width():.0f} px wide in "
                                f"{item.sceneBoundingRect().width():.0f} px")
            if not view.contains(widget.mapFromScene(text).boundingRect()):
                problems.append(f"label {item.text!r} outside the view")
    return problems


def clipped_labels(panel: QWidget) -> list[str]:
    """Plain (not wrapping) labels of a panel whose text is wider than the label."""
    out = []
    for label in panel.findChildren(QLabel):
        if label.isVisible() and not label.wordWrap() and label.text() and "<" not in label.text():
            width = QFontMetricsF(label.font()).horizontalAdvance(label.text())
            if width > label.contentsRect().width() + 1:
                out.append(f"{label.text()!r}: {width:.0f} px in {label.contentsRect().width()} px")
    return out


@pytest.mark.parametrize("screen", SCREENS)
def test_every_panel_fits_at_the_default_size(qtbot, window, wide_ckpt, images, screen) -> None:  # noqa: ANN001
    _loaded_at(qtbot, window, SCREENS[screen], wide_ckpt, images[:2])
    problems = []
    for name in TABBED + ["infoDock", "imagesDock"]:
        panel = show_dock(qtbot, window, name)
        settle()
        for widget in [panel, *panel.findChildren(QWidget)]:
            if isinstance(widget, pg.GraphicsLayoutWidget) and widget.isVisible():
                problems += [f"{name}: {p}" for p in clipped_graphics(widget)]
        problems += [f"{name}: {p}" for p in clipped_labels(panel)]
    problems += [f"image panel: {p}" for p in clipped_graphics(window.panel.view_widget)]
    problems += [f"controls: {p}" for p in clipped_labels(window.controls)]
    summary = window.controls.model_label
    assert summary.height() >= summary.heightForWidth(summary.width()), "the model summary is cut off"
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("screen", SCREENS)
def test_dock_tabs_are_whole_and_name_their_panel(qtbot, window, screen) -> None:  # noqa: ANN001
    window.use_size(default_size(QRect(0, 0, *SCREENS[screen])))
    settle()
    window.update_tab_tips()
    bars = [bar for bar in window.findChildren(QTabBar) if bar.parent() is window and bar.isVisible()
            and bar.count() and bar.width() > 0]                      # the docks' tabs, not a panel's own
    tabs = {tuple(bar.tabText(i) for i in range(bar.count())) for bar in bars}
    assert tabs == {("Overview", "Matrix", "Rollout", "Positions", "Heads", "Features"), ("Images", "Info")}
    full = {title: f"{name}: {what}" for title, name, what in DOCKS.values()}
    for bar in bars:
        for i in range(bar.count()):
            text = bar.tabText(i)
            assert bar.tabRect(i).width() >= bar.tabSizeHint(i).width(), f"tab {text!r} is elided"
            assert bar.tabToolTip(i) == full[text]
    view = {a.text() for a in window.menus.view.actions()}
    assert {"Layer × head overview", "Attention matrix", "Position embedding", "Head statistics"} <= view


def test_switching_tabs_does_not_move_anything(qtbot, window, wide_ckpt, images) -> None:  # noqa: ANN001
    """The Rollout tab used to widen the dock by ~180 px and shrink the image."""
    _loaded_at(qtbot, window, SCREENS["1280x800"], wide_ckpt, images[:1])
    show_dock(qtbot, window, "overviewDock")
    settle()
    before = (window.dock("overviewDock").width(), window.panel.width(), window.dock("controlsDock").width())
    for name in TABBED + ["overviewDock"]:
        show_dock(qtbot, window, name)
        settle()
        after = (window.dock(name).width(), window.panel.width(), window.dock("controlsDock").width())
        assert after == before, f"raising {name} moved the layout: {before} -> {after}"


def _label_spans(panel: MatrixPanel, side: str) -> list[tuple[float, float, str]]:
    """(start, end, text) in screen pixels along the axis of every major tick label drawn on one side."""
    axis = panel.plot.getAxis(side)
    metrics = QFontMetricsF(axis.style.get("tickFont") or axis.font())
    spans = []
    for value, text in axis._tickLevels[0]:
        point = panel.plot.vb.mapViewToScene(pg.Point(value, value))
        centre = point.y() if side == "left" else point.x()
        half = metrics.height() / 2 if side == "left" else metrics.horizontalAdvance(text) / 2
        spans.append((centre - half, centre + half, text))
    return sorted(spans)


@pytest.mark.parametrize("screen", SCREENS)
def test_matrix_axis_labels_never_overlap(qtbot, window, wide_ckpt, images, screen) -> None:  # noqa: ANN001
    _loaded_at(qtbot, window, SCREENS[screen], wide_ckpt, images[:1])
    panel = show_dock(qtbot, window, "matrixDock")
    settle()
    for side in ("left", "bottom"):
        spans = _label_spans(panel, side)
        assert spans and any(text.startswith("cls") for _a, _b, text in spans) or side == "bottom"
        for (_a0, end, first), (start, _b1, second) in zip(spans, spans[1:]):
            assert end <= start, f"{side} axis: {first!r} runs into {second!r}"
    names = [text for _a, _b, text in _label_spans(panel, "left")]
    assert "cls–reg3" in names or names[:5] == ["cls", "reg0", "reg1", "reg2", "reg3"]


FEATURE_TABS = ("pca", "similarity", "norms")


def shown_views(qtbot, window):  # noqa: ANN001, ANN201
    """(name, panel) for every dock raised in turn, and for each view of the Features dock, drawn from a result."""
    for name in TABBED + ["infoDock", "imagesDock"]:
        panel = show_dock(qtbot, window, name)
        settle()
        if name != "featuresDock":
            yield name, panel
            continue
        drawn: list[str] = []
        panel.shown.connect(drawn.append)
        for tab in FEATURE_TABS:
            panel.show_tab(tab)
            qtbot.waitUntil(lambda tab=tab: tab in drawn and window.is_idle(), timeout=30000)
            settle()
            yield f"{name} › {tab}", panel
        panel.shown.disconnect(drawn.append)


def plot_widgets(panel: QWidget) -> list[pg.GraphicsLayoutWidget]:
    return [w for w in [panel, *panel.findChildren(QWidget)]
            if isinstance(w, pg.GraphicsLayoutWidget) and w.isVisible()]


@pytest.mark.parametrize("screen", SCREENS)
def test_text_in_plots_is_whole_and_apart(qtbot, window, wide_ckpt, images, screen) -> None:  # noqa: ANN001
    """Inside every plot of every dock (each view of the Features dock too) and the image panel: no axis label,
    tick label, title, legend or line label runs into another or is cut by the plot's edge, none is drawn over
    the data, and no image is squeezed to a strip."""
    _loaded_at(qtbot, window, SCREENS[screen], wide_ckpt, images[:2])
    problems = []
    for name, panel in shown_views(qtbot, window):
        for widget in plot_widgets(panel):
            problems += [f"{name}: {p}" for p in plot_text_problems(widget)]
    problems += [f"image panel: {p}" for p in plot_text_problems(window.panel.view_widget)]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("screen", SCREENS)
def test_empty_docks_show_no_scaled_axes(qtbot, window, screen) -> None:  # noqa: ANN001
    """Before a model is open: no '(x0.001)' on an empty plot's axes (the Matrix dock had them), nothing cut."""
    window.use_size(default_size(QRect(0, 0, *SCREENS[screen])))
    problems = []
    for name in TABBED:
        panel = show_dock(qtbot, window, name)
        tabs = FEATURE_TABS if name == "featuresDock" else (None,)
        for tab in tabs:
            if tab:
                panel.show_tab(tab)
            settle()
            for widget in plot_widgets(panel):
                problems += [f"{name} {tab or ''}: {p}" for p in plot_text_problems(widget)]
    assert not problems, "\n".join(problems)
    matrix = window.dock("matrixDock").widget()
    assert not matrix.plot.getAxis("left").isVisible() and not matrix.colorbar.isVisible()


def test_a_title_that_wraps_does_not_move_the_image(qtbot, loaded) -> None:  # noqa: ANN001
    """The image panel keeps room for a two-line title, and a title never gives back room at the same width:
    titles of one, two and three lines in turn move the image once at most (to make room for the third)."""
    panel = loaded.panel
    settle()

    def view_after(text: str) -> tuple[float, float]:
        panel.title.setText(text)
        settle()
        rect = panel.view.sceneBoundingRect()
        return rect.top(), rect.height()

    short = "img0.png — CLS attention"
    two = " · ".join([short, "layer 1", "head mean", "shared scale 0–0.193 " * 2])
    width = panel.title.width()
    metrics = QFontMetricsF(panel.title.item.font())
    assert metrics.horizontalAdvance(two) < 2 * width          # at most two lines at this width
    first = view_after(short)
    assert view_after(two) == first and view_after(short) == first
    three = " · ".join([two] * 3)
    after = view_after(three)
    assert after[0] > first[0]                                    # a three-line title does take room ...
    assert view_after(short) == after and view_after(two) == after   # ... and keeps it


@pytest.mark.parametrize("levels", [(0.0042, 0.005), (0.0, 0.000728), (1.2e-5, 0.00454), (0.0, 25000.0),
                                    (0.0, 0.0941), (-1.0, 1.0), (3e-7, 9e-7)])
def test_one_number_format_per_colorbar(levels: tuple[float, float]) -> None:
    """Never '5e-3' beside '0.00454' or '4.6e-3': every label of a bar in one notation, with one exponent and
    the same number of places."""
    from vitviz.gui import colors

    labels = [t for t in colors.tick_labels(colors.nice_ticks(*levels)) if t != "0"]
    assert len(labels) >= 2
    exponents = {t.split("e")[1] if "e" in t else None for t in labels}
    places = {len(t.split("e")[0].split(".")[1]) if "." in t.split("e")[0] else 0 for t in labels}
    assert len(exponents) == 1 and len(places) == 1, labels


def test_a_colorbar_set_while_hidden_is_sized_when_shown(qtbot) -> None:  # noqa: ANN001
    """A colorbar given its range while hidden (a Features view cleared, then drawn) used to show no tick labels
    and its title over the bar: a hidden axis is sized 0 wide."""
    from _plot_text import axis_texts

    from vitviz.gui import colors
    from vitviz.gui.panels.base import dark_layout

    widget = dark_layout()
    qtbot.addWidget(widget)
    widget.resize(300, 300)
    view = widget.addViewBox(row=0, col=0)
    image = pg.ImageItem(np.random.default_rng(0).random((8, 8)))
    view.addItem(image)
    bar = pg.ColorBarItem(values=(0.0, 1.0), colorMap=colors.colormap("viridis"), interactive=False, width=12)
    widget.addItem(bar, row=0, col=1)
    widget.show()
    bar.setVisible(False)
    colors.set_colorbar_levels(bar, (-0.211, 1.0))
    bar.axis.setLabel("cosine similarity (both images)")
    bar.setVisible(True)
    settle()
    ticks = [t.text for t in axis_texts(bar.axis) if t.owner.endswith("tick")]
    assert ticks == ["0", "0.5", "1.0"]
    assert not plot_text_problems(widget)


@pytest.fixture(scope="module")
def eva02(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """EVA-02 (a learned table and RoPE), tiny, random, at 112 px (an 8 × 8 grid), saved as a timm hub folder."""
    import warnings

    timm = pytest.importorskip("timm")
    args = dict(embed_dim=64, num_heads=4, depth=2, img_size=112)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = timm.create_model("eva02_tiny_patch14_224", pretrained=False, num_classes=0, **args)
    folder = tmp_path_factory.mktemp("eva02")
    timm.models._hub.save_for_hf(model, str(folder), model_args=args, safe_serialization=True)
    return folder


@pytest.mark.parametrize("screen", SCREENS)
def test_learned_table_and_rope_both_get_room(qtbot, window, eva02, images, screen) -> None:  # noqa: ANN001
    """EVA-02's Positions dock: the learned table's maps were squeezed into a ~55 px strip above the RoPE kernel;
    both now get a readable height (the dock scrolls) with their text whole."""
    window.use_size(default_size(QRect(0, 0, *SCREENS[screen])))
    with qtbot.waitSignal(window.session.model.model_loaded, timeout=30000):
        window.load_model(str(eva02))
    window.session.add_images([str(images[0])])
    qtbot.waitUntil(window.is_idle, timeout=60000)
    panel = show_dock(qtbot, window, "posEmbedDock")
    qtbot.waitUntil(lambda: panel.rope is not None and panel.data is not None, timeout=30000)
    settle()
    problems = []
    for widget in (panel.widget, panel.rope_section.widget):
        assert widget.isVisible()
        problems += plot_text_problems(widget)
    assert not problems, "\n".join(problems)


def test_prefix_labels_one_by_one_when_there_is_room() -> None:
    from vitviz.core.spec import ModelSpec
    from vitviz.gui.panels.matrix import axis_ticks

    spec = ModelSpec(family="t", source="x", image_size=(64, 64), patch_size=4, embed_dim=48, depth=1, num_heads=1,
                     reg_tokens=4)
    roomy = axis_ticks(spec, (16, 16), pixels_per_token=20.0, extent=lambda _t: 12.0)[0]
    assert [t for _v, t in roomy[:5]] == ["cls", "reg0", "reg1", "reg2", "reg3"]
    tight = axis_ticks(spec, (16, 16), pixels_per_token=1.0, extent=lambda _t: 12.0)[0]
    assert tight[0] == (2.5, "cls–reg3")
    rows = [v for v, t in tight if t.startswith("row")]
    assert all(b - a >= 18 for a, b in zip(rows, rows[1:]))          # 12 px labels, 6 px apart at 1 px per token
    assert np.isfinite([v for v, _t in tight]).all()


def _small_screen(window) -> tuple[int, int]:  # noqa: ANN001
    """Lay `window` out as on a 1280 x 800 screen; its size there."""
    from vitviz.gui.window import default_size

    size = default_size(QRect(0, 0, 1280, 800))
    window.use_size(size)
    return size.width(), size.height()


def test_unfolded_model_settings_scroll_instead_of_making_the_window_taller_than_the_screen(
        qtbot, window, tiny_ckpt: Path, images) -> None:  # noqa: ANN001
    """On a 1280 x 800 screen the Controls panel with Model settings unfolded (as a model with assumptions opens
    it) is taller than the screen: it scrolls, the window keeps its size (it grew to 977 px), and the panel is
    not cut at the side (its minimum width follows Model settings)."""
    width, height = _small_screen(window)
    with qtbot.waitSignal(window.session.model.model_loaded, timeout=20000):
        window.load_model(str(tiny_ckpt), heads=HEADS)
    window.session.add_images([str(p) for p in images])
    wait_idle(qtbot, window)
    window.controls.model_settings.unfold(True)
    for _ in range(5):
        QApplication.processEvents()
    assert window.minimumSizeHint().height() <= height
    assert window.height() <= height and window.width() <= width
    button = window.controls.apply_size                  # the rightmost control of the panel's widest row
    dock = window.dock("controlsDock")
    right = button.mapTo(dock, QPoint(button.width(), 0)).x()
    assert right <= dock.width(), (right, dock.width())


def test_a_status_message_cut_at_the_edge_is_whole_in_the_bars_tooltip(qtbot, loaded) -> None:  # noqa: ANN001
    """At 1280 px the demo's 'to use your own: …' line was cut ('or pick one in t'): hovering the bar shows the
    message whole; a message that fits leaves no tooltip."""
    window = loaded
    _small_screen(window)
    for _ in range(5):
        QApplication.processEvents()
    long = ("Demo model loaded (shapes ViT, 8×8 patches, 5 shape classes) — to use your own: File ▸ Open model…, "
            "drop a checkpoint on the window, or pick one in the Models menu, or drop a model name on the window")
    window.statusBar().showMessage(long)              # two lines hold it now (round 5): no tooltip needed
    assert window.statusBar().toolTip() == ""
    longer = " ".join([long] * 3)
    window.statusBar().showMessage(longer)
    assert window.statusBar().toolTip() == longer
    window.statusBar().showMessage("Ready")
    assert window.statusBar().toolTip() == ""


def _plot_problems(name: str, panel) -> list[str]:  # noqa: ANN001
    return [f"{name}: {p}" for widget in plot_widgets(panel) for p in plot_text_problems(widget)]


@pytest.mark.parametrize("screen", SCREENS)
def test_text_in_compare_and_timeline_plots_is_whole_and_apart(qtbot, window, tiny_ckpt, tiny_ckpt_b, images,
                                                                tmp_path: Path, screen) -> None:  # noqa: ANN001
    """`_plot_text` over the Compare and Timeline docks (issue 35's Done when): no label over another or over a
    curve (Compare's legend lay over the CKA line), none cut, no map squeezed; the window stays within the
    screen with both docks open."""
    from _gui import HEADS
    from _tiny import write_tiny_checkpoint

    open_at(qtbot, window, SCREENS[screen], tiny_ckpt, images[0], heads=HEADS)
    window.session.add_images([str(p) for p in images[1:]])
    qtbot.waitUntil(window.is_idle, timeout=60000)
    window.compare_with(str(tiny_ckpt_b), heads=HEADS)
    qtbot.waitUntil(lambda: window.compare.active and window.is_idle(), timeout=60000)
    compare = show_dock(qtbot, window, "compareDock")
    qtbot.waitUntil(window.is_idle, timeout=60000)
    settle()
    problems = _plot_problems("compare", compare)
    # the key is under the plot, not a legend inside it (it lay over the CKA curve near 1 in the screenshot)
    assert compare.plot.legend is None and "linear&nbsp;CKA" in compare.key.text() and compare.key.isVisible()
    run = tmp_path / "run"
    run.mkdir()
    for i, step in enumerate((100, 200, 400)):
        write_tiny_checkpoint(run / f"step-{step}.pth", seed=20 + i)
    window.open_run(str(run))
    qtbot.waitUntil(lambda: window.timeline.store is not None, timeout=30000)
    timeline = show_dock(qtbot, window, "timelineDock")
    qtbot.waitUntil(window.is_idle, timeout=60000)
    timeline.request_redraw()
    qtbot.waitUntil(lambda: "p = " in timeline.prediction.text(), timeout=30000)
    settle()
    problems += _plot_problems("timeline", timeline)
    assert window.height() <= SCREENS[screen][1] and window.width() <= SCREENS[screen][0]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("screen", SCREENS)
def test_text_in_plots_is_whole_and_apart_for_a_windowed_model(qtbot, window, swin24, images,
                                                                screen) -> None:  # noqa: ANN001
    """`_plot_text` over every dock (each Features view too) and the image panel with Swin (a 24-head stage
    selected), at both screen sizes."""
    open_at(qtbot, window, SCREENS[screen], swin24, images[0])
    window.session.add_images([str(images[1])])
    qtbot.waitUntil(window.is_idle, timeout=60000)
    window.state.update(layer=3)
    settle()
    problems = []
    for name in TABBED + ["infoDock", "imagesDock"]:
        panel = show_dock(qtbot, window, name)
        for tab in FEATURE_TABS if name == "featuresDock" else (None,):
            if tab:
                panel.show_tab(tab)
            qtbot.waitUntil(window.is_idle, timeout=60000)
            settle()
            problems += _plot_problems(f"{name} {tab or ''}", panel)
    problems += [f"image panel: {p}" for p in plot_text_problems(window.panel.view_widget)]
    assert not problems, "\n".join(problems)


def test_a_long_status_message_wraps_onto_a_second_line_at_1280(qtbot, loaded) -> None:  # noqa: ANN001
    """The left status message was cut at the edge at 1280 × 800 (Qt draws it on one line): a message wider than
    the room left of the verdict and the buttons now takes two lines (the bar grows while it stands) and is drawn
    whole; a short one keeps the bar one line high."""
    from vitviz.gui.status import MESSAGE_LINES, WrappingStatusBar

    window = loaded
    window.use_size(default_size(QRect(0, 0, 1280, 800)))
    bar = window.statusBar()
    assert isinstance(bar, WrappingStatusBar)
    window.note("Token 17 picked (Matrix, Rollout, Features follow); the map stays the class relevance — choose "
                "'Attention of query token' in Map to see its attention, or click again to pick another")
    qtbot.waitUntil(lambda: bar.minimumHeight() > 0, timeout=5000)
    settle()
    text = bar.currentMessage()
    room = bar.message_rect()
    assert bar.fontMetrics().horizontalAdvance(text) > room.width()       # it would be cut on one line
    assert bar.lines_needed(text) == MESSAGE_LINES
    assert bar.height() >= MESSAGE_LINES * bar.fontMetrics().lineSpacing()
    verdict = window.status.verdict_label
    assert not verdict.isVisible() or room.right() < verdict.geometry().left()
    window.statusBar().showMessage("Ready")
    qtbot.waitUntil(lambda: bar.minimumHeight() == 0, timeout=5000)
    assert bar.height() < 2 * bar.fontMetrics().lineSpacing() + 4


def test_the_status_bar_measures_a_message_once(qtbot, loaded) -> None:  # noqa: ANN001
    """The bar asks how many lines a message takes on every message (its height, its tooltip): a text is measured
    once per room and font, and again when the room changes."""
    window = loaded
    bar = window.statusBar()
    measured: list = []
    metrics = bar.fontMetrics

    def counting():  # noqa: ANN202
        measured.append(1)
        return metrics()

    bar.fontMetrics = counting
    text = "Running img_018.jpg… " * 8
    first = bar.lines_needed(text)
    for _ in range(3):
        assert bar.lines_needed(text) == first
    assert len(measured) == 1
    room = bar.message_rect().width()
    window.resize(window.width() - 200, window.height())
    qtbot.waitUntil(lambda: bar.message_rect().width() != room, timeout=5000)
    measured.clear()
    assert bar.lines_needed(text) >= first and bar.lines_needed(text) >= first     # less room: measured anew, once
    assert len(measured) == 1
    del bar.fontMetrics
