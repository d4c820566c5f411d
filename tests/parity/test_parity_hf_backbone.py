"""transformers task models on a plain-ViT backbone (issue 31: Depth Anything was refused unclearly): the
DINOv2 backbone of `DepthAnythingForDepthEstimation`, read with its `backbone_config`, is exact against the
original's backbone (eager attention), saved with `save_pretrained`; the DPT neck and head are dropped, said."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import vitviz
from parity_refs import perturb
from vitviz.core.spec import GuessWarning

transformers = pytest.importorskip("transformers")

ATOL = 1e-5


@pytest.mark.parametrize("registers", [0, 2])
def test_depth_anything_backbone(tmp_path, registers: int) -> None:
    from transformers import DepthAnythingConfig, DepthAnythingForDepthEstimation, Dinov2Config, \
        Dinov2WithRegistersConfig

    kind = Dinov2WithRegistersConfig if registers else Dinov2Config
    extra = {"num_register_tokens": registers} if registers else {}
    backbone = kind(image_size=28, patch_size=14, hidden_size=32, num_hidden_layers=4, num_attention_heads=4,
                    layer_norm_eps=1e-5, out_indices=[1, 2, 3, 4], reshape_hidden_states=False,
                    attn_implementation="eager", **extra)
    model = perturb(DepthAnythingForDepthEstimation(DepthAnythingConfig(
        backbone_config=backbone, reassemble_hidden_size=32, neck_hidden_sizes=[8, 8, 8, 8], fusion_hidden_size=8,
        head_hidden_size=8, patch_size=14)))
    model.save_pretrained(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GuessWarning)   # the preprocessing: no preprocessor_config.json here
        vm = vitviz.load(tmp_path, device="cpu")
    s = vm.spec
    assert s.family == "hf-dinov2" and s.num_heads == 4 and s.eps == 1e-5 and s.reg_tokens == registers
    # read from the folder's config (its backbone_config: the composite-tower reader's sub-config), never guessed
    assert s.kind_of("num_heads") == "read" and "depth_anything" in s.source_of("identity")
    assert not {"num_heads", "eps"} & set(dict(s.guesses))
    x = torch.randn(1, 3, 28, 42, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        o = model.backbone(x, output_attentions=True, output_hidden_states=True)
        cls = model.backbone.layernorm(o.hidden_states[-1])[0, 0]   # the final norm's CLS token
    r = vm.run(x)
    assert r.attentions.shape == (4, 4, 1 + registers + 6, 1 + registers + 6)
    for i, ref in enumerate(o.attentions):
        np.testing.assert_allclose(r.attentions[i], ref[0].numpy(), atol=ATOL, err_msg=f"layer {i}")
    np.testing.assert_allclose(r.features, cls.numpy(), atol=ATOL)
    verdict = vitviz.verify(vm)   # transformers builds the task model; its backbone is compared
    assert verdict.verdict == "verified", verdict
