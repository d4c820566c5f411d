"""Parity for JAX / Flax `.npz` checkpoints (vit_jax, big_vision incl. SigLIP), with timm as the oracle.

No JAX here: a random, perturbed timm model is written in the JAX key layout by `to_npz` (timm's `_load_weights`
read backwards: kernels (in, out), attention kernels (D, H, hd), the patch kernel HWIO, scanned blocks stacked on a
leading depth axis), loaded into a fresh timm model by `_load_weights` itself, and into vitviz; logits / features,
every layer's per-head attention and the MAP head's attention are compared at 1e-5, also at another resolution.
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import vitviz
from parity_refs import perturb, timm_reference

timm = pytest.importorskip("timm")
from timm.models.vision_transformer import VisionTransformer, _load_weights  # noqa: E402

ATOL = 1e-5


def to_npz(model: VisionTransformer, path, layout: str, bf16: bool = False) -> None:
    """Write `model` as a JAX checkpoint: layout 'vit_jax' (encoderblock_N, MHA_1 / LayerNorm_2 / MlpBlock_3,
    posembed_input), 'vit_jax_opt' (the same under opt/target/), 'big_vision' (params/, MHA_0 / LayerNorm_1 /
    MlpBlock_0, pos_embedding) or 'siglip' (params/img/, scanned blocks, MAPHead_0)."""
    prefix = {"vit_jax": "", "vit_jax_opt": "opt/target/", "big_vision": "params/", "siglip": "params/img/"}[layout]
    bv = layout in ("big_vision", "siglip")
    mha, mlp, ln2 = (0, 0, 1) if bv else (1, 3, 2)
    d, heads = model.embed_dim, model.blocks[0].attn.num_heads
    hd = d // heads
    w: dict[str, np.ndarray] = {}

    def put(name: str, t: torch.Tensor) -> None:
        w[prefix + name] = t.detach().numpy().astype(np.float32)

    put("embedding/kernel", model.patch_embed.proj.weight.permute(2, 3, 1, 0))  # (D, C, P, P) -> (P, P, C, D)
    put("embedding/bias", model.patch_embed.proj.bias)
    if model.cls_token is not None:
        put("cls", model.cls_token)
    put("pos_embedding" if bv else "Transformer/posembed_input/pos_embedding", model.pos_embed)
    put("Transformer/encoder_norm/scale", model.norm.weight)
    put("Transformer/encoder_norm/bias", model.norm.bias)
    if isinstance(model.head, torch.nn.Linear):
        put("head/kernel", model.head.weight.t())
        put("head/bias", model.head.bias)

    def attn_kernels(qkv_w: torch.Tensor, qkv_b: torch.Tensor, names: tuple[str, ...]) -> dict[str, torch.Tensor]:
        out = {}
        for j, n in enumerate(names):
            out[f"{n}/kernel"] = qkv_w[j * d:(j + 1) * d].t().reshape(d, heads, hd)  # (A, D) -> (D, H, hd)
            out[f"{n}/bias"] = qkv_b[j * d:(j + 1) * d].reshape(heads, hd)
        return out

    blocks = []
    for blk in model.blocks:
        t = {"LayerNorm_0/scale": blk.norm1.weight, "LayerNorm_0/bias": blk.norm1.bias,
             f"LayerNorm_{ln2}/scale": blk.norm2.weight, f"LayerNorm_{ln2}/bias": blk.norm2.bias,
             f"MultiHeadDotProductAttention_{mha}/out/kernel": blk.attn.proj.weight.t().reshape(heads, hd, d),
             f"MultiHeadDotProductAttention_{mha}/out/bias": blk.attn.proj.bias}
        for name, v in attn_kernels(blk.attn.qkv.weight, blk.attn.qkv.bias, ("query", "key", "value")).items():
            t[f"MultiHeadDotProductAttention_{mha}/{name}"] = v
        for r, fc in enumerate((blk.mlp.fc1, blk.mlp.fc2)):
            t[f"MlpBlock_{mlp}/Dense_{r}/kernel"] = fc.weight.t()
            t[f"MlpBlock_{mlp}/Dense_{r}/bias"] = fc.bias
        blocks.append(t)
    if layout == "siglip":  # scanned: one array per name with a leading depth axis
        for name in blocks[0]:
            put(f"Transformer/encoderblock/{name}", torch.stack([b[name] for b in blocks]))
    else:
        for i, b in enumerate(blocks):
            for name, v in b.items():
                put(f"Transformer/encoderblock_{i}/{name}", v)
    if model.attn_pool is not None:
        ap, base = model.attn_pool, "MAPHead_0/"
        put(base + "probe", ap.latent)
        kv = torch.cat([ap.q.weight, ap.kv.weight]), torch.cat([ap.q.bias, ap.kv.bias])
        for name, v in attn_kernels(*kv, ("query", "key", "value")).items():
            put(f"{base}MultiHeadDotProductAttention_0/{name}", v)
        put(base + "MultiHeadDotProductAttention_0/out/kernel", ap.proj.weight.t().reshape(heads, hd, d))
        put(base + "MultiHeadDotProductAttention_0/out/bias", ap.proj.bias)
        put(base + "LayerNorm_0/scale", ap.norm.weight)
        put(base + "LayerNorm_0/bias", ap.norm.bias)
        for r, fc in enumerate((ap.mlp.fc1, ap.mlp.fc2)):
            put(f"{base}MlpBlock_0/Dense_{r}/kernel", fc.weight.t())
            put(f"{base}MlpBlock_0/Dense_{r}/bias", fc.bias)
    if bf16:  # as big_vision stores bfloat16: 2-byte void, the high half of each float32
        w = {k: (v.view(np.uint32) >> 16).astype(np.uint16).view("V2") for k, v in w.items()}
    np.savez(path, **w)


def build(layout: str, seed: int = 0) -> VisionTransformer:
    common = dict(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4, mlp_ratio=2.0, dynamic_img_size=True)
    if layout == "siglip":
        model = VisionTransformer(class_token=False, global_pool="map", num_classes=0, act_layer="gelu_tanh", **common)
    elif layout == "big_vision":
        model = VisionTransformer(class_token=False, global_pool="avg", fc_norm=False, num_classes=7, **common)
    else:
        model = VisionTransformer(num_classes=7, **common)
    return perturb(model, seed=seed)


def reference(model: VisionTransformer, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor | None]:
    """timm's eager logits/features, per-layer attention and (MAP models) the pooling head's softmax (1, H, N):
    the latent query against `kv` of the normed tokens, recomputed from timm's own modules."""
    kept: list[torch.Tensor] = []
    pool = None
    if model.attn_pool is not None:
        model.attn_pool.fused_attn = False
        hook = model.attn_pool.register_forward_pre_hook(lambda m, args: kept.append(args[0]))
    out, maps = timm_reference(model, x)
    if model.attn_pool is not None:
        hook.remove()
        ap = model.attn_pool
        with torch.no_grad():
            b, n, d = kept[0].shape
            h, hd = ap.num_heads, ap.head_dim
            q = ap.q(ap.latent).reshape(1, 1, h, hd).transpose(1, 2)
            k = ap.kv(kept[0]).reshape(b, n, 2, h, hd).permute(2, 0, 3, 1, 4)[0]
            pool = ((q * ap.scale) @ k.transpose(-2, -1)).softmax(-1)[:, :, 0]  # (1, H, N)
    return out, maps, pool


@pytest.mark.parametrize("layout", ["vit_jax", "vit_jax_opt", "big_vision", "siglip"])
@pytest.mark.parametrize("size", [(32, 32), (40, 56)])
def test_npz_matches_timm_load_weights(tmp_path, layout: str, size: tuple[int, int]) -> None:
    src = build(layout)
    path = tmp_path / "ViT-Ti_8.npz"
    to_npz(src, path, layout)
    oracle = build(layout, seed=9)  # other weights, all replaced by timm's own loader
    with torch.no_grad():
        _load_weights(oracle, str(path))
    oracle.eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a 32 px model: preprocessing guesses (inputs here are tensors)
        vm = vitviz.load(path, device="cpu")
    assert vm.spec.family == ("jax-siglip" if layout == "siglip" else "jax")
    assert vm.spec.num_heads == 4 and vm.spec.source_of("num_heads").startswith("shape")
    assert vm.spec.pooling == {"siglip": "map", "big_vision": "avg"}.get(layout, "token")
    x = torch.randn(1, 3, *size, generator=torch.Generator().manual_seed(1))
    out, maps, pool = reference(oracle, x)
    r = vm.run(x)
    got = r.features if vm.spec.num_classes == 0 else r.logits
    np.testing.assert_allclose(got, out[0].numpy(), atol=ATOL)
    assert r.attentions.shape[0] == len(maps) == 2
    for i, ref in enumerate(maps):
        np.testing.assert_allclose(r.attentions[i], ref[0].numpy(), atol=ATOL, err_msg=f"layer {i}")
    if pool is not None:
        assert r.pool_attention is not None and r.pool_attention.shape == (4, r.spec.num_tokens)
        np.testing.assert_allclose(r.pool_attention, pool[0].numpy(), atol=ATOL)
        np.testing.assert_allclose(r.pool_map().sum(), 1.0, atol=1e-5)


def test_bf16_npz_is_widened_exactly(tmp_path) -> None:
    src = build("siglip")
    to_npz(src, tmp_path / "f32.npz", "siglip")
    to_npz(src, tmp_path / "bf16.npz", "siglip", bf16=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        full, half = vitviz.load(tmp_path / "f32.npz", device="cpu"), vitviz.load(tmp_path / "bf16.npz", device="cpu")
    a, b = full.net.state_dict(), half.net.state_dict()
    for k in a:  # bfloat16 keeps the top 16 bits: the same value truncated, never more than 2^-7 relative off
        assert torch.equal(b[k], (a[k].view(torch.int32) & -65536).view(torch.float32)), k


def test_npz_with_pickled_objects_is_refused(tmp_path) -> None:
    from vitviz.errors import VitvizError
    np.savez(tmp_path / "bad.npz", **{"embedding/kernel": np.array([object()], dtype=object)})
    with pytest.raises(VitvizError, match="pickle"):
        vitviz.load(tmp_path / "bad.npz", device="cpu")


def test_a_folder_holding_an_npz_opens_it(tmp_path) -> None:
    """`.npz` is a weights suffix like the others: a folder with one opens it (the window's drop, `vitviz info DIR`)."""
    src = build("vit_jax")
    folder = tmp_path / "my-jax-vit"
    folder.mkdir()
    to_npz(src, folder / "ViT-Ti_8.npz", "vit_jax")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a, b = vitviz.load(folder, device="cpu"), vitviz.load(folder / "ViT-Ti_8.npz", device="cpu")
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    np.testing.assert_array_equal(a.run(x).attentions, b.run(x).attentions)
    from vitviz.gui.dropping import classify

    assert classify([str(folder)]).models == [str(folder)]
