"""Export's memory is flat in the image count (issue 36): the maps of an image are let go once its files are
written, so however many images an export writes, the attention arrays alive at once stay within the two batches
in flight (the one running and one being written), counted through weak references at every forward; `--memory`
sets the batch so that they fit it, and a budget that cannot be met is refused."""
from __future__ import annotations

import gc
import time
import weakref
from pathlib import Path

import numpy as np
import pytest
from _exports import timm_folder_and_images

from vitviz.cli import main as vitviz_main
from vitviz.core.running.capture import VitModel

timm = pytest.importorskip("timm")
pytestmark = pytest.mark.filterwarnings("ignore::vitviz.core.spec.GuessWarning")


def _model_and_images(tmp_path: Path, count: int) -> tuple[Path, list[Path]]:
    return timm_folder_and_images(tmp_path, count, img_size=32, depth=2, heads=2, image_px=40)


def _most_alive(monkeypatch: pytest.MonkeyPatch, argv: list[str], maps: str = "cls") -> tuple[int, int, int, int]:
    """Run `vitviz export argv`; (forwards, the largest batch, the most batches' maps alive at once, their most
    bytes alive at once)."""
    alive: list[weakref.ref] = []
    most = [0, 0, 0]
    forward = VitModel.forward_captured

    def watched(self: VitModel, *a: object, **k: object) -> tuple[np.ndarray, np.ndarray]:
        attn, out = forward(self, *a, **k)
        alive.append(weakref.ref(attn))
        gc.collect()        # what is still held, not garbage in a reference cycle the collector has yet to visit
        held = [r() for r in alive if r() is not None]   # this batch's and those not yet written
        most[0], most[1] = max(most[0], len(held)), max(most[1], sum(a.nbytes for a in held))
        most[2] = max(most[2], len(attn))
        return attn, out

    monkeypatch.setattr(VitModel, "forward_captured", watched)
    assert vitviz_main(["export", *argv, "--maps", maps, "--quiet", "--no-verify", "--workers", "1"]) == 0
    monkeypatch.undo()
    return len(alive), most[2], most[0], most[1]


def test_maps_alive_during_export_do_not_grow_with_the_images(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    folder, paths = _model_and_images(tmp_path, 12)
    forwards, _, most, _ = _most_alive(monkeypatch, ["--model", str(folder), *map(str, paths), "--out",
                                                  str(tmp_path / "out"), "--batch-size", "1"])
    assert forwards == 12   # one forward per image
    # the pipeline's bound: the image being run and one whose writes are still pending -- 2 of 12, whatever the
    # count of images (a batch runs only once at most one batch waits for its PNGs)
    assert 1 <= most <= 2, f"{most} images' maps alive at once (at most this one and 1 being written)"


def test_export_peak_is_flat_in_the_image_count_and_within_the_memory_budget(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--memory sets the batch (two batches in flight fit it), and the maps alive at once stay within it whether
    8 or 16 images are exported (entropy maps: every query row is captured). The writes are slowed so
    that they lag behind the forwards, as on a loaded machine: the pipeline's bound is what is measured."""
    from vitviz.batch.pipeline import Exporter

    write = Exporter._write

    def lagging(self: Exporter, *a: object) -> None:
        time.sleep(0.05)
        write(self, *a)

    folder, paths = _model_and_images(tmp_path, 16)
    per_image = 2 * 2 * 17 ** 2 * 4   # (L, H, T, T) float32: 2 layers, 2 heads, 1 + 16 tokens
    budget = 6 * per_image            # two batches of 3 in flight
    peaks = []
    for count in (8, 16):
        monkeypatch.setattr(Exporter, "_write", lagging)
        _, batch, _, peak = _most_alive(monkeypatch, ["--model", str(folder), *map(str, paths[:count]), "--out",
                                                      str(tmp_path / f"out{count}"), "--memory", str(budget)],
                                        "entropy")
        assert batch == 3   # the budget's batch (a batch may be smaller when the readers lag)
        peaks.append(peak)
    assert max(peaks) <= budget and peaks[1] >= 3 * per_image, f"maps alive at once: {peaks} bytes, budget {budget}"


def test_a_budget_that_does_not_fit_is_refused_naming_what_fits(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    folder, paths = _model_and_images(tmp_path, 2)
    per_image = 2 * 2 * 17 ** 2 * 4
    common = ["export", "--model", str(folder), *map(str, paths), "--out", str(tmp_path / "out"), "--maps", "entropy",
              "--no-verify", "--quiet"]
    assert vitviz_main([*common, "--memory", str(per_image)]) != 0   # not even two images in flight
    assert "--memory" in (err := capsys.readouterr().err) and "--half" in err and "at least" in err
    assert vitviz_main([*common, "--memory", str(4 * per_image), "--batch-size", "3"]) != 0
    assert "--batch-size 2 at most" in capsys.readouterr().err
    with pytest.raises(SystemExit) as bad:   # argparse's usage error
        vitviz_main([*common, "--memory", "lots"])
    assert bad.value.code != 0
    assert "expected a memory size" in capsys.readouterr().err
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").rglob("*.png"))
