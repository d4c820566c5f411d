"""The family readers (`vitviz.core.reading.families`) on files as their users have them.

Trial round 4 (scripts/trial_silent.py): files nobody here had made, opened as their users have them; each case
here was silently wrong before its fix -- it opened and showed numbers that differ from the original's, and nothing
named the setting responsible. Each test builds the original with its own library (random, perturbed weights),
saves it the way its users do, and checks that vitviz either matches it (logits and every layer's attention) or
says the setting that explains the difference -- and that the override it names then makes it match.

The newer families' config fields (timm DINOv3 / PE, transformers DINOv3, open_clip; issue 20), each set to a wrong
value or JSON type: a `MetadataError` naming the file and the field, or a load where the value still means what it
says.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from _hostile import quiet_load, variant
from parity_refs import perturb, timm_reference
from test_hyperparams import load, matches  # the same exact-parity check as the traps'

import vitviz
from vitviz.errors import MetadataError

timm = pytest.importorskip("timm")
from timm.models.vision_transformer import VisionTransformer  # noqa: E402

SMALL = dict(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4, num_classes=5)


def x_for(h: int = 32, w: int = 32) -> torch.Tensor:
    return torch.randn(1, 3, h, w, generator=torch.Generator().manual_seed(1))


def timm_vit(**kw: Any) -> torch.nn.Module:
    torch.manual_seed(0)
    return perturb(VisionTransformer(**{**SMALL, **kw}))


# ---------------------------------------------------------------------------------------- timm global_pool
POOLS = {  # timm constructor kwargs -> the pooling= that matches; each holds the same tensors as another pooling
    "avg_no_fc_norm": (dict(global_pool="avg", fc_norm=False), "avg"),       # = the default 'token' model's keys
    "max": (dict(global_pool="max"), "max"),                                 # = 'avg' with fc_norm (MAE) keys
    "avgmax": (dict(global_pool="avgmax"), "avgmax"),
    "avg_include_prefix": (dict(global_pool="avg", pool_include_prefix=True, reg_tokens=2), "avg_all"),
}


@pytest.mark.parametrize("case", list(POOLS))
def test_timm_pooling_of_a_bare_file_is_said_and_its_override_matches(tmp_path: Path, case: str) -> None:
    kw, pooling = POOLS[case]
    model = timm_vit(**kw)
    torch.save(model.state_dict(), tmp_path / "model.pth")
    x = x_for()
    ref = timm_reference(model, x)
    vm = load(tmp_path / "model.pth", heads=4)
    assert not matches(vm, x, ref)  # the file cannot tell: vitviz's pooling is the layout's convention ...
    assert "pooling" in dict(vm.spec.assumptions), vm.spec.source_of("pooling")  # ... and it says so
    assert repr(pooling) in vm.spec.source_of("pooling") or pooling == "avg"  # the override it names
    given = load(tmp_path / "model.pth", heads=4, pooling=pooling)
    assert given.spec.kind_of("pooling") == "given" and matches(given, x, ref)


def test_timm_default_token_pooling_still_matches(tmp_path: Path) -> None:
    model = timm_vit()
    torch.save(model.state_dict(), tmp_path / "model.pth")
    x = x_for()
    vm = load(tmp_path / "model.pth", heads=4)
    assert vm.spec.pooling == "token" and matches(vm, x, timm_reference(model, x))


@pytest.mark.parametrize("pool", ["max", "avgmax"])
def test_timm_hub_folder_global_pool_max_is_read(tmp_path: Path, pool: str) -> None:
    """config.json model_args global_pool 'max' / 'avgmax': read and computed (it used to be refused)."""
    args = {k: v for k, v in SMALL.items() if k != "num_classes"}
    torch.manual_seed(0)
    model = perturb(timm.create_model("vit_small_patch16_224", pretrained=False, num_classes=5, global_pool=pool,
                                      **args))
    timm.models._hub.save_for_hf(model, str(tmp_path), model_args={**args, "global_pool": pool},
                                 safe_serialization=True)
    x = x_for()
    vm = load(tmp_path)
    assert vm.spec.pooling == pool and vm.spec.kind_of("pooling") == "read"
    assert matches(vm, x, timm_reference(model, x))


@pytest.mark.parametrize("case", ["avg_no_fc_norm", "max"])
def test_timm_model_object_states_its_pooling(case: str) -> None:
    kw, pooling = POOLS[case]
    model = timm_vit(**kw)
    x = x_for()
    vm = load(model)
    assert vm.spec.pooling == pooling and vm.spec.kind_of("pooling") == "read"
    assert matches(vm, x, timm_reference(model, x))


# ------------------------------------------------------------------------ open_clip norm_kwargs / act_kwargs
OC_VISION = dict(layers=2, width=64, head_width=16, patch_size=8, image_size=32, mlp_ratio=2.0)


OC_TEXT = dict(context_length=8, vocab_size=64, width=32, heads=2, layers=1)


@pytest.mark.parametrize("vision, field, value", [
    (dict(norm_kwargs={"eps": 1e-6}), "eps", 1e-6),                      # every LayerNorm at 1e-6, not CLIP's 1e-5
    (dict(act_kwargs={"approximate": "tanh"}), "mlp_kind", "gelu_tanh"),  # nn.GELU(approximate='tanh')
])
def test_open_clip_config_norm_and_act_kwargs_are_read(tmp_path: Path, vision: dict, field: str, value: Any) -> None:
    open_clip = pytest.importorskip("open_clip")
    from parity_towers import mha_reference

    torch.manual_seed(0)
    model = perturb(open_clip.CLIP(embed_dim=16, quick_gelu=False, vision_cfg={**OC_VISION, **vision},
                                   text_cfg=OC_TEXT))
    torch.save(model.state_dict(), tmp_path / "open_clip_pytorch_model.bin")
    (tmp_path / "open_clip_config.json").write_text(json.dumps(
        {"model_cfg": {"embed_dim": 16, "quick_gelu": False, "vision_cfg": {**OC_VISION, **vision},
                       "text_cfg": OC_TEXT}}))
    vm = load(tmp_path / "open_clip_pytorch_model.bin")
    assert getattr(vm.spec, field) == value and vm.spec.kind_of(field) == "read"
    x = x_for()
    assert matches(vm, x, mha_reference(model.visual, model.encode_image, x))


def test_open_clip_act_kwargs_it_cannot_follow_are_refused(tmp_path: Path) -> None:
    from vitviz.errors import UnknownLayoutError

    open_clip = pytest.importorskip("open_clip")
    torch.manual_seed(0)
    model = open_clip.CLIP(embed_dim=16, quick_gelu=False, vision_cfg=OC_VISION, text_cfg=OC_TEXT)
    torch.save(model.state_dict(), tmp_path / "open_clip_pytorch_model.bin")
    (tmp_path / "open_clip_config.json").write_text(json.dumps(
        {"model_cfg": {"embed_dim": 16, "vision_cfg": {**OC_VISION, "norm_kwargs": {"elementwise_affine": True}},
                       "text_cfg": OC_TEXT}}))
    with pytest.raises(UnknownLayoutError, match="norm_kwargs"):
        load(tmp_path / "open_clip_pytorch_model.bin")


# ------------------------------------------------------------------ which state dict of a training checkpoint
@pytest.mark.parametrize("taken, other", [("model_ema", "model"),            # DeiT's main.py --model-ema
                                          ("state_dict_ema", "state_dict"),  # timm's train.py
                                          ("teacher", "student")])           # DINO
def test_a_training_checkpoint_with_two_models_says_which_it_took(tmp_path: Path, taken: str, other: str) -> None:
    from vitviz.core.spec import GuessWarning

    model, second = timm_vit(), perturb(timm_vit(), seed=7)
    torch.save({taken: second.state_dict(), other: model.state_dict(), "epoch": 3}, tmp_path / "checkpoint.pth")
    with pytest.warns(GuessWarning, match=f"nest_key = {taken} is assumed.*under '{other}'.*nest_key="):
        vm = vitviz.load(tmp_path / "checkpoint.pth", device="cpu", heads=4)
    assert vm.spec.kind_of("nest_key") == "assumed" and "nest_key" in dict(vm.spec.assumptions)
    x = x_for()
    assert matches(vm, x, timm_reference(second, x))
    given = load(tmp_path / "checkpoint.pth", heads=4, nest_key=other)
    assert "nest_key" not in dict(given.spec.assumptions) and matches(given, x, timm_reference(model, x))


def test_an_ema_copy_equal_to_the_weights_is_no_choice(tmp_path: Path) -> None:
    model = timm_vit()
    torch.save({"state_dict": model.state_dict(), "state_dict_ema": model.state_dict()}, tmp_path / "c.pth")
    assert "nest_key" not in dict(load(tmp_path / "c.pth", heads=4).spec.assumptions)


# --------------------------------------------------------------------- transformers hidden_act spellings
@pytest.mark.parametrize("act, kind", [("gelu_accurate", "gelu_tanh"), ("swish", "silu")])
def test_hf_hidden_act_spellings_are_read(tmp_path: Path, act: str, kind: str) -> None:
    """transformers' AccurateGELUActivation is the tanh approximation, 'swish' is SiLU: read as such (they were
    refused after the config check had accepted them)."""
    transformers = pytest.importorskip("transformers")
    from parity_refs import hf_reference

    config = transformers.ViTConfig(image_size=32, patch_size=8, hidden_size=64, num_hidden_layers=2,
                                    num_attention_heads=4, intermediate_size=128, num_labels=5, hidden_act=act)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = perturb(transformers.ViTForImageClassification(config))
    model.save_pretrained(str(tmp_path), safe_serialization=True)
    vm = load(tmp_path)
    assert vm.spec.mlp_kind == kind and vm.spec.kind_of("mlp_kind") == "read"
    x = x_for()
    assert matches(vm, x, hf_reference(model, x))


def test_norms_without_a_bias_are_named_when_refused(tmp_path: Path) -> None:
    """timm norm_layer=RmsNorm: the refusal says what the missing biases mean, not only which tensors are missing."""
    timm = pytest.importorskip("timm")
    from timm.layers import RmsNorm

    from vitviz.errors import InconsistentCheckpointError

    model = timm.models.VisionTransformer(img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2,
                                          num_classes=3, norm_layer=RmsNorm)
    torch.save(model.state_dict(), tmp_path / "rms.pth")
    with pytest.raises(InconsistentCheckpointError, match=r"norm1\.bias.*no bias: RMSNorm, or LayerNorm\(bias=False"):
        load(tmp_path / "rms.pth", heads=2)


def test_an_hf_activation_vitviz_does_not_compute_is_refused_at_the_door(tmp_path: Path) -> None:
    """transformers' 'gelu_10' (GELU clipped to [-10, 10]) passed the config check and was refused later as
    "mlp_kind 'gelu_10'": now config.json's hidden_act is named with what vitviz computes."""
    transformers = pytest.importorskip("transformers")
    from vitviz.errors import MetadataError

    config = transformers.ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=1,
                                    num_attention_heads=2, intermediate_size=64, num_labels=3, hidden_act="gelu_10")
    transformers.ViTForImageClassification(config).save_pretrained(str(tmp_path), safe_serialization=True)
    with pytest.raises(MetadataError, match=r"config\.json.*hidden_act.*'gelu_10'.*expected one of gelu"):
        load(tmp_path)


@pytest.mark.parametrize("kw", [dict(global_pool="max", pool_include_prefix=True),
                                dict(global_pool="avgmax", fc_norm=False, pool_include_prefix=True),
                                dict(global_pool="token", fc_norm=True, pool_include_prefix=True)])
def test_timm_model_object_pooling_with_include_prefix_matches(kw: dict) -> None:
    """A timm object whose global_pool the object states but the reference cannot (a max over the prefix tokens
    too) runs live instead of being converted with the layout's convention in silence (a named timm model's layout
    is no guess); 'token' with pool_include_prefix is the class token (the flag reduces nothing)."""
    args = {k: v for k, v in SMALL.items() if k != "num_classes"}
    torch.manual_seed(0)
    model = perturb(timm.create_model("vit_small_patch16_224", pretrained=False, num_classes=5, **args, **kw))
    x = x_for()
    vm = load(model)
    assert matches(vm, x, timm_reference(model, x))


@pytest.mark.parametrize("pool", ["max", "avgmax"])
def test_timm_training_checkpoint_pooling_is_read_from_train_args_or_said(tmp_path: Path, pool: str) -> None:
    """A timm train.py checkpoint names its architecture (`arch`, `args.model`), which made the fc_norm layout's
    'avg' a fact of the named model: `--gp max` opened with the patches' mean in silence. The saved `args.gp` is
    read; without it, an fc_norm under a named ViT (whose default has none) keeps its pooling an assumption."""
    args = {k: v for k, v in SMALL.items() if k != "num_classes"}
    torch.manual_seed(0)
    model = perturb(timm.create_model("vit_small_patch16_224", pretrained=False, num_classes=5, global_pool=pool,
                                      **args))
    x = x_for()
    ref = timm_reference(model, x)
    train_args = {"model": "vit_small_patch16_224", "gp": pool, "num_classes": 5, "img_size": 32}
    torch.save({"epoch": 3, "arch": "vit_small_patch16_224", "state_dict": model.state_dict(), "args": train_args},
               tmp_path / "last.pth.tar")
    vm = load(tmp_path / "last.pth.tar", heads=4)
    assert vm.spec.pooling == pool and vm.spec.kind_of("pooling") == "read" and matches(vm, x, ref)
    torch.save({"epoch": 3, "arch": "vit_small_patch16_224", "state_dict": model.state_dict(),
                "args": {"model": "vit_small_patch16_224", "img_size": 32}}, tmp_path / "no_gp.pth.tar")
    vm = load(tmp_path / "no_gp.pth.tar", heads=4)
    assert not matches(vm, x, ref) and "pooling" in dict(vm.spec.assumptions), vm.spec.source_of("pooling")
    assert matches(load(tmp_path / "no_gp.pth.tar", heads=4, pooling=pool), x, ref)


def test_timm_training_checkpoint_of_a_default_vit_stays_quiet_about_pooling(tmp_path: Path) -> None:
    args = {k: v for k, v in SMALL.items() if k != "num_classes"}
    torch.manual_seed(0)
    model = perturb(timm.create_model("vit_small_patch16_224", pretrained=False, num_classes=5, **args))
    torch.save({"epoch": 3, "arch": "vit_small_patch16_224", "state_dict": model.state_dict(),
                "args": {"model": "vit_small_patch16_224", "gp": None, "img_size": 32}}, tmp_path / "last.pth.tar")
    vm = load(tmp_path / "last.pth.tar", heads=4)
    x = x_for()
    assert vm.spec.pooling == "token" and "pooling" not in dict(vm.spec.assumptions)
    assert matches(vm, x, timm_reference(model, x))


# ----------------------------------------------------------------------------- configs of the newer families (issue 20)

BAD_FAMILY_CONFIGS = [
    # (folder, file, section, field, value, expected)
    ("dinov3", "config.json", "model_args", "rope_temperature", "hot", "finite number"),
    ("dinov3", "config.json", "model_args", "rope_temperature", [100], "finite number"),
    ("dinov3", "config.json", "model_args", "rope_temperature", 0, "finite number in (0"),
    ("dinov3", "config.json", "model_args", "rope_temperature", -100.0, "finite number in (0"),
    ("dinov3", "config.json", "model_args", "rope_temperature", float("nan"), "finite number"),
    ("dinov3", "config.json", "model_args", "rope_grid_offset", "1", None),      # a numeric string is a number
    ("dinov3", "config.json", "model_args", "rope_grid_offset", {"x": 1}, "finite number"),
    ("dinov3", "config.json", "model_args", "rope_grid_offset", float("nan"), "finite number"),
    ("dinov3", "config.json", "model_args", "rope_grid_offset", float("inf"), "finite number"),
    ("dinov3", "config.json", "model_args", "ref_feat_shape", "big", "grid of patches"),
    ("dinov3", "config.json", "model_args", "ref_feat_shape", [16, -16], "grid of patches"),
    ("dinov3", "config.json", "model_args", "ref_feat_shape", [1, 2, 3, 4], "grid of patches"),
    ("dinov3", "config.json", "model_args", "rope_rotate_half", "yes", "true or false"),
    ("pe", "config.json", "model_args", "attn_pool_num_heads", -2, "whole number"),
    ("pe", "config.json", "model_args", "attn_pool_num_heads", "two", "whole number"),
    ("pe", "config.json", "model_args", "attn_pool_num_heads", 2.5, "whole number"),
    ("hf-dinov3", "config.json", "", "rope_theta", "100", None),
    ("hf-dinov3", "config.json", "", "rope_theta", "a lot", "finite number"),
    ("hf-dinov3", "config.json", "", "rope_theta", 0, "finite number in (0"),
    ("hf-dinov3", "config.json", "", "rope_theta", -1.0, "finite number in (0"),
    ("hf-dinov3", "config.json", "", "rope_theta", None, "finite number"),
    ("open_clip", "open_clip_config.json", "model_cfg.vision_cfg", "head_width", "16", None),
    ("open_clip", "open_clip_config.json", "model_cfg.vision_cfg", "head_width", 0, "positive whole number"),
    ("open_clip", "open_clip_config.json", "model_cfg.vision_cfg", "head_width", [16], "positive whole number"),
    ("open_clip", "open_clip_config.json", "model_cfg.vision_cfg", "head_width", 24, "divisor of the width"),
    ("open_clip", "open_clip_config.json", "model_cfg.vision_cfg", "image_size", "large", "positive whole number"),
    ("open_clip", "open_clip_config.json", "model_cfg.vision_cfg", "image_size", -32, "positive whole number"),
    ("open_clip", "open_clip_config.json", "model_cfg.vision_cfg", "width", "wide", "positive whole number"),
    ("open_clip", "open_clip_config.json", "model_cfg.vision_cfg", "width", 64.5, "positive whole number"),
    ("open_clip", "open_clip_config.json", "model_cfg", "vision_cfg", "ViT-B", "JSON object"),
    ("open_clip", "open_clip_config.json", "model_cfg.text_cfg", "layers", -1, "whole number"),
    ("open_clip", "open_clip_config.json", "model_cfg.text_cfg", "context_length", 33000, "from 1 to 8192"),
    ("open_clip", "open_clip_config.json", "model_cfg.text_cfg", "heads", 3, "divides the width"),
]


@pytest.mark.parametrize("folder, file, section, field, value, expected", BAD_FAMILY_CONFIGS,
                         ids=[f"{c[0]}-{c[3]}-{c[4]!r}"[:60] for c in BAD_FAMILY_CONFIGS])
def test_config_fields_of_the_newer_families(family_folders: dict[str, Path], tmp_path: Path, folder: str,
                                             file: str, section: str, field: str, value: object,
                                             expected: str | None) -> None:
    path = variant(family_folders[folder], tmp_path / folder, file, section, field, value)
    target = path / "open_clip_pytorch_model.bin" if folder == "open_clip" else path
    if expected is None:   # a value of another JSON type that still means what it says
        assert quiet_load(target).spec.depth == 2
        return
    with pytest.raises(MetadataError) as info:
        quiet_load(target)
    text = str(info.value)
    where = f"{section}.{field}" if section else field
    assert str(path / file) in text and f"field '{where}'" in text and expected in text
    assert "please report" not in text


def test_the_newer_families_load_as_generated(family_folders: dict[str, Path]) -> None:
    for key, folder in family_folders.items():
        target = folder / "open_clip_pytorch_model.bin" if key == "open_clip" else folder
        assert quiet_load(target).spec.depth == 2, key
