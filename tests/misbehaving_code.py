"""Model code that misbehaves (issue 19), opened through `--code misbehaving_code.py:NAME` by the library, CLI and
window tests: a forward that calls sys.exit(), raises KeyboardInterrupt or a bare BaseException, a factory that
exits, weights with NaN, attention that is NaN, a model left on the meta device, a thread left running, a forward
that does not finish while a flag file exists (`VITVIZ_TEST_HANG`). `tiny` is a well-behaved ViT for the weights
tests (int8 weights, missing keys).
"""
from __future__ import annotations

import os
import sys
import threading
import time

import torch
from torch import nn


class TinyViT(nn.Module):
    """A 2-layer, 2-head ViT at 32 px (8 px patches, a class token), explicit softmax."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.patch = nn.Conv2d(3, 16, 8, 8)
        self.cls_token = nn.Parameter(torch.randn(1, 1, 16))
        self.pos_embed = nn.Parameter(torch.randn(1, 17, 16) * 0.5)
        self.qkv = nn.ModuleList([nn.Linear(16, 48) for _ in range(2)])
        self.head = nn.Linear(16, 5)
        self.mask_all = False

    def attend(self, x: torch.Tensor, qkv: nn.Linear) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = qkv(x).reshape(b, t, 3, 2, 8).permute(2, 0, 3, 1, 4)
        s = q @ k.transpose(-2, -1) * 8 ** -0.5
        if self.mask_all:        # every key masked: a softmax of nothing, NaN
            s = s.masked_fill(torch.ones_like(s, dtype=torch.bool), float("-inf"))
        return x + (s.softmax(-1) @ v).transpose(1, 2).reshape(b, t, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(len(x), -1, -1), x], 1) + self.pos_embed
        for qkv in self.qkv:
            x = self.attend(x, qkv)
        return self.head(x[:, 0])


class Misbehaves(TinyViT):
    def __init__(self, what: str) -> None:
        super().__init__()
        self.what = what

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        picture = float(x.std()) < 0.6     # a probe input has unit variance; a picture scaled to [0, 1] much less
        if self.what == "exit" or (self.what == "exit_on_images" and picture):
            sys.exit(0)
        self.mask_all = self.what == "nan_on_images" and picture
        if self.what == "interrupt":
            raise KeyboardInterrupt
        if self.what == "base":
            raise Bare("the forward gave up")
        if self.what in ("hang", "hang_on_images"):
            flag = os.environ.get("VITVIZ_TEST_HANG", "")
            images = self.what == "hang_on_images"
            deadline = time.monotonic() + 120
            while flag and os.path.exists(flag) and (not images or picture) and time.monotonic() < deadline:
                time.sleep(0.01)
        return super().forward(x)


class Bare(BaseException):
    """Neither an Exception nor a SystemExit."""


def tiny() -> nn.Module:
    return TinyViT()


def exits_in_forward() -> nn.Module:
    return Misbehaves("exit")


def interrupts_in_forward() -> nn.Module:
    return Misbehaves("interrupt")


def base_exception_in_forward() -> nn.Module:
    return Misbehaves("base")


def exits_when_built() -> nn.Module:
    sys.exit(3)


def interrupts_when_built() -> nn.Module:
    raise KeyboardInterrupt


def nan_weights() -> nn.Module:
    model = TinyViT()
    with torch.no_grad():
        model.qkv[1].weight[3, 4] = float("nan")
        model.head.bias[0] = float("inf")
    return model


def nan_attention() -> nn.Module:
    model = TinyViT()
    model.mask_all = True
    return model


def on_meta() -> nn.Module:
    with torch.device("meta"):
        return TinyViT()


def leaves_a_thread() -> nn.Module:
    """Starts a non-daemon thread that outlives the command (a data loader, a logger...): here one that never ends."""
    threading.Thread(target=threading.Event().wait, name="user-logger", daemon=False).start()
    return TinyViT()


def exits_on_images() -> nn.Module:
    """Loads (its probes have unit variance); calls sys.exit() on a picture."""
    return Misbehaves("exit_on_images")


def nan_on_images() -> nn.Module:
    """Loads; computes NaN attention (every key masked) on a picture."""
    return Misbehaves("nan_on_images")


def hangs() -> nn.Module:
    """Its forward does not finish while the flag file exists (its probe at load included)."""
    return Misbehaves("hang")


def hangs_on_images() -> nn.Module:
    """Loads; its forward then does not finish on a picture while the flag file exists."""
    return Misbehaves("hang_on_images")
