"""transformers ViTPose (issue 31: it crashed): no CLS token, a position table whose CLS row is added to every
patch, a patch conv padded by 2 px, the backbone's settings in `backbone_config`. Exact against
`VitPoseForPoseEstimation`'s backbone (eager attention), saved with `save_pretrained`."""
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

ATOL = 1e-5


def vitpose(**extra):
    from transformers import VitPoseBackboneConfig, VitPoseConfig, VitPoseForPoseEstimation

    backbone = VitPoseBackboneConfig(image_size=[32, 24], patch_size=[8, 8], hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=4, mlp_ratio=2, layer_norm_eps=1e-6, out_indices=[2],
                                     attn_implementation="eager", **extra)
    return perturb(VitPoseForPoseEstimation(VitPoseConfig(backbone_config=backbone)))


def test_vitpose_is_exact(tmp_path) -> None:
    model = vitpose()
    model.save_pretrained(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GuessWarning)   # the preprocessing: no preprocessor_config.json here
        vm = vitviz.load(tmp_path, device="cpu")
    s = vm.spec
    assert s.family == "hf-vitpose" and s.prefix_names == () and s.num_heads == 4 and s.eps == 1e-6
    assert s.image_size == (32, 24) and s.patch_pad == 2 and s.pooling == "avg"
    assert s.kind_of("patch_pad") == "named" and "backbone_config" in s.source_of("num_heads")
    assert not {"num_heads", "eps", "patch_pad", "pos_prefix", "image_size"} & set(dict(s.guesses))
    x = torch.randn(1, 3, 32, 24, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        o = model.backbone(x, output_attentions=True)
    r = vm.run(x)
    assert r.attentions.shape == (2, 4, 12, 12)
    for i, ref in enumerate(o.attentions):
        np.testing.assert_allclose(r.attentions[i], ref[0].numpy(), atol=ATOL, err_msg=f"layer {i}")
    # the backbone's output: the final norm over the patch tokens (the heatmap head is not the ViT's); vitviz pools
    np.testing.assert_allclose(r.features, o.feature_maps[-1][0].mean(0).numpy(), atol=ATOL)
    verdict = vitviz.verify(vm)   # transformers builds the task model; its backbone is compared
    assert verdict.verdict == "verified", verdict


def test_vitpose_plus_is_refused_by_name(tmp_path) -> None:
    model = vitpose()
    model.save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["backbone_config"]["num_experts"] = 6
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(VitvizError, match=r"ViTPose\+ .*num_experts=6.*not supported yet"):
        vitviz.load(tmp_path, device="cpu")


def test_vitpose_weights_without_config_are_refused_saying_what_to_keep(tmp_path) -> None:
    """Without config.json, transformers ViT keys with no CLS token are I-JEPA's or ViTPose's; a non-square table
    is not I-JEPA's: the refusal says which models it could be and to keep the config beside the file."""
    from safetensors.torch import save_file

    model = vitpose()
    sd = {k[len("backbone."):]: v.contiguous() for k, v in model.state_dict().items() if k.startswith("backbone.")}
    path = tmp_path / "weights.safetensors"
    save_file(sd, str(path))
    with pytest.raises(VitvizError, match=r"ViTPose.*config\.json") as e:
        vitviz.load(path, heads=4, device="cpu")
    assert "please report" not in str(e.value)


def test_vitpose_model_object_opens_exactly() -> None:
    """vitviz.load(model) with the transformers object: its config travels with it, the same exact reading."""
    model = vitpose()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GuessWarning)
        vm = vitviz.load(model, device="cpu")
    assert vm.spec.family == "hf-vitpose" and vm.spec.patch_pad == 2
    x = torch.randn(1, 3, 32, 24, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        o = model.backbone(x, output_attentions=True)
    r = vm.run(x)
    for i, ref in enumerate(o.attentions):
        np.testing.assert_allclose(r.attentions[i], ref[0].numpy(), atol=ATOL, err_msg=f"layer {i}")
