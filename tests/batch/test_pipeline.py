"""The export pipeline (`vitviz.batch.pipeline`, `vitviz export`) under hostile conditions (issue 13): a full disk
stops the run once naming the output folder; SIGTERM stops it promptly and the manifest records what was written."""
from __future__ import annotations

import errno
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from _hostile import subprocess_env
from _tiny import write_tiny_checkpoint
from PIL import Image

from vitviz.cli import main

pytestmark = [pytest.mark.filterwarnings("ignore::vitviz.core.spec.GuessWarning"),
              pytest.mark.filterwarnings("ignore:.*not a mapping of settings:UserWarning")]


@pytest.fixture
def export_inputs(tmp_path: Path) -> tuple[Path, Path]:
    model = write_tiny_checkpoint(tmp_path / "tiny.pth")
    folder = tmp_path / "images"
    folder.mkdir()
    for i in range(4):
        Image.new("RGB", (40, 40), (60 * i, 0, 0)).save(folder / f"img{i}.png")
    return model, folder


@pytest.mark.parametrize("manifest_fails", [False, True])
def test_export_on_a_full_disk(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path,
                               export_inputs: tuple[Path, Path], manifest_fails: bool) -> None:
    """ENOSPC: the run stops once, says the disk is full naming the output folder (not an input), exit 2, no
    traceback -- also when manifest.json cannot be written; the manifest, when written, records what is on disk."""
    from vitviz.core import files
    real = files._atomic_write
    writes = [0]

    def full_after_three(path: Any, write: Any, overwrite: bool) -> Path:
        writes[0] += 1
        if writes[0] > 3 and (manifest_fails or not str(path).endswith("manifest.json")):
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real(path, write, overwrite)

    monkeypatch.setattr(files, "_atomic_write", full_after_three)
    model, folder = export_inputs
    out = tmp_path / "out"
    rc = main(["export", "--model", str(model), "--heads", "2", str(folder), "--out", str(out), "--layers", "all",
               "--batch-size", "1", "--workers", "1"])
    err = capsys.readouterr().err
    assert rc == 2
    assert f"vitviz: error: {out}" in err and "the disk is full" in err, err
    assert "vitviz: skipped" not in err and "Traceback" not in err and "img0.png: " not in err
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert len(pngs) == 3
    if manifest_fails:
        assert "manifest.json could not be written" in err and not (out / "manifest.json").exists()
        return
    manifest = json.loads((out / "manifest.json").read_text())
    listed = sorted(Path(o).name for image in manifest["images"] for o in image["outputs"])
    assert listed == pngs and manifest["summary"]["files"] == 3 and manifest["summary"]["interrupted"]
    for image in manifest["images"]:
        assert image["status"] != "done" or all((out / o).exists() for o in image["outputs"])


SLOW_EXPORT = """
import sys, time
from vitviz.core import files
real = files.write_png_atomic
def slow(*args, **kwargs):
    time.sleep(0.05)
    return real(*args, **kwargs)
files.write_png_atomic = slow
from vitviz.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_sigterm_stops_an_export_promptly_and_records_what_was_written(tmp_path: Path) -> None:
    """SIGTERM mid-export: exit 130 within 10 s; the summary counts the files on disk and the manifest lists each
    of them, images whose files are all there as done."""
    model = write_tiny_checkpoint(tmp_path / "tiny.pth")
    folder = tmp_path / "images"
    folder.mkdir()
    for i in range(80):
        Image.new("RGB", (40, 40), (i, 0, 0)).save(folder / f"img{i:02d}.png")
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-c", SLOW_EXPORT, "export", "--model", str(model), "--heads", "2",
                             str(folder), "--out", str(out), "--layers", "all", "--which-heads", "all"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=subprocess_env())
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(list(out.glob("*.png"))) < 10:
        time.sleep(0.05)
    assert proc.poll() is None, proc.communicate()
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        _stdout, stderr = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("SIGTERM did not stop the export within 30 s")
    took = time.monotonic() - sent
    assert proc.returncode == 130 and took < 10, (proc.returncode, took, stderr[-1000:])
    assert "Traceback" not in stderr and "vitviz export interrupted" in stderr
    pngs = {p.name for p in out.glob("*.png")}
    manifest = json.loads((out / "manifest.json").read_text())
    listed = {Path(o).name for image in manifest["images"] for o in image["outputs"]}
    assert listed == pngs and manifest["summary"]["files"] == len(pngs) and manifest["summary"]["interrupted"]
    done = [image for image in manifest["images"] if image["status"] == "done"]
    assert done and all(len(image["outputs"]) == 4 for image in done)   # 2 layers x 2 heads
    assert f"{manifest['summary']['done']} done" in stderr and f"{len(pngs)} files written" in stderr
    assert not list(out.glob(".*.tmp"))    # no half-written file left behind
