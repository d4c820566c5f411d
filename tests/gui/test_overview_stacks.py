"""The layer × head overview with maps that are not one per layer and head: a class's relevance (one map of the
whole model) follows the method and class chosen, frames its one row whatever the layer, and names its column after
the map instead of calling it "rollout"."""
from __future__ import annotations

import numpy as np
from _gui import show_dock

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
    maps = w.session.current_maps
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
    assert overview._columns == [(0, column_name(w.session.current_maps.stack("rollout").title))]
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
