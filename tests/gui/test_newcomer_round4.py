"""The window as a newcomer meets it, round 4: what a first look at the real window showed clipped, overflowing or
saying something untrue (screenshots of each problem were taken under a virtual display)."""
from __future__ import annotations

from pathlib import Path

from _gui import HEADS, wait_idle
from PySide6.QtCore import QPoint, QRect
from PySide6.QtWidgets import QApplication


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
    with qtbot.waitSignal(window.session.model_loaded, timeout=20000):
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


def test_a_timeline_of_a_model_without_class_names_says_class_n_once(qtbot, loaded, tmp_path: Path) -> None:  # noqa: ANN001
    """The Timeline's prediction line said 'class 1 (class 1)' for a model without class names."""
    from _gui import show_dock
    from _tiny import write_tiny_checkpoint

    folder = tmp_path / "run"
    folder.mkdir()
    for i, step in enumerate((100, 200)):
        write_tiny_checkpoint(folder / f"step-{step}.pth", seed=10 + i)
    window = loaded
    window.open_run(str(folder))
    qtbot.waitUntil(lambda: window.timeline.store is not None, timeout=20000)
    panel = show_dock(qtbot, window, "timelineDock")
    wait_idle(qtbot, window, timeout=30000)
    panel.request_redraw()
    qtbot.waitUntil(lambda: "p = " in panel.prediction.text(), timeout=20000)
    text = panel.prediction.text()
    index = text.split("class ")[1].split(",")[0]
    assert f"class {index}, p = " in text and f"(class {index})" not in text, text


def test_the_query_scale_note_says_how_to_pick_a_query_and_goes_when_the_map_changes(loaded) -> None:  # noqa: ANN001
    """Choosing 'Attention of query token' with no query: the note says to click a patch (the map is CLS attention
    until then); choosing another map takes the note back (it said 'Normalise each map is on' over the entropy
    map with the box unticked again)."""
    from vitviz.gui.state import QUERY_SCALE_NOTE

    window = loaded
    window.state.update(query=None)
    window.state.update(source="token")
    message = window.statusBar().currentMessage()
    assert QUERY_SCALE_NOTE in message and "Click a patch" in message and "CLS attention" in message
    window.state.update(source="entropy")
    assert not window.state.normalize
    assert QUERY_SCALE_NOTE not in window.statusBar().currentMessage()
    assert window.status.idle_message() == window.status.ready_message
    window.note("Input size 100×72 is not a multiple of the 8 px patch; using 96×72")   # another note stays
    window.state.update(source="cls")
    assert window.statusBar().currentMessage().startswith("Input size 100×72")


def test_the_assumptions_dialog_shows_each_reason_whole(qtbot, window, tmp_path: Path) -> None:  # noqa: ANN001
    """The 'what the file does not say' dialog gave the Heads reason (two lines: 'vitviz guessed 2: width 128 /
    head_dim 64 ... ') the height of about one: its second line was cut in half."""
    import torch
    from timm.models.vision_transformer import VisionTransformer

    torch.manual_seed(1)
    path = tmp_path / "mid_vit.pth"                           # 128 wide: the head count is a guess, so it asks
    torch.save(VisionTransformer(img_size=32, patch_size=8, embed_dim=128, depth=1, num_heads=4,
                                 num_classes=3).state_dict(), path)
    window.load_model(str(path))
    qtbot.waitUntil(lambda: window.assumptions_dialog is not None and window.assumptions_dialog.isVisible(),
                    timeout=20000)
    dialog = window.assumptions_dialog
    for _ in range(5):
        QApplication.processEvents()
    assert "num_heads" in dialog.reasons
    for field, label in dialog.reasons.items():
        need = label.heightForWidth(label.width())
        assert label.height() >= need, (field, label.height(), need, label.text())
    dialog.reject()
    wait_idle(qtbot, window)


def _lines(label) -> list[str]:  # noqa: ANN001
    doc = label.item.document()
    out = []
    block = doc.begin()
    while block.isValid():
        layout = block.layout()
        for i in range(layout.lineCount()):
            line = layout.lineAt(i)
            out.append(block.text()[line.textStart():line.textStart() + line.textLength()])
        block = block.next()
    return out


def test_a_long_rollout_title_wraps_between_its_settings_not_inside_a_number(qtbot) -> None:  # noqa: ANN001
    """The Rollout dock's title 'rollout of cls (mean, residual 0.50) · max 0.0941' is one phrase wider than the
    half-dock it has at 1400 px: Qt broke it anywhere, into 'residual 0.5' / '0) · max ...'. It breaks after a
    setting's comma instead."""
    import pyqtgraph as pg

    from vitviz.gui.panels.base import TitleLabel

    widget = pg.GraphicsLayoutWidget()
    qtbot.addWidget(widget)
    label = TitleLabel("", size="10pt")
    widget.addItem(label)
    label.setText("rollout of cls (max, discard 0.90, from layer 2, residual 0.50) · max 0.0941")
    label.item.setTextWidth(180)
    lines = _lines(label)
    assert len(lines) > 1
    for before, after in zip(lines, lines[1:]):
        assert before[-1:].isspace() or after[:1].isspace(), lines     # a break at a space, never inside a word
    assert all(not line.strip()[:1].isdigit() and not line.strip().startswith(")") for line in lines), lines


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


def test_the_last_layer_stays_the_last_when_another_model_opens(qtbot, window, tmp_path) -> None:  # noqa: ANN001
    """Shown at its last layer, a model replaced by a deeper one opens at the new last layer (it opened at the old
    index: a 12-layer model at layer 2 after the 3-layer demo); a layer the user picked stays that index."""
    from _tiny import write_tiny_checkpoint

    shallow = write_tiny_checkpoint(tmp_path / "two.pth", depth=2)
    deep = write_tiny_checkpoint(tmp_path / "four.pth", depth=4)
    for path, want in ((shallow, 1), (deep, 3), (shallow, 1)):
        with qtbot.waitSignal(window.session.model_loaded, timeout=20000):
            window.load_model(str(path), heads=HEADS)
        assert window.state.layer == want, (path.name, window.state.layer)
    window.state.update(layer=0)                       # the user's own pick
    with qtbot.waitSignal(window.session.model_loaded, timeout=20000):
        window.load_model(str(deep), heads=HEADS)
    assert window.state.layer == 0
    wait_idle(qtbot, window)
