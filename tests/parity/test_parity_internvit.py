"""transformers InternViT (InternVL's vision tower, issue 31): exact by file -- an `InternVLVisionModel` folder and
a whole InternVL folder opened as its vision tower -- and live, against transformers' own eager attention, with a
verdict; q/k norm (InternViT-6B's, over the whole width) refused by file by name, exact live."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import vitviz
from parity_refs import perturb
from vitviz.core.spec import GuessWarning
from vitviz.errors import UnknownLayoutError

transformers = pytest.importorskip("transformers")

ATOL = 1e-5
VISION = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, image_size=32,
              patch_size=8, attention_bias=True)
TEXT = dict(model_type="qwen2", hidden_size=32, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=64, vocab_size=128)


def tower(**kw) -> torch.nn.Module:
    config = transformers.InternVLVisionConfig(**{**VISION, **kw}, attn_implementation="eager")
    return perturb(transformers.InternVLVisionModel(config))


def eager(net: torch.nn.Module, x: torch.Tensor) -> tuple[list[np.ndarray], np.ndarray]:
    """transformers' own attention (eager, output_attentions) and the CLS token of its last_hidden_state."""
    with torch.no_grad():
        out = net(pixel_values=x, output_attentions=True)
    return [a.numpy() for a in out.attentions], out.last_hidden_state[:, 0].numpy()


def quiet_load(what, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GuessWarning)
        return vitviz.load(what, device="cpu", **kw)


def check(model, net: torch.nn.Module, seed: int = 1) -> None:
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(seed))
    maps, cls = eager(net, x)
    attn, out = model.forward_captured(x)
    assert attn.shape == (2, 2, 4, 17, 17)
    for i, ref in enumerate(maps):
        np.testing.assert_allclose(attn[:, i], ref, atol=ATOL, err_msg=f"layer {i}")
    np.testing.assert_allclose(out, cls, atol=1e-4)


@pytest.mark.parametrize("mean_pooling", [True, False], ids=["no-final-norm", "final-layernorm"])
def test_internvit_folder_is_exact_and_verified(tmp_path, mean_pooling: bool) -> None:
    net = tower(use_mean_pooling=mean_pooling)
    net.save_pretrained(tmp_path)
    model = quiet_load(tmp_path)
    assert model.spec.family == "hf-internvit" and model.spec.num_heads == 4 and model.spec.layer_scale
    assert model.spec.final_norm == (not mean_pooling)
    check(model, net)
    verdict = vitviz.verify(model)
    assert verdict.verdict == "verified", verdict.summary()


def test_internvl_folder_opens_its_vision_tower_exactly(tmp_path) -> None:
    config = transformers.InternVLConfig(vision_config=VISION, text_config=TEXT, image_token_id=5)
    whole = perturb(transformers.InternVLForConditionalGeneration(config))
    whole.save_pretrained(tmp_path)
    model = quiet_load(tmp_path)
    assert model.spec.family == "hf-internvit" and "internvl" in model.spec.source_of("identity")
    net = whole.model.vision_tower
    net.config._attn_implementation = "eager"
    check(model, net, seed=2)
    verdict = vitviz.verify(model)
    assert verdict.verdict == "verified", verdict.summary()


def test_internvit_live_is_exact() -> None:
    net = tower()
    model = quiet_load(net, live=True)
    assert model.spec.family == "live" and [n for n, _ in model.layers] == [
        "encoder.layer.0.attention", "encoder.layer.1.attention"]
    check(model, net, seed=3)


def test_internvit_qk_norm_is_refused_by_file_and_exact_live(tmp_path) -> None:
    net = tower(use_qk_norm=True)
    net.save_pretrained(tmp_path)
    with pytest.raises(UnknownLayoutError, match=r"InternViT with q/k norm .*vitviz\.load\(module\)"):
        quiet_load(tmp_path)
    check(quiet_load(net), net, seed=4)    # the model object: its own code, run live
