"""Nothing clipped at the default layout (1600 × 1000 and 1280 × 800 screens): every panel's titles and labels fit
their widgets, the graphics of a panel fit its view, dock tabs are not elided and name their panel in a tooltip,
switching tabs never resizes the docks, and the matrix's axis labels never run into each other."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pyqtgraph as pg
import pytest
from _tiny import write_tiny_checkpoint
from _gui import show_dock
from PySide6.QtCore import QRect, QRectF
from PySide6.QtGui import QFontMetricsF
from PySide6.QtWidgets import QApplication, QLabel, QTabBar, QWidget

from vitviz.gui.panels.matrix import MatrixPanel
from vitviz.gui.window import DOCKS, default_size

SCREENS = {"1600x1000": (1600, 1000), "1280x800": (1280, 800)}
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
    with qtbot.waitSignal(window.session.model_loaded, timeout=30000):
        window.load_model(str(ckpt), heads=WIDE_HEADS)
    window.session.add_images([str(p) for p in images])
    qtbot.waitUntil(window.is_idle, timeout=60000)
    window.select_query(window.session.spec.num_prefix + 5)       # the longest titles: a query token's


def _settle() -> None:
    for _ in range(5):
        QApplication.processEvents()


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
        _settle()
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
    _settle()
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
    _settle()
    before = (window.dock("overviewDock").width(), window.panel.width(), window.dock("controlsDock").width())
    for name in TABBED + ["overviewDock"]:
        show_dock(qtbot, window, name)
        _settle()
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
    _settle()
    for side in ("left", "bottom"):
        spans = _label_spans(panel, side)
        assert spans and any(text.startswith("cls") for _a, _b, text in spans) or side == "bottom"
        for (_a0, end, first), (start, _b1, second) in zip(spans, spans[1:]):
            assert end <= start, f"{side} axis: {first!r} runs into {second!r}"
    names = [text for _a, _b, text in _label_spans(panel, "left")]
    assert "cls–reg3" in names or names[:5] == ["cls", "reg0", "reg1", "reg2", "reg3"]


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
