"""The image panel (`vitviz.gui.panels.image`): the map under the mouse and its hover readout."""
from __future__ import annotations

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
