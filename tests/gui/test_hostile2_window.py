"""Hostile inputs, round two (issue 20), in the window: Models › Open by name checks a name as the library does
(a revision that could lead out of the cache never reaches the worker), and the status bar's Cancel stops a load
while the hub has not answered yet (the metadata phase), keeping the model loaded before."""
from __future__ import annotations

from pathlib import Path

import pytest
from _fakehub import SilentHub
from _gui import load_model
from PySide6.QtWidgets import QInputDialog


@pytest.mark.parametrize("name, needle", [
    ("hf:acme/tiny@../../../x", "revision '../../../x' holds '..'"),
    ("hf:acme/tiny@/etc/evil", "revision '/etc/evil'"),
    ("hf:acme/tiny@ma\u00efn", "non-ASCII"),
    ("hf:a--b/c", "'--'"),
    ("hf:org/name.git", ".git"),
    ("torchvision:vit_b_16:../x", "weights '../x'"),
])
def test_open_by_name_refuses_what_the_library_refuses(qtbot, window, monkeypatch: pytest.MonkeyPatch,  # noqa: ANN001
                                                       tmp_path: Path, name: str, needle: str) -> None:
    asked: list[str] = []
    monkeypatch.setattr(window.session, "load_model", lambda path, device=None, **kw: asked.append(path))
    monkeypatch.setattr(QInputDialog, "getText", lambda *_a, **_k: (name, True))
    window.models.by_name_action.trigger()
    assert asked == []
    title, text = window.reporter.errors[-1][:2]
    assert title == "Not a model name" and needle in text and "expected" in text
    window.reporter.box.close()


def test_cancel_stops_a_load_while_the_hub_is_silent(qtbot, window, tiny_ckpt, images,  # noqa: ANN001
                                                    monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    load_model(qtbot, window, tiny_ckpt, images)
    before = window.session.spec
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("VITVIZ_HUB_TIMEOUT", "60")
    with SilentHub() as silent:
        monkeypatch.setenv("HF_ENDPOINT", silent.url)
        button = window.status.cancel_button
        window.open_by_name("hf:acme/silent-model")
        qtbot.waitUntil(lambda: button.isVisible(), timeout=20000)   # shown while the hub is asked
        assert "Downloading hf:acme/silent-model" in window.statusBar().currentMessage()
        with qtbot.waitSignal(window.session.client.busy_changed, timeout=120000,   # beyond the hub's 60 s: a
                              check_params_cb=lambda busy: not busy):             # cancel that failed is an error
            button.click()
    assert not button.isVisible()
    assert window.session.spec is before and window.reporter.errors == []


def test_nan_maps_are_an_error_box_not_a_picture(qtbot, window, tiny_ckpt, images,  # noqa: ANN001
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A normalisation that overflows (its load check disabled here) gives NaN attention: the window says so,
    naming the setting, and keeps running."""
    from _gui import HEADS, wait_idle

    from vitviz.core.reading import validate
    monkeypatch.setattr(validate, "normalized_reach", lambda _m, _s: 0.0)
    with qtbot.waitSignal(window.session.model_loaded, timeout=20000):
        window.load_model(str(tiny_ckpt), heads=HEADS, std=(1e-30,))
    window.session.add_images([str(images[0])])
    wait_idle(qtbot, window)
    qtbot.waitUntil(lambda: bool(window.reporter.errors), timeout=20000)
    text = " ".join(summary for _title, summary in window.reporter.errors)
    assert "NaN or infinite attention" in text and "std (1e-30,)" in text
    window.reporter.box.close()
    window.load_model(str(tiny_ckpt), heads=HEADS)        # the window still works
    wait_idle(qtbot, window)
