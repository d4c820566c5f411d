"""The attention-matrix view's reductions over heads and layers: never made on the GUI thread when the layer or head
changes (a layer's heads' mean is the worker's, made once; a heads' max or a mean over the layers is made in a pool
thread while the view says so), and drawn exactly as the reduction made on the GUI thread was."""
from __future__ import annotations

import dataclasses
import threading

import numpy as np
import pyqtgraph as pg
import pytest
from _gui import random_result

from vitviz.core.analyses.maps import ResultMaps
from vitviz.gui import colors
from vitviz.gui.images import ImageList
from vitviz.gui.panels.matrix import MatrixPanel, display_values
from vitviz.gui.state import ViewState

REDUCED: list[bool] = []       # one entry per reduction of the attention: whether it ran on the GUI thread


class Recorded(np.ndarray):
    """Attention that notes every mean or max taken of it (or of a view of it) and whether the GUI thread took it."""

    def mean(self, *args, **kwargs):  # noqa: ANN002, ANN003, ANN201
        REDUCED.append(threading.current_thread() is threading.main_thread())
        return super().mean(*args, **kwargs)

    def max(self, *args, **kwargs):  # noqa: ANN002, ANN003, ANN201
        REDUCED.append(threading.current_thread() is threading.main_thread())
        return super().max(*args, **kwargs)


@pytest.fixture
def shown(qtbot):  # noqa: ANN001, ANN201
    """(panel, state, maps, attn): a matrix view of a random 4-layer, 4-head result prepared as the worker prepares
    a run (`precompute`, on another thread), shown on screen; `attn` is the plain array."""
    REDUCED.clear()
    result = random_result(depth=4, heads=4, grid=(3, 5))
    attn = np.asarray(result.attentions)
    maps = ResultMaps(dataclasses.replace(result, attentions=attn.view(Recorded)))
    worker = threading.Thread(target=maps.precompute)
    worker.start()
    worker.join()
    state = ViewState()
    images = ImageList()
    panel = MatrixPanel(state, images, maps)
    qtbot.addWidget(panel)
    panel.resize(400, 400)
    panel.show()
    qtbot.waitExposed(panel)
    REDUCED.clear()
    return panel, state, maps, attn


def _rendered(values: np.ndarray, levels: tuple[float, float], colormap: str) -> bytes:
    """The picture pyqtgraph makes of `values` with these levels and colour map (what the view draws)."""
    item = pg.ImageItem()
    item.setImage(values, autoLevels=False, levels=levels, lut=colors.lut(colormap))
    item.render()
    return bytes(item.qimage.constBits())


def _panel_picture(panel: MatrixPanel) -> bytes:
    panel.image_item.render()
    return bytes(panel.image_item.qimage.constBits())


def test_layer_changes_read_the_workers_head_mean(shown) -> None:  # noqa: ANN001
    """A layer change with the heads' mean shown reduces nothing on the GUI thread: the mean is the one the worker
    made after the capture, the same array on every visit, and the picture is the one the old per-change
    reduction drew, bit for bit."""
    panel, state, maps, attn = shown
    seen = {}
    for layer in (0, 2, 1, 3, 0, 2):
        state.update(layer=layer, head="mean")
        old = attn[layer][None].mean(axis=1, dtype=np.float32)[0]          # what the GUI thread reduced before
        np.testing.assert_array_equal(panel.image_item.image, old)
        assert seen.setdefault(layer, panel.matrix) is panel.matrix        # made once per layer, kept
        assert _panel_picture(panel) == _rendered(old, display_values(old, False)[1], state.colormap)
        state.update(head=1)
        np.testing.assert_array_equal(panel.image_item.image, attn[layer, 1])
    assert not any(REDUCED), "the attention was reduced on the GUI thread"


def test_heads_max_is_made_off_the_gui_thread(qtbot, shown) -> None:  # noqa: ANN001
    """The heads' max of a layer (not made by the worker) is made in a pool thread while the view says so; drawn
    when it is there, and read as it is on the next visit."""
    panel, state, maps, attn = shown
    assert not maps.has_matrix(2, "max")
    with qtbot.waitSignal(panel._made, timeout=10000):
        state.update(layer=2, head="max")
        assert "making the heads' max" in panel.title.text
        assert panel.matrix is None
    np.testing.assert_array_equal(panel.image_item.image, attn[2][None].max(axis=1)[0])
    assert "layer 2 · head max" in panel.title.text and "making" not in panel.title.text
    state.update(layer=1, head=0)
    state.update(layer=2, head="max")                                   # made already: drawn at once
    np.testing.assert_array_equal(panel.image_item.image, attn[2].max(axis=0))
    assert not any(REDUCED)


@pytest.mark.parametrize("head", ["mean", 2])
def test_mean_over_layers_is_made_off_the_gui_thread(qtbot, shown, head) -> None:  # noqa: ANN001
    """The mean over the layers (of the heads' mean, or of one head) is made in a pool thread, once, and equals
    what the GUI thread reduced before."""
    panel, state, maps, attn = shown
    with qtbot.waitSignal(panel._made, timeout=10000):
        state.update(layer="mean", head=head)
    fused = attn.mean(axis=1, dtype=np.float32) if head == "mean" else attn[:, head]
    np.testing.assert_array_equal(panel.image_item.image, fused.mean(axis=0, dtype=np.float32))
    assert REDUCED.count(True) == 0
    made = panel.matrix
    state.update(layer=0)
    state.update(layer="mean")
    assert panel.matrix is made


def test_a_failed_reduction_is_said_and_not_tried_again(qtbot, shown, monkeypatch) -> None:  # noqa: ANN001
    """A reduction that fails in the pool thread (out of memory) is said in the title, not retried in a loop."""
    panel, state, maps, _attn = shown
    tries = []

    def fail(layer, head):  # noqa: ANN001, ANN202
        tries.append((layer, head))
        raise MemoryError("no room for the (T, T) max")

    monkeypatch.setattr(maps, "matrix", fail)
    with qtbot.waitSignal(panel._made, timeout=10000):
        state.update(layer=3, head="max")
    qtbot.wait(50)
    assert "could not make the heads' max: no room" in panel.title.text
    state.update(colormap="magma")                                     # another redraw of the same selection
    assert tries == [(3, "max")]


def test_a_failure_goes_with_its_result(qtbot, shown) -> None:  # noqa: ANN001
    """A failed reduction is remembered for the result it failed on only: once that result is gone, nothing of it
    is kept (keyed by address, a later result at the same address would be shown the old failure, never tried)."""
    import gc

    panel, state, _maps, _attn = shown
    other = ResultMaps(random_result(depth=4, heads=4, grid=(3, 5)))
    other.matrix = lambda layer, head: (_ for _ in ()).throw(MemoryError("no room"))
    panel.set_maps(other)
    with qtbot.waitSignal(panel._made, timeout=10000):
        state.update(layer=3, head="max")
    qtbot.wait(50)
    assert "could not make the heads' max: no room" in panel.title.text
    assert len(panel._making) == 1
    panel.set_maps(None)
    qtbot.wait(50)
    del other
    gc.collect()
    assert len(panel._making) == 0


def test_a_query_click_does_not_draw_the_matrix_again(shown, monkeypatch) -> None:  # noqa: ANN001
    """Choosing a query moves the row and column outlines only: the (T, T) picture is not set again."""
    panel, state, _maps, _attn = shown
    calls = []
    monkeypatch.setattr(panel.image_item, "setImage", lambda *a, **k: calls.append(a))
    state.update(query=5)
    assert panel.row_box.isVisible() and panel.row_box.rect().top() == 5
    assert calls == []
