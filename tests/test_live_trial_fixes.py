"""What the trial of eleven hand-written ViTs from GitHub (`scripts/trial_handwritten/REPORT.md`) found, each a
regression test (the models are copied in `trial_refs.py`, sources credited there):

1. d2l's ViT (nn.LazyConv2d / nn.LazyLinear everywhere): `code=` crashed with torch's "Can't access the shape of an
   uninitialized parameter" while its weights were matched; its Lazy modules are now given their shapes by one dry
   forward (torch's recommendation) before the weights load -- exact; a Lazy model whose forward takes no probe is
   a `UserCodeError` naming the Lazy modules and what to pass;
2. labml's ViT: sequence-first scores (T_q, T_k, B, H) with a softmax over dim=1 were no attention vitviz saw, and
   both routes' refusals sent the user to the other. The softmax is captured, its axes moved to (B, H, T_q, T_k)
   -- exact against the module's own `attn`, per image and head; the file's refusal names its attention; the live
   refusal offers the weights file only when the file route reads it;
3. the nn.Sequential einops ViT: its keys start with numbers, and the file's refusal now says so and gives --code;
4. `module_settings` reads an activation given as a module instance (`activation=nn.GELU()`) and one whose class
   vitviz does not know by what it computes (transformers' `NewGELUActivation`: tanh GELU).
"""
from __future__ import annotations

import copy
import math
import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from einops import rearrange
from torch import nn

import vitviz
from trial_refs import (
    D2LMultiHeadAttention, LabmlMultiHeadAttention, ZupMultiHeadAttention, make_d2l, make_labml, make_zuppichini,
)
from tutorial_refs import EncoderViT
from vitviz.core.running.live import NoAttentionError, UserCodeError
from vitviz.core.reading.objects import module_settings
from vitviz.errors import UnknownLayoutError

pytestmark = pytest.mark.filterwarnings("ignore::vitviz.core.spec.GuessWarning")
ATOL = 1e-5
TESTS = Path(__file__).resolve().parent


def _built(make: Callable[[], nn.Module], seed: int = 0) -> nn.Module:
    """The model its factory makes, given its shapes by one forward (as its first training step does), every
    parameter perturbed (attention far from uniform), in eval mode."""
    torch.manual_seed(seed)
    net = make()
    with torch.no_grad():
        net.eval()(torch.zeros(1, 3, 32, 32))
        g = torch.Generator().manual_seed(seed + 1)
        for p in net.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.1)
    return net.eval()


def _code_file(tmp_path: Path, factory: str) -> str:
    code = tmp_path / "model.py"
    code.write_text(f"import sys\nsys.path.insert(0, {str(TESTS)!r})\nfrom trial_refs import {factory}\n")
    return f"{code}:{factory}"


def _own_maps(net: nn.Module, cls: type, read: object, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The module's own output and, per attention module of class `cls`, what `read(module)` makes of what it
    kept ((B, H, T, T))."""
    maps: list[torch.Tensor] = []
    hooks = [m.register_forward_hook(lambda m, _a, _o: maps.append(read(m).detach().clone()))  # type: ignore[operator]
             for m in net.modules() if isinstance(m, cls)]
    try:
        with torch.no_grad():
            out = net(x)
    finally:
        for h in hooks:
            h.remove()
    return out, maps


def _same(attn: np.ndarray, maps: list[torch.Tensor], image: int = 0) -> None:
    """(L, H, T, T) captured against the per-layer (B, H, T, T) maps the module kept, for one image."""
    assert attn.shape == (len(maps), *maps[0].shape[1:])
    for i, ref in enumerate(maps):
        np.testing.assert_allclose(attn[i], ref[image].numpy(), atol=ATOL, err_msg=f"layer {i}")


def _d2l_maps(m: nn.Module) -> torch.Tensor:
    w = m.attention.attention_weights                         # (B*H, T, T), d2l keeps it
    return w.reshape(-1, m.num_heads, *w.shape[-2:])         # (B, H, T, T)


def _labml_maps(m: nn.Module) -> torch.Tensor:
    return m.attn.permute(2, 3, 0, 1)                         # (T_q, T_k, B, H) -> (B, H, T_q, T_k)


# --------------------------------------------------------------------------------------- 1. Lazy modules (d2l)
def test_d2l_lazy_vit_by_code_with_its_weights_is_exact(tmp_path: Path) -> None:
    net = _built(make_d2l)
    torch.save(net.state_dict(), tmp_path / "d2l.pth")
    vm = vitviz.load(tmp_path / "d2l.pth", code=_code_file(tmp_path, "make_d2l"), device="cpu")
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(5))
    out, maps = _own_maps(net, D2LMultiHeadAttention, _d2l_maps, x)
    attn, logits = vm.forward_captured(x)
    for b in range(2):
        _same(attn[b], maps, b)
    np.testing.assert_allclose(logits, out.numpy(), atol=1e-5)
    assert vm.spec.num_heads == 4 and vm.spec.depth == 2
    assert "Lazy modules" in vm.spec.source_of("path") and "dry forward of a (1, 3, 32, 32) input" in \
        vm.spec.source_of("path")


def test_a_fresh_lazy_model_opens_live_and_the_dry_run_leaves_the_global_random_state() -> None:
    torch.manual_seed(3)
    net = make_d2l()
    state = torch.random.get_rng_state()
    vm = vitviz.load(net, live=True, device="cpu")
    assert torch.equal(torch.random.get_rng_state(), state)
    assert not any(isinstance(m, nn.modules.lazy.LazyModuleMixin) for m in net.modules())   # Linear, Conv2d now
    assert net.patch_embedding.conv.in_channels == 3
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(5))
    _out, maps = _own_maps(net.eval(), D2LMultiHeadAttention, _d2l_maps, x)
    _same(vm.forward_captured(x)[0][0], maps)


class _LazyOddSize(nn.Module):
    """A Lazy model whose forward takes only 40 px images, which nothing in it states."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.LazyLinear(16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert x.shape[-1] == 40, "40 px images only"
        t = self.proj(x.flatten(2).transpose(1, 2)[:, :, :3])
        return torch.softmax(t @ t.transpose(1, 2), -1).mean(1)


def test_a_lazy_model_no_probe_fits_is_a_user_code_error_naming_its_lazy_modules(tmp_path: Path) -> None:
    with pytest.raises(UserCodeError, match=r"Lazy modules without shapes \(proj \(LazyLinear\)\).*image_size="):
        vitviz.load(_LazyOddSize(), live=True, device="cpu")


# -------------------------------------------------------------------- 2. labml: (T_q, T_k, B, H), softmax(dim=1)
@pytest.mark.parametrize("heads", [4, 2])     # 2 heads: as many as the two images, told apart by the probe
def test_labml_sequence_first_softmax_over_dim_1_is_captured_exactly(heads: int) -> None:
    net = _built(lambda: make_labml(heads))
    vm = vitviz.load(net, live=True, device="cpu")
    assert [m for _, m in vm.layers] == ["softmax over dim=1 of (T_q, T_k, B, H)"] * 3
    assert [n for n, _ in vm.layers] == [f"transformer_layers.{i}.self_attn" for i in range(3)]
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(7))
    out, maps = _own_maps(net, LabmlMultiHeadAttention, _labml_maps, x)
    attn, logits = vm.forward_captured(x)
    assert attn.shape == (2, 3, heads, 17, 17)
    for b in range(2):
        _same(attn[b], maps, b)
    np.testing.assert_allclose(logits, out.numpy(), atol=1e-5)


def test_labml_by_code_with_its_weights_is_exact_and_by_file_names_its_attention(tmp_path: Path) -> None:
    net = _built(make_labml)
    path = tmp_path / "labml.pth"
    torch.save(net.state_dict(), path)
    vm = vitviz.load(path, code=_code_file(tmp_path, "make_labml"), device="cpu", image_size=32)
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(7))
    _out, maps = _own_maps(net, LabmlMultiHeadAttention, _labml_maps, x)
    _same(vm.forward_captured(x)[0][0], maps)
    # by file: its query.linear / key.linear / value.linear are attention, so it is never "not a ViT"; what cannot
    # be placed is said, and the route given is --code, which works
    with pytest.raises(UnknownLayoutError) as refused:
        vitviz.load(path)
    msg = str(refused.value)
    assert "not a Vision Transformer" not in msg
    assert "attention: width 64" in msg and "positional_encodings (5000, 1, 64) is a sequence-first table" in msg
    assert "Next: open it with its own code" in msg and "--code" in msg


class _OverQueries(nn.Module):
    """(B, H, T, T) scores with a softmax over the queries (dim=-2): not attention over the keys, whatever its
    shape -- the rule for token axes elsewhere must not take it."""

    def __init__(self) -> None:
        super().__init__()
        self.patch_embed = nn.Conv2d(3, 32, 8, 8)
        self.qkv = nn.Linear(32, 96)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = self.patch_embed(x).flatten(2).transpose(1, 2)
        q, k, v = self.qkv(t).reshape(t.shape[0], t.shape[1], 3, 4, 8).permute(2, 0, 3, 1, 4)
        a = (q @ k.transpose(-2, -1)).softmax(dim=-2)
        return (a @ v).mean((1, 2))


def test_a_softmax_over_the_query_axis_of_b_h_t_t_scores_is_still_not_attention() -> None:
    with pytest.raises(NoAttentionError, match=r"softmax over other shapes: \[\(1, 4, 16, 16\)\]"):
        vitviz.load(_OverQueries(), live=True, device="cpu", image_size=32)


class _SigmoidAttention(nn.Module):
    """Attention the live path cannot see (sigmoid over the scores), under `attn.qkv` (which a file reads)."""

    def __init__(self, dim: int = 32) -> None:
        super().__init__()
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, -1)
        return self.proj(torch.sigmoid(q @ k.transpose(-2, -1)) @ v)


class _Block(nn.Module):
    def __init__(self, mixer: nn.Module) -> None:
        super().__init__()
        self.norm1, self.attn, self.norm2 = nn.LayerNorm(32), mixer, nn.LayerNorm(32)
        self.mlp = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class _Unseen(nn.Module):
    """A ViT whose attention no route shows when `named` is False: its mixing weights carry no attention names
    (`mix.a` / `mix.b`); with `named`, a file route reads its `attn.qkv`."""

    def __init__(self, named: bool) -> None:
        super().__init__()
        self.patch_embed = nn.Conv2d(3, 32, 8, 8)
        self.cls_token = nn.Parameter(torch.randn(1, 1, 32))
        self.pos_embed = nn.Parameter(torch.randn(1, 17, 32))
        mixer: nn.Module = _SigmoidAttention() if named else nn.Sequential(nn.Linear(32, 32), nn.Tanh())
        self.blocks = nn.ModuleList([_Block(copy.deepcopy(mixer)) for _ in range(2)])
        self.head = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], 1) + self.pos_embed
        for blk in self.blocks:
            x = blk(x)
        return self.head(x[:, 0])


def make_unseen_named() -> nn.Module:
    return _Unseen(named=True)


def make_unseen_plain() -> nn.Module:
    return _Unseen(named=False)


@pytest.mark.parametrize("named", [False, True])
def test_the_live_refusal_offers_the_weights_file_only_when_the_file_route_reads_it(tmp_path: Path,
                                                                                  named: bool) -> None:
    path = tmp_path / "unseen.pth"
    torch.save(_Unseen(named).state_dict(), path)
    code = tmp_path / "unseen.py"
    code.write_text(f"import sys\nsys.path.insert(0, {str(TESTS)!r})\n"
                    "from test_live_trial_fixes import make_unseen_named, make_unseen_plain\n")
    factory = "make_unseen_named" if named else "make_unseen_plain"
    with pytest.raises(NoAttentionError) as refused:
        vitviz.load(path, code=f"{code}:{factory}", device="cpu")
    msg = str(refused.value)
    assert "no self-attention was seen" in msg
    if named:       # the file route reads it: the advice stands
        assert "open its weights file by itself" in msg
    else:           # the file route refuses it: said, and not offered
        file_msg = ""
        try:
            vitviz.load(path)
        except UnknownLayoutError as e:
            file_msg = str(e)
        assert "--code" in file_msg            # the file route points at the code ...
        assert "open its weights file by itself" not in msg and "without code=" in msg   # ... and this not back
        assert "no attention weights" in msg and "Next: if it is a Vision Transformer" in msg


# ----------------------------------------------------------------------------- 3. nn.Sequential (zuppichini)
def test_an_nn_sequential_vit_file_is_refused_as_one_and_its_code_opens_it(tmp_path: Path) -> None:
    net = _built(make_zuppichini)
    path = tmp_path / "vit.pth"
    torch.save(net.state_dict(), path)
    with pytest.raises(UnknownLayoutError) as refused:
        vitviz.load(path)
    msg = str(refused.value)
    assert "keys start with numbers because the model is an nn.Sequential" in msg
    assert "0: 0.cls_token" in msg and "1: 1.0.0.fn.0.weight" in msg
    assert "Next: open it with its own code" in msg and "--code FILE.py:FACTORY" in msg
    assert ".0 comes before any attention" not in msg
    # the route it gives: exact (the softmax's probabilities; its division by sqrt(D) afterwards is said)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        vm = vitviz.load(path, code=_code_file(tmp_path, "make_zuppichini"), device="cpu")
    assert any("not the weights the module applies" in str(w.message) for w in caught)

    def softmax(m: nn.Module) -> torch.Tensor:
        qkv = rearrange(m.qkv(m.seen), "b n (h d qkv) -> (qkv) b h n d", h=m.num_heads, qkv=3)
        return torch.softmax(qkv[0] @ qkv[1].transpose(-2, -1), -1)

    hooks = [m.register_forward_pre_hook(lambda m, a: setattr(m, "seen", a[0])) for m in net.modules()
             if isinstance(m, ZupMultiHeadAttention)]
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    try:
        out, maps = _own_maps(net, ZupMultiHeadAttention, softmax, x)
    finally:
        for h in hooks:
            h.remove()
    attn, logits = vm.forward_captured(x)
    _same(attn[0], maps)
    np.testing.assert_allclose(logits, out.numpy(), atol=1e-5)


# ------------------------------------------------------------------------- 4. activations as module objects
class NewGELUActivation(nn.Module):
    """transformers' tanh GELU (activations.py), as tintn/vision-transformer-from-scratch copies it."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return 0.5 * input * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (input + 0.044715 * torch.pow(input, 3.0))))


class _ErfGELU(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))


class _Swish15(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(1.5 * x)      # none of the activations vitviz offers


class _MlpModel(nn.Module):
    def __init__(self, act: nn.Module) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([nn.Module() for _ in range(2)])
        for blk in self.blocks:
            blk.mlp = nn.Module()
            blk.mlp.fc1, blk.mlp.act, blk.mlp.fc2 = nn.Linear(8, 16), act, nn.Linear(16, 8)


@pytest.mark.parametrize(("act", "kind"), [(nn.GELU(), "gelu"), (nn.GELU(approximate="tanh"), "gelu_tanh"),
                                           (nn.ReLU(), "relu"), (nn.SiLU(), "silu")])
def test_a_transformer_encoder_layer_activation_given_as_a_module_is_read(act: nn.Module, kind: str) -> None:
    net = EncoderViT(norm_first=True, activation=act)    # type: ignore[arg-type]
    settings = module_settings(net)
    assert settings["act"][0] == kind and settings["act"][1].startswith("model object:")
    assert settings["block_norm"][0] == "pre"


def test_the_activation_read_from_the_object_opens_its_file_exactly(tmp_path: Path) -> None:
    """What `verify --code` and `vitviz.load(module)` take from the object (`module_settings`) is the setting the
    file needs: with it (and the head count) the file of an nn.TransformerEncoder ViT built with `nn.GELU()`
    opens exactly."""
    net = EncoderViT(norm_first=True, activation=nn.GELU()).eval()     # type: ignore[arg-type]
    with torch.no_grad():
        for p in net.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(4)) * 0.1)
    torch.save(net.state_dict(), tmp_path / "enc.pth")
    stated = {k: v for k, (v, _) in module_settings(net).items() if k in ("act", "block_norm")}
    assert stated == {"act": "gelu", "block_norm": "pre"}
    vm = vitviz.load(tmp_path / "enc.pth", heads=4, device="cpu", **stated)
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        with torch.no_grad():
            own = net(x).numpy()
    finally:
        torch.backends.mha.set_fastpath_enabled(True)
    np.testing.assert_allclose(vm.forward_captured(x)[1], own, atol=1e-4)


@pytest.mark.parametrize(("act", "kind"), [(NewGELUActivation(), "gelu_tanh"), (_ErfGELU(), "gelu"),
                                           (_Swish15(), None)])
def test_an_activation_class_vitviz_does_not_know_is_read_by_what_it_computes(act: nn.Module,
                                                                             kind: str | None) -> None:
    settings = module_settings(_MlpModel(act))
    if kind is None:        # unlike every activation vitviz offers: left unstated (an assumption, said as such)
        assert "act" not in settings
    else:
        assert settings["act"][0] == kind
        assert f"{type(act).__name__}, which computes {kind}" in settings["act"][1]
