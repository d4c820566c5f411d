"""Opening a model object (`vitviz.core.running.load`): the settings `_module_settings` reads from the object are
what it computes -- an activation given as a module instance (`activation=nn.GELU()`), and one whose class vitviz
does not know, read by what it computes (transformers' `NewGELUActivation`: tanh GELU). Found by the trial of
hand-written ViTs from GitHub (`scripts/trial_handwritten/REPORT.md`)."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from tutorial_refs import EncoderViT

import vitviz
from vitviz.core.running.load import _module_settings


# ------------------------------------------------------------------------- 4. activations as module objects
class NewGELUActivation(nn.Module):
    """transformers' tanh GELU (activations.py), as tintn/vision-transformer-from-scratch copies it."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return 0.5 * input * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (input + 0.044715 * torch.pow(input, 3.0))))


class _ErfGELU(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))


class _Swish15(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(1.5 * x)      # none of the activations vitviz offers


class _MlpModel(nn.Module):
    def __init__(self, act: nn.Module) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([nn.Module() for _ in range(2)])
        for blk in self.blocks:
            blk.mlp = nn.Module()
            blk.mlp.fc1, blk.mlp.act, blk.mlp.fc2 = nn.Linear(8, 16), act, nn.Linear(16, 8)


@pytest.mark.parametrize(("act", "kind"), [(nn.GELU(), "gelu"), (nn.GELU(approximate="tanh"), "gelu_tanh"),
                                           (nn.ReLU(), "relu"), (nn.SiLU(), "silu")])
def test_a_transformer_encoder_layer_activation_given_as_a_module_is_read(act: nn.Module, kind: str) -> None:
    net = EncoderViT(norm_first=True, activation=act)    # type: ignore[arg-type]
    settings = _module_settings(net)
    assert settings["act"][0] == kind and settings["act"][1].startswith("model object:")
    assert settings["block_norm"][0] == "pre"


def test_the_activation_read_from_the_object_opens_its_file_exactly(tmp_path: Path) -> None:
    """What `verify --code` and `vitviz.load(module)` take from the object (`_module_settings`) is the setting the
    file needs: with it (and the head count) the file of an nn.TransformerEncoder ViT built with `nn.GELU()`
    opens exactly."""
    net = EncoderViT(norm_first=True, activation=nn.GELU()).eval()     # type: ignore[arg-type]
    with torch.no_grad():
        for p in net.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(4)) * 0.1)
    torch.save(net.state_dict(), tmp_path / "enc.pth")
    stated = {k: v for k, (v, _) in _module_settings(net).items() if k in ("act", "block_norm")}
    assert stated == {"act": "gelu", "block_norm": "pre"}
    vm = vitviz.load(tmp_path / "enc.pth", heads=4, device="cpu", **stated)
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        with torch.no_grad():
            own = net(x).numpy()
    finally:
        torch.backends.mha.set_fastpath_enabled(True)
    np.testing.assert_allclose(vm.forward_captured(x)[1], own, atol=1e-4)


@pytest.mark.parametrize(("act", "kind"), [(NewGELUActivation(), "gelu_tanh"), (_ErfGELU(), "gelu"),
                                           (_Swish15(), None)])
def test_an_activation_class_vitviz_does_not_know_is_read_by_what_it_computes(act: nn.Module,
                                                                             kind: str | None) -> None:
    settings = _module_settings(_MlpModel(act))
    if kind is None:        # unlike every activation vitviz offers: left unstated (an assumption, said as such)
        assert "act" not in settings
    else:
        assert settings["act"][0] == kind
        assert f"{type(act).__name__}, which computes {kind}" in settings["act"][1]
