"""`vitviz.cli.progress`: a bar on a terminal, whole lines anywhere else (logs, SLURM, nohup, CI); `-q` / `-v` on
every command."""
from __future__ import annotations

import io

import pytest

from vitviz.cli import build_parser, window_parser
from vitviz.cli.progress import ProgressBar


def test_images_progress_is_lines_when_not_a_terminal() -> None:
    log = io.StringIO()
    bar = ProgressBar(20, stream=log)
    for _ in range(20):
        bar.advance()
    bar.close()
    lines = log.getvalue().splitlines()
    assert "\r" not in log.getvalue()
    assert lines[0].startswith("vitviz: 1/20 images (5%)") and lines[-1].startswith("vitviz: 20/20 images (100%)")
    assert len(lines) == 11   # the first, then one per tenth: not one per image


def test_download_progress_is_lines_when_not_a_terminal() -> None:
    log = io.StringIO()
    bar = ProgressBar(stream=log, tty_only=False)
    for done in range(0, 1001, 50):
        bar(done, 1000)
    assert "\r" not in log.getvalue()
    lines = log.getvalue().splitlines()
    assert 10 <= len(lines) <= 12 and lines[-1].endswith("(100%)")


def test_quiet_progress_prints_nothing() -> None:
    log = io.StringIO()
    bar = ProgressBar(3, stream=log, enabled=False)
    bar.advance(3)
    bar(10, 10)
    assert log.getvalue() == ""


@pytest.mark.parametrize("command", ["info", "export", "models", "verify"])
def test_every_command_takes_quiet_and_verbose(command: str) -> None:
    required = {"info": [], "export": ["x.png", "--out", "o"], "models": [], "verify": ["m.pth"]}[command]
    args = build_parser().parse_args([command, *required, "-q", "-v"])
    assert args.quiet and args.verbose


def test_the_window_takes_quiet_and_verbose() -> None:
    args = window_parser().parse_args(["-q", "-v"])
    assert args.quiet and args.verbose
