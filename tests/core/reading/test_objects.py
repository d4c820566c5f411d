"""`vitviz.core.reading.objects`: what a model object states beside its tensors; a library's classes are read by
its family module (`read_object` / `object_config`), torch's own here.

Opening a model object: the settings `module_settings` (`vitviz.core.reading.objects`) reads from the object are
what it computes -- an activation given as a module instance (`activation=nn.GELU()`), and one whose class vitviz
does not know, read by what it computes (transformers' `NewGELUActivation`: tanh GELU). Found by the trial of
hand-written ViTs from GitHub (`scripts/trial_handwritten/REPORT.md`)."""
from __future__ import annotations

import inspect
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from tutorial_refs import EncoderViT

import vitviz
from vitviz.core.reading import objects
from vitviz.core.reading.families import timm as timm_family, torchvision as tv_family
from vitviz.core.reading.objects import module_settings
from vitviz.errors import VitvizError


def test_a_librarys_object_reading_lives_in_its_family() -> None:
    source = inspect.getsource(objects)
    assert '"timm.' not in source and '"torchvision.' not in source     # no library's class tested by name here
    assert callable(timm_family.read_object) and callable(timm_family.object_config)
    assert callable(tv_family.read_object)


def test_timm_objects_state_pooling_norm_order_and_config() -> None:
    from timm.models.vision_transformer import VisionTransformer

    net = VisionTransformer(img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2, num_classes=3,
                            global_pool="avg")
    said = objects.module_settings(net)
    assert said["pooling"][0] == "avg" and "global_pool 'avg'" in said["pooling"][1]
    assert said["block_norm"] == ("pre", "model object: VisionTransformer's blocks are pre-norm by their class")
    assert timm_family.object_config(torch.nn.Linear(2, 2)) is None
    with pytest.raises(VitvizError, match="pool_include_prefix"):
        timm_family.read_object(VisionTransformer(img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2,
                                                  global_pool="max", pool_include_prefix=True), "V")


def test_torchvision_blocks_are_pre_norm_and_others_say_nothing() -> None:
    from torchvision.models.vision_transformer import VisionTransformer

    net = VisionTransformer(image_size=32, patch_size=8, num_layers=1, num_heads=2, hidden_dim=32, mlp_dim=64)
    assert tv_family.read_object(net, "V") == {"block_norm": ("pre", "model object: V's blocks are pre-norm by "
                                                                     "their class")}
    assert tv_family.read_object(torch.nn.Linear(2, 2), "L") == {} == timm_family.read_object(torch.nn.Linear(2, 2),
                                                                                               "L")
    layer = torch.nn.TransformerEncoderLayer(32, 2, 64, norm_first=False)
    assert objects.module_settings(torch.nn.TransformerEncoder(layer, 1))["block_norm"][0] == "post"   # torch's own


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
    settings = module_settings(net)
    assert settings["act"][0] == kind and settings["act"][1].startswith("model object:")
    assert settings["block_norm"][0] == "pre"


def test_the_activation_read_from_the_object_opens_its_file_exactly(tmp_path: Path) -> None:
    """What `verify --code` and `vitviz.load(module)` take from the object (`module_settings`) is the setting the
    file needs: with it (and the head count) the file of an nn.TransformerEncoder ViT built with `nn.GELU()`
    opens exactly."""
    net = EncoderViT(norm_first=True, activation=nn.GELU()).eval()     # type: ignore[arg-type]
    with torch.no_grad():
        for p in net.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(4)) * 0.1)
    torch.save(net.state_dict(), tmp_path / "enc.pth")
    stated = {k: v for k, (v, _) in module_settings(net).items() if k in ("act", "block_norm")}
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
    settings = module_settings(_MlpModel(act))
    if kind is None:        # unlike every activation vitviz offers: left unstated (an assumption, said as such)
        assert "act" not in settings
    else:
        assert settings["act"][0] == kind
        assert f"{type(act).__name__}, which computes {kind}" in settings["act"][1]
