"""Export's memory is flat in the image count (issue 36): the maps of an image are let go once its files are
written, so however many images an export writes, the attention arrays alive at once stay within the batches in
flight (the one running and those queued for writing), counted through weak references at every forward."""
from __future__ import annotations

import gc
import weakref
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from vitviz.cli import main as vitviz_main
from vitviz.core.running.capture import VitModel

timm = pytest.importorskip("timm")
pytestmark = pytest.mark.filterwarnings("ignore::vitviz.core.spec.GuessWarning")


def test_maps_alive_during_export_do_not_grow_with_the_images(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    args = dict(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2)
    model = timm.create_model("vit_small_patch16_224", pretrained=False, num_classes=3, **args)
    timm.models._hub.save_for_hf(model, str(tmp_path / "m"), model_args=args, safe_serialization=True)
    rng = np.random.default_rng(0)
    for i in range(12):
        Image.fromarray(rng.integers(0, 255, (40, 40, 3), dtype=np.uint8)).save(tmp_path / f"{i:02d}.png")
    alive: list[weakref.ref] = []
    most = [0]
    forward = VitModel.forward_captured

    def watched(self: VitModel, *a: object, **k: object) -> tuple[np.ndarray, np.ndarray]:
        attn, out = forward(self, *a, **k)
        alive.append(weakref.ref(attn))
        gc.collect()        # what is still held, not garbage in a reference cycle the collector has yet to visit
        most[0] = max(most[0], sum(r() is not None for r in alive))   # this image's and those not yet written
        return attn, out

    monkeypatch.setattr(VitModel, "forward_captured", watched)
    code = vitviz_main(["export", "--model", str(tmp_path / "m"), *(str(p) for p in sorted(tmp_path.glob("*.png"))),
                        "--out", str(tmp_path / "out"), "--maps", "cls,rollout", "--batch-size", "1", "--quiet",
                        "--no-verify", "--workers", "1"])
    assert code == 0 and len(alive) == 12   # one forward per image
    # the pipeline's bound: the image being run, and up to 2 x batch + 1 whose writes are still pending (a loaded
    # machine's writers lag; a quiet one's finish first) -- 4 of 12, whatever the count of images
    assert 1 <= most[0] <= 2 * 1 + 2, f"{most[0]} images' maps alive at once (at most this one and 3 being written)"
