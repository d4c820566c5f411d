"""Class- and embedding-specific relevance (core.relevance): parity with the reference implementations, the plain
capture left alone, errors, and faithfulness on the demo model.

The references are written here from their public sources and run on the original model class with the same random
weights:
- Chefer et al.'s generic rule: `generate_relevance` of hila-chefer/Transformer-MM-Explainability
  `Transformer_MM_explainability_ViT.ipynb` (whose ViT, `baselines/ViT/ViT_new.py`, saves each block's attention
  after `attn_drop` and its gradient by a tensor hook; here the same hooks on a timm VisionTransformer);
- gradient rollout: jacobgil/vit-explain `vit_grad_rollout.py` (`VITAttentionGradRollout`, `grad_rollout`) verbatim
  on a timm VisionTransformer;
- LeGrad: WalBouss/LeGrad `legrad/wrapper.py` (`compute_legrad_clip`, the hooks of `_activate_self_attention_hooks`)
  and `legrad/utils.py` (`hooked_resblock_forward`, the self-attention path of
  `hooked_torch_func_multi_head_attention_forward`, `min_max`) on an open_clip CLIP with a tiny vision tower.
"""
from __future__ import annotations

import math
import types
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import vitviz
from parity_refs import perturb
from vitviz.core.running.packed import packing_available
from vitviz.core.analyses.relevance import RelevanceError, class_relevance, legrad, legrad_pixels, pooling_query
from vitviz.errors import VitvizError

timm = pytest.importorskip("timm")
from timm.models.vision_transformer import VisionTransformer  # noqa: E402

ATOL = 1e-6
TINY = dict(img_size=32, patch_size=8, embed_dim=32, depth=3, num_heads=2, mlp_ratio=2.0, num_classes=5)


def timm_pair(seed: int = 0, **kw) -> tuple[VisionTransformer, object]:
    """A perturbed random timm ViT (eager attention) and the same weights loaded by vitviz."""
    torch.manual_seed(seed)
    model = perturb(VisionTransformer(**{**TINY, **kw}), std=0.2, seed=seed)
    for blk in model.blocks:
        blk.attn.fused_attn = False
    return model, vitviz.load(model, device="cpu", mean=(0.5,) * 3, std=(0.5,) * 3)


def x_for(seed: int = 1) -> torch.Tensor:
    return torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(seed))


# --------------------------------------------------------------- Transformer-MM-Explainability ViT notebook
def avg_heads(cam, grad):  # noqa: ANN001, ANN201 - the notebook's "rule 5"
    cam = cam.reshape(-1, cam.shape[-2], cam.shape[-1])
    grad = grad.reshape(-1, grad.shape[-2], grad.shape[-1])
    cam = grad * cam
    cam = cam.clamp(min=0).mean(dim=0)
    return cam


def apply_self_attention_rules(R_ss, cam_ss):  # noqa: ANN001, ANN201, N803 - the notebook's "rule 6"
    R_ss_addition = torch.matmul(cam_ss, R_ss)
    return R_ss_addition


def generate_relevance(model, input, index=None):  # noqa: ANN001, ANN201, A002 - the notebook's, without .cuda()
    """Returns the whole R (the notebook returns R[0, 1:]). ViT_new's `save_attention_map` and
    `attn.register_hook(save_attn_gradients)` are a forward hook on timm's attn_drop (identity in eval)."""
    maps, grads = {}, {}

    def hook(i):  # noqa: ANN001, ANN202
        def fwd(_m, _i, out):  # noqa: ANN001, ANN202
            maps[i] = out
            out.register_hook(lambda g: grads.__setitem__(i, g))
        return fwd

    handles = [blk.attn.attn_drop.register_forward_hook(hook(i)) for i, blk in enumerate(model.blocks)]
    try:
        output = model(input)
        if index is None:
            index = np.argmax(output.cpu().data.numpy(), axis=-1)
        one_hot = np.zeros((1, output.size()[-1]), dtype=np.float32)
        one_hot[0, index] = 1
        one_hot = torch.from_numpy(one_hot).requires_grad_(True)
        one_hot = torch.sum(one_hot * output)
        model.zero_grad()
        one_hot.backward(retain_graph=True)
        num_tokens = maps[0].shape[-1]
        R = torch.eye(num_tokens, num_tokens)  # noqa: N806
        for i in range(len(model.blocks)):
            grad = grads[i]
            cam = maps[i]
            cam = avg_heads(cam, grad)
            R += apply_self_attention_rules(R, cam)
    finally:
        for h in handles:
            h.remove()
    return R.detach(), [maps[i].detach() for i in range(len(maps))], [grads[i] for i in range(len(grads))]


# ------------------------------------------------------------------------------- vit-explain vit_grad_rollout.py
def grad_rollout(attentions, gradients, discard_ratio):  # noqa: ANN001, ANN201 - verbatim
    result = torch.eye(attentions[0].size(-1))
    with torch.no_grad():
        for attention, grad in zip(attentions, gradients):
            weights = grad
            attention_heads_fused = (attention*weights).mean(axis=1)
            attention_heads_fused[attention_heads_fused < 0] = 0

            # Drop the lowest attentions, but
            # don't drop the class token
            flat = attention_heads_fused.view(attention_heads_fused.size(0), -1)
            _, indices = flat.topk(int(flat.size(-1)*discard_ratio), -1, False)
            #indices = indices[indices != 0]
            flat[0, indices] = 0

            I = torch.eye(attention_heads_fused.size(-1))  # noqa: E741, N806
            a = (attention_heads_fused + 1.0*I)/2
            a = a / a.sum(dim=-1)
            result = torch.matmul(a, result)

    # Look at the total attention between the class token,
    # and the image patches
    mask = result[0, 0 , 1 :]
    # In case of 224x224 image, this brings us from 196 to 14
    width = int(mask.size(-1)**0.5)
    mask = mask.reshape(width, width).numpy()
    mask = mask / np.max(mask)
    return mask


class VITAttentionGradRollout:  # verbatim
    def __init__(self, model, attention_layer_name='attn_drop',  # noqa: ANN001
        discard_ratio=0.9):
        self.model = model
        self.discard_ratio = discard_ratio
        for name, module in self.model.named_modules():
            if attention_layer_name in name:
                module.register_forward_hook(self.get_attention)
                module.register_backward_hook(self.get_attention_gradient)

        self.attentions = []
        self.attention_gradients = []

    def get_attention(self, module, input, output):  # noqa: ANN001, A002
        self.attentions.append(output.cpu())

    def get_attention_gradient(self, module, grad_input, grad_output):  # noqa: ANN001
        self.attention_gradients.append(grad_input[0].cpu())

    def __call__(self, input_tensor, category_index):  # noqa: ANN001, ANN204
        self.model.zero_grad()
        output = self.model(input_tensor)
        category_mask = torch.zeros(output.size())
        category_mask[:, category_index] = 1
        loss = (output*category_mask).sum()
        loss.backward()

        return grad_rollout(self.attentions, self.attention_gradients,
            self.discard_ratio)


def vit_explain(model: VisionTransformer, x: torch.Tensor, index: int, discard_ratio: float) -> np.ndarray:
    with warnings.catch_warnings():  # torch deprecates the non-full backward hook the reference relies on
        warnings.simplefilter("ignore", FutureWarning)
        return VITAttentionGradRollout(model, discard_ratio=discard_ratio)(x, index)


# ------------------------------------------------------------------------------------------------ Chefer parity
@pytest.mark.parametrize("kw", [{}, {"reg_tokens": 2}], ids=["cls", "cls+2reg"])
@pytest.mark.parametrize("index", [None, 3])
def test_chefer_matches_notebook(kw: dict, index: int | None) -> None:
    model, vm = timm_pair(**kw)
    x = x_for()
    rel = class_relevance(vm, x, index)
    R, maps, grads = generate_relevance(model, x, index)  # noqa: N806
    p = vm.spec.num_prefix
    assert rel.query == "cls" and rel.chefer.shape == (4, 4)
    np.testing.assert_allclose(rel.chefer, R[0, p:].numpy().reshape(4, 4), atol=ATOL)  # notebook: R[0, 1:]
    np.testing.assert_allclose(rel.chefer_prefix, R[0, :p].numpy(), atol=ATOL)
    logits = model(x)[0].detach().numpy()
    assert rel.target == (int(logits.argmax()) if index is None else index)
    np.testing.assert_allclose(rel.score, logits[rel.target], atol=1e-5)
    # attention x gradient per layer and head: the CLS row of A ⊙ dA over the patches
    ref = np.stack([(m[0] * g[0])[:, 0, p:].numpy() for m, g in zip(maps, grads)]).reshape(3, 2, 4, 4)
    np.testing.assert_allclose(rel.attn_grad, ref, atol=ATOL)
    assert np.abs(rel.attn_grad).max() > 1e-3  # not trivially zero


def test_chefer_without_cls_uses_the_pooling_rows() -> None:
    """The references read row 0 (CLS); a mean-pooled model's output reads every patch, so its map is the mean of
    the patch rows of the same R."""
    model, vm = timm_pair(class_token=False, global_pool="avg")
    x = x_for()
    rel = class_relevance(vm, x, 2)
    R, _, _ = generate_relevance(model, x, 2)  # noqa: N806
    assert vm.spec.num_prefix == 0 and rel.query == "patch mean"
    np.testing.assert_allclose(rel.chefer, R.numpy().mean(axis=0).reshape(4, 4), atol=ATOL)


def test_pooling_query_weights() -> None:
    _, vm = timm_pair(reg_tokens=1)
    q, name = pooling_query(vm.spec)
    assert name == "cls" and q[0] == 1 and q.sum() == 1
    _, vm = timm_pair(class_token=False, global_pool="avg")
    q, name = pooling_query(vm.spec)
    assert name == "patch mean" and np.allclose(q, 1 / 16)


# ------------------------------------------------------------------------------------------ vit-explain parity
@pytest.mark.parametrize("discard", [0.9, 0.0, 0.5])
def test_grad_rollout_matches_vit_explain(discard: float) -> None:
    model, vm = timm_pair(seed=3)
    x = x_for(4)
    rel = class_relevance(vm, x, 1, discard_ratio=discard)
    np.testing.assert_allclose(rel.grad_rollout, vit_explain(model, x, 1, discard), atol=ATOL)
    assert rel.exact_reference and rel.grad_rollout.max() == pytest.approx(1.0)


def test_grad_rollout_fixed_variant() -> None:
    """exact_reference=False: each layer's own ds/dA, rows normalised, per-row discard of patch columns, raw."""
    model, vm = timm_pair(seed=3)
    x = x_for(4)
    fixed = class_relevance(vm, x, 1, discard_ratio=0.5, exact_reference=False)
    exact = class_relevance(vm, x, 1, discard_ratio=0.5)
    assert not np.allclose(fixed.grad_rollout / fixed.grad_rollout.max(), exact.grad_rollout, atol=1e-3)
    _, maps, grads = generate_relevance(model, x, 1)
    t, p = maps[0].shape[-1], 1
    k = int(np.floor(0.5 * (t - p)))
    v = np.eye(t)[0]
    for m, g in zip(reversed(maps), reversed(grads)):
        fused = np.maximum((m[0].double() * g[0].double()).mean(dim=0).numpy(), 0)  # (T, T)
        for row in fused:
            row[p + np.argsort(row[p:], kind="stable")[:k]] = 0
        a = (fused + np.eye(t)) / 2
        v = v @ (a / a.sum(axis=1, keepdims=True))
    np.testing.assert_allclose(fixed.grad_rollout, v[p:].reshape(4, 4), atol=ATOL)


# ------------------------------------------------------------------------------------------- LeGrad parity
def hooked_resblock_forward(self, q_x, k_x=None, v_x=None, attn_mask=None):  # noqa: ANN001, ANN201 - legrad/utils.py
    k_x = self.ln_1_kv(k_x) if hasattr(self, "ln_1_kv") and k_x is not None else None
    v_x = self.ln_1_kv(v_x) if hasattr(self, "ln_1_kv") and v_x is not None else None

    x = q_x + self.ls_1(self.attention(q_x=self.ln_1(q_x), k_x=k_x, v_x=v_x, attn_mask=attn_mask))
    # Hook for intermediate features post Attn
    self.feat_post_attn = x
    x = x + self.ls_2(self.mlp(self.ln_2(x)))
    # Hook for intermediate features post MLP
    self.feat_post_mlp = x
    return x


def hooked_torch_multi_head_attention_forward(self, query, key, value, key_padding_mask=None,  # noqa: ANN001, ANN201
                                              need_weights=True, attn_mask=None):
    assert self._qkv_same_embed_dim
    out, _attn_maps = hooked_torch_func_multi_head_attention_forward(
        query, key, value, self.embed_dim, self.num_heads,
        self.in_proj_weight, self.in_proj_bias,
        self.bias_k, self.bias_v, self.add_zero_attn,
        self.dropout, self.out_proj.weight, self.out_proj.bias,
        training=self.training,
        key_padding_mask=key_padding_mask, need_weights=True,
        attn_mask=attn_mask,
    )
    # Hook for attention maps
    self.attention_maps = _attn_maps
    return out, _attn_maps


def hooked_torch_func_multi_head_attention_forward(query, key, value, embed_dim_to_check, num_heads,  # noqa: ANN001, ANN201
                                                   in_proj_weight, in_proj_bias, bias_k, bias_v, add_zero_attn,
                                                   dropout_p, out_proj_weight, out_proj_bias, training=True,
                                                   key_padding_mask=None, need_weights=True, attn_mask=None):
    """LeGrad's copy of F.multi_head_attention_forward, reduced to the path a ViT block takes (self-attention; no
    masks, key/value biases or zero attention -- asserted)."""
    assert attn_mask is None and key_padding_mask is None and bias_k is None and bias_v is None and not add_zero_attn
    tgt_len, bsz, embed_dim = query.size()
    assert embed_dim == embed_dim_to_check
    head_dim = embed_dim // num_heads
    assert head_dim * num_heads == embed_dim, "embed_dim must be divisible by num_heads"
    scaling = float(head_dim) ** -0.5
    assert torch.equal(query, key) and torch.equal(key, value)
    # self-attention
    q, k, v = F.linear(query, in_proj_weight, in_proj_bias).chunk(3, dim=-1)
    q = q * scaling
    q = q.contiguous().view(tgt_len, bsz * num_heads, head_dim).transpose(0, 1)
    k = k.contiguous().view(-1, bsz * num_heads, head_dim).transpose(0, 1)
    v = v.contiguous().view(-1, bsz * num_heads, head_dim).transpose(0, 1)
    attn_output_weights = torch.bmm(q, k.transpose(1, 2))
    attn_output_weights = F.softmax(attn_output_weights, dim=-1)
    attn_output_weights = F.dropout(attn_output_weights, p=dropout_p, training=training)
    attn_output = torch.bmm(attn_output_weights, v)
    attn_output = attn_output.transpose(0, 1).contiguous().view(tgt_len, bsz, embed_dim)
    attn_output = F.linear(attn_output, out_proj_weight, out_proj_bias)
    return attn_output, attn_output_weights


def min_max(logits):  # noqa: ANN001, ANN201 - legrad/utils.py
    B, num_prompt = logits.shape[:2]  # noqa: N806
    logits_min = logits.reshape(B, num_prompt, -1).min(dim=-1, keepdim=True)[0].unsqueeze(-1)
    logits_max = logits.reshape(B, num_prompt, -1).max(dim=-1, keepdim=True)[0].unsqueeze(-1)
    logits = (logits - logits_min) / (logits_max - logits_min)
    return logits


class LeGradReference:
    """LeWrapper's CLIP path: `_activate_self_attention_hooks` and `compute_legrad_clip`.

    LeGrad pins open_clip <= 2.23, whose blocks run sequence-first (LND), which its hooks and `mean(dim=0)` assume;
    open_clip 3.x defaults to batch-first, so the tower is switched back to sequence-first here."""

    def __init__(self, model, layer_index=-2):  # noqa: ANN001
        self.model, self.visual = model, model.visual
        self.visual.transformer.batch_first = False
        for blk in self.visual.transformer.resblocks:
            blk.attn.batch_first = False
        self.patch_size = self.visual.patch_size[0]
        self.starting_depth = layer_index if layer_index >= 0 else len(
            self.visual.transformer.resblocks) + layer_index
        for name, param in self.model.named_parameters():
            param.requires_grad = False
            if name.startswith('visual.transformer.resblocks'):
                depth = int(name.split('visual.transformer.resblocks.')[-1].split('.')[0])
                if depth >= self.starting_depth:
                    param.requires_grad = True
        for layer in range(self.starting_depth, len(self.visual.transformer.resblocks)):
            blk = self.visual.transformer.resblocks[layer]
            blk.attn.forward = types.MethodType(hooked_torch_multi_head_attention_forward, blk.attn)
            blk.forward = types.MethodType(hooked_resblock_forward, blk)

    def compute_legrad_clip(self, text_embedding, image=None):  # noqa: ANN001, ANN201
        """Returns the reference's output and, in addition, the sum of its per-layer maps before upsampling."""
        num_prompts = text_embedding.shape[0]
        if image is not None:
            image = image.repeat(num_prompts, 1, 1, 1)
            _ = self.model.encode_image(image)

        blocks_list = list(dict(self.visual.transformer.resblocks.named_children()).values())

        image_features_list = []

        for layer in range(self.starting_depth, len(self.visual.transformer.resblocks)):
            intermediate_feat = self.visual.transformer.resblocks[layer].feat_post_mlp  # [num_patch, batch, dim]
            intermediate_feat = self.visual.ln_post(intermediate_feat.mean(dim=0)) @ self.visual.proj
            intermediate_feat = F.normalize(intermediate_feat, dim=-1)
            image_features_list.append(intermediate_feat)

        num_tokens = blocks_list[-1].feat_post_mlp.shape[0] - 1
        w = h = int(math.sqrt(num_tokens))

        # ----- Get explainability map
        accum_expl_map, grids = 0, 0
        for layer, (blk, img_feat) in enumerate(zip(blocks_list[self.starting_depth:], image_features_list)):
            self.visual.zero_grad()
            sim = text_embedding @ img_feat.transpose(-1, -2)  # [1, 1]
            one_hot = F.one_hot(torch.arange(0, num_prompts)).float().requires_grad_(True).to(text_embedding.device)
            one_hot = torch.sum(one_hot * sim)

            attn_map = blocks_list[self.starting_depth + layer].attn.attention_maps  # [b, num_heads, N, N]

            # -------- Get explainability map --------
            grad = torch.autograd.grad(one_hot, [attn_map], retain_graph=True, create_graph=True)[
                0]  # [batch_size * num_heads, N, N]
            grad = grad.reshape(num_prompts, -1, *grad.shape[-2:])  # rearrange '(b h) n m -> b h n m'
            grad = torch.clamp(grad, min=0.)

            image_relevance = grad.mean(dim=1).mean(dim=1)[:, 1:]  # average attn over [CLS] + patch tokens
            expl_map = image_relevance.reshape(1, num_prompts, w, h)  # rearrange 'b (w h) -> 1 b w h'
            grids = grids + expl_map
            expl_map = F.interpolate(expl_map, scale_factor=self.patch_size, mode='bilinear')  # [B, 1, H, W]
            accum_expl_map += expl_map

        # Min-Max Norm
        accum_expl_map = min_max(accum_expl_map)
        return accum_expl_map, grids


def clip_pair(seed: int = 0) -> tuple[object, object]:
    """A tiny open_clip CLIP (random, perturbed) and its vision tower loaded by vitviz as a reference ViT whose head
    is the projection (open_clip's conv1 has no bias; `no_ln_pre`, since the reference ViT has no ln_pre yet)."""
    open_clip = pytest.importorskip("open_clip")
    torch.manual_seed(seed)
    model = open_clip.CLIP(embed_dim=16, vision_cfg=dict(layers=3, width=32, head_width=16, patch_size=8,
                                                         image_size=32, no_ln_pre=True, mlp_ratio=2.0),
                           text_cfg=dict(context_length=8, vocab_size=64, width=32, heads=2, layers=1)).eval()
    perturb(model.visual, std=0.2, seed=seed)
    v = model.visual
    sd = {"patch_embed.proj.weight": v.conv1.weight, "cls_token": v.class_embedding.reshape(1, 1, -1),
          "pos_embed": v.positional_embedding[None], "norm.weight": v.ln_post.weight, "norm.bias": v.ln_post.bias,
          "head.weight": v.proj.t(), "head.bias": torch.zeros(v.proj.shape[1])}
    for i, blk in enumerate(v.transformer.resblocks):
        b = f"blocks.{i}."
        sd.update({b + "norm1.weight": blk.ln_1.weight, b + "norm1.bias": blk.ln_1.bias,
                   b + "attn.qkv.weight": blk.attn.in_proj_weight, b + "attn.qkv.bias": blk.attn.in_proj_bias,
                   b + "attn.proj.weight": blk.attn.out_proj.weight, b + "attn.proj.bias": blk.attn.out_proj.bias,
                   b + "norm2.weight": blk.ln_2.weight, b + "norm2.bias": blk.ln_2.bias,
                   b + "mlp.fc1.weight": blk.mlp.c_fc.weight, b + "mlp.fc1.bias": blk.mlp.c_fc.bias,
                   b + "mlp.fc2.weight": blk.mlp.c_proj.weight, b + "mlp.fc2.bias": blk.mlp.c_proj.bias})
    sd = {k: t.detach().clone() for k, t in sd.items()}
    vm = vitviz.load(sd, heads=2, eps=1e-5, mean=(0.5,) * 3, std=(0.5,) * 3, device="cpu")
    return model, vm


@pytest.mark.parametrize("layer_index", [-2, 0])
def test_legrad_matches_reference_on_open_clip(layer_index: int) -> None:
    model, vm = clip_pair()
    x = x_for()
    with torch.no_grad():
        np.testing.assert_allclose(vm.net(x).numpy(), model.encode_image(x).numpy(), atol=1e-5)  # same tower
    text = F.normalize(torch.randn(1, 16, generator=torch.Generator().manual_seed(2)), dim=-1)  # fixed "text"
    pixels, grids = LeGradReference(model, layer_index).compute_legrad_clip(text, x)
    ours = legrad(vm, x, text[0].numpy(), layer_index=layer_index)
    assert ours.layers == ((1, 2) if layer_index == -2 else (0, 1, 2)) and ours.target is None
    np.testing.assert_allclose(ours.map, grids[0, 0].detach().numpy(), atol=ATOL)
    assert ours.map.max() > 1e-3
    np.testing.assert_allclose(legrad_pixels(ours.map, 8), pixels[0, 0].detach().numpy(), atol=ATOL)


def test_legrad_for_a_class_and_errors() -> None:
    _, vm = timm_pair()
    x = x_for()
    leg = legrad(vm, x, 4, layer_index=0)
    assert leg.map.shape == (4, 4) and leg.per_layer.shape == (3, 4, 4) and leg.target == 4
    np.testing.assert_allclose(leg.map, leg.per_layer.sum(axis=0), atol=1e-6)
    assert (leg.map >= 0).all()
    with pytest.raises(RelevanceError, match="layer_index 3 out of range"):
        legrad(vm, x, 0, layer_index=3)
    with pytest.raises(RelevanceError, match="class index 5 out of range: the model has 5 classes"):
        legrad(vm, x, 5)


# ------------------------------------------------------------------------------- the plain path stays alone
def test_relevance_leaves_the_model_and_capture_alone() -> None:
    _, vm = timm_pair()
    x = x_for()
    before = vm.run(x)
    grads_before = [p.requires_grad for p in vm.net.parameters()]
    calls: list[str] = []
    if packing_available():
        original = torch.ops.mkldnn._linear_pointwise
        with pytest.MonkeyPatch.context() as m:
            m.setattr(torch.ops.mkldnn, "_linear_pointwise", lambda *a: calls.append(a[3]) or original(*a))
            class_relevance(vm, x)
            legrad(vm, x)
            assert not calls, "the gradient path must run plain F.linear, not the prepacked weights"
            vm.run(x)
            assert calls, "the plain capture still runs prepacked"
    else:
        class_relevance(vm, x)
    after = vm.run(x)
    np.testing.assert_array_equal(before.attentions, after.attentions)
    np.testing.assert_array_equal(before.logits, after.logits)
    assert [p.requires_grad for p in vm.net.parameters()] == grads_before
    assert not vm.net.training and all(b.attn.attn_probe.target is None for b in vm.net.blocks)
    assert all(p.grad is None for p in vm.net.parameters())


def test_relevance_at_another_size_after_a_capture_there() -> None:
    """The resampled position embedding cached by an inference-mode run is usable inside autograd."""
    _, vm = timm_pair()
    vm.run(torch.rand(1, 3, 48, 40))
    rel = class_relevance(vm, torch.rand(1, 3, 48, 40))
    assert rel.chefer.shape == (6, 5) and rel.attn_grad.shape == (3, 2, 6, 5) and rel.spec.grid == (6, 5)


def test_relevance_inside_inference_mode() -> None:
    """A caller's no_grad/inference_mode (a worker's habit) does not switch the gradient path off."""
    _, vm = timm_pair()
    x = x_for()
    plain = class_relevance(vm, x)
    with torch.inference_mode():
        inside = class_relevance(vm, x)
        leg = legrad(vm, x)
    with torch.no_grad():
        np.testing.assert_array_equal(class_relevance(vm, x).chefer, plain.chefer)
    np.testing.assert_array_equal(inside.chefer, plain.chefer)
    np.testing.assert_array_equal(leg.map, legrad(vm, x).map)


def test_embedding_target_and_headless_model() -> None:
    _, vm = timm_pair(num_classes=0)
    x = x_for()
    with pytest.raises(RelevanceError, match=r"no classifier .* pass a target embedding of shape \(32,\)"):
        class_relevance(vm, x)
    e = np.random.default_rng(0).standard_normal(32)
    e /= np.linalg.norm(e)
    rel = class_relevance(vm, x, e)
    out = vm.run(x).features
    assert rel.target is None and rel.score == pytest.approx(float(out @ e / np.linalg.norm(out)), abs=1e-5)
    with pytest.raises(RelevanceError, match=r"target embedding of shape \(16,\); expected \(32,\)"):
        class_relevance(vm, x, e[:16])


def test_errors_say_what_was_expected() -> None:
    _, vm = timm_pair()
    x = x_for()
    with pytest.raises(RelevanceError, match=r"class index 7 out of range: the model has 5 classes \(0..4\)"):
        class_relevance(vm, x, 7)
    with pytest.raises(RelevanceError, match="class index -1 out of range"):
        class_relevance(vm, x, -1)
    with pytest.raises(RelevanceError, match="expected a class index or an embedding"):
        class_relevance(vm, x, True)
    with pytest.raises(RelevanceError, match=r"discard_ratio must lie in \[0, 1\), found 1.0"):
        class_relevance(vm, x, discard_ratio=1.0)
    with pytest.raises(VitvizError):  # one image at a time
        class_relevance(vm, torch.rand(2, 3, 32, 32))


# ------------------------------------------------------------------------------- faithfulness on the demo model
def test_relevance_is_faithful_on_the_demo_model() -> None:
    """On 24 fresh demo images, for the true class: Chefer relevance puts >= 3x the box's area share inside the
    target box, more than last-layer CLS attention; deleting its most relevant patches first lowers the true-class
    probability faster than random order (smaller deletion-curve area). `python -m vitviz.demo.faithfulness` prints
    the figures over more images."""
    from vitviz.demo import demo_checkpoint
    from vitviz.demo.faithfulness import measure

    model = vitviz.load(demo_checkpoint(), device="cpu")
    f = measure(model, seed=7, count=24, random_orders=2)
    assert f.chefer_ratio >= 3.0 and f.chefer_ratio > f.cls_ratio, f
    assert f.deletion_relevance < 0.75 * f.deletion_random, f
