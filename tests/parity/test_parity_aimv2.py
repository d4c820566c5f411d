"""timm AIMv2 (`aimv2_*`, issue 31: refused before): RMSNorm without bias everywhere (blocks, patch embedding,
final norm; `spec.norm_kind='rms'`), SwiGLU gated with SiLU, no biases, no CLS token, average pooling. Exact against
timm, from a timm hub folder (named) and a state dict whose file name says AIMv2 (a flagged guess); a file that
names nothing is still refused, saying RMSNorm and LayerNorm(bias=False) cannot be told apart."""
from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch

import vitviz
from parity_refs import perturb, timm_reference
from vitviz.core.spec import GuessWarning
from vitviz.errors import VitvizError

timm = pytest.importorskip("timm")

ATOL = 1e-5
ARGS = dict(img_size=32, patch_size=8, embed_dim=48, depth=2, num_heads=4)


def aimv2():
    return perturb(timm.create_model("aimv2_large_patch14_224", pretrained=False, num_classes=5, **ARGS))


def check(vm, model) -> None:
    """Logits and every layer's attention at the native size (timm builds AIMv2 for a fixed input size)."""
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    out, maps = timm_reference(model, x)
    r = vm.run(x)
    assert r.attentions.shape == (2, 4, 16, 16)
    for i, ref in enumerate(maps):
        np.testing.assert_allclose(r.attentions[i], ref[0].numpy(), atol=ATOL, err_msg=f"layer {i}")
    np.testing.assert_allclose(r.logits, out[0].numpy(), atol=ATOL)


def test_aimv2_hub_folder(tmp_path) -> None:
    model = aimv2()
    timm.models._hub.save_for_hf(model, str(tmp_path), model_args=ARGS, safe_serialization=True)
    vm = vitviz.load(tmp_path, device="cpu")
    s = vm.spec
    assert s.norm_kind == "rms" and s.eps == 1e-5 and s.mlp_kind == "swiglu" and s.prefix_names == ()
    assert not s.qkv_bias and not s.proj_bias and not s.mlp_bias and s.pooling == "avg" and s.num_heads == 4
    assert s.kind_of("norm_kind") == "named" and not {"norm_kind", "eps", "mlp_kind"} & set(dict(s.guesses))
    check(vm, model)
    verdict = vitviz.verify(vm)   # timm builds aimv2_large_patch14_224 with the folder's model_args
    assert verdict.verdict == "verified", verdict


def test_aimv2_state_dict_named_by_its_file_is_a_flagged_guess(tmp_path) -> None:
    model = aimv2()
    path = tmp_path / "aimv2_large_patch14_224.pth"
    torch.save(model.state_dict(), path)
    with pytest.warns(GuessWarning, match="norm_kind"):
        vm = vitviz.load(path, heads=4, device="cpu")
    assert vm.spec.norm_kind == "rms" and "norm_kind" in dict(vm.spec.guesses)
    check(vm, model)


def test_rms_norm_file_naming_nothing_is_refused(tmp_path) -> None:
    path = tmp_path / "model.pth"
    torch.save(aimv2().state_dict(), path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GuessWarning)
        with pytest.raises(VitvizError, match=r"RMSNorm, or LayerNorm\(bias=False\)"):
            vitviz.load(path, heads=4, device="cpu")


# ------------------------------------------------------------------------------------ transformers AIMv2
@pytest.mark.parametrize("use_head", [False, True])
def test_hf_aimv2_vision_model(tmp_path, use_head: bool) -> None:
    """transformers `Aimv2VisionModel`: RMSNorm, SwiGLU, separate q/k/v; with `use_head` its attention-pooling
    head is the MAP head (identity query projection, no MLP) and the features are its `pooler_output`."""
    transformers = pytest.importorskip("transformers")

    model = perturb(transformers.Aimv2VisionModel(transformers.Aimv2VisionConfig(
        image_size=32, patch_size=8, hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        rms_norm_eps=1e-6, use_head=use_head, attn_implementation="eager")))
    model.save_pretrained(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GuessWarning)   # the preprocessing: no preprocessor_config.json here
        vm = vitviz.load(tmp_path, device="cpu")
    s = vm.spec
    assert s.family == "hf-aimv2" and s.norm_kind == "rms" and s.eps == 1e-6 and s.mlp_kind == "swiglu"
    assert s.prefix_names == () and s.num_heads == 4 and s.pooling == ("map" if use_head else "avg")
    assert not {"norm_kind", "eps", "mlp_kind", "num_heads", "pooling"} & set(dict(s.guesses))
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        o = model(pixel_values=x, output_attentions=True)
    r = vm.run(x)
    for i, ref in enumerate(o.attentions):
        np.testing.assert_allclose(r.attentions[i], ref[0].numpy(), atol=ATOL, err_msg=f"layer {i}")
    expected = o.pooler_output[0] if use_head else o.last_hidden_state[0].mean(0)
    np.testing.assert_allclose(r.features, expected.numpy(), atol=ATOL)
    if use_head:   # the head's own attention: its learned query over the patches
        assert r.pool_attention is not None and r.pool_attention.shape == (4, 16)
    verdict = vitviz.verify(vm)
    assert verdict.verdict == "verified", verdict


def test_aimv2_heads_follow_its_head_dim_not_the_size_word(tmp_path) -> None:
    """AIMv2-L is 1024 wide with 8 heads (head dim 128 at every size): a hub folder whose model_args state no
    heads must not take 'large' -> 16 from the name."""
    args = dict(img_size=32, patch_size=8, embed_dim=256, depth=2)
    model = perturb(timm.create_model("aimv2_large_patch14_224", pretrained=False, num_classes=5, num_heads=2, **args))
    timm.models._hub.save_for_hf(model, str(tmp_path), model_args=args, safe_serialization=True)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["model_args"].pop("num_heads", None)   # as timm's own hub configs: no head count written
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    vm = vitviz.load(tmp_path, device="cpu")
    assert vm.spec.num_heads == 2 and "head dim 128" in vm.spec.source_of("num_heads")
    check_at(vm, model, 2)


def check_at(vm, model, heads: int) -> None:
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    out, maps = timm_reference(model, x)
    r = vm.run(x)
    assert r.attentions.shape == (2, heads, 16, 16)
    for i, ref in enumerate(maps):
        np.testing.assert_allclose(r.attentions[i], ref[0].numpy(), atol=ATOL, err_msg=f"layer {i}")
    np.testing.assert_allclose(r.logits, out[0].numpy(), atol=ATOL)


def to_apple(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """timm's aimv2 state dict -> apple/ml-aim's layout (timm's `_convert_aimv2`, inverted)."""
    out = {}
    for k, v in sd.items():
        if k.startswith("head."):
            continue
        k = k.replace("patch_embed.", "preprocessor.patchifier.").replace("norm1", "norm_1").replace("norm2", "norm_2")
        k = "preprocessor.pos_embed" if k == "pos_embed" else k
        k = k.replace("mlp.fc2.", "mlp.fc2_tmp.").replace("mlp.fc1_g", "mlp.fc1").replace("mlp.fc1_x", "mlp.fc3")
        k = k.replace("mlp.fc2_tmp.", "mlp.fc2.")
        k = "trunk.post_trunk_norm." + k[len("norm."):] if k.startswith("norm.") else k
        k = "trunk." + k if k.startswith("blocks.") else k
        out[k] = v
    return out


def test_apple_aimv2_layout(tmp_path) -> None:
    """apple/ml-aim's own files: RMSNorm and SwiGLU derived from its layout; heads from AIMv2's head dim 128
    (flagged: nothing names the model)."""
    args = dict(img_size=32, patch_size=8, embed_dim=256, depth=2, num_heads=2)
    model = perturb(timm.create_model("aimv2_large_patch14_224", pretrained=False, num_classes=0, **args))
    path = tmp_path / "aimv2-large-patch14-224.pth"
    torch.save(to_apple(model.state_dict()), path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GuessWarning)
        vm = vitviz.load(path, device="cpu")
    s = vm.spec
    assert s.family == "hf-aimv2" and s.norm_kind == "rms" and s.kind_of("norm_kind") == "derived"
    assert s.num_heads == 2 and s.mlp_kind == "swiglu" and s.prefix_names == ()
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    out, maps = timm_reference(model, x)
    r = vm.run(x)
    for i, ref in enumerate(maps):
        np.testing.assert_allclose(r.attentions[i], ref[0].numpy(), atol=ATOL, err_msg=f"layer {i}")
    np.testing.assert_allclose(r.features, out[0].numpy(), atol=ATOL)
