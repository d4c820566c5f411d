"""vitviz's own small files -- the remembered answers, remembered verdicts, shape signatures -- are read only when
they are small regular files (issue 34: the answers store as a FIFO hung info, export and the window; as /dev/zero
it read 4 GiB). The one path check (`vitviz.core.files.check_path`) refuses a name holding a NUL character, and
configs read by name (a cache scan, the text tower's) are read through it too."""
from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from _hostile import fifo, random_png

import vitviz
from vitviz.batch.jobs import InputError
from vitviz.core.files import read_small_json
from vitviz.errors import VitvizError


def _bounded(call, seconds: float = 20.0):  # noqa: ANN001, ANN202
    """`call()` in a thread; fails the test (instead of hanging it) when it does not return in time."""
    box: dict = {}
    worker = threading.Thread(target=lambda: box.setdefault("value", call()), daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), "blocked"
    return box.get("value")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_or_dev_zero_is_no_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from vitviz.catalog import answers

    fifo = tmp_path / "answers.json"
    os.mkfifo(fifo)
    assert _bounded(lambda: read_small_json(fifo)) is None
    monkeypatch.setenv("VITVIZ_ANSWERS", str(fifo))
    assert _bounded(answers.read_all) == {}
    if os.path.exists("/dev/zero"):
        monkeypatch.setenv("VITVIZ_ANSWERS", "/dev/zero")
        assert _bounded(answers.read_all) == {}
        (tmp_path / "zero").symlink_to("/dev/zero")
        assert _bounded(lambda: read_small_json(tmp_path / "zero")) is None


def test_small_json_is_read_and_a_large_or_broken_one_is_not(tmp_path: Path) -> None:
    good, big, bad = tmp_path / "good.json", tmp_path / "big.json", tmp_path / "bad.json"
    good.write_text('{"a": 1}')
    big.write_text('{"a": "' + "x" * 2048 + '"}')
    bad.write_text("{not json")
    assert read_small_json(good) == {"a": 1}
    assert read_small_json(big, limit=1024) is None and read_small_json(bad) is None
    assert read_small_json(tmp_path / "missing.json") is None


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_remembered_verdict_that_is_a_fifo_is_checked_again(tiny_ckpt: Path, monkeypatch: pytest.MonkeyPatch,
                                                             tmp_path: Path) -> None:
    import warnings

    import vitviz
    from vitviz.core.analyses import verify as verify_module
    from _tiny import HEADS

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = vitviz.load(tiny_ckpt, heads=HEADS)
    store = verify_module._store(model, "auto", None)
    store.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(store)
    assert _bounded(lambda: verify_module.remembered_verification(model)) is None


# ---------------------------------------------------------------------- names with NUL, configs read by name (issue 34)

def test_a_name_with_a_nul_character_is_refused_by_the_path_check(tmp_path: Path) -> None:
    """Found by scripts/hostile3/fuzz.py: os.stat's ValueError ('embedded null byte') escaped the one check."""
    from vitviz.batch.ray_engine import fetch
    from vitviz.core.files import check_path

    fetch(random_png(tmp_path / "a.png").as_uri())       # file:// known: a NUL then reaches the path check
    with pytest.raises(InputError, match="NUL character"):
        fetch("file:///tmp/a\x00.png")
    with pytest.raises(InputError, match="NUL character"):
        check_path(str(tmp_path / "a\x00b"), "a file", missing=InputError, bad=InputError)
    with pytest.raises(VitvizError, match="NUL character"):
        vitviz.load(str(tmp_path / "m\x00.pth"))


def test_cache_scans_and_text_configs_read_only_regular_json(tmp_path: Path) -> None:
    """`vitviz models` scanning a cache and the text tower's config read a config.json by name through the one
    check: a FIFO is skipped (it hung the scan's read), nesting 200,000 deep is no config (RecursionError)."""
    import importlib

    scan = importlib.import_module("vitviz.catalog.scan")
    text = importlib.import_module("vitviz.core.analyses.text")
    pipe = fifo(tmp_path / "config.json")
    assert scan._read_json(pipe) is None
    deep = tmp_path / "deep"
    deep.mkdir()
    (deep / "config.json").write_text('{"model_type": "clip", "x": ' + "[" * 200_000 + "]" * 200_000 + "}")
    assert scan._read_json(deep / "config.json") is None
    assert text._hf_config(deep) is None and text._hf_config(tmp_path) is None
