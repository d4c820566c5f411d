"""transformers I-JEPA (issue 31: a no-CLS model read as if it had one): exact against `IJepaModel` and
`IJepaForImageClassification` (eager attention), saved with `save_pretrained`, at its native grid and resampled;
`vitviz verify` builds the original and says verified."""
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


def config(**extra):
    from transformers import IJepaConfig

    return IJepaConfig(image_size=32, patch_size=8, hidden_size=48, num_hidden_layers=2, num_attention_heads=3,
                       intermediate_size=96, layer_norm_eps=1e-6, attn_implementation="eager", **extra)


def load(path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GuessWarning)   # the preprocessing: no preprocessor_config.json here
        return vitviz.load(path, device="cpu")


def check(vm, model, x: torch.Tensor, **kw) -> None:
    with torch.no_grad():
        o = model(pixel_values=x, output_attentions=True, **kw)
    r = vm.run(x)
    n = (x.shape[-2] // 8) * (x.shape[-1] // 8)
    assert r.attentions.shape == (2, 3, n, n)
    for i, ref in enumerate(o.attentions):
        np.testing.assert_allclose(r.attentions[i], ref[0].numpy(), atol=ATOL, err_msg=f"layer {i}")
    if getattr(o, "logits", None) is not None:
        np.testing.assert_allclose(r.logits, o.logits[0].numpy(), atol=ATOL)
    else:
        np.testing.assert_allclose(r.features, o.last_hidden_state[0].mean(0).numpy(), atol=ATOL)


def test_ijepa_backbone(tmp_path) -> None:
    from transformers import IJepaModel

    model = perturb(IJepaModel(config()))
    model.save_pretrained(tmp_path)
    vm = load(tmp_path)
    s = vm.spec
    assert s.family == "hf-ijepa" and s.prefix_names == () and s.pos_prefix == 0 and s.num_heads == 3
    assert s.pooling == "avg" and s.eps == 1e-6 and not {"num_heads", "pos_prefix", "pooling"} & set(dict(s.guesses))
    check(vm, model, torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(1)))
    check(vm, model, torch.randn(1, 3, 40, 56, generator=torch.Generator().manual_seed(2)),
          interpolate_pos_encoding=True)


def test_ijepa_classifier(tmp_path) -> None:
    from transformers import IJepaForImageClassification

    model = perturb(IJepaForImageClassification(config(num_labels=5)))
    model.save_pretrained(tmp_path)
    vm = load(tmp_path)
    assert vm.spec.num_classes == 5 and vm.spec.family == "hf-ijepa"
    check(vm, model, torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(3)))


def test_ijepa_weights_without_config_are_read_by_layout(tmp_path) -> None:
    from transformers import IJepaModel

    model = perturb(IJepaModel(config()))
    model.save_pretrained(tmp_path)
    (tmp_path / "config.json").unlink()
    vm = vitviz.load(tmp_path / "model.safetensors", heads=3, device="cpu")
    assert vm.spec.family == "hf-ijepa" and vm.spec.prefix_names == () and vm.spec.pos_prefix == 0
    source = vm.spec.source_of("pos_prefix")
    assert "without a CLS token" in source or source.startswith("shape")
    with torch.no_grad():
        o = model(pixel_values=torch.zeros(1, 3, 32, 32), output_attentions=True)
    r = vm.run(torch.zeros(1, 3, 32, 32))
    np.testing.assert_allclose(r.attentions[-1], o.attentions[-1][0].numpy(), atol=ATOL)


def test_ijepa_verifies(tmp_path) -> None:
    from transformers import IJepaModel

    perturb(IJepaModel(config())).save_pretrained(tmp_path)
    vm = load(tmp_path)
    check_ = vitviz.verify(vm)
    assert check_.verdict == "verified", check_


def test_original_ijepa_checkpoint_takes_the_encoder_and_says_the_target_encoder(tmp_path) -> None:
    """facebookresearch/ijepa's `.pth.tar`: encoder, predictor and target_encoder (its EMA) under `module.`: a
    timm-layout ViT without a CLS token. The encoder is taken (as transformers' converter does) and the choice is
    said, naming nest_key='target_encoder', which opens the other exactly."""
    from timm.models.vision_transformer import VisionTransformer

    from parity_refs import timm_reference

    def vit(seed: int):
        return perturb(VisionTransformer(img_size=32, patch_size=8, embed_dim=48, depth=2, num_heads=3,
                                         class_token=False, global_pool="avg", num_classes=0), seed=seed)

    enc, target = vit(1), vit(2)
    prefixed = lambda m: {f"module.{k}": v for k, v in m.state_dict().items()}   # noqa: E731
    path = tmp_path / "IN1K-vit.h.14-300e.pth.tar"
    torch.save({"encoder": prefixed(enc), "target_encoder": prefixed(target), "epoch": 300, "opt": {},
                "predictor": {"module.predictor_embed.weight": torch.zeros(16, 48)}}, path)
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(4))
    with pytest.warns(GuessWarning, match="target_encoder"):
        vm = vitviz.load(path, heads=3, device="cpu")
    assert vm.spec.prefix_names == () and "nest_key" in dict(vm.spec.guesses)
    for model, loaded in ((enc, vm), (target, load_quiet(path, nest_key="target_encoder"))):
        out, maps = timm_reference(model, x)
        r = loaded.run(x)
        for i, ref in enumerate(maps):
            np.testing.assert_allclose(r.attentions[i], ref[0].numpy(), atol=ATOL, err_msg=f"layer {i}")
        np.testing.assert_allclose(r.features, out[0].numpy(), atol=ATOL)


def load_quiet(path, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GuessWarning)
        return vitviz.load(path, heads=3, device="cpu", **kw)
