"""A new user's trial of the live path: ViT classes in styles people write that `tests/live_classes_refs.py` does
not cover, each opened with `vitviz.load(module, live=True)` and `vitviz.load(None, code="scripts/trial_live.py:NAME")`,
every captured layer compared with the attention the class itself applies to its values.

    PYTHONPATH=$PWD python scripts/trial_live.py            # the table and the counts
    PYTHONPATH=$PWD python scripts/trial_live.py -v         # and what was said / the errors in full
    PYTHONPATH=$PWD python scripts/trial_live.py talking    # only cases whose name contains 'talking'

The ground truth is independent of vitviz: while `REC` is a list, every attention class appends the weights it
multiplies its values with (`keep`) -- after any head mixing, re-normalisation or dropout, since that is what the
module computes -- and `keep(..., shown=False)` marks attention that is not self-attention over all the image tokens
(cross-attention, a pooling query, a decoder's queries, a later layer over fewer tokens), which vitviz should not
show but list in `LiveModel.skipped`. SDPA and nn.MultiheadAttention classes compute the probabilities again by hand
for the record only.

Verdicts: exact (every expected layer, max |diff| < 1e-5, output within 1e-4), said (it differs, and a warning, the
skipped list, or a note in the provenance's path says so), SILENT (differs, wrong or missing layers, nothing said),
refused-clearly (a vitviz error for a model it should refuse, or whose message says what to do), refused (a vitviz
error for a model that should have worked), crash (any other exception).
"""
from __future__ import annotations

import math
import sys
import time
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

REC: list[tuple[torch.Tensor, bool]] | None = None
DIM, HEADS, MLP, PATCH = 32, 4, 64, 8


def keep(p: torch.Tensor, shown: bool = True) -> None:
    """Record the weights a class applies to its values: (B, H, L, S) or one head's (B, L, S)."""
    if REC is not None:
        REC.append((p.detach().float().clone(), shown))


def eager_probs(q: torch.Tensor, k: torch.Tensor, scale: float | None = None, mask: torch.Tensor | None = None,
                causal: bool = False) -> torch.Tensor:
    """The probabilities an SDPA call applies, written out (for the record only)."""
    s = (q.float() @ k.float().transpose(-2, -1)) * (scale if scale is not None else q.shape[-1] ** -0.5)
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask.float()
    return s.softmax(-1)


class Mlp(nn.Module):
    def __init__(self, dim: int = DIM, hidden: int = MLP) -> None:
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class Attention(nn.Module):
    """timm-style qkv attention; subclasses change how the weights are made (`weights`)."""

    def __init__(self, dim: int = DIM, heads: int = HEADS) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.scale = self.head_dim ** -0.5
        self.qkv, self.proj = nn.Linear(dim, dim * 3), nn.Linear(dim, dim)

    def split(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        b, n, c = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        return qkv[0], qkv[1], qkv[2]

    def weights(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        return (q @ k.transpose(-2, -1) * self.scale).softmax(dim=-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        q, k, v = self.split(x)
        a = self.weights(q, k)
        keep(a)
        return self.proj((a @ v).transpose(1, 2).reshape(b, n, c))


class Block(nn.Module):
    def __init__(self, attn: nn.Module, dim: int = DIM) -> None:
        super().__init__()
        self.norm1, self.attn, self.norm2, self.mlp = nn.LayerNorm(dim), attn, nn.LayerNorm(dim), Mlp(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class ViT(nn.Module):
    """A Conv2d-patch ViT with a class token and a learned position table; `attn` makes each block's attention."""

    def __init__(self, attn: Callable[[], nn.Module], depth: int = 2, size: tuple[int, int] = (32, 32),
                 classes: int = 10) -> None:
        super().__init__()
        self.patch_embed = nn.Conv2d(3, DIM, PATCH, PATCH)
        n = (size[0] // PATCH) * (size[1] // PATCH)
        self.cls_token = nn.Parameter(torch.randn(1, 1, DIM) * 0.5)
        self.pos_embed = nn.Parameter(torch.randn(1, n + 1, DIM) * 0.5)
        self.blocks = nn.ModuleList([Block(attn()) for _ in range(depth)])
        self.norm, self.head = nn.LayerNorm(DIM), nn.Linear(DIM, classes)

    def tokens(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x).flatten(2).transpose(1, 2)
        return torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], 1) + self.pos_embed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.tokens(x)
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.norm(x)[:, 0])


# ---------------------------------------------------------------------------------------------------------------
# The attention styles


class TemperatureAttention(Attention):
    """A learned temperature per head (as in XCiT / 'Vision Transformer for Small-Size Datasets' LSA)."""

    def __init__(self) -> None:
        super().__init__()
        self.temperature = nn.Parameter(torch.rand(HEADS, 1, 1) + 0.5)

    def weights(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        return (q @ k.transpose(-2, -1) * self.temperature).softmax(-1)


class TalkingHeadsAttention(Attention):
    """CaiT's talking heads: heads mixed by a Linear before and after the softmax; the mixed weights are applied."""

    def __init__(self) -> None:
        super().__init__()
        self.proj_l, self.proj_w = nn.Linear(HEADS, HEADS), nn.Linear(HEADS, HEADS)
        self.attn_drop = nn.Dropout(0.1)

    def weights(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        attn = q * self.scale @ k.transpose(-2, -1)
        attn = self.proj_l(attn.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        attn = attn.softmax(dim=-1)
        attn = self.proj_w(attn.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        return self.attn_drop(attn)


class RelPosBiasAttention(Attention):
    """A learned relative position bias table (BEiT / Swin style, global) added before a float32 softmax."""

    def __init__(self, grid: int = 4) -> None:
        super().__init__()
        self.grid = grid
        self.table = nn.Parameter(torch.randn((2 * grid - 1) ** 2 + 1, HEADS))
        coords = torch.stack(torch.meshgrid(torch.arange(grid), torch.arange(grid), indexing="ij")).flatten(1)
        rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0) + grid - 1
        idx = torch.zeros(grid * grid + 1, grid * grid + 1, dtype=torch.long)
        idx[1:, 1:] = rel[..., 0] * (2 * grid - 1) + rel[..., 1]
        idx[0, :] = idx[:, 0] = (2 * grid - 1) ** 2
        self.register_buffer("index", idx, persistent=False)

    def weights(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        bias = self.table[self.index].permute(2, 0, 1)
        return torch.softmax(q @ k.transpose(-2, -1) * self.scale + bias, dim=-1, dtype=torch.float32).to(q.dtype)


class SoftmaxStylesAttention(Attention):
    """Each layer calls its softmax another way: F.softmax(x, -1), nn.Softmax(dim=-1), x.softmax(3),
    F.softmax(x, dim=-1, dtype=torch.float32)."""

    count = 0

    def __init__(self) -> None:
        super().__init__()
        self.style = SoftmaxStylesAttention.count % 4
        SoftmaxStylesAttention.count += 1
        self.softmax = nn.Softmax(dim=-1)

    def weights(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        s = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim)
        if self.style == 0:
            return F.softmax(s, -1)
        if self.style == 1:
            return self.softmax(s)
        if self.style == 2:
            return s.softmax(3)
        return F.softmax(s, dim=-1, dtype=torch.float32)


class SigmoidAttention(Attention):
    """Sigmoid attention (no softmax: 'Theory, Analysis, and Best Practices for Sigmoid Self-Attention')."""

    def weights(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        n = q.shape[-2]
        return torch.sigmoid(q @ k.transpose(-2, -1) * self.scale - math.log(n))


class ReluAttention(Attention):
    """ReLU attention divided by the token count (no softmax)."""

    def weights(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        return F.relu(q @ k.transpose(-2, -1) * self.scale) / q.shape[-2]


class CausalAttention(Attention):
    """A causal mask (autoregressive image models, AIM): masked_fill with -inf above the diagonal."""

    def weights(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        s = q @ k.transpose(-2, -1) * self.scale
        n = s.shape[-1]
        mask = torch.triu(torch.ones(n, n, dtype=torch.bool, device=s.device), diagonal=1)
        return s.masked_fill(mask, float("-inf")).softmax(dim=-1)


class HardDropoutAttention(Attention):
    """F.dropout(attn, 0.1) written without training=self.training: it drops out in eval mode too."""

    def weights(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        return F.dropout((q @ k.transpose(-2, -1) * self.scale).softmax(-1), 0.1)


class PostMaskAttention(Attention):
    """Weights masked and renormalised after the softmax (DynamicViT-style keep policy; here: the two farthest
    tokens of each row dropped)."""

    def weights(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        a = (q @ k.transpose(-2, -1) * self.scale).softmax(-1)
        keep_ = torch.ones(a.shape[-1], a.shape[-1], device=a.device)
        keep_[:, -2:] = 0
        keep_[-2:, -2:] = torch.eye(2)
        a = a * keep_
        return a / a.sum(-1, keepdim=True)


class SdpaScaleMaskAttention(Attention):
    """F.scaled_dot_product_attention with scale= and a float attn_mask (a learned bias)."""

    def __init__(self, tokens: int = 17) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.randn(1, HEADS, tokens, tokens))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        q, k, v = self.split(x)
        if REC is not None:     # the record only: not computed (nor seen) in vitviz's runs
            keep(eager_probs(q, k, 0.3, self.bias))
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=self.bias, scale=0.3)
        return self.proj(o.transpose(1, 2).reshape(b, n, c))


class QkNormAttention(Attention):
    """q/k LayerNorm (ViT-22B), the softmax in float32 and back (`.float().softmax(-1).type_as(v)`), SDPA-free."""

    def __init__(self) -> None:
        super().__init__()
        self.q_norm, self.k_norm = nn.LayerNorm(self.head_dim), nn.LayerNorm(self.head_dim)

    def weights(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        q, k = self.q_norm(q), self.k_norm(k)
        return torch.einsum("bhid,bhjd->bhij", q, k).mul(self.scale).float().softmax(-1).type_as(q)


class LayerScaleBlock(Block):
    def __init__(self, attn: nn.Module, dim: int = DIM) -> None:
        super().__init__(attn, dim)
        self.gamma_1, self.gamma_2 = nn.Parameter(torch.rand(dim)), nn.Parameter(torch.rand(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.gamma_1 * self.attn(self.norm1(x))
        return x + self.gamma_2 * self.mlp(self.norm2(x))


class MhaWeightsBlock(nn.Module):
    """nn.MultiheadAttention asked for per-head weights, which the model then uses (token weights for pooling)."""

    def __init__(self) -> None:
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(DIM), nn.MultiheadAttention(DIM, HEADS, batch_first=True)
        self.norm2, self.mlp = nn.LayerNorm(DIM), Mlp()
        self.last: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        o, w = self.attn(h, h, h, need_weights=True, average_attn_weights=False)
        keep(w)
        self.last = w
        x = x + o
        return x + self.mlp(self.norm2(x))


class MhaWeightsViT(ViT):
    def __init__(self) -> None:
        super().__init__(Attention)
        self.blocks = nn.ModuleList([MhaWeightsBlock() for _ in range(2)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.tokens(x)
        for blk in self.blocks:
            x = blk(x)
        w = self.blocks[-1].last[:, :, 0, 1:].mean(1)            # (B, N): the class token's attention
        pooled = (w.unsqueeze(-1) * self.norm(x)[:, 1:]).sum(1)
        return self.head(pooled)


class MapHeadViT(ViT):
    """Self-attention blocks and a MAP head (a learned probe query attending to the tokens: SigLIP / perceiver)."""

    def __init__(self) -> None:
        super().__init__(Attention)
        self.probe = nn.Parameter(torch.randn(1, 1, DIM))
        self.pool = nn.MultiheadAttention(DIM, HEADS, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.tokens(x)
        for blk in self.blocks:
            x = blk(x)
        x = self.norm(x)
        q = self.probe.expand(x.shape[0], -1, -1)
        o, w = self.pool(q, x, x, need_weights=True, average_attn_weights=False)
        keep(w, shown=False)
        return self.head(o[:, 0])


class ParallelBlock(nn.Module):
    """Two attention branches and two MLPs in parallel ('Three things everyone should know about ViTs')."""

    def __init__(self) -> None:
        super().__init__()
        self.norms = nn.ModuleList([nn.LayerNorm(DIM) for _ in range(2)])
        self.attns = nn.ModuleList([Attention() for _ in range(2)])
        self.mlps = nn.ModuleList([Mlp() for _ in range(2)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + sum(a(n(x)) for a, n in zip(self.attns, self.norms))
        return x + sum(m(x) for m in self.mlps)


class CrossAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.heads, self.hd = HEADS, DIM // HEADS
        self.q, self.kv, self.proj = nn.Linear(DIM, DIM), nn.Linear(DIM, 2 * DIM), nn.Linear(DIM, DIM)

    def forward(self, x: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        q = self.q(x).reshape(b, n, self.heads, self.hd).transpose(1, 2)
        k, v = self.kv(memory).reshape(b, -1, 2, self.heads, self.hd).permute(2, 0, 3, 1, 4)
        a = (q @ k.transpose(-2, -1) * self.hd ** -0.5).softmax(-1)
        keep(a, shown=False)
        return self.proj((a @ v).transpose(1, 2).reshape(b, n, c))


class DecoderViT(ViT):
    """An encoder and a one-layer decoder of 5 learned queries (self-attention among them, cross-attention to the
    image tokens), DETR-style; the queries' mean goes to the head."""

    def __init__(self) -> None:
        super().__init__(Attention)
        self.queries = nn.Parameter(torch.randn(1, 5, DIM))
        self.dec_self = Attention()
        self.dec_cross = CrossAttention()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mem = self.tokens(x)
        for blk in self.blocks:
            mem = blk(mem)
        q = self.queries.expand(x.shape[0], -1, -1)
        global REC
        saved = REC
        REC = [] if saved is not None else None
        q = q + self.dec_self(q)                  # 5x5 self-attention among the queries: not over the image
        if saved is not None:
            saved.extend((m, False) for m, _ in REC)
        REC = saved
        q = q + self.dec_cross(q, mem)
        return self.head(q.mean(1))


class AlbertViT(ViT):
    """One block's weights applied three times (ALBERT-style sharing), in a loop."""

    def __init__(self) -> None:
        super().__init__(Attention, depth=1)
        self.repeats = 3

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.tokens(x)
        for _ in range(self.repeats):
            x = self.blocks[0](x)
        return self.head(self.norm(x)[:, 0])


class StackedPatchifyViT(ViT):
    """A hybrid stem of three 2x2 stride-2 convolutions (patch 8 overall), then the blocks."""

    def __init__(self) -> None:
        super().__init__(Attention)
        self.patch_embed = nn.Sequential(
            nn.Conv2d(3, 16, 2, 2), nn.BatchNorm2d(16), nn.ReLU(),
            nn.Conv2d(16, 32, 2, 2), nn.BatchNorm2d(32), nn.ReLU(),
            nn.Conv2d(32, DIM, 2, 2))


class ConvStem3x3ViT(ViT):
    """An 'early convolutions' stem: 3x3 stride-2 convolutions and a 1x1 projection (patch 8 overall)."""

    def __init__(self) -> None:
        super().__init__(Attention)
        self.patch_embed = nn.Sequential(
            nn.Conv2d(3, 16, 3, 2, 1), nn.BatchNorm2d(16), nn.ReLU(),
            nn.Conv2d(16, 32, 3, 2, 1), nn.BatchNorm2d(32), nn.ReLU(),
            nn.Conv2d(32, 32, 3, 2, 1), nn.ReLU(), nn.Conv2d(32, DIM, 1))


class LinearPatchViT(nn.Module):
    """Patches flattened with reshape/permute in the forward and projected by a Linear; 32x64 input (4x8 grid)."""

    def __init__(self, stated: bool = True) -> None:
        super().__init__()
        if stated:
            self.img_size = (32, 64)
        self.to_embed = nn.Linear(3 * PATCH * PATCH, DIM)
        self.cls_token = nn.Parameter(torch.randn(1, 1, DIM) * 0.5)
        self.pos_embed = nn.Parameter(torch.randn(1, 33, DIM) * 0.5)
        self.blocks = nn.ModuleList([Block(Attention()) for _ in range(2)])
        self.norm, self.head = nn.LayerNorm(DIM), nn.Linear(DIM, 10)

    def forward(self, img: torch.Tensor) -> torch.Tensor:
        b, c, h, w = img.shape
        p = PATCH
        x = img.reshape(b, c, h // p, p, w // p, p).permute(0, 2, 4, 3, 5, 1).reshape(b, -1, p * p * c)
        x = self.to_embed(x)
        x = torch.cat([self.cls_token.expand(b, -1, -1), x], 1) + self.pos_embed
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.norm(x)[:, 0])


class ExtraArgsViT(ViT):
    """forward(x, mask=None, return_attention=False): extra arguments with defaults."""

    def __init__(self) -> None:
        super().__init__(Attention)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None,  # type: ignore[override]
                return_attention: bool = False) -> Any:
        x = self.tokens(x)
        if mask is not None:
            x = x * mask
        for blk in self.blocks:
            x = blk(x)
        out = self.head(self.norm(x)[:, 0])
        return (out, []) if return_attention else out


class PruningViT(ViT):
    """EViT-style token pruning: after block 0, only the 8 patches the class token attends to most are kept."""

    def __init__(self) -> None:
        super().__init__(Attention)
        self.blocks[0].attn.keep_attn = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.tokens(x)
        x = self.blocks[0](x)
        score = self.blocks[0].attn.last[:, :, 0, 1:].mean(1)   # (B, N)
        idx = score.topk(8, dim=-1).indices.sort(-1).values + 1
        x = torch.cat([x[:, :1], x.gather(1, idx.unsqueeze(-1).expand(-1, -1, DIM))], 1)
        global REC
        saved = REC
        REC = [] if saved is not None else None
        x = self.blocks[1](x)
        if saved is not None:
            saved.extend((m, False) for m, _ in REC)
        REC = saved
        return self.head(self.norm(x)[:, 0])


class KeepLastAttention(Attention):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        q, k, v = self.split(x)
        a = self.weights(q, k)
        self.last = a
        keep(a)
        return self.proj((a @ v).transpose(1, 2).reshape(b, n, c))


class PerImageLoopAttention(Attention):
    """Attention computed one image at a time (a loop over the batch): (H, T, T) per image."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        q, k, v = self.split(x)
        outs, maps = [], []
        for i in range(b):
            a = torch.softmax(q[i] @ k[i].transpose(-2, -1) * self.scale, dim=-1)   # (H, T, T)
            maps.append(a)
            outs.append(a @ v[i])
        keep(torch.stack(maps))
        return self.proj(torch.stack(outs).transpose(1, 2).reshape(b, n, c))


class TransposedAttention(Attention):
    """Scores laid out (keys, queries) and the softmax over dim=-2."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        q, k, v = self.split(x)
        a = (k @ q.transpose(-2, -1) * self.scale).softmax(dim=-2)     # (B, H, S, L)
        keep(a.transpose(-2, -1))
        return self.proj((a.transpose(-2, -1) @ v).transpose(1, 2).reshape(b, n, c))


class MixedSigmoidViT(ViT):
    """Block 0 with softmax attention, block 1 with sigmoid attention."""

    def __init__(self) -> None:
        super().__init__(Attention)
        self.blocks[1].attn = SigmoidAttention()


class MixedTransposedViT(ViT):
    """Block 0 as usual, block 1 with its softmax over dim=-2 of (keys, queries) scores."""

    def __init__(self) -> None:
        super().__init__(Attention)
        self.blocks[1].attn = TransposedAttention()


# ---------------------------------------------------------------------------------------------------------------
# Factories (each a `--code scripts/trial_live.py:NAME`)


def _made(seed: int, make: Callable[[], nn.Module]) -> nn.Module:
    torch.manual_seed(seed)
    SoftmaxStylesAttention.count = 0
    m = make()
    with torch.no_grad():       # weights big enough that the attention is not flat
        for name, p in m.named_parameters():
            if name.endswith("weight") and p.dim() == 2:
                p.mul_(2.0)
    return m.eval()


def temperature(): return _made(1, lambda: ViT(TemperatureAttention))
def talking_heads(): return _made(2, lambda: ViT(TalkingHeadsAttention))
def rel_pos_bias(): return _made(3, lambda: ViT(RelPosBiasAttention))
def softmax_styles(): return _made(4, lambda: ViT(SoftmaxStylesAttention, depth=4))
def sigmoid_only(): return _made(5, lambda: ViT(SigmoidAttention))
def relu_only(): return _made(6, lambda: ViT(ReluAttention))
def mixed_sigmoid(): return _made(7, MixedSigmoidViT)
def causal(): return _made(8, lambda: ViT(CausalAttention))
def hard_dropout(): return _made(9, lambda: ViT(HardDropoutAttention))
def post_softmax_mask(): return _made(10, lambda: ViT(PostMaskAttention))
def sdpa_scale_mask(): return _made(11, lambda: ViT(SdpaScaleMaskAttention))
def qk_norm(): return _made(12, lambda: ViT(QkNormAttention))
def mha_weights_used(): return _made(14, MhaWeightsViT)
def map_head(): return _made(15, MapHeadViT)
def decoder(): return _made(17, DecoderViT)
def albert_shared(): return _made(18, AlbertViT)
def stacked_patchify(): return _made(19, StackedPatchifyViT)
def conv_stem_3x3(): return _made(20, ConvStem3x3ViT)
def linear_patch_32x64(): return _made(21, LinearPatchViT)
def linear_patch_32x64_unstated(): return _made(22, lambda: LinearPatchViT(stated=False))
def extra_args(): return _made(23, ExtraArgsViT)
def per_image_loop(): return _made(26, lambda: ViT(PerImageLoopAttention))
def transposed_only(): return _made(27, lambda: ViT(TransposedAttention))
def mixed_transposed(): return _made(28, MixedTransposedViT)


def layer_scale():
    def make() -> nn.Module:
        m = ViT(Attention)
        m.blocks = nn.ModuleList([LayerScaleBlock(Attention()) for _ in range(2)])
        return m
    return _made(13, make)


def parallel():
    def make() -> nn.Module:
        m = ViT(Attention)
        m.blocks = nn.ModuleList([ParallelBlock() for _ in range(2)])
        return m
    return _made(16, make)


def pruning():
    def make() -> nn.Module:
        m = PruningViT()
        m.blocks[0].attn = KeepLastAttention()
        return m
    return _made(24, make)


def float64(): return _made(29, lambda: ViT(TemperatureAttention)).double()
def bfloat16(): return _made(30, lambda: ViT(RelPosBiasAttention)).bfloat16()


class PlainAttention(Attention):
    """No record (TorchScript compiles it): the scripted model is refused, so nothing is compared."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        q, k, v = self.split(x)
        a = (q @ k.transpose(-2, -1) * self.scale).softmax(dim=-1)
        return self.proj((a @ v).transpose(1, 2).reshape(b, n, c))


def jit_scripted(): return torch.jit.script(_made(31, lambda: ViT(PlainAttention)))


def compiled(): return torch.compile(_made(32, lambda: ViT(CausalAttention)), backend="eager")


def compiled_talking_heads(): return torch.compile(_made(34, lambda: ViT(TalkingHeadsAttention)), backend="eager")


def compiled_inductor(): return torch.compile(_made(33, lambda: ViT(TemperatureAttention)))


@dataclass
class Case:
    name: str
    refuse: bool = False          # it should be refused (no softmax attention to show)
    code: bool = True             # also through code='scripts/trial_live.py:NAME'
    atol: float = 1e-5
    size: tuple[int, int] | None = None    # the input size it must find
    note: str = ""


CASES = [
    Case("temperature"), Case("talking_heads"), Case("rel_pos_bias"), Case("softmax_styles"),
    Case("sigmoid_only", refuse=True), Case("relu_only", refuse=True), Case("mixed_sigmoid"), Case("causal"),
    Case("hard_dropout"), Case("post_softmax_mask"), Case("sdpa_scale_mask"), Case("qk_norm"), Case("layer_scale"),
    Case("mha_weights_used"), Case("map_head"), Case("parallel"), Case("decoder"), Case("albert_shared"),
    Case("stacked_patchify"), Case("conv_stem_3x3"), Case("linear_patch_32x64", size=(32, 64)),
    Case("linear_patch_32x64_unstated", size=(32, 64), refuse=True), Case("extra_args"), Case("pruning"),
    Case("per_image_loop"), Case("transposed_only", refuse=True), Case("mixed_transposed"),
    Case("float64"), Case("bfloat16", atol=4e-3, note="its float32 softmax cast to bf16: bf16 rounding"),
    Case("jit_scripted", refuse=True, code=False), Case("compiled", code=False),
    Case("compiled_inductor", code=False, note="inductor"), Case("compiled_talking_heads", code=False),
]

# ---------------------------------------------------------------------------------------------------------------
# The trial


@dataclass
class Outcome:
    verdict: str
    detail: str = ""
    said: list[str] = field(default_factory=list)


def _strip_parens(text: str) -> str:
    out, depth = [], 0
    for ch in text:
        depth += ch == "("
        if not depth:
            out.append(ch)
        depth -= ch == ")" and depth > 0
    return "".join(out)


def _notes(model: Any) -> list[str]:
    """The notes the live path appended to the provenance's path (after the mechanisms, outside parentheses)."""
    path = dict(model.spec.provenance).get("path", "")
    return [p.strip() for p in _strip_parens(path).split("; ")[2:] if p.strip()]


def _refs_module(net: nn.Module) -> Any:
    base = getattr(net, "_orig_mod", net)
    return sys.modules[type(base).__module__]


def _own(net: nn.Module, x: torch.Tensor) -> tuple[list[tuple[torch.Tensor, bool]], Any]:
    base = getattr(net, "_orig_mod", net)
    refs = _refs_module(net)
    refs.REC = []
    try:
        with torch.inference_mode():
            out = base.eval()(x)
        return refs.REC, out
    finally:
        refs.REC = None


def _layers(record: list[tuple[torch.Tensor, bool]]) -> tuple[list[torch.Tensor], int]:
    shown = [m for m, s in record if s]
    return shown, sum(not s for _, s in record)


def run_case(case: Case, route: str) -> Outcome:
    import vitviz
    from vitviz.core.spec import GuessWarning
    from vitviz.errors import VitvizError

    said: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            if route == "live":
                model = vitviz.load(globals()[case.name](), live=True, device="cpu")
            else:
                model = vitviz.load(None, code=f"{Path(__file__).resolve()}:{case.name}", device="cpu")
        except VitvizError as e:
            kind = "refused-clearly" if case.refuse else "refused"
            return Outcome(kind, f"{type(e).__name__}: {e}")
        except Exception as e:  # noqa: BLE001 - the trial reports it
            return Outcome("crash", "".join(traceback.format_exception_only(e)).strip())
        if case.refuse:
            said.append("loaded a model it should refuse")
        s = model.spec
        g = torch.Generator().manual_seed(5)
        x = torch.randn(2, s.in_chans, *s.image_size, generator=g)
        dtype = next(p.dtype for p in getattr(model.net, "_orig_mod", model.net).parameters())
        try:
            record, own = _own(model.net, x.to(dtype))
            torch.manual_seed(0)
            attn, out = model.forward_captured(x)
        except VitvizError as e:
            return Outcome("refused" if not case.refuse else "refused-clearly", f"in a run: {type(e).__name__}: {e}")
        except Exception as e:  # noqa: BLE001
            return Outcome("crash", "in a run: " + "".join(traceback.format_exception_only(e)).strip())
    warned = [f"{w.category.__name__}: {w.message}" for w in caught      # vitviz's own (not torch's, not guesses)
              if w.category.__module__.startswith("vitviz") and not issubclass(w.category, GuessWarning)]
    guessed = [str(w.message) for w in caught if issubclass(w.category, GuessWarning)]
    notes = _notes(model)
    skipped = [f"{n} {m} {shape}" for n, m, shape in model.skipped]
    said += warned + [f"note: {n}" for n in notes] + [f"skipped: {k}" for k in skipped]
    shown, hidden = _layers(record)
    problems = []
    if case.size is not None and tuple(s.image_size) != case.size:
        problems.append(f"image size {s.image_size}, expected {case.size}")
        said += [f"guess: {gm}" for gm in guessed if "size" in gm]
    order = list(model.layout.order) if model.layout.order else list(range(s.num_tokens))
    if len(shown) != attn.shape[1]:
        problems.append(f"{attn.shape[1]} layers shown, the module applies {len(shown)} "
                        f"({', '.join(n for n, _ in model.layers)})")
    worst = 0.0
    for i, ref in enumerate(shown[:attn.shape[1]]):
        if ref.dim() == 3:
            problems.append(f"layer {i}: a single-head reference")
            continue
        if tuple(ref.shape[-2:]) != tuple(attn.shape[-2:]):
            problems.append(f"layer {i}: reference {tuple(ref.shape)} vs shown {attn.shape}")
            continue
        ref = ref[..., order, :][..., order]
        worst = max(worst, float((torch.from_numpy(attn[:, i]).float() - ref).abs().max()))
    if worst >= case.atol:
        problems.append(f"max |diff| {worst:.2e}")
    if hidden and not model.skipped:
        problems.append(f"{hidden} non-self-attention map(s) not in skipped")
    own_out = own[0] if isinstance(own, tuple) else own
    if out.size and own_out.shape == out.shape:
        d = float((torch.from_numpy(out) - own_out.float()).abs().max())
        if d > 1e-4 * max(1.0, float(own_out.float().abs().max())) and case.name != "hard_dropout":
            problems.append(f"output differs by {d:.2e}")
    detail = "; ".join(problems) or f"{attn.shape[1]} layers, max |diff| {worst:.1e}"
    if not problems and not case.refuse:
        return Outcome("exact", detail, said)
    relevant = warned + notes + (skipped if problems and all("layers shown" in p for p in problems) else [])
    relevant += [gm for gm in guessed if "size" in gm and any("image size" in p for p in problems)]
    return Outcome("said" if relevant else "SILENT", detail, said)


def main(argv: list[str]) -> int:
    verbose = "-v" in argv
    only = [a for a in argv if not a.startswith("-")]
    counts: dict[str, int] = {}
    t0 = time.perf_counter()
    print(f"{'case':32s} {'route':5s} {'verdict':16s} detail")
    for case in CASES:
        if only and not any(o in case.name for o in only):
            continue
        for route in ("live", "code") if case.code else ("live",):
            o = run_case(case, route)
            counts[o.verdict] = counts.get(o.verdict, 0) + 1
            detail = o.detail if verbose else o.detail[:150]
            print(f"{case.name:32s} {route:5s} {o.verdict:16s} {detail}")
            if verbose:
                for s in o.said:
                    print(f"{'':55s}said: {s[:300]}")
    print("\ncounts:", ", ".join(f"{k} {v}" for k, v in sorted(counts.items())),
          f"({sum(counts.values())} runs, {time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
