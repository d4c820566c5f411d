"""A model built on a DINOv3 backbone (transformers' CHMv2, `model_type: chmv2`): the backbone's settings are in
`backbone_config`, not at the top of config.json.

Issue 31: such a folder opened with 1 head where the original has 4 (DINOv3's head-dim-64 rule was taken as a
fact while `backbone_config.num_attention_heads` said 4), at 224 px where the backbone's image size is 32. The
backbone's config is read now; the head-dim rule is used only when nothing states the heads, and then flagged.
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

transformers = pytest.importorskip("transformers")
CHMv2 = pytest.importorskip("transformers.models.chmv2")

ATOL = 1e-5


def chmv2(heads: int = 4, hidden: int = 32):
    from transformers import CHMv2Config, CHMv2ForDepthEstimation

    backbone = dict(model_type="dinov3_vit", image_size=32, patch_size=8, hidden_size=hidden, intermediate_size=64,
                    num_attention_heads=heads, num_hidden_layers=4, num_register_tokens=4, out_indices=[1, 2, 3, 4],
                    layer_norm_eps=1e-6, rope_theta=50.0)
    cfg = CHMv2Config(backbone_config=backbone, patch_size=8, post_process_channels=[8, 8, 8, 8],
                      fusion_hidden_size=8, head_hidden_size=8, number_output_channels=8)
    cfg.backbone_config._attn_implementation = "eager"
    return perturb(CHMv2ForDepthEstimation(cfg))


def test_chmv2_reads_the_backbone_config(tmp_path) -> None:
    model = chmv2(heads=4)
    model.save_pretrained(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GuessWarning)   # the preprocessing (no preprocessor_config.json here)
        vm = vitviz.load(tmp_path, device="cpu")
    s = vm.spec
    assert not {"num_heads", "eps", "rope_theta", "image_size"} & set(dict(s.guesses))
    assert s.family == "hf-dinov3" and s.num_heads == 4 and s.eps == 1e-6 and s.rope_theta == 50.0
    assert s.image_size == (32, 32) and s.prefix_names == ("cls", "reg0", "reg1", "reg2", "reg3")
    assert "backbone_config" in s.source_of("num_heads") and s.kind_of("num_heads") == "read"
    x = torch.randn(1, 3, 32, 40, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        o = model.backbone(x, output_attentions=True, output_hidden_states=True)
    r = vm.run(x)
    assert r.attentions.shape == (4, 4, 5 + 4 * 5, 5 + 4 * 5)
    for i, ref in enumerate(o.attentions):
        np.testing.assert_allclose(r.attentions[i], ref[0].numpy(), atol=ATOL, err_msg=f"layer {i}")
    cls = model.backbone.norm(o.hidden_states[-1])[0, 0]   # the normed CLS token
    np.testing.assert_allclose(r.features, cls.detach().numpy(), atol=ATOL)
    verdict = vitviz.verify(vm)   # transformers builds the task model; its backbone is compared
    assert verdict.verdict == "verified", verdict


def test_dinov3_head_dim_rule_is_flagged_when_nothing_states_the_heads(tmp_path) -> None:
    model = chmv2(heads=8, hidden=128)   # the head-dim-64 rule says 2
    model.save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["backbone_config"].pop("num_attention_heads")
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.warns(GuessWarning, match="head"):
        vm = vitviz.load(tmp_path, device="cpu")
    assert vm.spec.num_heads == 2 and vm.spec.kind_of("num_heads") == "assumed" and "num_heads" in dict(vm.spec.guesses)
