"""The one reference ViT every checkpoint is converted into.

Key names follow timm (`patch_embed.proj`, `cls_token`, `blocks.N.attn.qkv`, ...). Attention is always explicit,
`softmax((q * scale) @ k^T + bias)` in float32, and passes through `attn_probe`, an identity module right after the
softmax that `vitviz.core.running.capture` hooks; each head's output passes through `head_probe`, the identity
that `vitviz.core.running.interventions` hooks to ablate heads. Every switch that changes the numerics is a field
of `ModelSpec`: 2-D RoPE on the patch tokens' q and k (`rope*`), BEiT's relative position bias and timm's relative
position MLP (`rel_pos*`), a MAP pooling head (`pooling='map'`, whose softmax passes through its own `pool_probe`),
CLIP's `norm_pre` and projection head, RMSNorm (`norm_kind`), a padded patch projection (`patch_pad`).
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from vitviz.core.options import ACTIVATIONS, BLOCK_NORMS
from vitviz.core.running.packed import Linear
from vitviz.core.posembed import (
    rel_log_coords, rel_pos_index, resample_grid, resize_rel_pos_table, rope_angles, rope_coords, rope_sincos, rotate,
    sincos_1d, sincos_2d,
)
from vitviz.core.spec import ModelSpec

Rope = "tuple[torch.Tensor, torch.Tensor] | None"  # one layer's (sin, cos), (N, hd) or (H, N, hd)
Biases = "tuple[torch.Tensor, ...]"               # additive (1, H, T, T) biases, in the order they are added


class QuickGELU(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(1.702 * x)


def make_act(kind: str) -> nn.Module:
    """The activation named by `ModelSpec.mlp_kind` / `pre_logits_act`."""
    if kind == "gelu":
        return nn.GELU()
    if kind == "gelu_tanh":
        return nn.GELU(approximate="tanh")
    if kind == "quick_gelu":
        return QuickGELU()
    if kind == "relu":
        return nn.ReLU()
    if kind == "silu":
        return nn.SiLU()
    if kind == "tanh":
        return nn.Tanh()
    raise ValueError(f"unknown activation {kind!r}; expected one of {', '.join(ACTIVATIONS)}")


def make_norm(spec: ModelSpec, dim: int, eps: float) -> nn.Module:
    """A norm over the embed dim, of `spec.norm_kind`: LayerNorm, or RMSNorm (weight only, no mean removed: timm
    `RmsNorm`, AIMv2). The blocks' norm1 / norm2, the patch embedding's, norm_pre and the final norms; the sub-norms
    (q/k-norm, EVA-02's sub-LNs, the MAP head's) stay LayerNorms."""
    if spec.norm_kind == "rms":
        return nn.RMSNorm(dim, eps=eps)
    if spec.norm_kind != "layer":
        raise ValueError(f"norm_kind {spec.norm_kind!r}; expected 'layer' or 'rms'")
    return nn.LayerNorm(dim, eps=eps)


class AttentionProbe(nn.Identity):
    """Identity placed right after the softmax: the hook point for attention capture.

    `target`, when a capture sets it, is a float32 tensor of the softmax's shape on its device: the scores and then
    the softmax (in place) are written straight into it (the capture's own array): no copy, no layer-sized temporary.
    """

    def __init__(self) -> None:
        super().__init__()
        self.target: torch.Tensor | None = None


class HeadProbe(nn.Identity):
    """Identity on each head's output (B, H, T, hd), after attention @ values and before the heads are joined and
    projected: the hook point of head ablations (`vitviz.core.running.interventions`). Returns its input itself, so
    a run without hooks on it is the run without it, bit for bit."""


class PoolProbe(nn.Identity):
    """Identity right after the MAP pooling head's softmax (B, H, 1, N): its hook point, apart from the blocks'
    `AttentionProbe`s (it is not a layer of the (L, H, T, T) stack)."""


class LayerScale(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.gamma = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma


class RelPosMlp(nn.Module):
    """timm's log-coordinate relative position MLP (`RelPosMlp`, 'cr' mode: `vit_relpos_*`, `vit_srelpos_*`): the
    bias of every patch pair is mlp(log-spaced offset) per head, computed for the grid of each run (as timm's
    `set_window_size` does); prefix tokens get a zero bias. Keys `mlp.fc1`, `mlp.fc2` (2 -> hidden -> heads, ReLU)."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.num_heads, self.num_prefix = spec.num_heads, spec.num_prefix
        self.mlp = nn.Module()
        self.mlp.fc1, self.mlp.fc2 = nn.Linear(2, spec.rel_pos_mlp), nn.Linear(spec.rel_pos_mlp, spec.num_heads)
        self._cache: dict[tuple[Any, ...], tuple[torch.Tensor, torch.Tensor]] = {}

    def bias(self, grid: tuple[int, int]) -> torch.Tensor:
        """The additive bias for `grid`: (1, H, T, T) float32, zeros on the prefix tokens' rows and columns."""
        w = self.mlp.fc1.weight
        key = (int(grid[0]), int(grid[1]), w.device, w.dtype)
        if key not in self._cache:
            self._cache[key] = (rel_log_coords(grid).to(w.device, w.dtype),
                                rel_pos_index(grid)[1:, 1:].reshape(-1).to(w.device))  # no CLS entries
        coords, index = self._cache[key]
        table = self.mlp.fc2(F.relu(self.mlp.fc1(coords)))  # (2gh-1, 2gw-1, H)
        n = int(grid[0]) * int(grid[1])
        bias = table.view(-1, self.num_heads)[index].view(n, n, self.num_heads).permute(2, 0, 1)  # (H, N, N)
        if self.num_prefix:
            bias = F.pad(bias, [self.num_prefix, 0, self.num_prefix, 0])  # (H, T, T)
        return bias.unsqueeze(0).float()


class Attention(nn.Module):
    """Multi-head self-attention with explicit, capturable probabilities.

    q, k and v are `attn_width` = heads x head_dim wide, which may differ from the embed dim (vit-pytorch's
    `dim_head`); the scale is `attn_scale` or head_dim ** -0.5; the output projection may be absent. RoPE, when
    the model has it, turns the patch tokens' q and k after the qk-norm (the prefix tokens are left as they are);
    additive biases (BEiT's relative position bias) join the scores before the softmax.
    """

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        d, a, self.num_heads = spec.embed_dim, spec.attn_width, spec.num_heads
        if a % self.num_heads:
            raise ValueError(f"attention width {a} is not divisible by {self.num_heads} heads")
        if not spec.attn_proj and a != d:
            raise ValueError(f"attention width {a} differs from the embed dim {d}, so it needs an output projection")
        self.head_dim, self.width = a // self.num_heads, a
        self.scale = spec.attn_scale or self.head_dim ** -0.5
        self.num_prefix, self.rope_half = spec.num_prefix, spec.rope_half
        self.qkv = Linear(d, 3 * a, bias=spec.qkv_bias)
        norm = (lambda: nn.LayerNorm(self.head_dim, eps=spec.eps)) if spec.qk_norm else nn.Identity
        self.q_norm, self.k_norm = norm(), norm()
        if spec.rel_pos == "layer" and spec.rel_pos_mlp:  # timm's log-coordinate MLP per block
            self.rel_pos = RelPosMlp(spec)
        elif spec.rel_pos == "layer":  # ((2gh-1)(2gw-1) + 3, H), gathered by ReferenceViT for the grid of a run
            gh, gw = spec.pos_grid
            self.relative_position_bias_table = nn.Parameter(torch.zeros((2 * gh - 1) * (2 * gw - 1) + 3,
                                                                         self.num_heads))
        self.attn_probe = AttentionProbe()
        self.head_probe = HeadProbe()
        self.norm = nn.LayerNorm(a, eps=spec.eps) if spec.attn_norm else nn.Identity()
        self.proj = Linear(a, d, bias=spec.proj_bias) if spec.attn_proj else nn.Identity()

    def _turn(self, t: torch.Tensor, rope: Rope) -> torch.Tensor:
        """RoPE on the patch tokens of t (B, H, T, hd); prefix tokens untouched."""
        if rope is None:
            return t
        p = self.num_prefix
        return torch.cat([t[:, :, :p], rotate(t[:, :, p:], rope[0], rope[1], self.rope_half)], dim=2)

    def _probs(self, q: torch.Tensor, k: torch.Tensor, rope: Rope = None, biases: Biases = ()) -> torch.Tensor:
        """softmax((q * scale) @ k^T + biases) through the probe: (B, H, T, hd) x 2 -> (B, H, T, T) float32."""
        q, k = self.q_norm(q), self.k_norm(k)
        if rope is not None:
            q, k = self._turn(q, rope).type_as(q), self._turn(k, rope).type_as(k)
        out = self.attn_probe.target
        if out is not None and out.shape == (*q.shape[:-1], k.shape[-2]) and out.device == q.device \
                and q.dtype == out.dtype:   # the scores, then the softmax in place, in the capture's own array
            attn = torch.matmul(q * self.scale, k.transpose(-2, -1), out=out)
            for bias in biases:
                attn.add_(bias)
            return self.attn_probe(torch.softmax(attn, dim=-1, out=attn))
        attn = ((q * self.scale) @ k.transpose(-2, -1)).float()
        for bias in biases:
            attn = attn + bias
        return self.attn_probe(attn.softmax(dim=-1))

    def forward(self, x: torch.Tensor, rope: Rope = None, biases: Biases = ()) -> torch.Tensor:
        b, t, _ = x.shape
        qkv = self.qkv(x).reshape(b, t, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)  # (3, B, H, T, hd)
        q, k, v = qkv.unbind(0)
        attn = self._probs(q, k, rope, biases).to(v.dtype)
        x = self.head_probe(attn @ v).transpose(1, 2).reshape(b, t, self.width)  # (B, H, T, hd) -> (B, T, A)
        return self.proj(self.norm(x))

    def probabilities(self, x: torch.Tensor, rope: Rope = None, biases: Biases = ()) -> torch.Tensor:
        """Only the attention probabilities (B, H, T, T): q and k are computed, v and the projection are not."""
        b, t, _ = x.shape
        a = self.width
        w, bias = self.qkv.weight[: 2 * a], None if self.qkv.bias is None else self.qkv.bias[: 2 * a]
        q, k = F.linear(x, w, bias).reshape(b, t, 2, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        return self._probs(q, k, rope, biases)


class Mlp(nn.Module):
    """fc1 -> act (or SwiGLU: act(first half) * second half) -> [LayerNorm, EVA-02 `scale_mlp`] -> fc2."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.fc1 = Linear(spec.embed_dim, spec.mlp_hidden, bias=spec.mlp_bias)
        self.act = make_act(spec.mlp_kind) if spec.mlp_kind != "swiglu" else nn.SiLU()
        self.swiglu, self.kind = spec.mlp_kind == "swiglu", spec.mlp_kind
        hidden = spec.mlp_hidden // 2 if self.swiglu else spec.mlp_hidden
        self.norm = nn.LayerNorm(hidden, eps=spec.eps) if spec.mlp_norm else nn.Identity()
        self.fc2 = Linear(hidden, spec.embed_dim, bias=spec.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.swiglu:
            return self.fc2(self.norm(self.fc1.forward_gelu(x, self.kind, self.act)))  # GELU fused when packed
        x1, x2 = self.fc1(x).chunk(2, dim=-1)  # DINOv2 / timm SwiGLUPacked / GluMlp order: act(x1) * x2
        return self.fc2(self.norm(self.act(x1) * x2))


class Block(nn.Module):
    """Transformer block. Pre-norm (`block_norm='pre'`, ViT): x + ls1(attn(norm1(x))), then
    x + ls2(mlp(norm2(x))). Post-norm ('post', nn.TransformerEncoderLayer's default): norm1(x + attn(x)), then
    norm2(x + mlp(x)). Res-post-norm ('res_post', timm ResPostBlock, Eva `use_post_norm`, Swin v2): each
    sub-layer's output normed inside the residual, x + ls1(norm1(attn(x))), then x + ls2(norm2(mlp(x))).
    `mlp_hidden=0`: a block without an MLP (attention only)."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        d = spec.embed_dim
        if spec.block_norm not in BLOCK_NORMS:
            raise ValueError(f"block_norm {spec.block_norm!r}; expected one of {', '.join(BLOCK_NORMS)}")
        self.post = spec.block_norm == "post"
        self.res_post = spec.block_norm == "res_post"
        self.norm1 = make_norm(spec, d, spec.eps)
        self.attn = Attention(spec)
        self.ls1 = LayerScale(d) if spec.layer_scale else nn.Identity()
        self.has_mlp = spec.mlp_hidden > 0
        self.norm2 = make_norm(spec, d, spec.eps) if self.has_mlp else nn.Identity()
        self.mlp = Mlp(spec) if self.has_mlp else nn.Identity()
        self.ls2 = LayerScale(d) if spec.layer_scale and self.has_mlp else nn.Identity()

    def attn_input(self, x: torch.Tensor) -> torch.Tensor:
        """What the attention of this block sees: norm1(x) pre-norm, x itself post-norm and res-post-norm."""
        return x if self.post or self.res_post else self.norm1(x)

    def forward(self, x: torch.Tensor, rope: Rope = None, biases: Biases = ()) -> torch.Tensor:
        if self.res_post:
            x = x + self.ls1(self.norm1(self.attn(x, rope, biases)))
            return x + self.ls2(self.norm2(self.mlp(x))) if self.has_mlp else x
        if self.post:
            x = self.norm1(x + self.ls1(self.attn(x, rope, biases)))
            return self.norm2(x + self.ls2(self.mlp(x))) if self.has_mlp else x
        x = x + self.ls1(self.attn(self.norm1(x), rope, biases))
        return x + self.ls2(self.mlp(self.norm2(x))) if self.has_mlp else x


class AttentionPool(nn.Module):
    """A MAP head (timm `AttentionPoolLatent`, big_vision `MAPHead`, transformers' SigLIP head): one learned latent
    query attends over the tokens, softmax(q_latent · K^T / sqrt(hd)) per head through `pool_probe`, then
    proj -> x + mlp(norm(x)). Its keys are timm's: `attn_pool.{latent, q, kv, proj, norm, mlp.fc1, mlp.fc2}`."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        d = spec.embed_dim
        self.num_heads = spec.pool_heads or spec.num_heads
        if d % self.num_heads:
            raise ValueError(f"embed dim {d} is not divisible by the pooling head's {self.num_heads} heads")
        self.head_dim = d // self.num_heads
        self.scale = self.head_dim ** -0.5
        self.latent = nn.Parameter(torch.zeros(1, 1, d))
        self.q = Linear(d, d)
        self.kv = Linear(d, 2 * d)
        self.pool_probe = PoolProbe()
        self.proj = Linear(d, d)
        self.norm = nn.LayerNorm(d, eps=spec.eps)
        self.mlp = nn.Module()
        self.mlp.fc1, self.mlp.fc2 = Linear(d, spec.pool_mlp), Linear(spec.pool_mlp, d)
        self.kind = spec.pool_act or spec.mlp_kind
        self.act = make_act(self.kind)

    def probabilities(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The latent query's attention (B, H, 1, N) float32 (through the probe) and the values (B, H, N, hd)."""
        b, n, _ = x.shape
        q = self.q(self.latent.expand(b, -1, -1)).reshape(b, 1, self.num_heads, self.head_dim).transpose(1, 2)
        kv = self.kv(x).reshape(b, n, 2, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)  # (2, B, H, N, hd)
        k, v = kv.unbind(0)
        attn = ((q * self.scale) @ k.transpose(-2, -1)).float().softmax(dim=-1)  # (B, H, 1, N)
        return self.pool_probe(attn), v

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, N, D) tokens -> (B, D) pooled."""
        b = x.shape[0]
        attn, v = self.probabilities(x)
        x = (attn.to(v.dtype) @ v).transpose(1, 2).reshape(b, 1, -1)  # (B, H, 1, hd) -> (B, 1, D)
        x = self.proj(x)
        x = x + self.mlp.fc2(self.mlp.fc1.forward_gelu(self.norm(x), self.kind, self.act))
        return x[:, 0]


class PreLogits(nn.Module):
    """The hidden layer of a two-layer head: Dense + Tanh (old timm / JAX in21k), or Dense + GELU/ReLU (the first
    vit-pytorch `mlp_head`, hand-written `Linear -> act -> Linear` heads)."""

    def __init__(self, dim: int, width: int, act: str = "tanh") -> None:
        super().__init__()
        self.fc = Linear(dim, width)
        self.act = make_act(act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.fc(x))


class PatchEmbed(nn.Module):
    """Image -> patch tokens. A conv with kernel = stride = patch (`proj`; zero-padded by `patch_pad` px for
    ViTPose), optionally with a LayerNorm over each flattened patch before it (`norm_in`, vit-pytorch's dual
    patchnorm; its weights in the conv's (c, p1, p2) order) and one after it (`norm`)."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        d, p, c = spec.embed_dim, spec.patch_size, spec.in_chans
        self.patch, self.pad = p, spec.patch_pad
        if self.pad and (2 * self.pad >= p or spec.patch_norm_in):
            raise ValueError(f"a patch projection padded by {self.pad} px needs 2 x padding < patch {p} and no "
                             "norm over the flattened patches")
        self.norm_in = nn.LayerNorm(c * p * p, eps=spec.eps) if spec.patch_norm_in else None
        self.proj = nn.Conv2d(c, d, p, p, padding=self.pad, bias=spec.patch_bias)
        self.norm = make_norm(spec, d, spec.eps) if spec.patch_norm else nn.Identity()

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        """(B, C, H, W) -> (B, N, D) tokens and the grid (gh, gw)."""
        p = self.patch
        grid = (x.shape[-2] // p, x.shape[-1] // p)
        if self.pad:  # whole patches only, so the padded conv gives the same grid (2 * pad < p)
            x = x[..., : grid[0] * p, : grid[1] * p]
        if self.norm_in is None:
            x = self.proj(x).flatten(2).transpose(1, 2)  # (B, D, gh, gw) -> (B, N, D)
        else:
            x = F.unfold(x, p, stride=p).transpose(1, 2)  # (B, C*P*P, N) -> (B, N, C*P*P), pixels in (c, p1, p2)
            x = F.linear(self.norm_in(x), self.proj.weight.flatten(1), self.proj.bias)  # (B, N, D)
        return self.norm(x), grid


class RotaryEmbedding(nn.Module):
    """The sin/cos tables of 2-D RoPE for a patch grid (`spec.rope`), cached per grid.

    'mixed' keeps the learned frequencies (2, L, H, hd/2) as `freqs` (timm's key `rope.freqs`); a file that stores
    DINOv3's periods keeps them as `periods`; otherwise nothing is stored and the tables are computed.
    """

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.spec = spec
        hd = spec.head_dim
        if hd % 4:
            raise ValueError(f"RoPE needs a head dim divisible by 4, got {hd}")
        self.freqs = nn.Parameter(torch.zeros(2, spec.depth, spec.num_heads, hd // 2)) if spec.rope == "mixed" \
            else None
        if spec.rope_periods:
            self.register_buffer("periods", torch.ones(hd // 4))
        else:
            self.periods = None
        self._cache: dict[tuple[int, int, bool], tuple[torch.Tensor, torch.Tensor]] = {}

    def tables(self, grid: tuple[int, int], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(sin, cos) for `grid`: (N, hd) each, or (L, H, N, hd) for 'mixed'."""
        key = (int(grid[0]), int(grid[1]), torch.is_inference_mode_enabled())
        hit = self._cache.get(key)
        if hit is None or hit[0].device != device:
            s = self.spec
            coords = rope_coords(s.rope, key[:2], s.rope_xy, s.rope_offset, s.rope_ref_grid)
            freqs = None if self.freqs is None else self.freqs.detach().cpu()
            periods = None if self.periods is None else self.periods.detach().cpu()
            angles = rope_angles(s.rope, coords, s.head_dim, s.rope_theta, freqs, periods)
            hit = tuple(t.to(device) for t in rope_sincos(angles, s.rope_half))
            self._cache[key] = hit
        return hit

    def layer(self, tables: tuple[torch.Tensor, torch.Tensor], index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One layer's (sin, cos): the same tables for every layer, except 'mixed'."""
        if self.freqs is None:
            return tables
        return tables[0][index], tables[1][index]  # (H, N, hd)


class ReferenceViT(nn.Module):
    """A Vision Transformer that can express every supported checkpoint family exactly."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.spec = spec
        d = spec.embed_dim
        self.patch_embed = PatchEmbed(spec)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, d)) if spec.cls_token else None
        self.dist_token = nn.Parameter(torch.zeros(1, 1, d)) if spec.dist_token else None
        self.reg_token = nn.Parameter(torch.zeros(1, spec.reg_tokens, d)) if spec.reg_tokens else None
        n_pos = spec.pos_prefix + spec.pos_grid[0] * spec.pos_grid[1]
        if spec.pos_embed and spec.pos_kind == "sincos2d":  # computed, so a buffer that is not in the state dict
            self.register_buffer("pos_embed", sincos_2d(spec.pos_grid, d), persistent=False)
        elif spec.pos_embed and spec.pos_kind == "sincos1d":  # over the whole sequence, prefix rows first
            self.register_buffer("pos_embed", sincos_1d(n_pos, d), persistent=False)
        elif spec.pos_embed and spec.pos_kind == "learned":
            self.pos_embed = nn.Parameter(torch.zeros(1, n_pos, d))
        elif spec.pos_embed:
            raise ValueError(f"pos_kind {spec.pos_kind!r}; expected 'learned', 'sincos1d' or 'sincos2d'")
        else:
            self.pos_embed = None
        if spec.rel_pos and not spec.rel_pos_mlp and spec.num_prefix != 1:
            raise ValueError(f"a relative position bias needs exactly one CLS token, found prefix {spec.prefix_names}")
        if spec.rel_pos == "shared" and spec.rel_pos_mlp:
            self.shared_rel_pos = RelPosMlp(spec)
        elif spec.rel_pos == "shared":
            gh, gw = spec.pos_grid
            self.rel_pos_bias = nn.Module()
            self.rel_pos_bias.relative_position_bias_table = nn.Parameter(
                torch.zeros((2 * gh - 1) * (2 * gw - 1) + 3, spec.num_heads))
        self.rope = RotaryEmbedding(spec) if spec.rope else None
        self.norm_pre = make_norm(spec, d, spec.eps) if spec.norm_pre else nn.Identity()
        self.blocks = nn.ModuleList(Block(spec) for _ in range(spec.depth))
        final_eps = spec.eps_final or spec.eps   # the final norms may use another eps than the blocks' (Chefer's ViT)
        self.norm = make_norm(spec, d, final_eps) if spec.final_norm else nn.Identity()
        self.norm_extra = make_norm(spec, d, final_eps) if spec.norm_extra else nn.Identity()
        self.attn_pool = AttentionPool(spec) if spec.pooling == "map" else None
        self.fc_norm = make_norm(spec, d, final_eps) if spec.fc_norm else nn.Identity()
        width = d * 2 if spec.pooling == "cls_avg" else d
        self.pre_logits = PreLogits(width, spec.pre_logits, spec.pre_logits_act) if spec.pre_logits else nn.Identity()
        width = spec.pre_logits or width
        out = spec.num_classes or spec.embed_out
        self.head = Linear(width, out, bias=spec.head_bias) if out else nn.Identity()
        self.head_dist = Linear(d, spec.num_classes) if spec.head_dist else None
        self._pos_cache: dict[tuple[int, int], torch.Tensor] = {}
        self._rel_cache: dict[tuple[Any, ...], torch.Tensor] = {}

    def grid_pos_embed(self, grid: tuple[int, int]) -> torch.Tensor:
        """The grid part of the position embedding resampled to `grid` with the family's recipe: (1, N, D)."""
        assert self.pos_embed is not None
        stored = self.pos_embed[:, self.spec.pos_prefix:]
        if tuple(grid) == tuple(self.spec.pos_grid):
            return stored
        key = (int(grid[0]), int(grid[1]))
        if key not in self._pos_cache:
            if self.spec.pos_kind == "sincos2d":  # computed for the grid, as SimpleViT computes it
                pos = sincos_2d(key, self.spec.embed_dim).to(stored.device, stored.dtype)
            elif self.spec.pos_kind == "sincos1d":  # the rows after the prefix of a longer (or shorter) sequence
                k = self.spec.pos_prefix
                pos = sincos_1d(k + key[0] * key[1], self.spec.embed_dim)[:, k:].to(stored.device, stored.dtype)
            else:
                pos = resample_grid(stored, self.spec.pos_grid, key, self.spec.pos_interp)
            self._pos_cache[key] = pos
        return self._pos_cache[key]

    def _apply(self, fn, recurse=True):  # noqa: ANN001 - drop resampled caches (and packed weights) when moving
        self._pos_cache, self._rel_cache = {}, {}
        if self.rope is not None:
            self.rope._cache = {}
        for m in self.modules():
            if isinstance(m, Linear):
                m._packed = None
        return super()._apply(fn, recurse)

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) image -> (B, T, D) tokens in order [cls, dist, reg..., patches] (after `norm_pre`)."""
        x, grid = self.patch_embed(x)  # (B, C, H, W) -> (B, N, D)
        b = x.shape[0]
        parts = [t.expand(b, -1, -1) for t in (self.cls_token, self.dist_token, self.reg_token) if t is not None]
        prefix = torch.cat(parts, dim=1) if parts else x[:, :0]  # (B, P, D)
        k = self.spec.pos_prefix
        x = torch.cat([prefix[:, :k], x], dim=1)  # tokens the position embedding covers
        if self.pos_embed is not None:
            pos = self.grid_pos_embed(grid)
            x = x + (torch.cat([self.pos_embed[:, :k], pos], dim=1) if k else pos)
        if prefix.shape[1] > k:  # prefix tokens without position embedding go right after the covered ones
            x = torch.cat([x[:, :k], prefix[:, k:], x[:, k:]], dim=1)
        return self.norm_pre(x)

    def _rel_bias(self, table: torch.Tensor, grid: tuple[int, int], name: str) -> torch.Tensor:
        """A relative position bias table gathered for `grid`: (1, H, T, T) float32 (table resampled with the
        family's recipe when the grid is not the stored one)."""
        key = (name, int(grid[0]), int(grid[1]), torch.is_inference_mode_enabled())
        if tuple(grid) != tuple(self.spec.pos_grid):
            if key not in self._rel_cache:
                with torch.no_grad():
                    self._rel_cache[key] = resize_rel_pos_table(table.detach(), self.spec.pos_grid, grid,
                                                                self.spec.rel_pos_interp)
            table = self._rel_cache[key]
        ikey = ("index", int(grid[0]), int(grid[1]), table.device)
        if ikey not in self._rel_cache:
            self._rel_cache[ikey] = rel_pos_index(grid).view(-1).to(table.device)
        t = grid[0] * grid[1] + 1
        bias = table[self._rel_cache[ikey]].view(t, t, -1)  # (T*T, H) -> (T, T, H)
        return bias.permute(2, 0, 1).unsqueeze(0).float()  # (1, H, T, T)

    def positions(self, x: torch.Tensor) -> tuple[torch.Tensor, "RunPositions"]:
        """(B, C, H, W) image -> tokens (B, T, D) and what each block needs for that grid (RoPE tables, shared
        relative position bias)."""
        p = self.spec.patch_size
        grid = (x.shape[-2] // p, x.shape[-1] // p)
        tokens = self.embed(x)
        tables = self.rope.tables(grid, tokens.device) if self.rope is not None else None
        shared = None
        if self.spec.rel_pos == "shared":
            shared = self.shared_rel_pos.bias(grid) if self.spec.rel_pos_mlp else \
                self._rel_bias(self.rel_pos_bias.relative_position_bias_table, grid, "shared")
        return tokens, RunPositions(self, grid, tables, shared)

    def pool(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, D) normed tokens -> (B, D') pooled features."""
        pooling, n_prefix = self.spec.pooling, self.spec.num_prefix
        if pooling == "avg":
            return x[:, n_prefix:].mean(dim=1)
        if pooling == "avg_all":  # every token, prefix included (vit-pytorch pool='mean' with a cls token)
            return x.mean(dim=1)
        if pooling in ("max", "avgmax"):  # timm global_pool='max' / 'avgmax' (the patches' max; half avg, half max)
            patches = x[:, n_prefix:]
            top = patches.amax(dim=1)
            return top if pooling == "max" else 0.5 * (patches.mean(dim=1) + top)
        if pooling == "cls_avg":  # HF DINOv2 classifier input
            return torch.cat([x[:, 0], x[:, n_prefix:].mean(dim=1)], dim=-1)
        if pooling == "map":
            assert self.attn_pool is not None
            return self.attn_pool(x if self.spec.pool_prefix else x[:, n_prefix:])
        return x[:, 0]

    def forward_attention(self, x: torch.Tensor, upto: int | None = None) -> None:
        """Run only as far as layer `upto`'s softmax (default: the last layer's); every probe up to it fires.

        The work after that softmax -- the last block's values, projection and MLP, the final norm and the head --
        is skipped, so there are no logits; the attention is the same as `forward`'s.
        """
        n = len(self.blocks) if upto is None else upto + 1
        if not 1 <= n <= len(self.blocks):
            raise ValueError(f"layer {upto} out of range for a model with {len(self.blocks)} layers")
        x, at = self.positions(x)
        for i, block in enumerate(self.blocks[: n - 1]):
            x = block(x, *at.layer(i))
        last = self.blocks[n - 1]
        last.attn.probabilities(last.attn_input(x), *at.layer(n - 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) -> (B, num_classes) logits, or (B, D) features for a headless backbone (or an embedding
        projection's output)."""
        x, at = self.positions(x)
        for i, block in enumerate(self.blocks):
            x = block(x, *at.layer(i))
        x = self.norm_extra(self.norm(x))
        out = self.head(self.pre_logits(self.fc_norm(self.pool(x))))
        if self.head_dist is not None:
            out = (out + self.head_dist(x[:, 1])) / 2
        return out


class RunPositions:
    """What the blocks of one forward pass need for its grid: each layer's RoPE (sin, cos) and additive biases."""

    def __init__(self, net: ReferenceViT, grid: tuple[int, int],
                 tables: tuple[torch.Tensor, torch.Tensor] | None, shared: torch.Tensor | None) -> None:
        self.net, self.grid, self.tables, self.shared = net, grid, tables, shared

    def layer(self, index: int) -> tuple[Any, tuple[torch.Tensor, ...]]:
        """(rope, biases) for block `index`."""
        net = self.net
        rope = net.rope.layer(self.tables, index) if self.tables is not None and net.rope is not None else None
        biases: tuple[torch.Tensor, ...] = ()
        if net.spec.rel_pos == "layer" and net.spec.rel_pos_mlp:
            biases = (net.blocks[index].attn.rel_pos.bias(self.grid),)
        elif net.spec.rel_pos == "layer":
            table = net.blocks[index].attn.relative_position_bias_table
            biases = (net._rel_bias(table, self.grid, f"layer{index}"),)
        if self.shared is not None:
            biases = (*biases, self.shared)
        return rope, biases
