"""The live probe's size where the model states one too large for the memory (HunYuan-VL states 2048 px: a probe
of 128 GiB): the probe shrinks to the largest size the model takes that fits, said loudly as an assumption, and is
refused only where no size it takes fits. The memory available is set small (the machine's own would let a
2048 px probe of a tiny tower through, slowly), so that a stated size does not fit it."""
from __future__ import annotations

import importlib
import warnings

import numpy as np
import pytest
import torch

import vitviz
from vitviz.core.spec import GuessWarning
from vitviz.errors import DeviceError

transformers = pytest.importorskip("transformers")
AVAILABLE = 256 << 20     # the memory the probe is told is available
DESCRIBE = importlib.import_module("vitviz.core.running.live.describe")   # (the package's `describe` is a function)


def _pixtral(image_size: int = 2048) -> torch.nn.Module:
    """A tiny Pixtral tower (2-D RoPE: it takes any whole number of 16 px patches up to its stated size)."""
    config = transformers.PixtralVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                              num_attention_heads=4, image_size=image_size, patch_size=16,
                                              head_dim=8)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    return transformers.PixtralVisionModel(config).eval()


def test_a_stated_size_too_large_is_shrunk_and_said(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(DESCRIBE, "available_memory", lambda: AVAILABLE)
    tower = _pixtral()
    with pytest.warns(GuessWarning, match=r"probed at \d+ px, not the configured 2048 px"):
        vm = vitviz.load(tower, device="cpu")
    side = vm.spec.image_size[0]
    assert vm.spec.image_size == (side, side) and 16 <= side < 2048 and side % 16 == 0
    said = vm.spec.source_of("image_size")
    assert said.startswith("guess: probed at") and "to stay within 128.0 MiB" in said and "config.image_size" in said
    assert "image_size" in dict(vm.spec.guesses)
    # the size chosen fits, the next one up does not (the largest that fits)
    from vitviz.core.running.live.describe import _probe_bytes

    assert _probe_bytes(tower, (side, side), 3, 16) <= AVAILABLE // 2
    assert _probe_bytes(tower, (side + 16, side + 16), 3, 16) > AVAILABLE // 2
    # and at that size the maps are Pixtral's own
    x = torch.randn(1, 3, side, side, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        theirs = tower(pixel_values=x, image_sizes=[(side, side)], output_attentions=True).attentions
    ours = vm.run(x).attentions
    assert len(ours) == len(theirs) == 2
    for mine, ref in zip(ours, theirs):
        np.testing.assert_allclose(mine, ref[0].numpy(), atol=1e-5)


def test_a_size_that_fits_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(DESCRIBE, "available_memory", lambda: AVAILABLE)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always", GuessWarning)
        vm = vitviz.load(_pixtral(64), device="cpu")
    assert vm.spec.image_size == (64, 64) and vm.spec.source_of("image_size") == "metadata: config.image_size"
    assert "image_size" not in dict(vm.spec.guesses) and not any("probed at" in str(w.message) for w in said)


def test_a_size_given_is_never_shrunk(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(DESCRIBE, "available_memory", lambda: AVAILABLE)
    with pytest.raises(DeviceError, match=r"a 2048x2048 probe input .* nothing was allocated"):
        vitviz.load(_pixtral(), device="cpu", image_size=2048)


def test_refused_when_no_size_it_takes_fits(monkeypatch: pytest.MonkeyPatch) -> None:
    """A ViT that takes only its stated size (no position interpolation asked for) refuses the smaller probe: the
    refusal names the memory and the size it refused."""
    monkeypatch.setattr(DESCRIBE, "available_memory", lambda: AVAILABLE)
    config = transformers.ViTConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                    image_size=2048, patch_size=16)
    with pytest.raises(DeviceError, match=r"probed at \d+ px, not the configured 2048 px.*its forward refused"):
        vitviz.load(transformers.ViTModel(config).eval(), device="cpu", live=True)


def test_a_packed_tower_shrinks_in_whole_merge_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """A packed tower (PaddleOCR-VL's, 4 px patches in 2 x 2 merge blocks) probed at its default size that does not
    fit shrinks to whole merge blocks, the only sizes its processor makes (here 136 px; in whole patches it would
    be 140 px, which the tower refuses)."""
    monkeypatch.setattr(DESCRIBE, "available_memory", lambda: 300 << 20)
    config = transformers.PaddleOCRVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                                num_attention_heads=4, image_size=32, patch_size=4,
                                                spatial_merge_size=2)
    torch.manual_seed(0)
    with pytest.warns(GuessWarning, match=r"probed at \d+ px, not the default 224 px"):
        vm = vitviz.load(transformers.PaddleOCRVisionModel(config).eval(), device="cpu")
    side = vm.spec.image_size[0]
    assert vm.spec.image_size == (side, side) and side < 224 and side % 8 == 0
    assert "whole 8 px merge blocks" in vm.spec.source_of("image_size")
    assert vm.run(np.zeros((side, side, 3), np.uint8)).attentions.shape == (2, 4, (side // 4) ** 2, (side // 4) ** 2)
