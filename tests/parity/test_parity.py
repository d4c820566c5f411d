"""Exact parity with the original implementations (timm, torchvision, transformers, and the seed layouts).

Each case builds the original with random weights, perturbs every parameter (so eps, placement and scale
mistakes show), saves it the way its users save it, loads the file with vitviz, and compares the logits and
every layer's per-head attention with the original's eager attention at atol 1e-5 (float32).
"""
from __future__ import annotations

import argparse
import json

import numpy as np
import pytest
import torch

import vitviz
from vitviz.core.spec import GuessWarning
from parity_refs import (SeedViT, WZViT, hf_dinov2_to_original, hf_reference, perturb, seed_reference,
                         timm_reference, torchvision_reference)

timm = pytest.importorskip("timm")
transformers = pytest.importorskip("transformers")
from timm.models.vision_transformer import VisionTransformer  # noqa: E402

ATOL = 1e-5
SMALL = dict(img_size=32, patch_size=8, embed_dim=192, depth=2, num_heads=3, mlp_ratio=2.0)


def assert_parity(vm, x: torch.Tensor, ref_out: torch.Tensor, ref_maps: list[torch.Tensor]) -> None:
    result = vm.run(x)
    assert result.attentions.shape == (len(ref_maps), *ref_maps[0].shape[1:])
    for i, ref in enumerate(ref_maps):
        np.testing.assert_allclose(result.attentions[i], ref[0].numpy(), atol=ATOL, err_msg=f"layer {i}")
    out = result.logits if vm.spec.num_classes else result.features  # a headless model's output is features
    assert out is not None and (result.logits.size == 0) == (vm.spec.num_classes == 0)
    np.testing.assert_allclose(out, ref_out[0].numpy(), atol=ATOL)
    np.testing.assert_allclose(result.attentions.sum(-1), 1.0, atol=1e-5)


def n_params(model: torch.nn.Module, skip: tuple[str, ...] = ()) -> int:
    return sum(p.numel() for n, p in model.named_parameters() if not any(s in n for s in skip))


def x_for(c: int = 3, h: int = 32, w: int = 32) -> torch.Tensor:
    return torch.randn(1, c, h, w, generator=torch.Generator().manual_seed(1))


# ----------------------------------------------------------------------------------------------------- timm
TIMM_CASES = {
    "default": dict(),
    "avg_no_cls": dict(class_token=False, global_pool="avg"),
    "registers": dict(reg_tokens=2),
    "no_embed_class_reg": dict(no_embed_class=True, reg_tokens=1),
    "layer_scale": dict(init_values=0.1),
    "qk_norm": dict(qk_norm=True),
    "no_qkv_bias": dict(qkv_bias=False),
}


@pytest.mark.parametrize("name", list(TIMM_CASES))
@pytest.mark.parametrize("suffix", [".pth", ".safetensors"])
def test_timm_state_dicts(tmp_path, name: str, suffix: str) -> None:
    model = perturb(VisionTransformer(num_classes=5, **SMALL, **TIMM_CASES[name]))
    path = tmp_path / f"model{suffix}"
    if suffix == ".pth":
        torch.save(model.state_dict(), path)
    else:
        from safetensors.torch import save_file
        save_file(model.state_dict(), str(path))
    vm = vitviz.load(path, device="cpu")  # heads from the embed-dim table (192 -> 3)
    assert vm.spec.num_heads == 3 and vm.spec.family == "timm"
    assert vm.spec.num_params == n_params(model)
    x = x_for()
    assert_parity(vm, x, *timm_reference(model, x))


def test_timm_training_checkpoint_prefers_ema(tmp_path) -> None:
    model, ema = perturb(VisionTransformer(num_classes=5, **SMALL), seed=1), perturb(VisionTransformer(num_classes=5, **SMALL), seed=2)
    ckpt = {"epoch": 3, "arch": "vit_tiny_patch8_32", "args": argparse.Namespace(model="vit_tiny_patch8_32", img_size=32),
            "state_dict": {f"module.{k}": v for k, v in model.state_dict().items()}, "state_dict_ema": ema.state_dict(),
            "optimizer": {"state": {}, "param_groups": []}}
    torch.save(ckpt, tmp_path / "checkpoint-3.pth.tar")
    vm = vitviz.load(tmp_path / "checkpoint-3.pth.tar", device="cpu")
    assert vm.spec.source_of("num_heads").startswith("metadata")
    x = x_for()
    assert_parity(vm, x, *timm_reference(ema, x))
    vm2 = vitviz.load(tmp_path / "checkpoint-3.pth.tar", nest_key="state_dict", device="cpu")
    assert_parity(vm2, x, *timm_reference(model, x))


def test_timm_hub_folder(tmp_path) -> None:
    model = perturb(timm.create_model("vit_small_patch16_224", pretrained=False, num_classes=4, depth=2, img_size=32,
                                      patch_size=8, embed_dim=96))  # 6 heads from the name; table would say 1
    timm.models._hub.save_for_hf(model, str(tmp_path), model_args=dict(img_size=32, patch_size=8, depth=2, embed_dim=96),
                                 safe_serialization=True)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["architecture"] == "vit_small_patch16_224"
    vm = vitviz.load(tmp_path, device="cpu")
    assert vm.spec.num_heads == 6 and vm.spec.image_size == (32, 32)
    x = x_for()
    assert_parity(vm, x, *timm_reference(model, x))


def test_timm_dynamic_size_matches_timm_resampling(tmp_path) -> None:
    model = perturb(VisionTransformer(num_classes=5, dynamic_img_size=True, **SMALL))
    torch.save(model.state_dict(), tmp_path / "m.pth")
    vm = vitviz.load(tmp_path / "m.pth", device="cpu")
    x = x_for(h=40, w=56)  # non-square, another resolution: timm resamples bicubic with antialias
    out, maps = timm_reference(model, x)
    r = vm.run(x)
    assert r.spec.grid == (5, 7)
    np.testing.assert_allclose(r.logits, out[0].numpy(), atol=ATOL)
    np.testing.assert_allclose(r.attentions[-1], maps[-1][0].numpy(), atol=ATOL)


def test_deit_distilled(tmp_path) -> None:
    from timm.models.deit import VisionTransformerDistilled
    model = perturb(VisionTransformerDistilled(num_classes=5, **SMALL))
    torch.save({"model": model.state_dict()}, tmp_path / "deit_tiny_distilled.pth")
    vm = vitviz.load(tmp_path / "deit_tiny_distilled.pth", device="cpu")
    assert vm.spec.family == "deit" and vm.spec.prefix_names == ("cls", "dist")
    x = x_for()
    assert_parity(vm, x, *timm_reference(model, x))


def test_deit3_gamma_names(tmp_path) -> None:
    model = perturb(VisionTransformer(num_classes=5, no_embed_class=True, init_values=1e-6, **SMALL))
    sd = {k.replace("ls1.gamma", "gamma_1").replace("ls2.gamma", "gamma_2"): v for k, v in model.state_dict().items()}
    torch.save({"model": sd}, tmp_path / "deit_3_tiny.pth")
    vm = vitviz.load(tmp_path / "deit_3_tiny.pth", device="cpu")
    assert vm.spec.family == "deit3" and vm.spec.layer_scale and vm.spec.pos_prefix == 0
    x = x_for()
    assert_parity(vm, x, *timm_reference(model, x))


def test_dino_training_checkpoint(tmp_path) -> None:
    teacher = perturb(VisionTransformer(num_classes=0, **SMALL), seed=3)
    student = perturb(VisionTransformer(num_classes=0, **SMALL), seed=4)
    head = {"head.mlp.0.weight": torch.randn(64, 192), "head.mlp.0.bias": torch.randn(64),
            "head.last_layer.weight_g": torch.randn(100, 1), "head.last_layer.weight_v": torch.randn(100, 64)}
    ckpt = {"teacher": {**{f"backbone.{k}": v for k, v in teacher.state_dict().items()}, **head},
            "student": {**{f"module.backbone.{k}": v for k, v in student.state_dict().items()},
                        **{f"module.{k}": v for k, v in head.items()}},
            "epoch": 10, "args": argparse.Namespace(arch="vit_tiny", patch_size=8)}
    torch.save(ckpt, tmp_path / "checkpoint.pth")
    vm = vitviz.load(tmp_path / "checkpoint.pth", device="cpu")
    assert vm.spec.family == "dino" and vm.spec.num_classes == 0 and any("head.mlp" in k for k in vm.dropped)
    x = x_for()
    assert_parity(vm, x, *timm_reference(teacher, x))
    assert_parity(vitviz.load(tmp_path / "checkpoint.pth", nest_key="student", device="cpu"), x,
                  *timm_reference(student, x))


def test_mae_average_pooling(tmp_path) -> None:
    model = perturb(VisionTransformer(num_classes=5, global_pool="avg", **SMALL))  # cls token kept, fc_norm
    assert "norm.weight" not in model.state_dict() and "fc_norm.weight" in model.state_dict()
    torch.save({"model": model.state_dict()}, tmp_path / "mae_finetuned_vit_tiny.pth")
    vm = vitviz.load(tmp_path / "mae_finetuned_vit_tiny.pth", device="cpu")
    assert vm.spec.family == "mae" and vm.spec.pooling == "avg"
    x = x_for()
    assert_parity(vm, x, *timm_reference(model, x))


def test_wz_pre_logits(tmp_path) -> None:
    model = perturb(WZViT())
    torch.save(model.state_dict_wz(), tmp_path / "model-9.pth")
    (tmp_path / "class_indices.json").write_text(json.dumps({str(i): f"flower{i}" for i in range(5)}))
    vm = vitviz.load(tmp_path / "model-9.pth", device="cpu")
    assert vm.spec.pre_logits == 96 and vm.spec.labels[2] == "flower2"
    x = x_for()
    ref_logits = model(x).detach()
    _, maps = timm_reference(model.inner, x)
    assert_parity(vm, x, ref_logits, maps)


# ----------------------------------------------------------------------------------------------- torchvision
@pytest.mark.parametrize("variant", ["plain", "legacy_names", "representation"])
def test_torchvision(tmp_path, variant: str) -> None:
    from torchvision.models import VisionTransformer as TV
    model = perturb(TV(image_size=32, patch_size=8, num_layers=2, num_heads=3, hidden_dim=192, mlp_dim=384,
                       num_classes=5, representation_size=64 if variant == "representation" else None))
    sd = model.state_dict()
    if variant == "legacy_names":
        sd = {k.replace("mlp.0.", "mlp.linear_1.").replace("mlp.3.", "mlp.linear_2."): v for k, v in sd.items()}
    torch.save(sd, tmp_path / "vit_tiny.pth")
    vm = vitviz.load(tmp_path / "vit_tiny.pth", device="cpu")
    assert vm.spec.family == "torchvision" and vm.spec.num_params == n_params(model)
    x = x_for()
    assert_parity(vm, x, *torchvision_reference(model, x))


def test_torchvision_file_name_metadata() -> None:
    from vitviz.core.reading.metadata import torchvision_weights
    info = torchvision_weights("vit_b_16-c867db91.pth")
    assert info["arch"] == "vit_b_16" and len(info["categories"]) == 1000 and info["resize"] == 256
    assert info["categories"][1] == "goldfish"
    swag = torchvision_weights("vit_h_14_swag-80465313.pth")
    assert swag["arch"] == "vit_h_14" and swag["crop"] == 518 and swag["interpolation"] == "bicubic"
    assert torchvision_weights("resnet50-0676ba61.pth") is None


def test_torchvision_resampling_matches_interpolate_embeddings() -> None:
    from torchvision.models.vision_transformer import interpolate_embeddings
    from vitviz.core.posembed import resample_pos_embed
    pos = torch.randn(1, 1 + 16, 12)
    ref = interpolate_embeddings(48, 8, {"encoder.pos_embedding": pos})["encoder.pos_embedding"]
    np.testing.assert_allclose(resample_pos_embed(pos, 1, (4, 4), (6, 6), "torchvision"), ref, atol=1e-6)


# --------------------------------------------------------------------------------------------- Hugging Face
def _hf_small(kind: str):
    from transformers import (DeiTConfig, DeiTForImageClassificationWithTeacher, Dinov2Config,
                              Dinov2ForImageClassification, Dinov2WithRegistersConfig, Dinov2WithRegistersModel,
                              ViTConfig, ViTForImageClassification, ViTModel)
    c = dict(hidden_size=192, num_hidden_layers=2, num_attention_heads=4, image_size=32, patch_size=8,
             attn_implementation="eager")
    labels = {"id2label": {str(i): f"label{i}" for i in range(5)}, "num_labels": 5}
    if kind == "vit":
        return ViTForImageClassification(ViTConfig(intermediate_size=384, hidden_act="gelu_new", **labels, **c))
    if kind == "vit_model":
        return ViTModel(ViTConfig(intermediate_size=384, **c))
    if kind == "deit":
        return DeiTForImageClassificationWithTeacher(DeiTConfig(intermediate_size=384, **labels, **c))
    if kind == "dinov2":
        return Dinov2ForImageClassification(Dinov2Config(mlp_ratio=2, **labels, **c))
    return Dinov2WithRegistersModel(Dinov2WithRegistersConfig(mlp_ratio=2, num_register_tokens=3, **c))


@pytest.mark.parametrize("kind", ["vit", "vit_model", "deit", "dinov2", "dinov2_reg"])
@pytest.mark.parametrize("safe", [True, False])
def test_hf_folders(tmp_path, kind: str, safe: bool) -> None:
    model = perturb(_hf_small(kind))
    model.save_pretrained(tmp_path, safe_serialization=safe)
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({
        "do_resize": True, "size": {"height": 32, "width": 32}, "resample": 3, "do_normalize": True,
        "image_mean": [0.4, 0.5, 0.6], "image_std": [0.2, 0.3, 0.4]}))
    vm = vitviz.load(tmp_path, device="cpu")
    assert vm.spec.num_heads == 4  # from config.json; the table would say 3
    assert vm.spec.preprocess.mean == (0.4, 0.5, 0.6) and vm.spec.preprocess.mode == "squash"
    if kind in ("vit", "deit", "dinov2"):
        assert vm.spec.labels[3] == "label3"
    assert vm.spec.num_params == n_params(model, skip=("mask_token", "pooler"))
    x = x_for()
    assert_parity(vm, x, *hf_reference(model, x))


def test_hf_vit_other_resolution(tmp_path) -> None:
    model = perturb(_hf_small("vit"))
    model.save_pretrained(tmp_path)
    vm = vitviz.load(tmp_path, device="cpu")
    x = x_for(h=48, w=40)
    out, maps = hf_reference(model, x, interpolate_pos_encoding=True)
    r = vm.run(x)
    np.testing.assert_allclose(r.logits, out[0].numpy(), atol=ATOL)
    np.testing.assert_allclose(r.attentions[1], maps[1][0].numpy(), atol=ATOL)


@pytest.mark.parametrize("kind", ["dinov2", "dinov2_reg"])
@pytest.mark.parametrize("chunked", [False, True])
def test_dinov2_original_layout(tmp_path, kind: str, chunked: bool) -> None:
    """The hub / training layout of facebookresearch/dinov2, produced by inverting the HF conversion."""
    hf = perturb(_hf_small(kind))
    backbone = hf.dinov2 if kind == "dinov2" else hf
    backbone.save_pretrained(tmp_path / "hf")
    from safetensors.torch import load_file
    sd = hf_dinov2_to_original(load_file(str(tmp_path / "hf" / "model.safetensors")))
    if chunked:  # training configs use block_chunks=4: blocks.{chunk}.{global index}
        sd = {(f"blocks.{int(k.split('.')[1]) // 2}.{k.split('.', 1)[1]}" if k.startswith("blocks.") else k): v
              for k, v in sd.items()}
        assert any(k.startswith("blocks.0.1.") for k in sd)
        sd = {f"backbone.{k}": v for k, v in sd.items()}
        sd.update({"dino_head.mlp.0.weight": torch.randn(8, 192)})
        torch.save({"teacher": sd}, tmp_path / "teacher_checkpoint.pth")
        path = tmp_path / "teacher_checkpoint.pth"
    else:
        torch.save(sd, tmp_path / "dinov2_vits8_pretrain.pth")
        path = tmp_path / "dinov2_vits8_pretrain.pth"
    vm = vitviz.load(path, heads=4, image_size=32, device="cpu")
    assert vm.spec.family == "dinov2" and vm.spec.reg_tokens == (3 if kind == "dinov2_reg" else 0)
    x = x_for()
    out, maps = hf_reference(backbone, x)
    r = vm.run(x)
    for i, ref in enumerate(maps):
        np.testing.assert_allclose(r.attentions[i], ref[0].numpy(), atol=ATOL)
    with torch.no_grad():
        feats = backbone(pixel_values=x).pooler_output
    assert r.logits.shape == (0,) and r.top_k() == []  # a backbone: its output is features, not class scores
    np.testing.assert_allclose(r.features, feats[0].numpy(), atol=ATOL)


# ----------------------------------------------------------------------------------------------------- seed
def test_seed_tutorial_vit_single_channel(tmp_path) -> None:
    model = perturb(SeedViT(), std=0.1)
    torch.save(model.state_dict(), tmp_path / "vit_digits.pt")
    vm = vitviz.load(tmp_path / "vit_digits.pt", device="cpu")
    assert vm.spec.family == "seed" and vm.spec.in_chans == 1 and vm.spec.num_heads == 4
    assert vm.spec.eps == 1e-5 and vm.spec.num_params == n_params(model) == 69194
    x = x_for(c=1, h=8, w=8)
    assert_parity(vm, x, *seed_reference(model, x))


@pytest.mark.parametrize("kind", ["dinov2", "dinov2_reg"])
def test_hf_dinov2_other_resolution(tmp_path, kind: str) -> None:
    """HF DINOv2 always resamples (bicubic, size=); with registers it also antialiases, like the original."""
    model = perturb(_hf_small(kind))
    model.save_pretrained(tmp_path)
    vm = vitviz.load(tmp_path, device="cpu")
    x = x_for(h=48, w=40)
    out, maps = hf_reference(model, x)
    r = vm.run(x)
    assert r.spec.grid == (6, 5)
    np.testing.assert_allclose(r.logits if vm.spec.num_classes else r.features, out[0].numpy(), atol=ATOL)
    for i, ref in enumerate(maps):
        np.testing.assert_allclose(r.attentions[i], ref[0].numpy(), atol=ATOL)


def test_timm_config_model_args_give_heads(tmp_path) -> None:
    model = perturb(timm.create_model("vit_base_patch16_224", pretrained=False, num_classes=3, img_size=32,
                                      patch_size=8, embed_dim=64, depth=1, num_heads=4))
    timm.models._hub.save_for_hf(model, str(tmp_path), safe_serialization=True,
                                 model_args=dict(img_size=32, patch_size=8, embed_dim=64, depth=1, num_heads=4))
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["architecture"] = "vit_custom_patch8_32"  # a name without a size word: heads must come from model_args
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    vm = vitviz.load(tmp_path, device="cpu")
    assert vm.spec.num_heads == 4 and vm.spec.source_of("num_heads") == "metadata: config.json model_args"
    x = x_for()
    assert_parity(vm, x, *timm_reference(model, x))


@pytest.mark.parametrize("name", list(TIMM_CASES))
def test_attention_only_matches_timm_attention_extract(tmp_path, name: str) -> None:
    """`logits=False` stops at the last softmax, as timm's fx AttentionExtract does; the maps must agree."""
    from timm.utils import AttentionExtract

    model = perturb(VisionTransformer(num_classes=5, **SMALL, **TIMM_CASES[name]))
    for block in model.blocks:
        block.attn.fused_attn = False
    torch.save(model.state_dict(), tmp_path / "model.pth")
    vm = vitviz.load(tmp_path / "model.pth", device="cpu")
    x = x_for()
    with torch.no_grad():
        ref = list(AttentionExtract(model, method="fx")(x).values())
    got = vm.run(x, logits=False)
    assert got.logits.shape == (0,) and got.attentions.shape == (len(ref), *ref[0].shape[1:])
    for i, r in enumerate(ref):
        np.testing.assert_allclose(got.attentions[i], r[0].numpy(), atol=ATOL, err_msg=f"layer {i}")


def test_model_objects_load_with_their_head_count() -> None:
    """`vitviz.load(model)` takes a model in memory; heads come from the object (here 6, not the table's 3)."""
    from transformers import ViTConfig, ViTForImageClassification

    tm = perturb(VisionTransformer(num_classes=5, **{**SMALL, "num_heads": 6}))
    cfg = ViTConfig(hidden_size=192, num_hidden_layers=2, num_attention_heads=6, intermediate_size=384,
                    image_size=32, patch_size=8, num_labels=5, attn_implementation="eager")
    hf = perturb(ViTForImageClassification(cfg).eval())
    x = x_for()
    for model, ref in ((tm, timm_reference), (hf, hf_reference)):
        vm = vitviz.load(model, device="cpu")
        assert vm.spec.num_heads == 6
        assert_parity(vm, x, *ref(model, x))
        assert vm.spec.source_of("num_heads").startswith("model object:")
    with pytest.raises(vitviz.VitvizError, match="cannot load a int; expected a checkpoint path"):
        vitviz.load(3)


def test_timm_model_object_built_at_another_size() -> None:
    """timm's pretrained_cfg holds the registry's default size; the model's own size is what counts."""
    model = perturb(timm.create_model("vit_tiny_patch16_224", img_size=(96, 64), num_classes=0).eval())
    vm = vitviz.load(model, device="cpu")
    assert vm.spec.image_size == (96, 64) and vm.spec.grid == (6, 4) and vm.spec.num_heads == 3
    x = x_for(h=96, w=64)
    assert_parity(vm, x, *timm_reference(model, x))


def test_family_override_sets_that_familys_defaults(tmp_path) -> None:
    model = perturb(VisionTransformer(num_classes=5, **SMALL))
    torch.save(model.state_dict(), tmp_path / "m.pth")
    with pytest.warns(GuessWarning, match="not an ImageNet model"):
        plain = vitviz.load(tmp_path / "m.pth", device="cpu").spec
    dv2 = vitviz.load(tmp_path / "m.pth", device="cpu", family="dinov2").spec
    # a 32 px model is not an ImageNet model: no ImageNet statistics unless its family is named
    assert (plain.family, plain.pos_interp, plain.preprocess.mean) == ("timm", "timm", (0.0,))
    assert plain.source_of("preprocess").startswith("guess") and plain.preprocess.mode == "center"
    assert (dv2.family, dv2.pos_interp) == ("dinov2", "dinov2") and dv2.preprocess.mean == (0.485, 0.456, 0.406)
    assert "dinov2" in dv2.source_of("preprocess")
