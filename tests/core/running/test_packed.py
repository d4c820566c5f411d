"""Prepacked oneDNN linears (core.packed): same numbers as F.linear, rebuilt when weights change, off when unsafe."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import vitviz
from _tiny import write_tiny_checkpoint
from vitviz.core.running import runtime as memory
from vitviz.core.running.packed import Linear, packing_available, set_packed

pytestmark = pytest.mark.skipif(not packing_available(), reason="no oneDNN prepacked linears in this torch build")


@pytest.fixture()
def tiny(tmp_path):
    return vitviz.load(write_tiny_checkpoint(tmp_path / "m.pth", reg_tokens=1, depth=3), heads=2, device="cpu")


def _plain(model, x):
    set_packed(model.net, False)
    try:
        return model.forward_captured(x)
    finally:
        set_packed(model.net, True)


def test_packed_matches_plain_linear(tiny) -> None:
    assert tiny.packed_layers == 3 * 4 + 1  # qkv, proj, fc1, fc2 per block, and the head
    x = torch.rand(3, 3, 32, 32)
    attn, logits = tiny.forward_captured(x)
    calls = []
    original = torch.ops.mkldnn._linear_pointwise
    with pytest.MonkeyPatch.context() as m:
        m.setattr(torch.ops.mkldnn, "_linear_pointwise", lambda *a: calls.append(a[3]) or original(*a))
        tiny.forward_captured(x)
    assert calls.count("gelu") == 3 and calls.count("none") == 3 * 3 + 1  # GELU fused into every fc1
    ref_attn, ref_logits = _plain(tiny, x)
    np.testing.assert_allclose(attn, ref_attn, atol=1e-6)
    np.testing.assert_allclose(logits, ref_logits, atol=1e-5)


def test_weights_changed_in_place_or_moved_are_repacked(tiny) -> None:
    x = torch.rand(1, 3, 32, 32)
    before = tiny.forward_captured(x)[1]
    with torch.no_grad():
        tiny.net.head.weight.mul_(2.0)  # in place: the packed copy is stale
    after = tiny.forward_captured(x)[1]
    np.testing.assert_allclose(after, _plain(tiny, x)[1], atol=1e-5)
    assert not np.allclose(after, before)
    tiny.net.double()  # float64: not packable, F.linear runs
    with torch.inference_mode():
        out = tiny.net(x.double())
    assert out.dtype == torch.float64
    tiny.net.float()  # new tensors: packed again from them
    np.testing.assert_allclose(tiny.forward_captured(x)[1], after, atol=1e-5)


def test_autograd_and_low_memory_use_plain_linear(tiny, monkeypatch, tmp_path) -> None:
    x = torch.rand(1, 3, 32, 32)
    out = tiny.net(x)  # grad enabled: the packed path is skipped, gradients flow
    out.sum().backward()
    assert tiny.net.head.weight.grad is not None
    monkeypatch.setattr(memory, "available_memory", lambda: 1000)  # packed copies would not fit
    small = vitviz.load(write_tiny_checkpoint(tmp_path / "n.pth"), heads=2, device="cpu")
    assert small.packed_layers == 0
    assert not any(m._want_packed for m in small.net.modules() if isinstance(m, Linear))


def test_a_model_loaded_under_inference_mode_runs_packed(tmp_path) -> None:
    """Weights made under `torch.inference_mode()` are inference tensors without a version counter: the packed
    weight is keyed by its data alone (was: "Inference tensors do not track version counter")."""
    with torch.inference_mode():
        model = vitviz.load(write_tiny_checkpoint(tmp_path / "m.pth", depth=2), heads=2, device="cpu")
    assert model.packed_layers > 0
    x = torch.rand(1, 3, 32, 32)
    attn, logits = model.forward_captured(x)
    ref_attn, ref_logits = _plain(model, x)
    np.testing.assert_allclose(attn, ref_attn, atol=1e-6)
    np.testing.assert_allclose(logits, ref_logits, atol=1e-5)
