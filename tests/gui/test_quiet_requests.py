"""Quiet requests (`Request.quiet`, `vitviz.gui.client.QUIET_MS`): a request that is said where it was asked for
(an ablate click's run: its banner and the Interventions dock) reaches the status bar only when it runs long; a
request that is not quiet is said at once, as before."""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from vitviz.gui import client as client_mod
from vitviz.gui.protocol import Independent


@dataclass(eq=False)
class _Wait(Independent):
    """Waits in the worker until `go` is set (the test decides when it ends, never a clock)."""

    go: threading.Event | None = None
    loud: bool = False

    @property
    def quiet(self) -> bool:  # type: ignore[override]
        return not self.loud

    def describe(self) -> str:
        return "Waiting…"

    def __call__(self, _ctx: Any) -> None:
        self.go.wait(30)


def _client(qtbot):  # noqa: ANN001, ANN202
    client = client_mod.WorkerClient()
    said: list[Any] = []
    client.busy_changed.connect(lambda busy: said.append(busy))
    client.status.connect(lambda text: said.append(text))
    return client, said


def test_a_quick_quiet_request_says_nothing(qtbot, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setattr(client_mod, "QUIET_MS", 60_000)     # it ends long before: nothing is said
    client, said = _client(qtbot)
    go = threading.Event()
    go.set()
    with qtbot.waitSignal(client.answered, timeout=20000):
        client.submit(_Wait, go=go)
    qtbot.waitUntil(lambda: not client.busy, timeout=20000)
    assert said == []
    assert client.shutdown()


def test_a_long_quiet_request_is_said_and_ends_ready(qtbot, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setattr(client_mod, "QUIET_MS", 1)          # past at once: said while it still runs
    client, said = _client(qtbot)
    go = threading.Event()
    with qtbot.waitSignal(client.answered, timeout=20000):
        client.submit(_Wait, go=go)
        qtbot.waitUntil(lambda: "Waiting…" in said, timeout=20000)
        go.set()
    qtbot.waitUntil(lambda: not client.busy, timeout=20000)
    assert said[0] is True and said[-2:] == ["Ready", False]
    assert client.shutdown()


def test_a_loud_request_is_said_at_once(qtbot, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setattr(client_mod, "QUIET_MS", 60_000)
    client, said = _client(qtbot)
    go = threading.Event()
    client.submit(_Wait, go=go, loud=True)
    assert said == [True]                                   # at submit, before the worker has started it
    qtbot.waitUntil(lambda: "Waiting…" in said, timeout=20000)
    go.set()
    qtbot.waitUntil(lambda: not client.busy, timeout=20000)
    assert said[-2:] == ["Ready", False]
    assert client.shutdown()
