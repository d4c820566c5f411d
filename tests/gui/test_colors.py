"""The colour bar of the window (`vitviz.gui.colors`): its ticks span the bar."""
from __future__ import annotations

import pytest

from vitviz.gui import colors


@pytest.mark.parametrize("levels,labels", [((0.0, 0.000728), ["0", "2e-4", "4e-4", "6e-4"]),
                                           ((0.0, 0.0941), ["0", "0.02", "0.04", "0.06", "0.08"]),
                                           ((-1.0, 1.0), ["-1.0", "-0.5", "0", "0.5", "1.0"])])
def test_colorbar_ticks_span_the_bar(window, levels, labels) -> None:  # noqa: ANN001
    ticks = colors.nice_ticks(*levels)
    assert colors.tick_labels(ticks) == labels
    assert ticks[-1] >= levels[0] + 0.7 * (levels[1] - levels[0])          # up the whole bar, not just its foot
    colors.set_colorbar_levels(window.panel.colorbar, levels)
    assert [t[1] for t in window.panel.colorbar.axis._tickLevels[0]] == labels
