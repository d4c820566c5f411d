"""A capture holds the (B, L, H, T, T) stack and no layer-sized tensor beside it (issue 36): on the CPU, each
layer's scores and then its softmax are written in place into the capture's own array. Every tensor an operation
makes during the capture is watched (a dispatch mode): each of one layer's (B, H, T, T) shape must live in that
array, and the maps and logits are those of a plain forward."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from _tiny import write_tiny_checkpoint
from torch.utils._python_dispatch import TorchDispatchMode

import vitviz


class _LayerSized(TorchDispatchMode):
    """The storage address of every tensor an operation returns with one layer's shape."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        super().__init__()
        self.shape, self.made = shape, []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and tuple(t.shape) == self.shape:
                self.made.append((func.__name__, t.untyped_storage().data_ptr()))
        return out


@pytest.mark.parametrize("batch", [1, 2])
def test_capture_makes_no_layer_sized_tensor_outside_its_array(tmp_path: Any, batch: int) -> None:
    model = vitviz.load(write_tiny_checkpoint(tmp_path / "m.pth", reg_tokens=2), heads=2, device="cpu")
    x = torch.rand(batch, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    tokens = 3 + 16
    watch = _LayerSized((batch, 2, tokens, tokens))
    with watch:
        maps, logits = model.forward_captured(x)
    start = maps.__array_interface__["data"][0]
    outside = [(name, p) for name, p in watch.made if not start <= p < start + maps.nbytes]
    assert watch.made and not outside, f"layer-sized tensors outside the capture's array: {outside}"
    with torch.no_grad():   # the same maps and logits as an eager softmax gives
        eager = [blk.attn.probabilities(blk.attn_input(h)) for blk, h in _block_inputs(model, x)]
        plain = model.net(x)
    np.testing.assert_allclose(maps, torch.stack(eager, 1).numpy(), atol=1e-6)
    np.testing.assert_allclose(logits, plain.numpy(), atol=1e-6)


def _block_inputs(model: Any, x: torch.Tensor) -> list[tuple[Any, torch.Tensor]]:
    """Each block with the tokens it is given in a plain forward (hooks record them)."""
    seen: list[tuple[Any, torch.Tensor]] = []
    handles = [b.register_forward_pre_hook(lambda m, a: seen.append((m, a[0]))) for b in model.net.blocks]
    try:
        model.net(x)
    finally:
        for h in handles:
            h.remove()
    return seen
