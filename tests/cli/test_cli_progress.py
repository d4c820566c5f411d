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


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_download_that_never_starts_draws_no_zero_bytes_line() -> None:
    """An unreachable or offline hub calls the bar with (0, None) while it waits; on a terminal that drew a stray
    '0 B' line above the error (issue 35). The first byte draws the bar."""
    term = _Terminal()
    bar = ProgressBar(stream=term, tty_only=False)
    for _ in range(3):
        bar(0, None)
    bar.close()
    assert term.getvalue() == ""
    bar(2048, None)
    bar.close()
    assert term.getvalue() == "\r2.0 kB\n"


def test_offline_timm_name_fails_before_importing_timm(tmp_path) -> None:  # noqa: ANN001
    """Offline (HF_HUB_OFFLINE) a timm name whose architecture has nothing in the cache fails at once, naming the
    cache, without importing timm for its default tag (that import made the error take seconds; issue 35); a
    cached tag is still looked up by timm. No network is touched either way."""
    import subprocess
    import sys

    code = ("import sys\nfrom vitviz.catalog.hub import resolve_hub, HubError\n"
            "try:\n    resolve_hub('timm:vit_tiny_patch16_224', cache_dir=sys.argv[1])\n"
            "except HubError as e:\n    print('error:', e)\nprint('timm imported:', 'timm' in sys.modules)\n")
    env = {**__import__("os").environ, "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, env=env,
                         check=True).stdout
    assert "timm imported: False" in out, out
    assert "offline (HF_HUB_OFFLINE is set)" in out and str(tmp_path) in out and "timm/vit_tiny_patch16_224" in out
    (tmp_path / "models--timm--vit_tiny_patch16_224.augreg_in21k_ft_in1k").mkdir()   # a tag is cached: timm asked
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, env=env,
                         check=True).stdout
    assert "timm imported: True" in out and "error:" in out, out
