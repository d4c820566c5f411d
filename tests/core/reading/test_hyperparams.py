"""The settings no tensor shows (`vitviz.core.reading.hyperparams`): read where a file or config states them,
else assumed and said.

Assumption traps (issue 18, "never silently wrong"): for every setting no tensor shows -- norm order,
activation, eps, the final norms' eps, attention scale, token order, resize recipe -- two models that differ in
that one setting alone are saved the same way (so their files hold the same bytes), and each is loaded with
vitviz. Each must either match its original exactly (logits and every layer's per-head attention at atol 1e-5)
or have that setting among `spec.assumptions`, by field name: zero silent wrongs. Where a config beside the file
states the setting (timm's config.json `model_args`), both must match.

The reader-side cases of the issue are here too: timm `model_args` read, the timm pre_norm eps rule, timm's
NaFlexVit read from its config, a plain SwiGLU ViT that is no EVA-02, timm's relative-position ViTs refused by
name, a two-stage patch embedding folded (not placed as a classifier layer), timm's DINOv2 preprocessing, and
a test that the trap itself fails when a reader calls such a setting read or derived.
"""
from __future__ import annotations

import dataclasses
import json
import warnings
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
import torch
from parity_refs import perturb, recorded_forward, timm_reference
from torch import nn
from trap_refs import CLASSES, DIM, HEADS, IMAGE, MLP, TrapViT, chefer_vit, relu_vit_pytorch, timm_vit
from tutorial_refs import EncoderViT, mha_reference, softmax_reference, stored_attention_reference

import vitviz
from vitviz.errors import UnknownLayoutError

pytestmark = pytest.mark.filterwarnings("ignore::vitviz.core.spec.GuessWarning")


ATOL = 1e-5


Reference = Callable[[nn.Module, torch.Tensor], "tuple[torch.Tensor, list[torch.Tensor]]"]


def x_for(seed: int = 1) -> torch.Tensor:
    return torch.randn(1, 3, IMAGE, IMAGE, generator=torch.Generator().manual_seed(seed))


def stored(model: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    return stored_attention_reference(model, x, model.attentions())


def load(path: Path, **kw: Any):  # noqa: ANN201
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return vitviz.load(path, device="cpu", **kw)


def matches(vm, x: torch.Tensor, ref: tuple[torch.Tensor, list[torch.Tensor]]) -> bool:  # noqa: ANN001
    """Whether vitviz's model computes what the original does: logits and every layer's attention."""
    out, maps = ref
    result = vm.run(x)
    got = result.features if result.logits.size == 0 else result.logits
    if got.shape != tuple(out[0].shape) or result.attentions.shape[0] != len(maps):
        return False
    if any(result.attentions[i].shape != tuple(m[0].shape) for i, m in enumerate(maps)):
        return False
    return bool(np.allclose(got, out[0].numpy(), atol=ATOL)) and all(
        np.allclose(result.attentions[i], m[0].numpy(), atol=ATOL) for i, m in enumerate(maps))


def save_state_dict(model: nn.Module, path: Path) -> Path:
    torch.save(model.state_dict(), path)
    return path


def trap(setting: str, originals: dict[str, nn.Module], reference: Reference, tmp_path: Path,
         save: Callable[[nn.Module, Path], Path] = save_state_dict, **load_kw: Any) -> dict[str, bool]:
    """Load each original (saved the same way) with vitviz: it matches exactly, or `setting` is assumed. Also
    checks that the originals really differ (the trap can catch something). Returns {name: matched}."""
    x = x_for()
    refs = {name: reference(model, x) for name, model in originals.items()}
    outs = [r[0] for r in refs.values()]
    assert any(not torch.allclose(outs[0], o, atol=ATOL) for o in outs[1:]), f"{setting}: the originals agree"
    matched = {}
    for name, model in originals.items():
        folder = tmp_path / name
        folder.mkdir(parents=True)
        vm = load(save(model, folder / "model.pth"), **load_kw)
        matched[name] = matches(vm, x, refs[name])
        assumed = {field for field, _ in vm.spec.assumptions}
        assert matched[name] or setting in assumed, (
            f"{name}: {setting} silently wrong: vitviz used {getattr(vm.spec, setting, '')!r} from "
            f"{vm.spec.source_of(setting)!r} ({vm.spec.kind_of(setting)}), and it is not flagged")
    return matched


# ------------------------------------------------------------------------------------- unknowable settings
TRAPS = {  # setting -> {variant: TrapViT kwargs}: one switch apart, saved as the same bytes
    "block_norm": {"pre": {}, "post": dict(norm="post")},
    "block_norm_res_post": {"pre": {}, "res_post": dict(norm="res_post")},
    "mlp_kind": {"gelu": {}, "relu": dict(act=nn.ReLU)},
    "mlp_kind_tanh": {"gelu": {}, "gelu_tanh": dict(act=lambda: nn.GELU(approximate="tanh"))},
    "eps": {"1e-5": dict(eps_final=1e-5), "1e-2": dict(eps=1e-2, eps_final=1e-5)},
    "eps_final": {"same": dict(eps=1e-6), "1e-1": dict(eps=1e-6, eps_final=1e-1)},
    "attn_scale": {"head_dim": {}, "custom": dict(scale=0.5)},
    "token_order": {"first": {}, "appended": dict(cls_last=True)},
}


@pytest.mark.parametrize("case", list(TRAPS))
def test_hand_written_settings_are_exact_or_flagged(tmp_path: Path, case: str) -> None:
    setting = case.split("_res_post")[0].split("_tanh")[0]
    originals = {}
    for name, kw in TRAPS[case].items():
        torch.manual_seed(0)
        originals[name] = perturb(TrapViT(**kw))
    matched = trap(setting, originals, stored, tmp_path, heads=HEADS)
    assert list(matched.values())[0], "the conventional variant opens exactly"


def test_vit_pytorch_activation_is_flagged(tmp_path: Path) -> None:
    """An edited vit-pytorch copy whose FeedForward uses ReLU: GELU is vit-pytorch's, not a fact of the file."""
    originals = {}
    for name, relu in (("gelu", False), ("relu", True)):
        torch.manual_seed(0)
        originals[name] = perturb(relu_vit_pytorch(relu))
    assert trap("mlp_kind", originals, softmax_reference, tmp_path, heads=HEADS) == {"gelu": True, "relu": False}


def test_vit_pytorch_conventions_are_assumed_even_with_a_name(tmp_path: Path) -> None:
    """A model name in the training args names no vit-pytorch code: its activation, norm order, eps, attention
    scale and token order stay assumed."""
    model = perturb(relu_vit_pytorch(False))
    torch.save({"state_dict": model.state_dict(), "args": {"model": "vit_small", "heads": HEADS}}, tmp_path / "r.pth")
    spec = load(tmp_path / "r.pth").spec
    assert spec.named
    assert {"mlp_kind", "block_norm", "eps", "attn_scale", "token_order"} <= {f for f, _ in spec.assumptions}


@pytest.mark.parametrize("setting, variants", [
    ("mlp_kind", {"relu": dict(activation="relu"), "gelu": dict(activation="gelu")}),
    ("block_norm", {"post": dict(norm_first=False), "pre": dict(norm_first=True)}),
])
def test_transformer_encoder_settings_are_flagged(tmp_path: Path, setting: str, variants: dict) -> None:
    originals = {}
    for name, kw in variants.items():
        torch.manual_seed(0)
        originals[name] = perturb(EncoderViT(dim=DIM, heads=HEADS, mlp=MLP, final_norm=True, **kw))
    trap(setting, originals, mha_reference, tmp_path, heads=HEADS)


def test_chefer_final_norm_eps_is_flagged(tmp_path: Path) -> None:
    """Transformer-Explainability's ViT: timm's names, blocks at eps 1e-6, the final norm nn.LayerNorm's 1e-5.
    A bare timm-layout file names nothing, so the final norms' eps is an assumption (and so is the blocks')."""
    torch.manual_seed(0)
    plain = perturb(timm_vit())
    torch.manual_seed(0)
    chefer = perturb(chefer_vit(final_eps=1e-5))
    spec = load(save_state_dict(chefer, tmp_path / "chefer.pth"), heads=HEADS).spec
    assert {"eps", "eps_final"} <= {f for f, _ in spec.assumptions}
    assert spec.eps_final == spec.eps == 1e-6
    # the same trap with a final eps far enough apart to show in the logits
    torch.manual_seed(0)
    far = perturb(chefer_vit(final_eps=1e-1))
    assert trap("eps_final", {"timm": plain, "chefer": far}, timm_reference, tmp_path, heads=HEADS) == \
        {"timm": True, "chefer": False}
    exact = load(tmp_path / "chefer" / "model.pth", heads=HEADS, eps=1e-6, eps_final=1e-1)
    assert matches(exact, x_for(), timm_reference(far, x_for()))


def test_resize_recipe_of_an_unnamed_file_is_flagged(tmp_path: Path) -> None:
    """The same weights trained with two eval recipes: a file without preprocessing metadata cannot say which,
    so vitviz's recipe is an assumption, whichever it picked."""
    model = perturb(TrapViT())
    recipes = {"imagenet_center": dict(resize=36, mode="center", mean=(0.485, 0.456, 0.406),
                                       std=(0.229, 0.224, 0.225)),
               "inception_squash": dict(resize=32, mode="squash", mean=(0.5,) * 3, std=(0.5,) * 3)}
    for path in (save_state_dict(model, tmp_path / "hand.pth"),
                 save_state_dict(perturb(timm_vit()), tmp_path / "timm.pth")):
        spec = load(path, heads=HEADS).spec
        pp = spec.preprocess
        same = [name for name, r in recipes.items()
                if all(getattr(pp, k) == tuple(v) if isinstance(v, tuple) else getattr(pp, k) == v
                       for k, v in r.items())]
        assert len(same) <= 1
        assert "preprocess" in {f for f, _ in spec.assumptions}, (path.name, spec.source_of("preprocess"))


# --------------------------------------------------------------------------- the trap is able to fail
def test_the_trap_fails_when_a_reader_calls_a_convention_derived(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A reader that says a hand-written file's norm order (or attention scale) came from its tensors makes the
    trap fail: a silent wrong is caught."""
    from vitviz.core.reading.families import structural

    real = structural.facts_from_metadata

    def overclaiming(facts, raw, **kw):  # noqa: ANN001, ANN003, ANN202
        return dataclasses.replace(real(facts, raw, **kw), block_norm=("pre", "shape: the norms sit in front"),
                                   attn_scale=(0.0, "read: the usual scale"))

    monkeypatch.setattr(structural, "facts_from_metadata", overclaiming)
    for setting, kw in (("block_norm", dict(norm="post")), ("attn_scale", dict(scale=0.5))):
        torch.manual_seed(0)
        originals = {"usual": perturb(TrapViT())}
        torch.manual_seed(0)
        originals["odd"] = perturb(TrapViT(**kw))
        with pytest.raises(AssertionError, match=f"odd: {setting} silently wrong"):
            trap(setting, originals, stored, tmp_path / setting, heads=HEADS)


# ---------------------------------------------------------------------------------- norm order (case 1)
def test_res_post_norm_blocks_run_exactly_when_given(tmp_path: Path) -> None:
    """`x = x + LN(attn(x))`: the reference block computes it exactly (block_norm='res_post'); from a bare file it
    is the flagged norm-order assumption (above)."""
    from vitviz.core.running.model import ReferenceViT

    torch.manual_seed(0)
    model = perturb(TrapViT(norm="res_post"))
    vm = load(save_state_dict(model, tmp_path / "rp.pth"), heads=HEADS)
    net = ReferenceViT(dataclasses.replace(vm.spec, block_norm="res_post")).eval()
    net.load_state_dict(vm.net.state_dict())
    x = x_for()
    out, maps = stored(model, x)
    got, seen = recorded_forward(net, x, [b.attn.attn_probe for b in net.blocks])
    np.testing.assert_allclose(got.numpy(), out.numpy(), atol=ATOL)
    for a, b in zip(seen, maps):
        np.testing.assert_allclose(a.numpy(), b.numpy(), atol=ATOL)


def test_timm_res_post_block_is_named(tmp_path: Path) -> None:
    """timm's `vit_base_patch16_rpn_224` (ResPostBlock: the same keys as Block, res-post-norm numerics) named in
    config.json: block_norm 'res_post', exact; never pre-norm."""
    torch.manual_seed(0)
    model = perturb(timm_vit(name="vit_base_patch16_rpn_224"))
    folder = save_for_hf(model, tmp_path / "rpn" / "model.pth")
    vm = load(folder)
    assert vm.spec.block_norm == "res_post" and vm.spec.kind_of("block_norm") == "named"
    x = x_for()
    assert matches(vm, x, timm_reference(model, x))


def test_an_extra_layernorm_at_the_start_of_the_mlp_is_refused_clearly(tmp_path: Path) -> None:
    """A block norm in front of the MLP and another at its start: two stacked norms the reference block has no
    place for; refused naming them, never one of them dropped or taken for the final norm."""
    torch.manual_seed(0)
    path = save_state_dict(perturb(TrapViT(mlp_ln=True)), tmp_path / "mlp_ln.pth")
    with pytest.raises(UnknownLayoutError) as err:
        load(path, heads=HEADS)
    msg = str(err.value)
    assert "LayerNorm" in msg and "layers.0.ff.0" in msg and "not a Vision Transformer" not in msg


# ----------------------------------------------------------------------------- timm config.json (case 2)
def save_for_hf(model: nn.Module, path: Path, **model_args: Any) -> Path:
    from timm.models import save_for_hf as save

    save(model, str(path.parent), safe_serialization=True, model_args=model_args or None)
    return path.parent


@pytest.mark.parametrize("setting, variants", [
    ("mlp_kind", {"gelu": {}, "relu": dict(act_layer="relu"), "quick_gelu": dict(act_layer="quick_gelu")}),
    ("pooling", {"token": {}, "avg": dict(global_pool="avg", fc_norm=False)}),
    ("pooling", {"avg_fc": dict(global_pool="avg"), "token_fc": dict(global_pool="token", fc_norm=True)}),
    ("pos_prefix", {"cls": {}, "no_embed_class": dict(no_embed_class=True, reg_tokens=2)}),
    ("mlp_kind", {"plain": dict(class_token=False, global_pool="avg"), "qk": dict(qk_norm=True, act_layer="silu")}),
])
def test_timm_model_args_are_read(tmp_path: Path, setting: str, variants: dict) -> None:
    """timm's config.json records the arguments the model was created with: each one that changes the
    computation is read, so every variant opens exactly and nothing is assumed."""
    originals = {}
    for name, kw in variants.items():
        torch.manual_seed(0)
        originals[name] = perturb(timm_vit(**kw))
    matched = trap(setting, originals, timm_reference, tmp_path, save=save_for_hf)
    assert all(matched.values()), matched
    for name in variants:
        spec = load(tmp_path / name).spec
        assert spec.assumptions == (), (name, spec.assumptions)


def test_timm_model_args_vitviz_does_not_read_are_flagged(tmp_path: Path) -> None:
    model = perturb(timm_vit())
    folder = save_for_hf(model, tmp_path / "m" / "model.pth")
    cfg = json.loads((folder / "config.json").read_text())
    cfg["model_args"].update(attn_layer="diff", block_fn="ResPostBlock", drop_path_rate=0.1, weight_init="jax")
    (folder / "config.json").write_text(json.dumps(cfg))
    spec = load(folder).spec
    assumed = dict(spec.assumptions)
    assert "attn_layer" in assumed["model_args"] and "block_fn" in assumed["model_args"]
    assert "likely the attn_scale" in assumed["model_args"] and "likely the block_norm" in assumed["model_args"]
    assert not any("drop_path_rate" in s or "weight_init" in s for s in assumed.values())
    cfg["model_args"] = {"act_layer": "mish"}
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnknownLayoutError, match="act_layer 'mish'"):
        load(folder)


# ------------------------------------------------------------------------------------------- eps (case 3)
@pytest.mark.parametrize("arch, eps", [("vit_small_patch16_224", 1e-6), ("vit_base_patch16_clip_224", 1e-5)])
def test_timm_pre_norm_eps_follows_the_architecture(tmp_path: Path, arch: str, eps: float) -> None:
    """timm's VisionTransformer uses LayerNorm eps 1e-6 with pre_norm too; only its registered *_clip_* towers
    pass 1e-5. Named in config.json, either opens exactly; unnamed, the eps is a said guess."""
    torch.manual_seed(0)
    model = perturb(timm_vit(name=arch, pre_norm=True))
    assert model.norm_pre.eps == eps
    folder = save_for_hf(model, tmp_path / "hub" / "model.pth")
    vm = load(folder)
    assert vm.spec.eps == eps and vm.spec.kind_of("eps") == "named" and vm.spec.assumptions == ()
    x = x_for()
    assert matches(vm, x, timm_reference(model, x))
    bare = load(save_state_dict(model, tmp_path / "bare.pth"), heads=HEADS).spec
    assert "eps" in dict(bare.assumptions) and bare.eps == 1e-5


def test_timm_naflex_siglip_reads_its_config(tmp_path: Path) -> None:
    """timm's NaFlexVit SigLIP 2 (`naflexvit_base_patch16_siglip`) named in config.json: eps 1e-6 and tanh-GELU
    are that architecture's (not nn.LayerNorm's 1e-5 or plain GELU), and it opens exactly, MAP head included."""
    import timm

    torch.manual_seed(0)
    model = perturb(timm.create_model("naflexvit_base_patch16_siglip", pretrained=False, embed_dim=DIM, depth=2,
                                      num_heads=HEADS, num_classes=0))
    folder = save_for_hf(model, tmp_path / "nf" / "model.pth")
    vm = load(folder)
    s = vm.spec
    assert (s.family, s.eps, s.mlp_kind, s.pooling) == ("timm-naflex", 1e-6, "gelu_tanh", "map")
    assert s.assumptions == (), s.assumptions
    x = torch.randn(1, 3, *s.image_size, generator=torch.Generator().manual_seed(2))
    assert matches(vm, x, timm_reference(model, x))


# -------------------------------------------------------------------------------- misdetection (case 6)
def test_plain_swiglu_vit_is_not_eva02(tmp_path: Path) -> None:
    """timm's VisionTransformer with a SwiGLU MLP and a learned table: no RoPE (nothing names any), exact; the
    gate's activation is its act_layer, which no tensor shows (flagged)."""
    from timm.layers import SwiGLU

    originals = {}
    for name, act in (("silu", nn.SiLU), ("gelu", nn.GELU)):
        torch.manual_seed(0)
        originals[name] = perturb(timm_vit(mlp_layer=SwiGLU, act_layer=act))
    trap("mlp_kind", originals, timm_reference, tmp_path, heads=HEADS)
    spec = load(tmp_path / "silu" / "model.pth", heads=HEADS).spec
    assert spec.rope == "" and spec.mlp_kind == "swiglu" and "rope" not in dict(spec.assumptions)
    assert matches(load(tmp_path / "silu" / "model.pth", heads=HEADS), x_for(), timm_reference(originals["silu"],
                                                                                                 x_for()))


def test_eva02_layout_without_a_name_guesses_rope_loudly(tmp_path: Path) -> None:
    import timm

    model = timm.create_model("eva02_tiny_patch14_224", pretrained=False, img_size=56, embed_dim=64, depth=2,
                              num_heads=4, num_classes=0)
    spec = load(save_state_dict(model, tmp_path / "eva.pth")).spec
    assert spec.rope and "rope" in dict(spec.assumptions)


@pytest.mark.parametrize("kind", ["bias", "mlp_swin"])
def test_timm_relative_position_vits_vitviz_cannot_compute_are_refused_by_name(tmp_path: Path, kind: str) -> None:
    """The default log-coordinate MLP opens (tests/parity/test_parity_relpos.py); the table and sigmoid-MLP variants are
    refused by name, naming the route."""
    model = timm_vit(name="vit_relpos_base_patch16_224", rel_pos_type=kind)
    with pytest.raises(UnknownLayoutError) as err:
        load(save_state_dict(model, tmp_path / "relpos.pth"), heads=HEADS)
    msg = str(err.value)
    assert "timm relative-position ViT" in msg and "not supported yet" in msg and "--code FILE.py:FACTORY" in msg
    assert "RoPE" not in msg


# -------------------------------------------------------------------------- two-stage patch embedding (case 7)
@pytest.mark.parametrize("width", [DIM, 24])
def test_conv_then_linear_patch_embedding_is_folded(tmp_path: Path, width: int) -> None:
    """A Conv2d then a Linear: folded into one conv (exact), never read as a layer of the classifier; that
    nothing comes between them is said as assumed."""
    torch.manual_seed(0)
    model = perturb(TrapViT(two_stage=width))
    vm = load(save_state_dict(model, tmp_path / "two.pth"), heads=HEADS)
    assert vm.spec.pre_logits == 0 and vm.spec.num_classes == CLASSES
    assert "patch_embed" in dict(vm.spec.assumptions) and "Linear" in vm.spec.source_of("patch_embed")
    x = x_for()
    assert matches(vm, x, stored(model, x))


# --------------------------------------------------------------------------------- preprocessing (case 8)
def test_bare_timm_dinov2_registers_preprocess_as_timm_does(tmp_path: Path) -> None:
    """timm's DINOv2 (with registers) uses ImageNet mean/std, bicubic, crop_pct 1.0 at 518 px -- and from a bare
    state dict that recipe is an assumption, said so."""
    import timm

    model = timm.create_model("vit_small_patch14_reg4_dinov2", pretrained=False, embed_dim=DIM, depth=2,
                              num_heads=HEADS, num_classes=0)
    spec = load(save_state_dict(model, tmp_path / "dinov2_reg.pth")).spec
    pp = spec.preprocess
    assert pp.mean == (0.485, 0.456, 0.406) and pp.std == (0.229, 0.224, 0.225)
    assert pp.resize == min(pp.crop) and pp.interpolation == "bicubic" and pp.mode == "center"
    assert "preprocess" in dict(spec.assumptions)
    smaller = load(tmp_path / "dinov2_reg.pth", image_size=224).spec.preprocess
    assert smaller.crop == (224, 224) and smaller.resize == 224


# -------------------------------------------------------------------------- a torch-hub name's hash, bounded (issue 34)

def test_a_hub_named_file_far_larger_than_its_tensors_is_not_hashed(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """'NAME-HASH.pth' padded to 40 GiB (sparse): the name is not checked by reading 40 GiB (open is never
    called); one within the slack but over HASH_LIMIT says in its provenance that it was not hashed."""
    import types

    import torch

    from vitviz.core.reading import hyperparams as hp

    big = tmp_path / "vit_b_16-c867db91.pth"
    with open(big, "wb") as f:
        f.truncate(40 << 30)
    raw = types.SimpleNamespace(weights_file=big, tensors={"w": torch.zeros(10)}, tower=None)

    def no_open(*a, **k):  # noqa: ANN002, ANN003, ANN202
        raise AssertionError("the file was opened to hash it")

    monkeypatch.setattr(hp, "open", no_open, raising=False)
    assert hp._published_file(raw) == ""
    raw.tensors = {"w": torch.zeros((40 << 30) // 4 // 2, dtype=torch.float32, device="meta")}   # 20 GiB held
    said = hp._published_file(raw)
    assert said.startswith("derived") and "not hashed" in said and "40.0 GiB" in said
