"""The command line's map of itself: `vitviz --help` lists the commands with an example each, every command's help
names the model names it takes, `--json` documents carry a schema, `vitviz --info` reports the environment."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from vitviz.cli import SUBCOMMANDS, build_parser, main
from vitviz.cli.about import COMMANDS
from vitviz.cli.jsonout import schema

README = Path(__file__).resolve().parents[2] / "README.md"


def test_top_level_help_is_a_short_map_of_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert len(out.splitlines()) < 40
    for command in SUBCOMMANDS:
        assert f"  {command} " in out and f"vitviz {command} " in out   # one line and an example each
    assert {c for c, _, _ in COMMANDS} >= set(SUBCOMMANDS)
    assert "--help-all" in out and "--info" in out and "hf:" in out
    assert main(["--help-all"]) == 0   # the window's options are still all there, one flag away
    assert "--screenshot" in capsys.readouterr().out


@pytest.mark.parametrize("command", ["info", "export", "verify"])
def test_model_names_are_in_every_commands_help(command: str) -> None:
    sub = build_parser()._subparsers._group_actions[0].choices[command]   # noqa: SLF001
    text = sub.format_help()
    assert "hf:ORG/NAME[@REVISION]" in text and "timm:NAME[.TAG]" in text and "torchvision:ARCH" in text


def test_json_outputs_carry_a_schema(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    assert main(["models", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == "vitviz.models/1" and doc["models"] == []
    assert main(["models", "--named", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == "vitviz.named/1" and doc["models"][0]["name"].startswith("torchvision:")
    from _tiny import write_tiny_checkpoint

    assert main(["info", str(write_tiny_checkpoint(tmp_path / "t.pth")), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert list(doc)[0] == "schema" and doc["schema"] == schema("info") == "vitviz.info/1"
    text = README.read_text(encoding="utf-8")
    for kind in ("info", "verify", "models", "named", "get"):   # every document is described in the README
        assert f"vitviz.{kind}/1" in text


def test_info_reports_versions_devices_and_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("VITVIZ_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("VITVIZ_SETTINGS", str(tmp_path / "s.ini"))
    assert main(["--info"]) == 0
    out = capsys.readouterr().out
    for key in ("vitviz: ", "torch: ", "CUDA devices: ", "Qt: ", "Settings (window): ", "Answers ", "Cache "):
        assert key in out
    assert str(tmp_path / "cache") in out and str(tmp_path / "s.ini") in out


def test_readme_lists_every_environment_variable_vitviz_reads() -> None:
    import re

    package = Path(__file__).resolve().parents[2] / "vitviz"
    names = set()
    for path in package.rglob("*.py"):
        names |= set(re.findall(r"\b(VITVIZ_[A-Z_]+)\b", path.read_text(encoding="utf-8")))
    names -= {"VITVIZ_RAY_TEST_DIE_ONCE", "VITVIZ_RAY_TEST_GATE", "VITVIZ_"}   # test hooks
    text = README.read_text(encoding="utf-8").split("## Environment and files", 1)[1]
    missing = sorted(n for n in names if n not in text)
    assert not missing, f"not in the README's Environment and files: {missing}"
