"""How the image panel and the Overview paint (issue 37: an ablate click's paint cost): their pictures are drawn
from a 32-bit copy (`vitviz.gui.panels.blit`) that Qt scales faster, and the screen pixels are the same as from
pyqtgraph's own picture; an intervened run of the same photo does not set the photo again."""
from __future__ import annotations

import numpy as np
import pyqtgraph as pg
import pytest
from PySide6.QtGui import QImage

from vitviz.gui.panels import blit


def shown(view) -> np.ndarray:
    """The view's viewport as painted now, (H, W, 4) uint8."""
    view.viewport().repaint()
    image = view.viewport().grab().toImage().convertToFormat(QImage.Format.Format_ARGB32)
    return np.frombuffer(image.constBits(), np.uint8).reshape(image.height(), image.width(), 4).copy()


def items_of(window, which: str) -> tuple[object, list[blit.ImageItem]]:
    if which == "image":
        return window.panel.view_widget, [window.panel.image_item, window.panel.overlay_item]
    return window.overview.widget, [window.overview.image_item]


@pytest.mark.parametrize("which", ["image", "overview"])
@pytest.mark.parametrize("opacity", [1.0, 0.55])
def test_the_32_bit_picture_paints_the_same_pixels(loaded, monkeypatch, which, opacity) -> None:
    """The panel painted from the converted pictures and from pyqtgraph's own (RGB888 photo, colour-table map)
    gives the same screen pixels, at a view scale that is not a whole number, with the map half transparent."""
    window = loaded
    window.state.update(opacity=opacity, layer=1, head=1)
    view, items = items_of(window, which)
    assert all(isinstance(item, blit.ImageItem) for item in items)
    fast = shown(view)
    assert all(item.qimage.format() in blit.FAST for item in items)
    monkeypatch.setattr(blit.ImageItem, "render", pg.ImageItem.render)
    for item in items:
        item.qimage = None
        item._renderRequired = True
    plain = shown(view)
    assert not any(item.qimage.format() in blit.FAST for item in items)     # pyqtgraph's own formats this time
    assert fast.shape == plain.shape and (fast == plain).all()
    assert len(np.unique(fast.reshape(-1, 4), axis=0)) > 50     # a photo and a map, not an empty view


def test_the_same_photo_is_not_set_again_and_another_is(loaded, monkeypatch) -> None:
    """An intervened run of the same image (its photo an equal array, not the same object) only changes the map:
    the photo item is not given the photo again and the pixels are those of the first draw; another photo is set
    and shown."""
    window = loaded
    panel = window.panel
    before = shown(panel.view_widget)
    calls = []
    plain_set = panel.image_item.setImage
    monkeypatch.setattr(panel.image_item, "setImage", lambda *a, **k: (calls.append(a), plain_set(*a, **k)))
    photo = panel._photo
    panel.set_image(photo.copy(), panel._grid, panel._patch)
    assert calls == [] and (shown(panel.view_widget) == before).all()
    changed = photo.copy()
    changed[:4, :4] = 255 - changed[:4, :4]
    panel.set_image(changed, panel._grid, panel._patch)
    assert len(calls) == 1 and not (shown(panel.view_widget) == before).all()
    panel.clear("nothing")
    panel.set_image(changed, panel._grid, panel._patch)     # after a clear the photo is set again
    assert len(calls) == 2


def _blit_items(panel) -> list[blit.ImageItem]:
    """The panel's converted image items holding a picture."""
    return [item for view in _views(panel) for item in view.scene().items()
            if isinstance(item, blit.ImageItem) and item.image is not None and item.isVisible()]


def _views(panel) -> list[pg.GraphicsView]:
    return [view for view in panel.findChildren(pg.GraphicsView) if view.isVisible()]


@pytest.mark.parametrize("dock", ["rolloutDock", "featuresDock"])
def test_rollout_and_features_paint_the_same_pixels_from_32_bits(qtbot, loaded, monkeypatch, dock) -> None:
    """The rollout's and the token features' photos, maps and histogram are drawn from the 32-bit copies too, with
    the same screen pixels as from pyqtgraph's own pictures."""
    from _gui import show_dock

    window = loaded
    window.state.update(opacity=0.55)
    panel = show_dock(qtbot, window, dock)
    if dock == "featuresDock":        # the token features come from a pass of their own (the worker)
        maps = window.session.image_list.current_maps
        qtbot.waitUntil(lambda: maps.features is not None, timeout=20000)
        panel.redraw()
    qtbot.waitUntil(lambda: len(_blit_items(panel)) >= 2, timeout=20000)
    views, items = _views(panel), _blit_items(panel)
    fast = [shown(view) for view in views]
    assert all(item.qimage.format() in blit.FAST for item in items)
    monkeypatch.setattr(blit.ImageItem, "render", pg.ImageItem.render)
    for item in items:
        item.qimage = None
        item._renderRequired = True
    plain = [shown(view) for view in views]
    assert not any(item.qimage.format() in blit.FAST for item in items)
    for a, b in zip(fast, plain):
        assert a.shape == b.shape and (a == b).all()
    assert max(len(np.unique(a.reshape(-1, 4), axis=0)) for a in fast) > 50
