"""The answers store (`vitviz.catalog.answers`, "remember for this file") attacked (issue 34): a store nested too
deeply is no store and said, values that loading would refuse are never remembered, a store that cannot be read is
never overwritten, and answers remembered at once are all kept."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from _hostile import DEMO

from vitviz.cli import main


def test_an_answers_store_nested_too_deeply_is_no_store_and_said(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture) -> None:
    from vitviz.catalog import answers

    store = tmp_path / "answers.json"
    store.write_text("[" * 200_000 + "]" * 200_000)
    monkeypatch.setenv("VITVIZ_ANSWERS", str(store))
    with pytest.warns(RuntimeWarning, match="answers.json: JSON nested too deeply"):
        assert answers.read_all() == {}
    assert main(["info", str(DEMO)]) == 0
    err = capsys.readouterr().err
    assert "RecursionError" not in err and "Traceback" not in err


def test_remember_refuses_what_loading_would_refuse(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from vitviz.catalog import answers
    from vitviz.errors import OverrideError

    store = tmp_path / "answers.json"
    monkeypatch.setenv("VITVIZ_ANSWERS", str(store))
    for values in ({"attn_scale": float("inf")}, {"heads": 10**30}, {"heads": 2.5}, {"attn_scale": float("nan")},
                   {"block_norm": "sideways"}):
        with pytest.raises(OverrideError, match=f"{store.name}: not remembered for"):
            answers.remember(str(DEMO), values)
    assert not store.exists()
    answers.remember(str(DEMO), {"heads": 4, "attn_scale": 0.25})
    assert answers.answers_for(str(DEMO)) == {"heads": 4, "attn_scale": 0.25}
    # a store written by hand (or by an older vitviz) with such values: they are dropped when read, never applied
    store.write_text(json.dumps({str(DEMO.absolute()): {"heads": 10**30, "attn_scale": 1e999, "act": "gelu"}})
                     .replace("Infinity", "1e999"))
    assert answers.answers_for(str(DEMO)) == {"act": "gelu"}


def test_remembering_into_an_unreadable_store_leaves_it_as_it_is(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A store the user may still want (a typo in a hand edit, a JSON list) is never overwritten: `remember` says
    why it cannot, naming it; the window's `write_all` leaves it too."""
    from vitviz.catalog import answers

    store = tmp_path / "answers.json"
    monkeypatch.setenv("VITVIZ_ANSWERS", str(store))
    for text in ('{"/m": {"heads": 4}, oops', "[1, 2]"):
        store.write_text(text)
        with pytest.raises(answers.AnswersStoreError, match=f"{store}.*nothing remembered, the store is left"):
            answers.remember("/other", {"heads": 2})
        answers.write_all({"/other": {"heads": 2}})     # the window's write, after its read said the store
        assert store.read_text() == text
        with pytest.warns(answers.UnreadableStoreWarning):
            assert answers.forget("/m") == {} and store.read_text() == text


def test_remembering_at_once_loses_no_answer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Eight threads remember at once (as the window and a command line may): each read-change-write holds the
    store's lock, so none overwrites another's answer."""
    import threading
    import time

    from vitviz.catalog import answers

    monkeypatch.setenv("VITVIZ_ANSWERS", str(tmp_path / "answers.json"))
    real = answers._stored

    def slow_read():  # noqa: ANN202 - a slow disk: without the lock the others read the same old content meanwhile
        found = real()
        time.sleep(0.05)
        return found

    monkeypatch.setattr(answers, "_stored", slow_read)
    threads = [threading.Thread(target=answers.remember, args=(f"/m{i}", {"heads": 4})) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(answers.read_all()) == [f"/m{i}" for i in range(8)]
