"""Faster CPU inference: `Linear` layers whose weights are prepacked once for oneDNN.

PyTorch's `F.linear` on the CPU re-packs the weight matrix for the GEMM kernel on every call; oneDNN can keep it
packed (`torch.ops.mkldnn._reorder_linear_weight` / `_linear_pointwise`, the ops PyTorch's own compiler uses for
frozen CPU models). For a ViT, whose time is nearly all in its Linear layers, that is about a quarter off a
forward pass (bench/capture.py), and the MLP's exact GELU can be fused into fc1. Results agree with `F.linear` to
float32 rounding (~1e-6); the parity tests run through this path.

Packing is an optimisation, never a requirement: it is used only on the CPU, in float32, without autograd, when
the ops exist and agree with `F.linear` on a probe, and when the packed copies fit in memory comfortably; anything
else runs `F.linear`. A packed copy is rebuilt when its weight changes (in place or by moving), and dropped when
the model leaves the CPU. `VITVIZ_PACKED=0` switches it off.
"""
from __future__ import annotations

import os
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import nn

_GELU_ALGORITHM = {"gelu": "none", "gelu_tanh": "tanh"}


@lru_cache(maxsize=1)
def packing_available() -> bool:
    """Whether this PyTorch build can run prepacked oneDNN linears, and they agree with `F.linear` here."""
    if os.environ.get("VITVIZ_PACKED", "1") == "0" or not torch.backends.mkldnn.is_available():
        return False
    try:
        ops = torch.ops.mkldnn
        g = torch.Generator().manual_seed(0)
        w, b, x = (torch.randn(24, 16, generator=g), torch.randn(24, generator=g), torch.randn(2, 5, 16, generator=g))
        with torch.inference_mode():
            y = ops._linear_pointwise(x, ops._reorder_linear_weight(w, None), b, "none", [], "")
            act = ops._linear_pointwise(x, ops._reorder_linear_weight(w, None), b, "gelu", [], "none")
            return bool(torch.allclose(y, F.linear(x, w, b), atol=1e-4)
                        and torch.allclose(act, F.gelu(F.linear(x, w, b)), atol=1e-4))
    except (RuntimeError, AttributeError, NotImplementedError):
        return False


class Linear(nn.Linear):
    """`nn.Linear` (same parameters and state-dict keys) that runs with a prepacked weight once `pack()`ed."""

    def __init__(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003 - nn.Linear's signature
        super().__init__(*args, **kwargs)
        self._packed: tuple[torch.Tensor, int, int] | None = None
        self._want_packed = False

    def pack(self, on: bool) -> None:
        self._want_packed, self._packed = on, None

    def _weight_packed(self, x: torch.Tensor) -> torch.Tensor | None:
        """The packed weight when the fast path applies to `x`, else None (repacked if the weight changed)."""
        w = self.weight
        if not (self._want_packed and x.device.type == "cpu" and x.dtype == torch.float32
                and w.device.type == "cpu" and w.dtype == torch.float32 and not torch.is_grad_enabled()):
            return None
        # an inference tensor (a model loaded under torch.inference_mode) has no version counter: its data pointer
        # is the key (it can change in place only inside inference mode)
        key = (w.data_ptr(), -1 if w.is_inference() else w._version)
        if self._packed is None or self._packed[1:] != key:
            self._packed = (torch.ops.mkldnn._reorder_linear_weight(w.detach(), None), *key)
        return self._packed[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        packed = self._weight_packed(x)
        if packed is None:
            return F.linear(x, self.weight, self.bias)
        return torch.ops.mkldnn._linear_pointwise(x, packed, self.bias, "none", [], "")

    def forward_gelu(self, x: torch.Tensor, kind: str, act: nn.Module) -> torch.Tensor:
        """act(self(x)), with the GELU fused into the packed GEMM when it can be (`kind` 'gelu' / 'gelu_tanh')."""
        packed = self._weight_packed(x) if kind in _GELU_ALGORITHM else None
        if packed is None:
            return act(self(x))
        return torch.ops.mkldnn._linear_pointwise(x, packed, self.bias, "gelu", [], _GELU_ALGORITHM[kind])


def set_packed(net: nn.Module, on: bool) -> int:
    """Pack (or unpack) every `Linear` of `net`; returns how many layers will run packed."""
    on = on and packing_available()
    layers = [m for m in net.modules() if isinstance(m, Linear)]
    for m in layers:
        m.pack(on)
    return len(layers) if on else 0
