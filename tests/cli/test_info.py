"""`vitviz info` and remembered answers (issue 30): what the window remembered for a file ("Remember for this
file") is said as remembered wherever the model is shown -- info's table, its JSON, the export manifest -- never as a
plain override, and `vitviz info FILE --forget` forgets it, leaving those settings assumed again."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from _tiny import write_tiny_checkpoint

from vitviz.catalog import answers
from vitviz.cli import main


def _row(out: str, name: str) -> str:
    return next(line for line in out.splitlines() if line.split()[:1] == [name])


def test_a_remembered_answer_is_said_as_remembered(tiny_ckpt: Path, capsys: pytest.CaptureFixture[str]) -> None:
    answers.remember(str(tiny_ckpt), {"heads": 4, "block_norm": "post"})
    assert main(["info", str(tiny_ckpt)]) == 0
    captured = capsys.readouterr()
    heads = _row(captured.out, "num_heads")
    assert heads.split()[1:3] == ["4", "given"]
    assert "(remembered: you answered 4 in the window for this file (forget: vitviz info FILE --forget" in heads
    assert "override" not in heads
    assert "remembered: you answered post" in _row(captured.out, "block_norm")
    assert "attn_scale" in _row(captured.out, "attn_scale") and "assumed" in _row(captured.out, "attn_scale")
    assert f"vitviz info {tiny_ckpt} --forget to forget" in captured.err
    assert main(["info", str(tiny_ckpt), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["provenance"]["num_heads"].startswith("remembered: you answered 4")
    assert data["provenance_kinds"]["num_heads"] == "given" and "num_heads" not in data["assumptions"]
    assert data["provenance_kinds"]["block_norm"] == "given"


def test_an_answer_typed_now_is_an_override_not_a_remembered_one(tiny_ckpt: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    answers.remember(str(tiny_ckpt), {"heads": 4, "block_norm": "post"})
    assert main(["info", str(tiny_ckpt), "--heads", "2", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["num_heads"] == 2 and data["provenance"]["num_heads"] == "override"
    assert data["provenance"]["block_norm"].startswith("remembered: you answered post")


def test_the_export_manifest_says_remembered(tiny_ckpt: Path, photo: Path, tmp_path: Path) -> None:
    answers.remember(str(tiny_ckpt), {"heads": 4})
    out = tmp_path / "out"
    assert main(["export", "--model", str(tiny_ckpt), str(photo), "--out", str(out), "--quiet"]) == 0
    spec = json.loads((out / "manifest.json").read_text())["model"]["spec"]
    assert spec["num_heads"] == 4 and spec["provenance"]["num_heads"].startswith("remembered: you answered 4")
    assert spec["provenance_kinds"]["num_heads"] == "given"


def test_forget_drops_the_answers_and_they_are_assumed_again(tiny_ckpt: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    answers.remember(str(tiny_ckpt), {"heads": 4, "attn_scale": 0.0})
    assert main(["info", str(tiny_ckpt), "--forget"]) == 0
    captured = capsys.readouterr()
    assert f"forgot what you told the window for {tiny_ckpt}: attn_scale 0.0, heads 4" in captured.err
    assert answers.answers_for(str(tiny_ckpt)) == {} and answers.read_all() == {}
    heads = _row(captured.out, "num_heads")
    assert heads.split()[1:3] == ["1", "assumed"] and "(guess: width 32" in heads
    assert "remembered" not in captured.out and "!! GUESSED num_heads" in captured.out
    assert main(["info", str(tiny_ckpt), "--forget"]) == 0                    # nothing left: said so
    assert f"nothing was remembered for {tiny_ckpt}" in capsys.readouterr().err


def test_forget_keeps_the_other_files_answers(tiny_ckpt: Path, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    other = write_tiny_checkpoint(tmp_path / "other.pth")
    answers.remember(str(tiny_ckpt), {"heads": 4})
    answers.remember(str(other), {"heads": 2})
    assert main(["info", str(tiny_ckpt), "--forget", "--json"]) == 0
    capsys.readouterr()
    assert answers.answers_for(str(tiny_ckpt)) == {} and answers.answers_for(str(other)) == {"heads": 2}


def test_forget_needs_a_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info", "--code", "nowhere.py:build", "--forget"]) == 2
    assert "--forget needs a CHECKPOINT" in capsys.readouterr().err
