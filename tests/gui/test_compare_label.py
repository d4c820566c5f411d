"""The Compare dock's mapping line (`vitviz.gui.panels.compare.SteadyLabel`): a new text of the same height lays the
dock out no more (it changes with every linked layer or head), a taller one does. Counted, never timed."""
from __future__ import annotations

from PySide6.QtCore import QEvent, QObject
from PySide6.QtWidgets import QVBoxLayout, QWidget


class _Requests(QObject):
    """Counts the layout requests a widget receives."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def eventFilter(self, _obj: QObject, event: QEvent) -> bool:  # noqa: N802 - Qt override
        if event.type() == QEvent.Type.LayoutRequest:
            self.count += 1
        return False


def test_same_height_text_does_not_lay_the_dock_out_a_taller_one_does(qtbot) -> None:  # noqa: ANN001
    from PySide6.QtWidgets import QApplication

    from vitviz.gui.panels.compare import SteadyLabel

    parent = QWidget()
    qtbot.addWidget(parent)
    label = SteadyLabel("compareMapping")
    QVBoxLayout(parent).addWidget(label)
    parent.resize(300, 200)
    parent.show()
    qtbot.waitExposed(parent)
    label.setText("A layer 1 ↔ B layer 2")
    QApplication.processEvents()
    one_line = label.height()
    assert one_line > 0 and label.text() == "A layer 1 ↔ B layer 2"
    assert parent.findChild(QWidget, "compareMapping") is label.label          # found by its name, as before
    requests = _Requests()
    parent.installEventFilter(requests)
    for layer in range(3, 9):                       # new words, one line each: no layout request, same height
        label.setText(f"A layer {layer} ↔ B layer {layer + 1}")
        QApplication.processEvents()
        assert label.height() == one_line and label.label.text().endswith(f"B layer {layer + 1}")
    assert requests.count == 0
    label.setText(" · ".join(f"A head {h} ↔ B head {h}, similarity 0.91" for h in range(8)))   # wraps: taller
    QApplication.processEvents()
    assert requests.count >= 1 and label.height() > one_line
    assert label.label.height() == label.height() and label.label.width() == label.width()   # the text all shows
    label.setText("")
    QApplication.processEvents()
    assert label.height() == 0
