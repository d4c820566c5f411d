"""The model's own code in the window (issue 19): code that misbehaves -- exits, interrupts, raises a bare
BaseException, has NaN weights or attention, is left on the meta device, asks for 43 GB, has a file name too long,
gets weights that do not fit -- is one error box, and the window keeps the model it had and stays usable; code that
does not finish offers Stop waiting after the settings' time: the stuck worker is given up on, a fresh one starts,
the previous model is back and the status bar says what happened."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from _gui import HEADS, wait_idle

from vitviz.gui.client import parking
from vitviz.gui.session import LOAD_FAILED
from vitviz.gui.settings import STOP_WAITING_KEY, stop_waiting_seconds

BAD = Path(__file__).parents[1] / "misbehaving_code.py"


@pytest.fixture
def weights(tmp_path: Path) -> dict[str, Path]:
    """The well-behaved tiny model's weights saved as int8, and without one layer."""
    import sys

    import torch

    sys.path.insert(0, str(BAD.parent))
    try:
        import misbehaving_code
    finally:
        sys.path.remove(str(BAD.parent))
    sd = misbehaving_code.tiny().state_dict()
    int8, partial = tmp_path / "int8.pth", tmp_path / "partial.pth"
    torch.save({k: v.round().to(torch.int8) if k.endswith("weight") else v for k, v in sd.items()}, int8)
    torch.save({k: v for k, v in sd.items() if not k.startswith("qkv.1")}, partial)
    return {"int8": int8, "partial": partial}


CASES: dict[str, tuple[str, str | None, dict[str, Any], str]] = {   # factory, weights, overrides, the error says
    "sys.exit": ("exits_in_forward", None, {}, "SystemExit"),
    "KeyboardInterrupt": ("interrupts_in_forward", None, {}, "KeyboardInterrupt"),
    "BaseException": ("base_exception_in_forward", None, {}, "Bare: the forward gave up"),
    "exit while built": ("exits_when_built", None, {}, "SystemExit: 3"),
    "NaN weights": ("nan_weights", None, {}, "NaN or infinite weights in qkv.1.weight"),
    "NaN attention": ("nan_attention", None, {}, "NaN or infinite attention"),
    "meta device": ("on_meta", None, {}, "'meta' device"),
    "43 GB input": ("tiny", None, {"image_size": 60000}, "nothing was allocated"),
    "int8 weights": ("tiny", "int8", {}, "int8 into float32"),
    "missing keys": ("tiny", "partial", {}, "qkv.1.weight"),
    "long file name": ("", None, {}, "too long"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_misbehaving_code_is_one_error_and_the_model_stays(qtbot, loaded, images, weights, tmp_path,  # noqa: ANN001
                                                         case: str) -> None:
    factory, weights_name, overrides, needle = CASES[case]
    window = loaded
    s = window.session
    before = (s.model.spec, s.model.model_path)
    code = f"{tmp_path / ('m' * 300 + '.py')}:build" if case == "long file name" else f"{BAD}:{factory}"
    window.trust_code = True
    with qtbot.waitSignal(s.model.loading_changed, timeout=30000, check_params_cb=lambda busy: not busy):
        window.load_code(code, str(weights[weights_name]) if weights_name else None, **overrides)
    wait_idle(qtbot, window)
    titles = [t for t, _ in window.reporter.errors]
    assert titles == [LOAD_FAILED], window.reporter.errors
    assert needle in window.reporter.errors[0][1]
    assert (s.model.spec, s.model.model_path) == before                      # the model loaded before is still there
    window.reporter.box.close()
    s.clear_images()
    s.add_images([str(images[0])])                               # and runs
    wait_idle(qtbot, window)
    assert s.result(str(images[0])) is not None and len(window.reporter.errors) == 1


def test_nan_attention_on_a_picture_is_a_run_error(qtbot, window, images) -> None:  # noqa: ANN001
    window.trust_code = True
    with qtbot.waitSignal(window.session.model.model_loaded, timeout=30000):
        window.load_code(f"{BAD}:nan_on_images")
    window.session.add_images([str(images[0])])
    wait_idle(qtbot, window)
    assert [t for t, _ in window.reporter.errors] == ["Could not run image"]
    assert "NaN or infinite attention" in window.reporter.errors[0][1]
    assert str(images[0]) in window.session.image_list.failed


def _flag(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    flag = tmp_path / "hang"
    flag.write_text("while this file exists, the model's forward does not finish")
    monkeypatch.setenv("VITVIZ_TEST_HANG", str(flag))
    return flag


def _stop(qtbot, window) -> None:  # noqa: ANN001
    qtbot.waitUntil(window.status.stop_button.isVisible, timeout=20000)
    assert "has run 0.3 s without finishing" in window.statusBar().currentMessage()
    window.status.stop_button.click()


def _released(qtbot, flag: Path) -> None:  # noqa: ANN001
    """The given-up thread ends by itself: the exception raised in it stops the Python loop that would not end
    (the flag file still there); the flag goes afterwards in any case."""
    try:
        qtbot.waitUntil(lambda: not parking.abandoned_running(), timeout=20000)
    finally:
        flag.unlink(missing_ok=True)


def test_stop_waiting_on_a_load_brings_the_previous_model_back(qtbot, loaded, images, tmp_path,  # noqa: ANN001
                                                              monkeypatch) -> None:
    window = loaded
    s = window.session
    flag = _flag(tmp_path, monkeypatch)
    s.stop_waiting_after = 0.3
    path = s.model.model_path
    window.trust_code = True
    window.load_code(f"{BAD}:hangs")
    try:
        _stop(qtbot, window)
        with qtbot.waitSignal(s.model.model_loaded, timeout=30000):    # the model loaded before, in a fresh worker
            pass
        wait_idle(qtbot, window)
        assert s.model.model_path == path and s.model.spec.family != "live"
        assert any("Stopped waiting for the code of misbehaving_code.py:hangs after 0.3 s" in n
                   for n in window.notes)
        assert not window.status.stop_button.isVisible() and window.reporter.errors == []
        assert all(s.result(str(p)) is not None for p in images)     # its images run again
    finally:
        _released(qtbot, flag)
    with qtbot.waitSignal(s.model.model_loaded, timeout=30000):            # and the window loads what it is given
        window.load_code(f"{BAD}:tiny")
    wait_idle(qtbot, window)
    assert s.model.spec.family == "live"


def test_stop_waiting_on_a_run_reloads_the_model_and_marks_the_image(qtbot, window, images, tmp_path,  # noqa: ANN001
                                                                    monkeypatch, tiny_ckpt) -> None:
    s = window.session
    flag = _flag(tmp_path, monkeypatch)
    s.stop_waiting_after = 0.3
    window.trust_code = True
    with qtbot.waitSignal(s.model.model_loaded, timeout=30000):
        window.load_code(f"{BAD}:hangs_on_images")              # its probes finish; a picture does not
    try:
        s.add_images([str(images[0])])
        _stop(qtbot, window)
        with qtbot.waitSignal(s.model.model_loaded, timeout=30000):    # the same model again, in a fresh worker
            pass
        wait_idle(qtbot, window)
        assert s.model.spec.family == "live" and s.model.model_code == f"{BAD}:hangs_on_images"
        assert "stopped waiting after 0.3 s" in s.image_list.failed[str(images[0])]   # not run again: it would hang again
        assert any("loading" in n and "again in a fresh worker" in n for n in window.notes)
    finally:
        _released(qtbot, flag)
    with qtbot.waitSignal(s.model.model_loaded, timeout=30000):            # the window is usable
        window.load_model(str(tiny_ckpt), heads=HEADS)
    wait_idle(qtbot, window)
    assert s.result(str(images[0])) is not None and window.reporter.errors == []


def test_the_stop_waiting_time_is_a_setting(settings) -> None:  # noqa: ANN001
    assert stop_waiting_seconds(settings) == 30.0
    settings.setValue(STOP_WAITING_KEY, 5)
    assert stop_waiting_seconds(settings) == 5.0
    settings.setValue(STOP_WAITING_KEY, 0)
    assert stop_waiting_seconds(settings) is None                    # never offered
    settings.setValue(STOP_WAITING_KEY, "soon")
    assert stop_waiting_seconds(settings) == 30.0
    assert os.environ.get("VITVIZ_TEST_HANG") is None
