"""Exact parity for the ViTs people train themselves: vit-pytorch (every generation, ViT and SimpleViT),
nn.TransformerEncoder ViTs, and hand-written layouts (nn.MultiheadAttention under other names, one Linear per
head, separate q/k/v, no output projection, odd scales, no class token, mean pooling, stacked norms, two-layer
heads, 1-channel 28 px inputs), plus what the files do not say (heads, preprocessing) and how refusals read.

Each case builds the original with random weights, perturbs every parameter (LayerNorm weights and biases too,
so eps and norm placement matter), saves it as its users do, loads the file with vitviz, and compares the logits
and every layer's per-head attention at atol 1e-5.
"""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

import vitviz
from parity_refs import perturb
from tutorial_refs import (EncoderViT, FlexViT, MhaViT, OldLucidrainsViT, PerHeadViT, mha_reference,
                           softmax_reference, stored_attention_reference)
from vitviz.core.spec import GuessWarning
from vitviz.errors import UnknownLayoutError

vit_pytorch = pytest.importorskip("vit_pytorch")
pytestmark = pytest.mark.filterwarnings("ignore::vitviz.core.spec.GuessWarning")

ATOL = 1e-5


def assert_parity(vm, x: torch.Tensor, ref_out: torch.Tensor, ref_maps: list[torch.Tensor]) -> None:
    result = vm.run(x)
    assert result.attentions.shape == (len(ref_maps), *ref_maps[0].shape[1:])
    for i, ref in enumerate(ref_maps):
        np.testing.assert_allclose(result.attentions[i], ref[0].numpy(), atol=ATOL, err_msg=f"layer {i}")
    np.testing.assert_allclose(result.logits, ref_out[0].numpy(), atol=ATOL)
    only = vm.run(x, logits=False)  # stops after the last softmax (post-norm, wide q/k/v): the same maps
    np.testing.assert_allclose(only.attentions[-1], ref_maps[-1][0].numpy(), atol=ATOL)


def x_for(c: int = 3, h: int = 32, w: int = 32) -> torch.Tensor:
    return torch.randn(1, c, h, w, generator=torch.Generator().manual_seed(1))


def n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# ------------------------------------------------------------------------------------------------ vit-pytorch
@pytest.mark.parametrize("case", ["cls", "mean", "no_out_proj", "one_channel"])
def test_vit_pytorch_vit(tmp_path, case: str) -> None:
    from vit_pytorch import ViT

    kw = dict(image_size=32, patch_size=8, num_classes=5, dim=48, depth=2, heads=2, mlp_dim=96, dim_head=64)
    if case == "mean":
        kw["pool"] = "mean"  # a (0, D) class token, mean of the patches
    if case == "no_out_proj":
        kw.update(heads=1, dim_head=48)  # to_out is nn.Identity
    if case == "one_channel":
        kw.update(channels=1, image_size=28, patch_size=7)
    model = perturb(ViT(**kw))
    torch.save(model.state_dict(), tmp_path / "vit.pt")
    if case == "no_out_proj":  # vit-pytorch drops to_out only for one head as wide as the model: no guess
        vm = vitviz.load(tmp_path / "vit.pt", device="cpu")
        assert vm.spec.num_heads == 1 and not vm.spec.heads_guessed
    else:
        with pytest.warns(GuessWarning, match=r"num_heads = 2 is a guess: vit-pytorch's default dim_head=64"):
            vm = vitviz.load(tmp_path / "vit.pt", device="cpu")
        assert vm.spec.heads_guessed
    s = vm.spec
    assert s.family == "vit_pytorch" and s.eps == 1e-5 and not s.qkv_bias
    assert s.attn_width == kw["heads"] * kw["dim_head"] and s.patch_norm_in and s.patch_norm
    assert s.pooling == ("avg" if case == "mean" else "token") and s.cls_token == (case != "mean")
    assert s.attn_proj == (case != "no_out_proj") and s.num_params == n_params(model)
    x = x_for(c=kw.get("channels", 3), h=kw["image_size"], w=kw["image_size"])
    assert_parity(vm, x, *softmax_reference(model, x))


def test_vit_pytorch_simple_vit_in_a_training_container(tmp_path) -> None:
    """SimpleViT: sin-cos position embedding computed (not in the file), mean pooling, no biases in attention;
    saved as people do, with the hyper-parameters next to the weights."""
    from vit_pytorch import SimpleViT

    model = perturb(SimpleViT(image_size=32, patch_size=8, num_classes=5, dim=64, depth=2, heads=4, mlp_dim=96,
                              dim_head=16))
    torch.save({"epoch": 7, "model_state_dict": model.state_dict(), "optimizer_state_dict": {"state": {}},
                "hparams": {"heads": 4, "image_size": 32}, "classes": [f"c{i}" for i in range(5)]},
               tmp_path / "simple.pth")
    vm = vitviz.load(tmp_path / "simple.pth", device="cpu")
    s = vm.spec
    assert s.pos_kind == "sincos2d" and s.pooling == "avg" and not s.cls_token and not s.proj_bias
    assert s.num_heads == 4 and s.source_of("num_heads") == "metadata: checkpoint hparams.heads"
    assert s.image_size == (32, 32) and s.labels[3] == "c3" and not s.heads_guessed
    x = x_for()
    assert_parity(vm, x, *softmax_reference(model, x))
    y = x_for(h=48, w=40)  # another size: the sin-cos table is computed for that grid, as SimpleViT does
    r = vm.run(y)
    ref = perturb(SimpleViT(image_size=(48, 40), patch_size=8, num_classes=5, dim=64, depth=2, heads=4, mlp_dim=96,
                            dim_head=16))
    ref.load_state_dict(model.state_dict())
    out, maps = softmax_reference(ref.eval(), y)
    np.testing.assert_allclose(r.logits, out[0].numpy(), atol=ATOL)
    np.testing.assert_allclose(r.attentions[-1], maps[-1][0].numpy(), atol=ATOL)


@pytest.mark.parametrize("gen", ["gist", "g0", "g0_late", "g1", "g2"])
def test_vit_pytorch_history(tmp_path, gen: str) -> None:
    """vit-pytorch from the first gist to 1.0: Residual/PreNorm wrappers, `transformer.net`, `patch_to_embedding`,
    dim ** -0.5 scaling, heads with a hidden layer or a LayerNorm, dual patchnorm."""
    model = perturb(OldLucidrainsViT(gen))
    torch.save(model.state_dict(), tmp_path / f"{gen}.pt")
    vm = vitviz.load(tmp_path / f"{gen}.pt", heads=2, device="cpu")
    s = vm.spec
    assert s.family == "vit_pytorch" and s.eps == 1e-5 and s.fc_norm == (gen != "gist") and not s.final_norm
    if gen in ("gist", "g0"):
        assert s.pre_logits == 64 and s.pre_logits_act == "gelu" and s.attn_scale == pytest.approx(48 ** -0.5)
    else:
        assert s.attn_width == 64 and s.attn_scale == 0.0
    if gen == "g0_late":  # 2021: the scale changed on 2021-01-21; files that old are said to be a guess
        assert s.source_of("attn_scale").startswith("guess")
    x = x_for()
    assert_parity(vm, x, *stored_attention_reference(model, x, model.attentions()))


def test_vit_pytorch_mean_pool_with_class_token_from_args(tmp_path) -> None:
    """Before 2025-11 vit-pytorch's pool='mean' averaged every token, the class token included; the training
    args say so."""
    model = perturb(OldLucidrainsViT("g1", pool="mean"))
    torch.save({"state_dict": model.state_dict(), "args": {"pool": "mean", "heads": 2, "dim_head": 32}},
               tmp_path / "ckpt.pth")
    vm = vitviz.load(tmp_path / "ckpt.pth", device="cpu")
    assert vm.spec.pooling == "avg_all" and "pool" in vm.spec.source_of("pooling") and vm.spec.num_heads == 2
    x = x_for()
    assert_parity(vm, x, *stored_attention_reference(model, x, model.attentions()))


# ------------------------------------------------------------------------------------- nn.TransformerEncoder
@pytest.mark.parametrize("norm_first,activation,final_norm", [(False, "relu", False), (True, "gelu", True),
                                                               (False, "gelu", True), (True, "relu", False)])
def test_transformer_encoder_vit(tmp_path, norm_first: bool, activation: str, final_norm: bool) -> None:
    model = perturb(EncoderViT(norm_first=norm_first, activation=activation, final_norm=final_norm))
    torch.save(model.state_dict(), tmp_path / "encoder_vit.pth")
    with pytest.warns(GuessWarning, match="norm_first=False"):
        guessed = vitviz.load(tmp_path / "encoder_vit.pth", device="cpu").spec
    assert guessed.family == "torch_encoder" and guessed.block_norm == "post" and guessed.mlp_kind == "relu"
    assert guessed.eps == 1e-5 and {k for k, _ in guessed.guesses} >= {"block_norm", "mlp_kind", "num_heads"}
    vm = vitviz.load(tmp_path / "encoder_vit.pth", device="cpu", heads=4, act=activation,
                     block_norm="pre" if norm_first else "post")
    assert vm.spec.final_norm == final_norm and vm.spec.num_params == n_params(model)
    x = x_for()
    assert_parity(vm, x, *mha_reference(model, x))


def test_transformer_encoder_settings_from_args(tmp_path) -> None:
    model = perturb(EncoderViT(norm_first=True, activation="gelu", final_norm=True))
    torch.save({"model": model.state_dict(), "args": {"nhead": 4, "norm_first": True, "activation": "gelu"}},
               tmp_path / "run.pth")
    vm = vitviz.load(tmp_path / "run.pth", device="cpu")
    s = vm.spec
    assert (s.num_heads, s.block_norm, s.mlp_kind) == (4, "pre", "gelu")
    assert not {"num_heads", "block_norm", "mlp_kind"} & {k for k, _ in s.guesses}
    x = x_for()
    assert_parity(vm, x, *mha_reference(model, x))


# ------------------------------------------------------------------------------------------------ hand-written
@pytest.mark.parametrize("head_norm,pos_2d", [(False, False), (True, False), (False, True)])
def test_multihead_attention_under_other_names(tmp_path, head_norm: bool, pos_2d: bool) -> None:
    model = perturb(MhaViT(head_norm=head_norm, pos_2d=pos_2d))
    sd = {f"module.{k}": v for k, v in model.state_dict().items()}  # saved from nn.DataParallel
    torch.save({"net": sd}, tmp_path / "mha.pt")
    vm = vitviz.load(tmp_path / "mha.pt", heads=4, device="cpu")
    assert vm.spec.family == "structural" and vm.spec.fc_norm == head_norm and vm.spec.final_norm != head_norm
    assert vm.spec.pos_prefix == (0 if pos_2d else 1) and vm.spec.pos_grid == (4, 4)
    assert vm.spec.num_params == n_params(model)
    x = x_for()
    assert_parity(vm, x, *mha_reference(model, x))


def test_one_linear_per_head(tmp_path) -> None:
    """`attention.heads.H.query/key/value`: the head count is in the structure, no guess needed."""
    model = perturb(PerHeadViT())
    torch.save(model.state_dict(), tmp_path / "vit_scratch.pt")
    vm = vitviz.load(tmp_path / "vit_scratch.pt", device="cpu")
    assert vm.spec.num_heads == 3 and vm.spec.source_of("num_heads").startswith("shape: 3 per-head")
    assert not vm.spec.heads_guessed and vm.spec.family == "structural"
    x = x_for()
    assert_parity(vm, x, *stored_attention_reference(model, x, model.attentions()))


FLEX_CASES = {
    "separate_qkv": (dict(), {}),
    "no_out_proj_dim_scale": (dict(out_proj=False, dim_head=16, scale="dim"), dict(attn_scale=48 ** -0.5)),
    "no_scale_fused": (dict(attn="fused", scale="none"), dict(attn_scale=1.0)),
    "token0_no_cls": (dict(cls=False), dict(pooling="token")),
    "mean_pool_no_cls": (dict(cls=False, pool="mean"), {}),
    "mean_pool_cls": (dict(pool="mean"), dict(pooling="avg_all")),
    "two_final_norms": (dict(final_norms=2, pool="mean", cls=False), {}),
    "mlp_head_relu": (dict(head="mlp", act=torch.nn.ReLU), dict(act="relu", head_act="relu")),
    "ln_head_no_final_norm": (dict(head="ln_linear", final_norms=0), {}),
    "ln_inside_mlp": (dict(mlp_norm_inside=True), {}),
    "unfold_patches": (dict(patches="unfold"), dict(patch_order="cp1p2")),
    "width_differs": (dict(dim_head=32), {}),
    "pos_nn_embedding": (dict(pos_table="embedding"), {}),
}


@pytest.mark.parametrize("case", list(FLEX_CASES))
def test_hand_written_variants(tmp_path, case: str) -> None:
    kwargs, overrides = FLEX_CASES[case]
    model = perturb(FlexViT(**kwargs))
    torch.save({"model_state": model.state_dict()}, tmp_path / "model.pt")
    vm = vitviz.load(tmp_path / "model.pt", heads=3, device="cpu", **overrides)
    assert vm.spec.family == "structural" and vm.spec.num_params == n_params(model)
    x = x_for()
    assert_parity(vm, x, *stored_attention_reference(model, x, model.attentions()))


def test_mnist_style_one_channel_vit(tmp_path) -> None:
    """A 1-channel 28 px ViT: heads from hparams.yaml beside the file, labels from `class_to_idx`, and
    preprocessing at the native size without ImageNet statistics."""
    model = perturb(FlexViT(image=28, patch=7, chans=1, dim=64, heads=2, dim_head=32, attn="fused", classes=10))
    run = tmp_path / "lightning_logs" / "version_0"
    (run / "checkpoints").mkdir(parents=True)
    (run / "hparams.yaml").write_text("model:\n  dim: 64\n  num_heads: 2  # two heads\n  img_size: 28\nlr: 1e-3\n")
    torch.save({"weights": model.state_dict(), "class_to_idx": {str(i): i for i in range(10)}},
               run / "checkpoints" / "epoch=9.ckpt")
    vm = vitviz.load(run / "checkpoints" / "epoch=9.ckpt", device="cpu")
    s = vm.spec
    assert s.in_chans == 1 and s.image_size == (28, 28) and s.labels[7] == "7"
    assert s.num_heads == 2 and s.source_of("num_heads") == "metadata: hparams.yaml model.num_heads"
    pp = s.preprocess
    assert pp.mean == (0.0,) and pp.std == (1.0,) and pp.mode == "squash" and pp.crop == (28, 28)
    assert s.source_of("preprocess").startswith("guess") and "not an ImageNet model" in s.source_of("preprocess")
    x = x_for(c=1, h=28, w=28)
    assert_parity(vm, x, *stored_attention_reference(model, x, model.attentions()))


def test_mnist_stats_from_metadata_and_guessed_heads(tmp_path) -> None:
    """Without a head count anywhere, it is guessed and said (GuessWarning); mean/std in the args are used."""
    model = perturb(FlexViT(image=28, patch=7, chans=1, dim=64, heads=2, dim_head=32, classes=10))
    torch.save({"state": model.state_dict(), "args": {"mean": [0.1307], "std": [0.3081]}}, tmp_path / "mnist.pth")
    with pytest.warns(GuessWarning) as caught:
        vm = vitviz.load(tmp_path / "mnist.pth", device="cpu")
    text = " ".join(str(w.message) for w in caught)
    assert "num_heads = 1 is a guess" in text and "--heads" in text and "1, 2, 4, 8, 16, 32, 64" in text
    assert vm.spec.heads_guessed and ("num_heads", vm.spec.source_of("num_heads")) in vm.spec.guesses
    assert vm.spec.preprocess.mean == (0.1307,) and vm.spec.preprocess.std == (0.3081,)
    assert vm.spec.source_of("preprocess").startswith("metadata: checkpoint args.mean")
    assert "preprocess" not in dict(vm.spec.guesses)
    right = vitviz.load(tmp_path / "mnist.pth", heads=2, device="cpu")
    assert not right.spec.heads_guessed
    x = x_for(c=1, h=28, w=28)
    assert_parity(right, x, *stored_attention_reference(model, x, model.attentions()))


# --------------------------------------------------------------------------------------------------- refusals
def test_vit_shaped_but_unplaceable_file_names_what_was_recognised(tmp_path) -> None:
    model = FlexViT()
    sd = model.state_dict()
    sd["blocks.1.attn.rel_bias"] = torch.randn(3, 17, 17)  # a relative position bias vitviz cannot place
    torch.save(sd, tmp_path / "odd.pth")
    with pytest.raises(UnknownLayoutError) as e:
        vitviz.load(tmp_path / "odd.pth", heads=3)
    msg = str(e.value)
    assert "not a Vision Transformer" not in msg and "does not look like" not in msg
    assert "odd.pth" in msg and "Recognised: blocks: 2 blocks under blocks.N" in msg and "attention: width 48" in msg
    assert "blocks.1.attn.rel_bias (3, 17, 17)" in msg and "vitviz.load(model)" in msg
    swiglu = FlexViT().state_dict()
    swiglu["blocks.0.mlp.gate.weight"] = torch.randn(96, 48)
    torch.save(swiglu, tmp_path / "gated.pth")
    with pytest.raises(UnknownLayoutError, match=r"blocks\.0\.mlp\.gate\.weight") as e2:
        vitviz.load(tmp_path / "gated.pth", heads=3)
    assert "not a Vision Transformer" not in str(e2.value)


def test_file_without_attention_is_still_not_a_vit(tmp_path) -> None:
    from torchvision.models import resnet18

    torch.save(resnet18().state_dict(), tmp_path / "resnet.pth")
    with pytest.raises(UnknownLayoutError, match="no attention weights"):
        vitviz.load(tmp_path / "resnet.pth")


# ------------------------------------------------------------------------------------------ command line / spec
def test_info_says_loudly_that_heads_were_guessed(tmp_path) -> None:
    model = FlexViT(image=28, patch=7, chans=1, dim=64, heads=2, dim_head=32, classes=10)
    torch.save(model.state_dict(), tmp_path / "mnist.pth")
    out = subprocess.run([sys.executable, "-m", "vitviz", "info", str(tmp_path / "mnist.pth")], capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stderr
    assert "num_heads" in out.stdout and "GUESSED" in out.stdout and "--heads N" in out.stdout
    assert "mean (0.0,), std (1.0,)" in out.stdout and "not an ImageNet model" in out.stdout
    fixed = subprocess.run([sys.executable, "-m", "vitviz", "info", str(tmp_path / "mnist.pth"), "--heads", "2",
                            "--mean", "0.1307", "--std", "0.3081", "--resize", "32", "--crop-mode", "center",
                            "--json"], capture_output=True, text=True)
    data = json.loads(fixed.stdout)
    assert data["num_heads"] == 2 and data["heads_guessed"] is False and data["provenance"]["num_heads"] == "override"
    assert data["preprocess"]["mean"] == [0.1307] and data["preprocess"]["resize"] == 32
    assert data["preprocess"]["mode"] == "center"


def test_resize_and_crop_mode_overrides(tmp_path) -> None:
    model = FlexViT(image=28, patch=7, chans=1, dim=64, heads=2, dim_head=32, classes=10)
    torch.save(model.state_dict(), tmp_path / "m.pth")
    vm = vitviz.load(tmp_path / "m.pth", heads=2, resize=36, crop_mode="center", device="cpu")
    assert (vm.spec.preprocess.resize, vm.spec.preprocess.mode) == (36, "center")
    assert "resize, crop_mode overridden" in vm.spec.source_of("preprocess")
    r = vm.run(np.full((50, 70), 200, np.uint8))
    assert r.input.shape == (1, 28, 28)
    with pytest.raises(vitviz.VitvizError, match="crop_mode 'zoom'; expected one of center, squash, squash_crop"):
        vitviz.load(tmp_path / "m.pth", heads=2, crop_mode="zoom")


# ------------------------------------------------------------------------------------------- text configs beside
def test_text_configs_beside_the_weights(tmp_path) -> None:
    """`<stem>.json`, `config.yaml`, `args.json` next to the file give heads and size; a config that cannot be
    parsed is skipped with a warning naming it; YAML is read as text (a python tag is not executed)."""
    from vitviz.core.reading.checkpoint import parse_plain_yaml

    model = perturb(FlexViT())
    torch.save(model.state_dict(), tmp_path / "vit_small_run.pth")
    (tmp_path / "vit_small_run.json").write_text(json.dumps({"model": {"n_heads": 3}}))
    vm = vitviz.load(tmp_path / "vit_small_run.pth", device="cpu")
    assert vm.spec.num_heads == 3 and vm.spec.source_of("num_heads") == "metadata: vit_small_run.json model.n_heads"
    (tmp_path / "vit_small_run.json").unlink()
    (tmp_path / "config.yaml").write_text("model: !!python/object:__main__.Cfg\n  heads: 3\n  dim_head: 16\n"
                                          "data:\n  mean: [0.5, 0.5, 0.5]\n  std: [0.25, 0.25, 0.25]\n")
    vm = vitviz.load(tmp_path / "vit_small_run.pth", device="cpu")
    assert vm.spec.num_heads == 3 and vm.spec.preprocess.std == (0.25, 0.25, 0.25)
    assert vm.spec.source_of("preprocess").startswith("metadata: config.yaml data.mean")
    (tmp_path / "config.yaml").write_text("model:\n  heads: 3\n  - broken\n: :\n")
    (tmp_path / "args.json").write_text('{"heads": 3,')
    with pytest.warns(UserWarning, match=r"args\.json: skipped, not a readable config"):
        vm = vitviz.load(tmp_path / "vit_small_run.pth", heads=3, device="cpu")
    assert parse_plain_yaml("a: 1\nb:\n  c: [1, 2.5, x]\n  d: 'q # not a comment'  # comment\ne: ~\n") == \
        {"a": 1, "b": {"c": [1, 2.5, "x"], "d": "q # not a comment"}, "e": None}
    x = x_for()
    assert_parity(vm, x, *stored_attention_reference(model, x, model.attentions()))


@pytest.mark.parametrize("mlp", [96, 144])  # 144: the MLP's first Linear has the shape of q/k/v, (3D, D)
def test_attention_without_telling_names(tmp_path, mlp: int) -> None:
    """`attn.l1` / `attn.l2`, `mlp.a` / `mlp.b`: q/k/v is the (3A, D) Linear with its (D, A) projection beside it,
    the MLP the (F, D) / (D, F) pair; a 1-channel patch-4 Linear (48, 16) is no attention either."""
    model = perturb(FlexViT(attn="fused", mlp=mlp, image=16, patch=4, chans=1))
    names = {".attn.qkv.": ".attn.l1.", ".attn.proj.": ".attn.l2.", ".mlp.0.": ".mlp.a.", ".mlp.3.": ".mlp.b."}
    sd = {}
    for k, v in model.state_dict().items():
        for old, new in names.items():
            k = k.replace(old, new)
        sd[k] = v
    torch.save(sd, tmp_path / "plain.pth")
    vm = vitviz.load(tmp_path / "plain.pth", heads=3, device="cpu")
    assert vm.spec.mlp_hidden == mlp and vm.spec.in_chans == 1 and vm.spec.patch_size == 4
    x = x_for(c=1, h=16, w=16)
    assert_parity(vm, x, *stored_attention_reference(model, x, model.attentions()))
