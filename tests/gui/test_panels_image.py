"""The image panel (`vitviz.gui.panels.image`): the map under the mouse and its hover readout."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from vitviz.gui.numbers import number



def test_the_hover_readout_follows_the_map_under_a_still_mouse(loaded) -> None:  # noqa: ANN001
    """Clicking a patch (a query map) or going back to CLS attention redraws the map under a mouse that did not
    move: the readout shows the new map's value, not the previous one's."""
    window = loaded
    panel = window.panel
    panel._on_mouse_moved(panel.image_item.mapToScene(panel.image_item.boundingRect().center()))
    row, col = panel.hovered_patch
    assert row >= 0
    before = window.hover_label.text()
    window.state.update(source="token", query=window.session.model.spec.num_prefix)   # another map, the mouse still
    after = window.hover_label.text()
    assert number(panel.values[row, col]) in after and after != before


def test_a_long_bracketed_phrase_wraps_before_its_bracket_not_before_its_end() -> None:
    """Second pass (SAM): the image title broke as "… window's queries" / ") · stage 0": the phrase 'attention
    received (mean over each window's queries)' is too long for a line and unbreakable. It may now wrap before a
    bracket that opens words, still not inside a place like '(0, 5)' or '(8×8)'."""
    from vitviz.gui.panels.base import unbreakable_phrases

    out = unbreakable_phrases("a.jpg — attention received (mean over each window's queries) · block 3 (global (8×8))"
                              " · patch (0, 5)")
    assert "received (mean&nbsp;over" in out and "queries)" in out
    assert "(8×8)" in out and "global&nbsp;(8×8)" in out and "patch&nbsp;(0,&nbsp;5)" in out


@pytest.mark.parametrize("which", ["image", "overview"])
def test_a_panel_built_from_bare_parts_says_what_they_say(qtbot, which) -> None:  # noqa: ANN001
    """The image and overview panels are built from the parts they show (the model part, the image list), not the
    session: bare parts, with no session or worker anywhere, alone say what the panel waits for."""
    from vitviz.core.spec import ModelSpec
    from vitviz.gui.images import ImageList
    from vitviz.gui.model_slot import ModelSlot
    from vitviz.gui.panels.image import ImagePanel
    from vitviz.gui.panels.overview import OverviewPanel
    from vitviz.gui.state import ViewState

    model, images = ModelSlot(), ImageList()
    panel = (ImagePanel if which == "image" else OverviewPanel)(ViewState(), model, images)
    qtbot.addWidget(panel)
    assert "Open a model" in panel.placeholder()
    model.spec = ModelSpec(family="vit", source="x", image_size=(32, 32), patch_size=8, embed_dim=32, depth=2,
                           num_heads=2)
    path = str(Path("/imgs/a.png"))
    images.current = images.add([path])[1]
    assert panel.placeholder() == ("Running a.png…" if which == "image" else "Running the image…")
    images.fail(path, f"{path}: not a recognised image format")
    assert panel.placeholder() == ("a.png: not a recognised image format" if which == "image"
                                   else "No result for this image")


@pytest.mark.parametrize("which", ["image", "overview"])
def test_a_panel_built_from_the_loaded_parts_alone_follows_them(qtbot, loaded, images, which) -> None:  # noqa: ANN001
    """Built from the session's parts (not the session, not the window) after a result is shown, the panel starts on
    that result (`image_list.current_maps`) and follows the current image from there."""
    from vitviz.gui.panels.image import ImagePanel
    from vitviz.gui.panels.overview import OverviewPanel
    from vitviz.gui.state import ViewState

    session = loaded.session
    qtbot.waitUntil(lambda: session.result(str(images[1])) is not None, timeout=20000)
    first = session.image_list.current_maps
    panel = (ImagePanel if which == "image" else OverviewPanel)(ViewState(), session.model, session.image_list)
    qtbot.addWidget(panel)
    panel.show()
    qtbot.waitExposed(panel)
    assert first is not None and panel._maps is first
    drawn = np.array(panel.image_item.image)
    session.set_current(str(images[1]))
    second = session.result(str(images[1]))
    assert panel._maps is second and second is not first
    assert not np.array_equal(panel.image_item.image, drawn)        # redrawn from the new result
