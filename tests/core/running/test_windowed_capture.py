"""The windowed capture's fast path (vitviz.core.running.windowed): the attention built in place (bias, SAM's decomposed
bias in slices, the shift mask, the softmax written over its input) gives bitwise the values of the out-of-place
sums that run whenever a gradient is needed; the one-key-per-row NaN check still catches non-finite attention."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from _windowed import swin_spec, sam_spec
from parity_refs import perturb
from vitviz.core.running import windowed
from vitviz.core.running.windowed import WindowedModel, WindowedNet
from vitviz.errors import NonFiniteError






SPECS = {
    "swin": swin_spec(),
    "swin roll_pad": replace(swin_spec(), order="roll_pad", shift_rule="built"),
    "swinv2": replace(swin_spec(), attn_kind="cosine", rel_pos="cpb", block_norm="res_post", merge_norm="after"),
    "sam": sam_spec(),
}


def probed(net: WindowedNet, x: torch.Tensor) -> tuple[list[torch.Tensor], bool]:
    """Every block's softmax, and whether all of them were made on the autograd path."""
    kept: list[torch.Tensor] = []
    grads: list[bool] = []

    def hook(_m, _i, out: torch.Tensor) -> None:
        kept.append(out.detach().clone())
        grads.append(out.requires_grad)

    hooks = [blk.attn.probe.register_forward_hook(hook) for blk in net.all_blocks()]
    try:
        net(x)
    finally:
        for h in hooks:
            h.remove()
    return kept, all(grads)


@pytest.mark.parametrize("name", list(SPECS))
@pytest.mark.parametrize("chunk", [windowed.CHUNK, 40])
def test_in_place_is_bitwise_the_out_of_place_path(name: str, chunk: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """chunk=40: SAM's decomposed bias made a few rows at a time (every slice boundary exercised)."""
    monkeypatch.setattr(windowed, "CHUNK", chunk)
    spec = SPECS[name]
    torch.manual_seed(0)
    net = perturb(WindowedNet(spec), std=0.3)
    size = (72, 60) if spec.arch == "sam" else (80, 68)      # padded windows, resampled tables
    x = torch.randn(1, 3, *size, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        fast = probed(net, x)
        out_fast = net(x)
    with torch.enable_grad():                                  # parameters need gradients: the out-of-place sums
        slow = probed(net, x)
        out_slow = net(x)
    (fast, fast_grad), (slow, slow_grad) = fast, slow
    assert slow_grad and not fast_grad and len(fast) == spec.depth
    for i, (a, b) in enumerate(zip(fast, slow)):
        assert torch.equal(a, b.detach()), f"block {i}"
    assert torch.equal(out_fast, out_slow.detach())


def test_non_finite_attention_is_refused() -> None:
    spec = swin_spec()
    torch.manual_seed(0)
    net = perturb(WindowedNet(spec), std=0.3)
    with torch.no_grad():
        net.all_blocks()[2].attn.qkv.weight[0, 0] = float("nan")
    model = WindowedModel(net, spec, torch.device("cpu"), [])
    x = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    with pytest.raises(NonFiniteError, match=r"block 2 \(windowed \(4×4\)\)"):
        model.run(x)
    with torch.no_grad():
        net.all_blocks()[2].attn.qkv.weight[0, 0] = 0.0
        net.all_blocks()[3].attn.qkv.weight[5, 3] = float("inf")    # an infinite logit: its row's sum is NaN
    with pytest.raises(NonFiniteError, match="block 3"):
        model.run(x)
    with torch.no_grad():
        net.all_blocks()[3].attn.qkv.weight[5, 3] = 0.0
    assert np.isfinite(model.run(x).blocks[3]).all()
