"""The window's interventions (`vitviz.gui.interventions`): a head ablated from the overview tile's menu runs in the
worker and shows the library's numbers beside the clean run; the tile is marked; undo restores; the importance grid
is the library's and a click on a cell ablates that head."""
from __future__ import annotations

import numpy as np
from PySide6.QtCore import QPointF, Qt
from PySide6.QtGui import QMouseEvent

from _gui import HEADS, wait_idle


def _probability(result, index: int) -> float:
    z = result.logits.astype(np.float64)
    p = np.exp(z - z.max())
    return float(p[index] / p.sum())


def test_ablate_from_the_overview_menu_and_undo(qtbot, loaded, tiny_ckpt) -> None:  # noqa: ANN001
    import vitviz
    from vitviz.core.running.interventions import Ablate

    window = loaded
    iv = window.interventions
    dock = window.dock("interventionsDock")
    assert not dock.isVisible() and iv.available
    menu = iv.menu(window, 1, 0)
    assert menu is not None and menu.actions()[0].text() == "Ablate layer 1, head 0"
    menu.actions()[0].trigger()
    menu.close()
    wait_idle(qtbot, window)
    qtbot.waitUntil(lambda: iv.current() is not None, timeout=20000)
    assert dock.isVisible() and iv.heads == [(1, 0)]
    assert len(window.overview._marks) == 1
    panel = dock.widget()
    path = window.session.current
    model = vitviz.load(tiny_ckpt, heads=HEADS)
    want = model.run(path, intervene=Ablate([(1, 0)]))
    table = panel.table
    assert table.rowCount() == 5
    for row in range(table.rowCount()):
        label = table.item(row, 0).text()
        index = next(i for i, name, _p in want.top_k(5) if name == label)
        assert float(table.item(row, 2).text()) == round(_probability(want, index), 3) or \
            abs(float(table.item(row, 2).text()) - _probability(want, index)) < 6e-4
    assert "Ablated (zero): L1.H0" in panel.heads_label.text()
    assert iv.current().maps.result.interventions == ("ablate L1.H0 (zero)",)
    iv.undo()
    assert iv.heads == [] and window.overview._marks == []
    assert table.item(0, 2).text() == ""


def test_importance_grid_and_a_click_on_a_cell(qtbot, loaded, tiny_ckpt) -> None:  # noqa: ANN001
    import vitviz
    from vitviz.core.analyses.importance import head_importance
    from vitviz.core.drawing.importance import LEFT, TOP, _cell, _title_height

    window = loaded
    iv = window.interventions
    iv.scan()
    wait_idle(qtbot, window)
    qtbot.waitUntil(lambda: iv.current_importance() is not None, timeout=20000)
    imp = iv.current_importance()
    want = head_importance(vitviz.load(tiny_ckpt, heads=HEADS), window.session.current)
    np.testing.assert_allclose(imp.drop, want.drop, atol=1e-6)
    panel = window.dock("interventionsDock").widget()
    assert not panel.grid.pixmap().isNull()
    cell = _cell(imp.drop.shape)
    x, y = LEFT + 1 * cell + cell // 2, _title_height(2) + TOP + 0 * cell + cell // 2   # layer 0, head 1
    click = QMouseEvent(QMouseEvent.Type.MouseButtonPress, QPointF(x, y), QPointF(x, y), Qt.MouseButton.LeftButton,
                        Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier)
    panel._grid_clicked(click)
    assert iv.heads == [(0, 1)]
    wait_idle(qtbot, window)
    qtbot.waitUntil(lambda: iv.current() is not None, timeout=20000)
