"""The layer × head overview with maps that are not one per layer and head: a class's relevance (one map of the
whole model) follows the method and class chosen, frames its one row whatever the layer, and names its column after
the map instead of calling it "rollout"."""
from __future__ import annotations

import numpy as np
import pytest
from _gui import SCREENS, open_at, settle, show_dock
from _plot_text import plot_text_problems
from PySide6.QtCore import QPointF

from vitviz.gui.panels.overview import column_name


def test_relevance_stacks_follow_the_method_and_frame_their_one_row(qtbot, loaded) -> None:  # noqa: ANN001
    w = loaded
    overview = show_dock(qtbot, w, "overviewDock")
    with qtbot.waitSignal(w.session.relevance_pass.ready, timeout=20000):
        w.state.update(source="relevance", layer=1, head="mean")
    qtbot.waitUntil(lambda: overview._shape[0] == 1, timeout=5000)
    nl, nc, gh, _gw = overview._shape
    assert (nl, nc) == (1, 1)
    assert overview.frame.isVisible() and overview.frame.rect().top() < gh     # row 0 although layer is 1
    title = overview.title.text.split(" · ")[0]
    assert title.startswith("class relevance (Chefer) of") and overview._columns == [(0, title)]   # not "rollout"
    assert "scale" not in overview.title.text              # one tile: no scale shared "per column kind"
    assert overview.plot.getAxis("bottom")._tickLevels[0][0][1] == title
    w.state.update(relevance_method="attngrad")                                # a stack per layer and head now
    qtbot.waitUntil(lambda: overview._shape[0] == 2, timeout=5000)
    assert overview._shape[1] == 2 + 2 and overview.title.text.startswith("attention × gradient")
    assert overview.title.text.endswith(" · one scale per column kind")
    w.state.update(relevance_method="relevance", relevance_class=3)            # another class: its own stack
    with qtbot.waitSignal(w.session.relevance_pass.ready, timeout=20000):
        pass
    qtbot.waitUntil(lambda: overview._shape[0] == 1 and "class 3" in overview.title.text, timeout=5000)
    maps = w.session.image_list.current_maps
    stack = maps.stack(__import__("vitviz.core.analyses.maps", fromlist=["MapKind"]).MapKind("relevance", target=3))
    np.testing.assert_allclose(np.nan_to_num(overview.image_item.image), stack.shared_scaled()[0, 0], rtol=1e-6)


class _Click:
    """What `OverviewPanel._on_clicked` reads of a scene click."""

    def __init__(self, pos) -> None:  # noqa: ANN001
        self.pos = pos

    def button(self):  # noqa: ANN201
        from PySide6.QtCore import Qt

        return Qt.MouseButton.LeftButton

    def scenePos(self):  # noqa: ANN201, N802 - Qt's name
        return self.pos


def test_a_click_on_a_whole_model_map_keeps_the_layer(qtbot, loaded) -> None:  # noqa: ANN001
    w = loaded
    overview = show_dock(qtbot, w, "overviewDock")
    w.state.update(source="rollout", layer=0)
    assert overview._columns == [(0, column_name(w.session.image_list.current_maps.stack("rollout").title))]
    assert overview._columns[0][1].startswith("rollout of cls")
    with qtbot.waitSignal(w.session.relevance_pass.ready, timeout=20000):
        w.state.update(source="relevance", layer=1)
    qtbot.waitUntil(lambda: overview._shape[0] == 1, timeout=5000)
    clicked: list[tuple[object, object]] = []
    overview.tile_clicked.connect(lambda layer, head: clicked.append((layer, head)))
    overview._on_clicked(_Click(overview.plot.vb.mapViewToScene(__import__("PySide6.QtCore", fromlist=["QPointF"])
                                                                .QPointF(1.5, 1.5))))
    assert clicked == [(1, None)] and w.state.layer == 1          # the tile is every layer's: the layer stays
    assert column_name("rollout of cls (mean, residual 0.50)") == "rollout of cls"
    assert column_name("class relevance (Chefer) of 'cat' (class 3)") == "class relevance (Chefer) of 'cat' (class 3)"


class _Click:
    def __init__(self, scene_pos: QPointF) -> None:
        self._pos = scene_pos

    def button(self):  # noqa: ANN201
        from PySide6.QtCore import Qt

        return Qt.MouseButton.LeftButton

    def scenePos(self) -> QPointF:  # noqa: N802
        return self._pos


@pytest.mark.parametrize("screen", SCREENS)
def test_a_swin_stage_with_24_heads_wraps_its_heads_into_readable_tiles(qtbot, window, swin24, images,
                                                                         screen) -> None:  # noqa: ANN001
    """The Overview showed a Swin stage as 2 rows of 26 tiles about 10 px wide; each block's heads are now
    wrapped into bands (mean and max beside the first), every tile at least 24 px on screen, the text whole, and a
    click on any tile picks that block and head."""
    open_at(qtbot, window, SCREENS[screen], swin24, images[0])
    window.state.update(layer=3)            # a block of the 24-head stage
    overview = show_dock(qtbot, window, "overviewDock")
    qtbot.waitUntil(lambda: overview._shape[1] == 26, timeout=20000)
    settle()
    nl, nc, gh, gw = overview._shape
    assert overview._bands > 1 and nl == 2
    assert overview._blocks == [2, 3]
    pixel = overview.plot.vb.viewPixelSize()
    assert min(gw / pixel[0], gh / pixel[1]) >= 24, (gw / pixel[0], gh / pixel[1], overview._bands)
    assert not plot_text_problems(overview.widget), plot_text_problems(overview.widget)
    clicked = []
    overview.tile_clicked.connect(lambda layer, head: clicked.append((layer, head)))
    for layer in range(nl):
        for col in range(nc):
            row, vcol = overview._place(layer, col)
            centre = QPointF((vcol + 0.5) * (gw + overview._gap), (row + 0.5) * (gh + overview._gap))
            assert overview.tile_at(centre) == (layer, col)
    row, vcol = overview._place(1, 13)
    scene = overview.plot.vb.mapViewToScene(QPointF((vcol + 0.5) * (gw + overview._gap),
                                                    (row + 0.5) * (gh + overview._gap)))
    overview._on_clicked(_Click(scene))
    assert clicked == [(3, 13)]
    labels = [text for _pos, text in overview.plot.getAxis("left")._tickLevels[0]]
    assert labels[:2] == ["2", "3"] and f"+{overview._per_band()}" in labels


def test_a_plain_vit_keeps_one_row_per_layer() -> None:
    """A 12 × 12 ViT-B (or the demo's 3 × 4) is not wrapped: wrapping only pays for few rows of many heads."""
    from vitviz.gui.panels.overview import wrap_layout

    assert wrap_layout(12, 12, 400, 300) == 1 and wrap_layout(3, 4, 400, 300) == 1
    assert wrap_layout(24, 16, 400, 300) == 1
    assert wrap_layout(2, 24, 400, 300) > 1 and wrap_layout(2, 24, 0, 0) > 1
