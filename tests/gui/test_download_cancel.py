"""Cancelling a named model's download from the status bar: the download stops at its next chunk, the request
answers `cancelled` (no error box), and the model loaded before stays."""
from __future__ import annotations

import time
from pathlib import Path

import pytest
from _fakehub import SilentHub
from _gui import load_model


def test_cancel_button_stops_a_download_and_keeps_the_model(qtbot, window, tiny_ckpt, images,  # noqa: ANN001
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from vitviz import catalog

    load_model(qtbot, window, tiny_ckpt, images)
    before = window.session.model.spec
    chunks: list[int] = []

    def slow_download(name: str, progress=None, **_kw):  # noqa: ANN001, ANN202 - stands in for the hub
        for i in range(2000):        # 2000 chunks of 1 MB, each a new percent step every 20 chunks
            chunks.append(i)
            progress(i * 2**20, 2000 * 2**20)
            time.sleep(0.002)
        raise AssertionError("the download was not cancelled")

    monkeypatch.setattr(catalog, "resolve_named", slow_download)
    button = window.status.cancel_button
    assert not button.isVisible()
    window.load_model("hf:acme/slow-model")
    qtbot.waitUntil(lambda: button.isVisible(), timeout=20000)
    assert "Downloading hf:acme/slow-model" in window.statusBar().currentMessage()
    with qtbot.waitSignal(window.session.client.busy_changed, timeout=20000,
                          check_params_cb=lambda busy: not busy):
        button.click()
    assert 0 < len(chunks) < 2000
    assert not button.isVisible()
    assert window.session.model.spec is before and window.reporter.errors == []


def test_cancel_stops_a_load_while_the_hub_is_silent(qtbot, window, tiny_ckpt, images,  # noqa: ANN001
                                                    monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    load_model(qtbot, window, tiny_ckpt, images)
    before = window.session.model.spec
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
    assert window.session.model.spec is before and window.reporter.errors == []
