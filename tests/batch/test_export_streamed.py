"""A streamed export (issue 36): when the maps asked for are a rollout and CLS / token maps, the capture keeps, of
each layer as it is computed, only what they read (the query rows, each layer's heads fused) and lets the layer
go -- never the (L, H, T, T) stack -- so what an image holds is a fraction of its full maps and the peak is flat in
the number of images; the PNGs are those of the full capture, pixel for pixel."""
from __future__ import annotations

import gc
import time
import weakref
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from _exports import timm_folder_and_images
from PIL import Image

from vitviz.batch import pipeline
from vitviz.cli import main as vitviz_main
from vitviz.core.running.capture import VitModel

timm = pytest.importorskip("timm")
pytestmark = pytest.mark.filterwarnings("ignore::vitviz.core.spec.GuessWarning")
DEPTH, HEADS, TOKENS = 3, 4, 1 + 8 * 8


def _model_and_images(tmp_path: Path, count: int) -> tuple[Path, list[str]]:
    folder, paths = timm_folder_and_images(tmp_path, count, img_size=64, depth=DEPTH, heads=HEADS, image_px=70)
    return folder, [str(p) for p in paths]


def _pngs(out: Path) -> dict[Path, np.ndarray]:
    return {p.relative_to(out): np.asarray(Image.open(p)) for p in sorted(out.rglob("*.png"))}


def _export(folder: Path, images: list[str], out: Path, *extra: str, maps: str = "cls,token:5,rollout") -> None:
    assert vitviz_main(["export", "--model", str(folder), *images, "--out", str(out), "--quiet", "--no-verify",
                        "--maps", maps, "--workers", "1", *extra]) == 0


def test_a_streamed_export_writes_the_full_captures_maps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder, images = _model_and_images(tmp_path, 3)
    every = ("--layers", "all", "--which-heads", "all")
    _export(folder, images, tmp_path / "full", "--npz", *every)   # .npz keeps the (L, H, T, T) stack: a full capture
    full = _pngs(tmp_path / "full")

    def refused(*_a: Any, **_k: Any) -> Any:
        raise AssertionError("the whole (L, H, T, T) stack was captured")

    monkeypatch.setattr(VitModel, "forward_captured", refused)
    for maps in ("cls,token:5,rollout", "rollout"):
        _export(folder, images, tmp_path / maps, *every, maps=maps)
        streamed = _pngs(tmp_path / maps)
        assert streamed and set(streamed) <= set(full)
        for name, picture in streamed.items():
            assert np.array_equal(picture, full[name]), name


def _most_held(monkeypatch: pytest.MonkeyPatch, folder: Path, images: list[str], out: Path) -> tuple[int, int]:
    """Export with the writes lagging behind the forwards (as on a loaded machine); (the most bytes of the kept
    arrays alive at once, at any forward; the bytes one image keeps)."""
    alive: list[weakref.ref] = []
    most = [0, 0]
    init, append = pipeline.Kept.__init__, pipeline.Kept.append
    write = pipeline.Exporter._write

    def made(self: pipeline.Kept, *a: Any) -> None:
        init(self, *a)
        held = [self.rows_of, *self.fused.values()]
        alive.extend(weakref.ref(h) for h in held)
        most[1] = sum(h.nbytes for h in held) // len(self.rows_of)

    def appended(self: pipeline.Kept, layer: Any) -> None:   # (its arrays are made whole before the first layer)
        append(self, layer)
        if self.layers == 1:
            gc.collect()   # what is still held, not garbage in a cycle the collector has yet to visit
            most[0] = max(most[0], sum(r().nbytes for r in alive if r() is not None))

    def lagging(self: pipeline.Exporter, *a: Any) -> None:
        time.sleep(0.05)
        write(self, *a)

    monkeypatch.setattr(pipeline.Kept, "__init__", made)
    monkeypatch.setattr(pipeline.Kept, "append", appended)
    monkeypatch.setattr(pipeline.Exporter, "_write", lagging)
    _export(folder, images, out, "--batch-size", "1")
    monkeypatch.undo()
    return most[0], most[1]


def test_a_streamed_exports_peak_is_flat_in_the_image_count(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    folder, images = _model_and_images(tmp_path, 8)
    few, per_image = _most_held(monkeypatch, folder, images[:3], tmp_path / "few")
    many, _ = _most_held(monkeypatch, folder, images, tmp_path / "many")
    stack = DEPTH * HEADS * TOKENS ** 2 * 4
    # an image keeps its 2 query rows and one fused (T, T) per layer: well under its (L, H, T, T) stack
    assert per_image == DEPTH * HEADS * 2 * TOKENS * 4 + DEPTH * TOKENS ** 2 * 4 and per_image < stack / 3
    # at most the image running and the one being written, however many are exported
    assert per_image <= few <= 2 * per_image and per_image <= many <= 2 * per_image, (few, many, per_image)


def test_a_streamed_forward_out_of_memory_fails_its_images_with_the_reason(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """An allocation refused during the streamed forward is said as the captured forward says it (DeviceError: not
    enough memory for the input, what to try) on each image of its batch; the export ends with its manifest instead
    of torch's bare RuntimeError."""
    import json

    folder, images = _model_and_images(tmp_path, 2)

    def refused(*_a: Any, **_k: Any) -> Any:
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:119] DefaultCPUAllocator: can't allocate memory")

    monkeypatch.setattr(VitModel, "forward_streamed", refused)
    out = tmp_path / "out"
    code = vitviz_main(["export", "--model", str(folder), *images, "--out", str(out), "--quiet", "--no-verify",
                        "--maps", "cls,rollout", "--workers", "1"])
    manifest = json.loads((out / "manifest.json").read_text())
    assert code != 0 and manifest["summary"]["failed"] == 2 and manifest["summary"]["done"] == 0
    errors = [job["error"] for job in manifest["images"]]
    assert all("not enough memory for input" in e and "can't allocate memory" in e for e in errors), errors
