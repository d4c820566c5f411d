"""timm's relative-position ViTs (`vit_relpos_*`, `vit_srelpos_*`; issue 31: refused before): the log-coordinate
relative position MLP (`spec.rel_pos_mlp`), per block or shared, zero on the class token. Exact against timm
(`VisionTransformerRelPos`, eager attention) from a state dict and a timm hub folder, at the native grid and, after
timm's `set_input_size`, at another."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import vitviz
from parity_refs import perturb, timm_reference
from vitviz.core.spec import GuessWarning

timm = pytest.importorskip("timm")

ATOL = 1e-5
ARGS = dict(img_size=32, patch_size=8, embed_dim=48, depth=2, num_heads=4)


def relpos(arch: str):
    extra = {"rel_pos_dim": 16} if "srelpos" in arch else {}
    return perturb(timm.create_model(arch, pretrained=False, num_classes=5, **ARGS, **extra))


def check(vm, model, size: tuple[int, int] = (32, 32)) -> None:
    x = torch.randn(1, 3, *size, generator=torch.Generator().manual_seed(size[1]))
    out, maps = timm_reference(model, x)
    r = vm.run(x)
    assert len(maps) == 2 and r.attentions.shape[-1] == maps[0].shape[-1]
    for i, ref in enumerate(maps):
        np.testing.assert_allclose(r.attentions[i], ref[0].numpy(), atol=ATOL, err_msg=f"layer {i} at {size}")
    np.testing.assert_allclose(r.logits, out[0].numpy(), atol=ATOL)


CASES = {   # architecture -> (rel_pos, prefix, pooling, block_norm)
    "vit_relpos_base_patch16_224": ("layer", (), "avg", "pre"),
    "vit_srelpos_small_patch16_224": ("shared", (), "avg", "pre"),
    "vit_relpos_base_patch16_cls_224": ("layer", ("cls",), "token", "pre"),
    "vit_relpos_base_patch16_clsgap_224": ("layer", ("cls",), "avg", "pre"),
    "vit_relpos_base_patch32_plus_rpn_256": ("layer", (), "avg", "res_post"),
}


@pytest.mark.parametrize("arch", list(CASES))
def test_relpos_state_dict_named_by_its_file(tmp_path, arch: str) -> None:
    model = relpos(arch)
    path = tmp_path / f"{arch}.pth"
    torch.save(model.state_dict(), path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GuessWarning)   # a file name is a guess (said); the preprocessing
        vm = vitviz.load(path, heads=4, image_size=32, device="cpu")
    s = vm.spec
    rel_pos, prefix, pooling, block_norm = CASES[arch]
    assert s.family == "timm_relpos" and s.rel_pos == rel_pos and s.rel_pos_mlp == (16 if "srelpos" in arch else 128)
    assert s.prefix_names == prefix and s.pooling == pooling and s.block_norm == block_norm and not s.pos_embed
    assert s.position_kind == "relative"
    check(vm, model)


@pytest.mark.parametrize("arch", ["vit_relpos_base_patch16_224", "vit_relpos_base_patch16_cls_224"])
def test_relpos_hub_folder_at_two_sizes(tmp_path, arch: str) -> None:
    model = relpos(arch)
    timm.models._hub.save_for_hf(model, str(tmp_path), model_args=ARGS, safe_serialization=True)
    vm = vitviz.load(tmp_path, device="cpu")
    s = vm.spec
    assert s.kind_of("block_norm") == "named" and s.kind_of("rel_pos_mlp") == "derived" and s.num_heads == 4
    assert not {"block_norm", "eps", "pooling", "rel_pos", "rel_pos_mlp"} & set(dict(s.guesses))
    check(vm, model)
    verdict = vitviz.verify(vm, sizes=[32])
    assert verdict.verdict == "verified", verdict
    model.set_input_size(img_size=(40, 48))   # timm recomputes the MLP's coordinates for the new grid
    check(vm, model, (40, 48))


def test_relpos_plus_heads_follow_head_dim_64(tmp_path) -> None:
    """vit_relpos_base_patch16_plus_240 is 896 wide with 14 heads: a hub config that states no heads must not take
    'base' -> 12 from the name."""
    import json

    args = dict(img_size=32, patch_size=8, embed_dim=128, depth=2)
    model = perturb(timm.create_model("vit_relpos_base_patch16_plus_240", pretrained=False, num_classes=5,
                                      num_heads=2, **args))
    timm.models._hub.save_for_hf(model, str(tmp_path), model_args=args, safe_serialization=True)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["model_args"].pop("num_heads", None)   # as timm's own hub configs: no head count written
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    vm = vitviz.load(tmp_path, device="cpu")
    assert vm.spec.num_heads == 2 and "head dim 64" in vm.spec.source_of("num_heads")
    check(vm, model)
