"""Model settings › Maps in float16 (issue 36): the window's runs keep float16 maps (half the memory per image,
each value within 2^-12 of float32's), the images run again when it changes, and it is remembered."""
from __future__ import annotations

import numpy as np
from _gui import wait_idle


def test_maps_in_float16_runs_the_images_again(qtbot, loaded, images) -> None:  # noqa: ANN001
    w, path = loaded, str(images[0])
    s, box = w.session, w.controls.model_settings.half_box
    before = s.result(path).result.attentions
    assert before.dtype == np.float32 and not box.isChecked()
    box.setChecked(True)
    assert s.half_maps and s.result(path) is None          # the float32 results are let go
    wait_idle(qtbot, w)
    after = s.result(path).result.attentions
    assert after.dtype == np.float16 and after.nbytes * 2 == before.nbytes
    assert 0 < np.abs(after.astype(np.float32) - before).max() <= 2.0 ** -12
    assert w.settings.value("maps/float16", type=bool) is True
    box.setChecked(False)
    wait_idle(qtbot, w)
    np.testing.assert_array_equal(s.result(path).result.attentions, before)
    assert w.settings.value("maps/float16", type=bool) is False
