"""`vitviz export` picture options the window also has: the labelled colour bar (byte-identical to the window's
export), and the notice before drawing maps over huge originals."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from _tiny import write_tiny_checkpoint
from PIL import Image

import vitviz
from vitviz.cli import main
from vitviz.core.analyses.maps import ResultMaps
from vitviz.gui import exporting
from vitviz.gui.state import ViewState

HEADS = 2


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("pictures")
    image = folder / "img.png"
    Image.fromarray(np.random.default_rng(2).integers(0, 256, (40, 52, 3), dtype=np.uint8)).save(image)
    return write_tiny_checkpoint(folder / "tiny.pth"), image


def _cli(ckpt: Path, image: Path, out: Path, *args: str) -> int:
    return main(["export", "--model", str(ckpt), "--heads", str(HEADS), str(image), "--out", str(out),
                 "--layers", "all", "--which-heads", "all,mean", "--device", "cpu", *args])


def test_labelled_colorbar_is_the_windows(files: tuple[Path, Path], tmp_path: Path) -> None:
    ckpt, image = files
    maps = ResultMaps(vitviz.load(ckpt, heads=HEADS, device="cpu").run(image))
    window = tmp_path / "window"
    window.mkdir()
    state = ViewState()
    state.update(source="rollout", rollout_fusion="max")
    exporting.export_all(maps, state, window, colorbar=True, label=True)
    assert _cli(ckpt, image, tmp_path / "cli", "--maps", "rollout", "--fusion", "max", "--colorbar",
                "--colorbar-label", "--quiet") == 0
    ours = {p.name: p.read_bytes() for p in window.glob("*.png")}
    theirs = {p.name: p.read_bytes() for p in (tmp_path / "cli").glob("*.png")}
    assert ours and ours == theirs
    assert _cli(ckpt, image, tmp_path / "plain", "--maps", "rollout", "--fusion", "max", "--colorbar", "--quiet") == 0
    plain = {p.name: p.read_bytes() for p in (tmp_path / "plain").glob("*.png")}
    assert plain.keys() == ours.keys() and all(plain[k] != ours[k] for k in ours)   # the label is drawn


def test_huge_originals_are_announced(files: tuple[Path, Path], tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    ckpt, _ = files
    big = tmp_path / "big.png"
    Image.new("RGB", (5000, 4000), (20, 30, 40)).save(big)
    assert _cli(ckpt, big, tmp_path / "input", "--size", "input", "--layers", "last", "--which-heads", "mean") == 0
    assert "megapixels" not in capsys.readouterr().err
    assert _cli(ckpt, big, tmp_path / "orig", "--layers", "last", "--which-heads", "mean") == 0
    err = capsys.readouterr().err
    assert "1 image(s) are over 16 megapixels" in err and "big.png, 5000x4000" in err and "--size input" in err
