"""Interventions (`vitviz.core.running.interventions`) against the same interventions done with forward hooks on the
original timm and transformers models (random weights, built here): logits and downstream attention at the parity
tests' atol; a clean run is bit-identical with and without the machinery; bad input is refused by name."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import vitviz
from parity_refs import perturb
from vitviz.core.files import read_npz, write_npz_atomic
from vitviz.core.running.interventions import Ablate, InterventionError, Knockout, PatchAttention, PatchResidual

timm = pytest.importorskip("timm")
transformers = pytest.importorskip("transformers")
from timm.models.vision_transformer import VisionTransformer  # noqa: E402

ATOL = 1e-5
HEADS, DEPTH, DIM = 4, 3, 64


def _image(seed: int) -> torch.Tensor:
    return torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


A, B, C = _image(1), _image(2), _image(3)

# every kind of intervention, and the tokens the timm model (CLS + 2 registers) has: 0 CLS, 1-2 registers
CASES = {
    "ablate_zero": Ablate([(1, 2), (2, 0)]),
    "ablate_mean": Ablate([(0, 1), (2, 3)], "mean", reference=[B, C]),
    "ablate_resample": Ablate([(1, 0)], "resample", reference=B),
    "patch_attention_head": PatchAttention(1, 2, B),
    "patch_attention_all": PatchAttention(0, None, B),
    "patch_residual_cls": PatchResidual(1, B, tokens=[0]),
    "patch_residual_all": PatchResidual(0, B),
    "knockout_cls": Knockout([0]),
    "knockout_regs": Knockout([1, 2], layers=[1, 2], heads=[0, 3]),
}


@pytest.fixture(scope="module")
def timm_pair(tmp_path_factory):
    """A timm ViT with 2 registers (fused attention off, so its softmax passes `attn_drop`) and vitviz's model of
    the same file."""
    net = perturb(VisionTransformer(img_size=32, patch_size=8, embed_dim=DIM, depth=DEPTH, num_heads=HEADS,
                                    mlp_ratio=2.0, num_classes=5, reg_tokens=2))
    for blk in net.blocks:
        blk.attn.fused_attn = False
    path = tmp_path_factory.mktemp("timm") / "vit.pth"
    torch.save(net.state_dict(), path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return net, vitviz.load(path, heads=HEADS, device="cpu")


def _timm_points(net: torch.nn.Module, kind: str, layer: int) -> torch.nn.Module:
    """timm's hook points: the joined heads enter `attn.proj`, the softmax leaves `attn.attn_drop`."""
    blk = net.blocks[layer]
    return {"heads": blk.attn.proj, "attention": blk.attn.attn_drop, "block": blk}[kind]


def _run_hooked(net: torch.nn.Module, points, x: torch.Tensor, pre: dict, post: dict,
                forward=None) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Run the original with forward pre-hooks `pre` and forward hooks `post` ({module: fn}); its output and every
    layer's softmax after the hooks (read where it leaves the attention hook point)."""
    maps: list[torch.Tensor] = []
    handles = [m.register_forward_pre_hook(fn) for m, fn in pre.items()]
    handles += [m.register_forward_hook(fn) for m, fn in post.items()]
    handles += [points(i).register_forward_hook(lambda _m, _i, o: maps.append(o.detach()))
                for i in range(DEPTH)]
    try:
        with torch.no_grad():
            out = (forward or net)(x)
    finally:
        for h in handles:
            h.remove()
    return out, maps


def _record(net: torch.nn.Module, module: torch.nn.Module, x: torch.Tensor, pre: bool, forward=None) -> torch.Tensor:
    got: list[torch.Tensor] = []
    if pre:
        h = module.register_forward_pre_hook(lambda _m, inp: got.append(inp[0].detach().clone()))
    else:
        h = module.register_forward_hook(lambda _m, _i, out: got.append(out.detach().clone()))
    try:
        with torch.no_grad():
            (forward or net)(x)
    finally:
        h.remove()
    return got[0]


def _reference_hooks(net, item, point, forward=None, attention_patch=None):
    """The intervention as hooks on the original: (pre-hooks, forward hooks); `attention_patch(layer, fn)` installs
    a softmax replacement where the library has no module after the softmax (transformers)."""
    pre, post = {}, {}
    hd = DIM // HEADS
    if isinstance(item, Ablate):
        for layer in sorted({l_ for l_, _ in item.heads}):
            heads = [h for l_, h in item.heads if l_ == layer]
            module = point("heads", layer)
            value = None
            if item.mode != "zero":
                refs = item.reference if isinstance(item.reference, list) else [item.reference]
                value = torch.stack([_record(net, module, r, True, forward)[0] for r in refs]).mean(0)  # (T, D)

            def fn(_m, inp, heads=heads, value=value):
                x = inp[0].clone()
                for h in heads:
                    x[..., h * hd:(h + 1) * hd] = 0 if value is None else value[:, h * hd:(h + 1) * hd]
                return (x, *inp[1:])
            pre[module] = fn
    elif isinstance(item, PatchAttention):
        src = _record(net, point("attention", item.layer), item.source, False, forward)[0]

        def patch(w, head=item.head, src=src):
            w = w.clone()
            if head is None:
                w[:] = src
            else:
                w[:, head] = src[head]
            return w
        attention_patch(item.layer, patch, post)
    elif isinstance(item, PatchResidual):
        module = point("block", item.layer)
        src = _record(net, module, item.source, False, forward)[0]

        def residual(_m, _i, out, tokens=item.tokens, src=src):
            out = out.clone()
            if tokens is None:
                out[:] = src
            else:
                out[:, list(tokens)] = src[list(tokens)]
            return out
        post[module] = residual
    else:
        def knock(w, item=item):
            w = w.clone()
            heads = list(range(HEADS)) if item.heads is None else list(item.heads)
            part = w[:, heads]
            part[..., list(item.tokens)] = 0
            w[:, heads] = part / part.sum(-1, keepdim=True)
            return w
        for layer in (range(DEPTH) if item.layers is None else item.layers):
            attention_patch(layer, knock, post)
    return pre, post


def _assert_same(result, out: torch.Tensor, maps: list[torch.Tensor]) -> None:
    np.testing.assert_allclose(result.logits, out[0].numpy(), atol=ATOL)
    for i, ref in enumerate(maps):
        np.testing.assert_allclose(result.attentions[i], ref[0].numpy(), atol=ATOL, err_msg=f"layer {i}")


@pytest.mark.parametrize("name", list(CASES))
def test_timm_hooks_agree(timm_pair, name: str) -> None:
    net, vm = timm_pair
    item = CASES[name]
    clean = vm.run(A)

    def point(kind, layer):
        return _timm_points(net, kind, layer)

    def attention_patch(layer, fn, post):
        module = point("attention", layer)
        before = post.get(module)
        post[module] = (lambda _m, _i, out, fn=fn, before=before:
                        fn(out if before is None else before(_m, _i, out)))

    pre, post = _reference_hooks(net, item, point, attention_patch=attention_patch)
    out, maps = _run_hooked(net, lambda i: point("attention", i), A, pre, post)
    result = vm.run(A, intervene=item)
    _assert_same(result, out, maps)
    assert result.interventions == (item.describe(),)
    assert np.abs(result.logits - clean.logits).max() > 1e-3, "the intervention changed nothing: a vacuous test"


@pytest.fixture(scope="module")
def hf_pair(tmp_path_factory):
    from transformers import ViTConfig, ViTForImageClassification

    hf = perturb(ViTForImageClassification(ViTConfig(
        hidden_size=DIM, num_hidden_layers=DEPTH, num_attention_heads=HEADS, intermediate_size=2 * DIM,
        image_size=32, patch_size=8, num_labels=5, attn_implementation="eager")))
    folder = tmp_path_factory.mktemp("hf")
    hf.save_pretrained(folder)
    return hf, vitviz.load(folder, device="cpu")


HF_CASES = {k: v for k, v in CASES.items() if k != "knockout_regs"} | {
    "knockout_patches": Knockout([3, 7], layers=[0, 2], heads=[1])}


@pytest.mark.parametrize("name", list(HF_CASES))
def test_transformers_hooks_agree(hf_pair, monkeypatch, name: str) -> None:
    """transformers computes the softmax inside an attention function, not a module: the softmax is replaced through
    its own `AttentionInterface` (the eager function's weights, modified, then times the values)."""
    from transformers import AttentionInterface
    from transformers.models.vit import modeling_vit

    hf, vm = hf_pair
    item = HF_CASES[name]
    layers = hf.vit.layers
    index = {id(layer.attention): i for i, layer in enumerate(layers)}
    patches: dict[int, list] = {}

    def attention(module, q, k, v, mask, scaling=None, dropout=0.0, **kw):
        out, w = modeling_vit.eager_attention_forward(module, q, k, v, mask, scaling=scaling, dropout=dropout, **kw)
        fns = patches.get(index[id(module)], [])
        if not fns:
            return out, w
        for fn in fns:
            w = fn(w)
        return torch.matmul(w, v).transpose(1, 2).contiguous(), w

    AttentionInterface.register("vitviz_intervention_test", attention)

    def forward(x):
        return hf(pixel_values=x).logits

    def point(kind, layer):
        return {"heads": layers[layer].attention.o_proj, "block": layers[layer]}[kind]

    def attention_patch(layer, fn, _post):
        patches.setdefault(layer, []).append(fn)

    if isinstance(item, PatchAttention):  # the source's softmax, read by the clean eager run
        with torch.no_grad():
            src = hf(pixel_values=item.source, output_attentions=True).attentions[item.layer][0]
        head = item.head

        def patch(w, src=src):
            w = w.clone()
            if head is None:
                w[:] = src
            else:
                w[:, head] = src[head]
            return w
        pre, post = {}, {}
        patches[item.layer] = [patch]
    else:
        pre, post = _reference_hooks(hf, item, point, forward, attention_patch)
    monkeypatch.setattr(hf.config, "_attn_implementation", "vitviz_intervention_test")
    handles = [m.register_forward_pre_hook(fn) for m, fn in pre.items()]
    handles += [m.register_forward_hook(fn) for m, fn in post.items()]
    try:
        with torch.no_grad():
            ref = hf(pixel_values=A, output_attentions=True)
    finally:
        for h in handles:
            h.remove()
    result = vm.run(A, intervene=item)
    _assert_same(result, ref.logits, list(ref.attentions))
    assert np.abs(result.logits - vm.run(A).logits).max() > 1e-3, "the intervention changed nothing"


def test_clean_run_bit_identical(timm_pair, tmp_path) -> None:
    """A run without interventions is bit for bit the run of a net whose probes have no hooks, before and after an
    intervened run (every hook removed, the model's `interventions` back to ())."""
    _net, vm = timm_pair
    first = vm.run(A)
    with vm.intervening() as done:
        assert done == ()
        empty = vm.run(A)
    vm.run(A, intervene=[Ablate([(0, 0)]), Knockout([0]), PatchResidual(1, B)])
    again = vm.run(A)
    for r in (empty, again):
        assert np.array_equal(r.logits, first.logits) and np.array_equal(r.attentions, first.attentions)
        assert r.interventions == ()
    hooked = [m for m in vm.net.modules() if m._forward_hooks or m._forward_pre_hooks]
    assert hooked == [] and vm.interventions == ()
    t = torch.randn(1, HEADS, 3, 4)
    assert vm.net.blocks[0].attn.head_probe(t) is t   # the probe is the identity: the same tensor object


def test_intervening_context_and_metadata(timm_pair, tmp_path) -> None:
    _net, vm = timm_pair
    item = Ablate([(2, 1)])
    with vm.intervening(item):
        inside = vm.run(A)
        both = vm.run(A, intervene=Knockout([0]))
    assert inside.interventions == ("ablate L2.H1 (zero)",)
    assert both.interventions == ("ablate L2.H1 (zero)", "knock out attention to token 0 in all layers, all heads")
    np.testing.assert_array_equal(inside.logits, vm.run(A, intervene=item).logits)
    assert "intervened: ablate L2.H1 (zero)" in repr(inside)
    path = write_npz_atomic(tmp_path / "r.npz", inside)
    assert read_npz(path)["interventions"] == ["ablate L2.H1 (zero)"]
    assert "interventions" not in read_npz(write_npz_atomic(tmp_path / "c.npz", vm.run(A)))


def test_mean_ablation_is_the_mean_of_the_resamplings(timm_pair) -> None:
    """What a mean ablation over {B, C} puts in the head is the average of what resampling from B and from C puts
    there (per token position); the other heads keep A's own output."""
    from vitviz.core.running.interventions import record

    _net, vm = timm_pair
    seen = {}
    for key, item in {"mean": Ablate([(0, 1)], "mean", reference=[B, C]),
                      "b": Ablate([(0, 1)], "resample", reference=B),
                      "c": Ablate([(0, 1)], "resample", reference=C), "clean": None}.items():
        with vm.intervening(*([item] if item else [])):
            seen[key] = record(vm, A, heads=[0])["heads"][0][0]   # (H, T, hd) after the intervention's hook
    torch.testing.assert_close(seen["mean"][1], (seen["b"][1] + seen["c"][1]) / 2, atol=1e-6, rtol=0)
    assert not torch.allclose(seen["b"][1], seen["c"][1])
    for key in ("mean", "b", "c"):
        assert torch.equal(seen[key][[0, 2, 3]], seen["clean"][[0, 2, 3]])


@pytest.mark.parametrize("item, words", [
    (lambda: Ablate([(3, 0)]), ["layer 3", "3 layers (0-2)"]),
    (lambda: Ablate([(0, 4)]), ["head 4", "4 heads per layer (0-3)"]),
    (lambda: Ablate([(0, 0)], "mean", reference=[B]), ["at least 2", "got 1"]),
    (lambda: Ablate([(0, 0)], "mean"), ["at least 2", "got 0"]),
    (lambda: Ablate([(0, 0)], "resample", reference=[B, C]), ["one reference image"]),
    (lambda: Ablate([(0, 0)], "noise"), ["'noise'", "zero, mean, resample"]),
    (lambda: Knockout(list(range(19))), ["all 19 tokens"]),
    (lambda: Knockout([19]), ["token 19", "19 tokens (0-18", "cls, reg0, reg1"]),
    (lambda: PatchResidual(5, B), ["block 5", "0-2"]),
    (lambda: PatchAttention(0, 0, torch.randn(1, 3, 40, 40)), ["(40, 40)", "(32, 32)"]),
    (lambda: PatchResidual(0, [B, C]), ["one source image", "a set of 2"]),
])
def test_bad_input_is_named(timm_pair, item, words) -> None:
    _net, vm = timm_pair
    with pytest.raises(InterventionError) as err:
        vm.run(A, intervene=item())
    for w in words:
        assert w in str(err.value)
    assert not [m for m in vm.net.modules() if m._forward_hooks]


def test_models_without_hook_points_are_refused(timm_pair) -> None:
    """A model run by its own code, and a windowed model, say why they cannot be intervened on."""
    net, _vm = timm_pair
    live = vitviz.load(net, live=True)
    with pytest.raises(InterventionError, match="LiveModel.*your own module"):
        live.run(A, intervene=Ablate([(0, 0)]))
    from _windowed import model_of, swin_spec
    from vitviz.core.running.interventions import applied

    with pytest.raises(InterventionError, match="WindowedModel.*per \\(shifted\\) window"):
        with applied(model_of(swin_spec()), Ablate([(0, 0)])):
            pass


@pytest.mark.parametrize("name", ["ablate_mean", "patch_attention_head", "patch_residual_cls", "knockout_regs"])
def test_interventions_hold_inside_autograd(timm_pair, name: str) -> None:
    """Gradient maps (a forward and backward pass) run under an open intervention: its hooks work inside autograd
    (no in-place change of a tensor the backward needs), and the map is the intervened model's."""
    from vitviz.core.analyses.relevance import class_relevance

    _net, vm = timm_pair
    clean = class_relevance(vm, A, 0).chefer
    with vm.intervening(CASES[name]):
        changed = class_relevance(vm, A, 0).chefer
    assert np.isfinite(changed).all() and np.abs(changed - clean).max() > 1e-6
