"""Parity for transformers' ViTDet backbone (`VitDetModel`, save_pretrained), read as a SAM / ViTDet windowed model.

A tiny VitDetModel with random, perturbed weights: 3 blocks of width 32, 2 heads, 8 px patches, windowed blocks 0
and 2 (2x2 windows), block 1 global; the absolute table is the pretrain grid's (a class-token slot first), the
native size another (so the table is resampled even there). Every block's per-window, per-head attention
(`output_attentions=True`, VitDet's eager softmax) and the last hidden state are compared at the native size and at
sizes where the windows are padded, the global block's relative tables and the absolute table resampled.
"""
from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch

import vitviz
from parity_refs import perturb
from vitviz.core.spec import GuessWarning
from vitviz.errors import VitvizError

transformers = pytest.importorskip("transformers")

ATOL_ATTN, ATOL_OUT = 1e-5, 1e-4
CFG = dict(hidden_size=32, num_hidden_layers=3, num_attention_heads=2, image_size=40, patch_size=8, window_size=2,
           window_block_indices=[0, 2], use_relative_position_embeddings=True, pretrain_image_size=32)
SIZES = [(40, 40), (56, 48), (24, 32)]


def x_for(size: tuple[int, int]) -> torch.Tensor:
    return torch.randn(1, 3, *size, generator=torch.Generator().manual_seed(1))


def vitdet(**kw) -> torch.nn.Module:
    from transformers import VitDetConfig, VitDetModel

    torch.manual_seed(0)
    return perturb(VitDetModel(VitDetConfig(**{**CFG, **kw})))


def reference(model: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    with torch.no_grad():
        o = model(pixel_values=x, output_attentions=True)
    return o.last_hidden_state, o.attentions


def load(path, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GuessWarning)
        return vitviz.load(path, device="cpu", **kw)


def check(result, feats: torch.Tensor, maps) -> None:
    assert len(result.blocks) == len(maps)
    for i, (mine, ref) in enumerate(zip(result.blocks, maps)):
        ref = ref.numpy().reshape(mine.shape)     # (B * windows, heads, n, n) -> (windows, heads, n, n)
        np.testing.assert_allclose(mine, ref, atol=ATOL_ATTN, err_msg=f"block {i} ({result.spec_line(i)})")
    np.testing.assert_allclose(result.feature_map, feats[0].numpy(), atol=ATOL_OUT)


def test_hf_vitdet_parity(tmp_path) -> None:
    model = vitdet()
    model.save_pretrained(tmp_path)
    vm = load(tmp_path)
    s = vm.spec
    assert (s.family, s.arch, s.heads, s.neck, s.rel_pos) == ("hf-vitdet", "sam", (2,), "", "decomposed")
    assert s.image_size == (40, 40) and s.pos_grid == (4, 4) and s.pos_interp == "hf" and s.eps == 1e-6
    assert s.windows == ((2, 2), (0, 0), (2, 2)) and s.kind_of("windows") == "derived"
    assert s.named and s.assumptions == (("preprocess", s.source_of("preprocess")),)
    assert any("class-token slot" in d for d in vm.dropped)
    assert vm.spec.describe_blocks()[1] == "stage 0 block 1: global (5×5)"
    for size in SIZES:
        result = vm.run(x_for(size))
        assert result.geometry[0].padded == tuple(-(-d // 8 // 2) * 2 for d in size)
        check(result, *reference(model, x_for(size)))
    # the comparison can fail: timm's antialiased resampling of the table (SAM's recipe) is not ViTDet's when the
    # grid shrinks
    with pytest.raises(AssertionError):
        check(load(tmp_path, pos_interp="timm").run(x_for((24, 32))), *reference(model, x_for((24, 32))))
    # the class slot is never added
    with torch.no_grad():
        model.embeddings.position_embeddings[:, 0] += 1.0
    check(vm.run(x_for(SIZES[1])), *reference(model, x_for(SIZES[1])))


def test_hf_vitdet_without_relative_positions(tmp_path) -> None:
    """transformers' default: no relative tables, so windows and global blocks come from config.json alone;
    the native size equal to the pretrain size (the table added as stored)."""
    model = vitdet(use_relative_position_embeddings=False, image_size=32, window_block_indices=[1])
    model.save_pretrained(tmp_path)
    vm = load(tmp_path)
    assert vm.spec.rel_pos == "" and vm.spec.windows == ((0, 0), (2, 2), (0, 0))
    assert vm.spec.kind_of("windows") == "read" and "window_block_indices" in vm.spec.source_of("windows")
    for size in [(32, 32), (40, 24)]:
        check(vm.run(x_for(size)), *reference(model, x_for(size)))


def test_hf_vitdet_residual_blocks(tmp_path) -> None:
    """`residual_block_indices`: a convolutional bottleneck after blocks 0 and 1 (VitMatte's backbone has them);
    the output after it, and the attention of the blocks it feeds, match."""
    model = vitdet(residual_block_indices=[0, 1])
    model.save_pretrained(tmp_path / "m")
    vm = load(tmp_path / "m")
    assert vm.spec.residual_blocks == (0, 1) and vm.spec.kind_of("residual_blocks") == "derived"
    assert vm.net.blocks[0].residual is not None and vm.net.blocks[2].residual is None
    for size in SIZES[:2]:
        check(vm.run(x_for(size)), *reference(model, x_for(size)))
    residual, vm.net.blocks[1].residual = vm.net.blocks[1].residual, None   # the bottleneck does count
    with pytest.raises(AssertionError, match="block 2"):
        check(vm.run(x_for(SIZES[0])), *reference(model, x_for(SIZES[0])))
    vm.net.blocks[1].residual = residual
    # a config that lists other blocks than the file holds is refused, naming the setting
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    cfg["residual_block_indices"] = [1]
    (tmp_path / "m" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(VitvizError, match="residual_block_indices"):
        load(tmp_path / "m")


def test_hf_vitdet_backbone_and_model_type(tmp_path) -> None:
    """VitDetBackbone saves the same keys; config.json's model_type names the family for the catalog."""
    from transformers import VitDetBackbone, VitDetConfig

    from vitviz.core.reading.families import hf_family

    torch.manual_seed(0)
    bb = perturb(VitDetBackbone(VitDetConfig(**CFG, out_features=["stage3"])))
    bb.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "vitdet"
    assert hf_family("vitdet") == "hf-vitdet"
    vm = load(tmp_path)
    x = x_for((40, 40))
    with torch.no_grad():
        o = bb(pixel_values=x, output_attentions=True)
    check(vm.run(x), o.feature_maps[-1], o.attentions)


def test_hf_vitdet_bare_state_dict(tmp_path) -> None:
    """No config.json: the windows and the native size (here larger than the pretrain grid of the absolute table)
    from the decomposed tables' shapes, the family's eps and activation assumed and flagged."""
    from safetensors.torch import save_file

    model = vitdet()
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp_path / "vitdet.safetensors"))
    vm = load(tmp_path / "vitdet.safetensors")
    s = vm.spec
    assert s.family == "hf-vitdet" and s.image_size == (40, 40) and s.kind_of("image_size") == "derived"
    assert s.windows == ((2, 2), (0, 0), (2, 2)) and {"eps", "mlp_kind"} <= set(dict(s.assumptions))
    for size in SIZES:
        check(vm.run(x_for(size)), *reference(model, x_for(size)))
