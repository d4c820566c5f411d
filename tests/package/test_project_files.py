"""Issue 33's conventions that live in the project's files: the package index's page and the test suite's
warnings filter."""
from __future__ import annotations

import email
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RELATIVE_PICTURE = re.compile(r"!\[[^\]]*\]\((?![a-z][a-z0-9+.-]*://)")


def test_the_package_index_page_has_no_relative_pictures(tmp_path: Path) -> None:
    """The metadata's long description (what the index shows) has every README picture's caption and no picture
    by a relative path (which the index shows broken); no address is made up for them."""
    code = f"from setuptools import build_meta as b; print(b.prepare_metadata_for_build_wheel({str(tmp_path)!r}))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    metadata = email.message_from_string((tmp_path / r.stdout.split()[-1] / "METADATA").read_text(encoding="utf-8"))
    body = metadata.get_payload()
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    captions = re.findall(r"!\[([^\]]*)\]\(", readme)
    assert captions and RELATIVE_PICTURE.search(readme)       # the README itself keeps its pictures
    assert not RELATIVE_PICTURE.search(body)
    assert all(f"*(picture: {caption})*" in body for caption in captions)
    assert metadata["Description-Content-Type"] == "text/markdown"
    assert "## Layout" in body and len(body) > len(readme) // 2       # the README, not a stub


def test_vitviz_guess_warnings_stay_out_of_the_warnings_summary(tmp_path: Path) -> None:
    """pyproject's filter keeps vitviz's own GuessWarnings (raised on purpose by the tiny fixtures) out of the
    summary, and only them: another warning is still listed."""
    (tmp_path / "test_warns.py").write_text(
        "import warnings\nfrom vitviz.core.spec import GuessWarning\n\n\ndef test_warns():\n"
        "    warnings.warn(GuessWarning('a guessed value'))\n    warnings.warn(UserWarning('an unexpected one'))\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c",
                        str(ROOT / "pyproject.toml"), "--rootdir", str(tmp_path), str(tmp_path / "test_warns.py")],
                       capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:]
    assert "an unexpected one" in r.stdout and "1 warning" in r.stdout
    assert "GuessWarning" not in r.stdout and "a guessed value" not in r.stdout
