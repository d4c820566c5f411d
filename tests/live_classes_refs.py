"""Hand-written ViT classes in the styles people write (issue 19), opened through `--code live_classes_refs.py:NAME`.

Written fresh for vitviz's tests, after the patterns of tutorial and course ViTs and of the code published
checkpoints were trained with: one module per head, a loop over heads, einsum attention, (B*H, T, T) bmm,
nn.MultiheadAttention pre- and post-norm, nn.TransformerEncoder, SDPA with masks, 1-channel MNIST ViTs at 28 px,
CIFAR ViTs at 32 px, patches cut in the forward (no patch module), token-0 pooling without a class token, the class
token last, models returning tuples, dicts and transformers outputs, embedding heads, Lightning-style wrappers.

Every class computes its attention with its own code. The reference is what that code computes: while `RECORD` is
a list, `keep` appends each attention map a class computes -- (B, H, T, T), or (B, T, T) for one head -- and with
`EAGER` the SDPA and nn.MultiheadAttention classes take their explicit path (softmax written out, MHA asked for
per-head weights), as timm's `fused_attn = False` does. Nothing here knows about vitviz.
"""
from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

RECORD: list[torch.Tensor] | None = None
EAGER = False
DIM, MLP = 32, 64


def keep(p: torch.Tensor) -> None:
    if RECORD is not None:
        RECORD.append(p.detach().float().clone())


@contextlib.contextmanager
def mha_weights(model: nn.Module) -> Iterator[None]:
    """While open, each nn.MultiheadAttention of `model` (called by code that cannot be edited, such as
    nn.TransformerEncoderLayer) is asked once more for its per-head weights on the same inputs, which are kept;
    PyTorch's fused fast path is off, so its own output is the eager one."""
    busy: list[bool] = []

    def hook(mod: nn.MultiheadAttention, args: tuple, kwargs: dict) -> None:
        if busy:
            return
        q, k, v = (list(args) + [kwargs.get(n) for n in ("query", "key", "value")][len(args):])[:3]
        busy.append(True)
        try:
            keep(mod(q, k, v, need_weights=True, average_attn_weights=False, attn_mask=kwargs.get("attn_mask"))[1])
        finally:
            busy.clear()

    handles = [m.register_forward_pre_hook(hook, with_kwargs=True) for m in model.modules()
               if isinstance(m, nn.MultiheadAttention)]
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        yield
    finally:
        torch.backends.mha.set_fastpath_enabled(True)
        for h in handles:
            h.remove()


def _seed(n: int) -> None:
    torch.manual_seed(n)


class Mlp(nn.Module):
    def __init__(self, dim: int = DIM, hidden: int = MLP) -> None:
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


def _tokens(x: torch.Tensor, cls: torch.Tensor | None, pos: torch.Tensor | None, last: bool = False) -> torch.Tensor:
    if cls is not None:
        c = cls.expand(x.shape[0], -1, -1)
        x = torch.cat([x, c] if last else [c, x], dim=1)
    return x if pos is None else x + pos


# ------------------------------------------------------------------------------------------------ one module per head


class AttentionHead(nn.Module):
    """One head with its own q, k, v (the course-notebook style)."""

    def __init__(self, dim: int, head_dim: int) -> None:
        super().__init__()
        self.q, self.k, self.v = nn.Linear(dim, head_dim), nn.Linear(dim, head_dim), nn.Linear(dim, head_dim)
        self.head_dim = head_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.q(x), self.k(x), self.v(x)
        w = F.softmax(q @ k.transpose(1, 2) / math.sqrt(self.head_dim), dim=-1)  # (B, T, T)
        keep(w)
        return w @ v


class MultiHead(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = nn.ModuleList([AttentionHead(dim, dim // heads) for _ in range(heads)])
        self.out = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.cat([h(x) for h in self.heads], dim=-1))


class EncoderBlock(nn.Module):
    def __init__(self, attn: nn.Module, dim: int = DIM) -> None:
        super().__init__()
        self.ln1, self.attn, self.ln2, self.mlp = nn.LayerNorm(dim), attn, nn.LayerNorm(dim), Mlp(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class PerHeadViT(nn.Module):
    """CIFAR-10 at 32 px, 4 px patches, heads as modules."""

    def __init__(self) -> None:
        super().__init__()
        self.patch_embed = nn.Conv2d(3, DIM, 4, 4)
        self.cls_token = nn.Parameter(torch.randn(1, 1, DIM))
        self.pos_embed = nn.Parameter(torch.randn(1, 65, DIM) * 0.5)
        self.blocks = nn.Sequential(*[EncoderBlock(MultiHead(DIM, 4)) for _ in range(2)])
        self.norm, self.fc = nn.LayerNorm(DIM), nn.Linear(DIM, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x).flatten(2).transpose(1, 2)  # (B, D, 8, 8) -> (B, 64, D)
        x = self.blocks(_tokens(x, self.cls_token, self.pos_embed))
        return self.fc(self.norm(x[:, 0]))


class LoopHeads(nn.Module):
    """One module, a Python loop over the heads, a (B, T, T) softmax per head."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.n_heads, self.hd = heads, dim // heads
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)  # 3 x (B, T, D)
        outs = []
        for h in range(self.n_heads):
            sl = slice(h * self.hd, (h + 1) * self.hd)
            att = torch.softmax(torch.bmm(q[..., sl], k[..., sl].transpose(1, 2)) * self.hd ** -0.5, dim=-1)
            keep(att)
            outs.append(att @ v[..., sl])
        return self.proj(torch.cat(outs, dim=-1))


class MnistLoopHeadsViT(nn.Module):
    """MNIST: 1 channel at 28 px, 7 px patches (4 x 4 + CLS = 17 tokens), a loop over heads; nothing states the
    input size (the position table's 17 rows do)."""

    def __init__(self) -> None:
        super().__init__()
        self.patchify = nn.Conv2d(1, DIM, 7, 7)
        self.cls_token = nn.Parameter(torch.randn(1, 1, DIM))
        self.pos_embedding = nn.Parameter(torch.randn(1, 17, DIM) * 0.5)
        self.layers = nn.ModuleList([EncoderBlock(LoopHeads(DIM, 4)) for _ in range(3)])
        self.classifier = nn.Sequential(nn.LayerNorm(DIM), nn.Linear(DIM, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = _tokens(self.patchify(x).flatten(2).transpose(1, 2), self.cls_token, self.pos_embedding)
        for layer in self.layers:
            x = layer(x)
        return self.classifier(x[:, 0])


class SharedLoopViT(nn.Module):
    """ALBERT-style: one block applied three times (shared weights), heads in a loop."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Conv2d(3, DIM, 8, 8)
        self.cls_token = nn.Parameter(torch.randn(1, 1, DIM))
        self.pos_embed = nn.Parameter(torch.randn(1, 17, DIM) * 0.5)
        self.block = EncoderBlock(LoopHeads(DIM, 2))
        self.head = nn.Linear(DIM, 6)
        self.img_size = 32

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = _tokens(self.embed(x).flatten(2).transpose(1, 2), self.cls_token, self.pos_embed)
        for _ in range(3):
            x = self.block(x)
        return self.head(x[:, 0])


# ------------------------------------------------------------------------------------------------ fused-head layouts


class EinsumAttention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.h = heads
        self.to_qkv, self.to_out, self.attend = nn.Linear(dim, 3 * dim, bias=False), nn.Linear(dim, dim), \
            nn.Softmax(dim=-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = (t.reshape(b, n, self.h, d // self.h).transpose(1, 2) for t in self.to_qkv(x).chunk(3, -1))
        attn = self.attend(torch.einsum("bhid,bhjd->bhij", q, k) * (d // self.h) ** -0.5)
        keep(attn)
        return self.to_out(torch.einsum("bhij,bhjd->bhid", attn, v).transpose(1, 2).reshape(b, n, d))


class EinsumUnfoldViT(nn.Module):
    """Patches cut with F.unfold in the forward, a Linear projection (no patch module), einsum attention; the
    stated `patch_size` and the position table say the input size."""

    def __init__(self) -> None:
        super().__init__()
        self.patch_size = 8
        self.proj = nn.Linear(3 * 8 * 8, DIM)
        self.cls = nn.Parameter(torch.randn(1, 1, DIM))
        self.pos = nn.Parameter(torch.randn(1, 17, DIM) * 0.5)
        self.blocks = nn.ModuleList([EncoderBlock(EinsumAttention(DIM, 4)) for _ in range(2)])
        self.head = nn.Linear(DIM, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.unfold(x, self.patch_size, stride=self.patch_size).transpose(1, 2)  # (B, N, C*p*p)
        x = _tokens(self.proj(x), self.cls, self.pos)
        for blk in self.blocks:
            x = blk(x)
        return self.head(x[:, 0])


class BmmAttention(nn.Module):
    """Heads folded into the batch: (B*H, T, hd) and torch.bmm, as fairseq-era code does."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.h, self.hd = heads, dim // heads
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (y.reshape(b, t, self.h, self.hd).transpose(1, 2).reshape(b * self.h, t, self.hd)
                   for y in self.qkv(x).chunk(3, dim=-1))  # 3 x (B*H, T, hd)
        w = torch.bmm(q, k.transpose(1, 2)).mul(self.hd ** -0.5).softmax(dim=-1)  # (B*H, T, T)
        keep(w.view(b, self.h, t, t))
        o = torch.bmm(w, v).view(b, self.h, t, self.hd).transpose(1, 2).reshape(b, t, d)
        return self.proj(o)


class BmmViT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv_proj = nn.Conv2d(3, DIM, 8, 8)
        self.class_token = nn.Parameter(torch.randn(1, 1, DIM))
        self.pos_embedding = nn.Parameter(torch.randn(1, 17, DIM) * 0.5)
        self.blocks = nn.Sequential(*[EncoderBlock(BmmAttention(DIM, 4)) for _ in range(2)])
        self.head = nn.Linear(DIM, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = _tokens(self.conv_proj(x).flatten(2).transpose(1, 2), self.class_token, self.pos_embedding)
        return self.head(self.blocks(x)[:, 0])


class ScoresAttention(nn.Module):
    """The timm/DINO style: (B, H, T, hd) q, k, v from one Linear, `(q @ k^T) * scale` then `.softmax(-1)`."""

    def __init__(self, dim: int, heads: int, return_attn: bool = False) -> None:
        super().__init__()
        self.h, self.scale, self.return_attn = heads, (dim // heads) ** -0.5, return_attn
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        b, t, d = x.shape
        q, k, v = self.qkv(x).reshape(b, t, 3, self.h, d // self.h).permute(2, 0, 3, 1, 4)
        attn = ((q @ k.transpose(-2, -1)) * self.scale).softmax(dim=-1)
        keep(attn)
        out = self.proj((attn @ v).transpose(1, 2).reshape(b, t, d))
        return (out, attn) if self.return_attn else out


class MnistLinearPatchViT(nn.Module):
    """MNIST at 28 px cut into 4 px patches by reshapes in the forward (7 x 7 + CLS = 50 tokens), a Linear of 16
    pixels; only `img_size` is stated: the grid follows from 50 tokens at 28 px."""

    def __init__(self) -> None:
        super().__init__()
        self.img_size = 28
        self.linear_proj = nn.Linear(16, DIM)
        self.cls_tok = nn.Parameter(torch.randn(1, 1, DIM))
        self.position = nn.Parameter(torch.randn(1, 50, DIM) * 0.5)
        self.blocks = nn.ModuleList([EncoderBlock(ScoresAttention(DIM, 2)) for _ in range(2)])
        self.out = nn.Linear(DIM, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = x.shape[0]
        x = x.reshape(b, 1, 7, 4, 7, 4).permute(0, 2, 4, 1, 3, 5).reshape(b, 49, 16)  # (B, 49, 1*4*4)
        x = _tokens(self.linear_proj(x), self.cls_tok, self.position)
        for blk in self.blocks:
            x = blk(x)
        return self.out(x[:, 0])


class ConvStemViT(nn.Module):
    """A convolutional stem (two stride-2 3x3 convs, then a 1x1), not a patch Conv2d: 32 px -> 8 x 8 tokens,
    no class token (mean pooled); `image_size` is stated."""

    def __init__(self) -> None:
        super().__init__()
        self.image_size = 32
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1), nn.ReLU(), nn.Conv2d(16, 16, 3, 2, 1), nn.ReLU(),
                                  nn.Conv2d(16, DIM, 1))
        self.pos = nn.Parameter(torch.randn(1, 64, DIM) * 0.5)
        self.blocks = nn.ModuleList([EncoderBlock(ScoresAttention(DIM, 4)) for _ in range(2)])
        self.head = nn.Linear(DIM, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x).flatten(2).transpose(1, 2) + self.pos
        for blk in self.blocks:
            x = blk(x)
        return self.head(x.mean(1))


class RegistersViT(nn.Module):
    """A class token and 4 registers, a 32 x 48 input (non-square), the patches in an einops-free Rearrange."""

    def __init__(self) -> None:
        super().__init__()
        self.img_size = (32, 48)
        self.patch_embed = nn.Conv2d(3, DIM, 8, 8)
        self.cls_token = nn.Parameter(torch.randn(1, 1, DIM))
        self.register_tokens = nn.Parameter(torch.randn(1, 4, DIM))
        self.pos_embed = nn.Parameter(torch.randn(1, 24, DIM) * 0.5)
        self.blocks = nn.ModuleList([EncoderBlock(ScoresAttention(DIM, 4)) for _ in range(2)])
        self.head = nn.Linear(DIM, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x).flatten(2).transpose(1, 2) + self.pos_embed
        b = x.shape[0]
        x = torch.cat([self.cls_token.expand(b, -1, -1), self.register_tokens.expand(b, -1, -1), x], dim=1)
        for blk in self.blocks:
            x = blk(x)
        return self.head(x[:, 0])


class DistilledViT(nn.Module):
    """DeiT-style: class and distillation tokens, two heads averaged at inference."""

    def __init__(self) -> None:
        super().__init__()
        self.patch_embed = nn.Conv2d(3, DIM, 8, 8)
        self.cls_token = nn.Parameter(torch.randn(1, 1, DIM))
        self.dist_token = nn.Parameter(torch.randn(1, 1, DIM))
        self.pos_embed = nn.Parameter(torch.randn(1, 18, DIM) * 0.5)
        self.blocks = nn.ModuleList([EncoderBlock(ScoresAttention(DIM, 2)) for _ in range(2)])
        self.head, self.head_dist = nn.Linear(DIM, 10), nn.Linear(DIM, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x).flatten(2).transpose(1, 2)
        b = x.shape[0]
        x = torch.cat([self.cls_token.expand(b, -1, -1), self.dist_token.expand(b, -1, -1), x], 1) + self.pos_embed
        for blk in self.blocks:
            x = blk(x)
        return (self.head(x[:, 0]) + self.head_dist(x[:, 1])) / 2


class ClassTokenLastViT(nn.Module):
    """The class token appended after the patches, read back as x[:, -1]."""

    def __init__(self) -> None:
        super().__init__()
        self.patch_embed = nn.Conv2d(3, DIM, 8, 8)
        self.cls_token = nn.Parameter(torch.randn(1, 1, DIM))
        self.pos_embed = nn.Parameter(torch.randn(1, 17, DIM) * 0.5)
        self.blocks = nn.ModuleList([EncoderBlock(ScoresAttention(DIM, 4)) for _ in range(2)])
        self.head = nn.Linear(DIM, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = _tokens(self.patch_embed(x).flatten(2).transpose(1, 2), self.cls_token, self.pos_embed, last=True)
        for blk in self.blocks:
            x = blk(x)
        return self.head(x[:, -1])


# ------------------------------------------------------------------------------------------------ outputs


class TupleOutputViT(nn.Module):
    """Returns (logits, [attention of every layer]), as models written to show their attention do."""

    def __init__(self) -> None:
        super().__init__()
        self.patch_embed = nn.Conv2d(3, DIM, 8, 8)
        self.cls_token = nn.Parameter(torch.randn(1, 1, DIM))
        self.pos_embed = nn.Parameter(torch.randn(1, 17, DIM) * 0.5)
        self.norms = nn.ModuleList([nn.LayerNorm(DIM) for _ in range(2)])
        self.attns = nn.ModuleList([ScoresAttention(DIM, 4, return_attn=True) for _ in range(2)])
        self.mlps = nn.ModuleList([Mlp() for _ in range(2)])
        self.head = nn.Linear(DIM, 10)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        x = _tokens(self.patch_embed(x).flatten(2).transpose(1, 2), self.cls_token, self.pos_embed)
        maps = []
        for norm, attn, mlp in zip(self.norms, self.attns, self.mlps):
            y, a = attn(norm(x))
            maps.append(a)
            x = x + y
            x = x + mlp(x)
        return self.head(x[:, 0]), maps


class FeaturesFirstTupleViT(TupleOutputViT):
    """Returns (features, logits): the logits are the second element."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[override]
        x = _tokens(self.patch_embed(x).flatten(2).transpose(1, 2), self.cls_token, self.pos_embed)
        for norm, attn, mlp in zip(self.norms, self.attns, self.mlps):
            x = x + attn(norm(x))[0]
            x = x + mlp(x)
        return x, self.head(x[:, 0])


class DictOutputViT(PerHeadViT):
    """Returns a dict whose class scores are not called 'logits'."""

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:  # type: ignore[override]
        x = self.patch_embed(x).flatten(2).transpose(1, 2)
        x = self.blocks(_tokens(x, self.cls_token, self.pos_embed))
        feats = self.norm(x[:, 0])
        return {"features": feats, "pred": self.fc(feats)}


class HFOutputViT(MnistLoopHeadsViT):
    """Returns a transformers ImageClassifierOutput."""

    def forward(self, x: torch.Tensor):  # noqa: ANN201
        from transformers.modeling_outputs import ImageClassifierOutput

        x = _tokens(self.patchify(x).flatten(2).transpose(1, 2), self.cls_token, self.pos_embedding)
        hidden = []
        for layer in self.layers:
            x = layer(x)
            hidden.append(x)
        return ImageClassifierOutput(logits=self.classifier(x[:, 0]), hidden_states=tuple(hidden))


class EmbeddingViT(nn.Module):
    """A contrastive image encoder: a 16-wide projection of the class token, L2-normalised -- an embedding, not
    16 classes."""

    def __init__(self, normalise: bool = True) -> None:
        super().__init__()
        self.normalise = normalise
        self.patch_embed = nn.Conv2d(3, DIM, 8, 8)
        self.cls_token = nn.Parameter(torch.randn(1, 1, DIM))
        self.pos_embed = nn.Parameter(torch.randn(1, 17, DIM) * 0.5)
        self.blocks = nn.ModuleList([EncoderBlock(EinsumAttention(DIM, 2)) for _ in range(2)])
        self.projection = nn.Linear(DIM, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = _tokens(self.patch_embed(x).flatten(2).transpose(1, 2), self.cls_token, self.pos_embed)
        for blk in self.blocks:
            x = blk(x)
        z = self.projection(x[:, 0])
        return F.normalize(z, dim=-1) if self.normalise else z


# ------------------------------------------------------------------------------------------------ torch modules


class MhaBlock(nn.Module):
    def __init__(self, pre_norm: bool, batch_first: bool, need_weights: bool) -> None:
        super().__init__()
        self.pre_norm, self.batch_first, self.need_weights = pre_norm, batch_first, need_weights
        self.norm1, self.norm2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.attn = nn.MultiheadAttention(DIM, 4, batch_first=batch_first)
        self.mlp = Mlp()

    def _attend(self, y: torch.Tensor) -> torch.Tensor:
        if EAGER:
            out, w = self.attn(y, y, y, need_weights=True, average_attn_weights=False)
            keep(w if self.batch_first else w)
            return out
        if self.need_weights:
            return self.attn(y, y, y)[0]        # the default: head-averaged weights, thrown away
        return self.attn(y, y, y, need_weights=False)[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.pre_norm:
            x = x + self._attend(self.norm1(x))
            return x + self.mlp(self.norm2(x))
        x = self.norm1(x + self._attend(x))
        return self.norm2(x + self.mlp(x))


class MhaPreNormViT(nn.Module):
    """CIFAR at 32 px, nn.MultiheadAttention (batch first, its weights asked for and thrown away), pre-norm."""

    def __init__(self) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, DIM, 4, 4)
        self.cls_token = nn.Parameter(torch.randn(1, 1, DIM))
        self.pos_embed = nn.Parameter(torch.randn(1, 65, DIM) * 0.5)
        self.blocks = nn.ModuleList([MhaBlock(True, True, True) for _ in range(2)])
        self.head = nn.Sequential(nn.LayerNorm(DIM), nn.Linear(DIM, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = _tokens(self.patch(x).flatten(2).transpose(1, 2), self.cls_token, self.pos_embed)
        for blk in self.blocks:
            x = blk(x)
        return self.head(x[:, 0])


class MhaPostNormViT(nn.Module):
    """nn.MultiheadAttention sequence-first (T, B, D), need_weights=False, post-norm, MNIST at 28 px."""

    def __init__(self) -> None:
        super().__init__()
        self.patch = nn.Conv2d(1, DIM, 7, 7)
        self.cls_token = nn.Parameter(torch.randn(1, 1, DIM))
        self.pos_embed = nn.Parameter(torch.randn(1, 17, DIM) * 0.5)
        self.blocks = nn.ModuleList([MhaBlock(False, False, False) for _ in range(2)])
        self.head = nn.Linear(DIM, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = _tokens(self.patch(x).flatten(2).transpose(1, 2), self.cls_token, self.pos_embed)
        x = x.transpose(0, 1)  # (T, B, D)
        for blk in self.blocks:
            x = blk(x)
        return self.head(x[0])


class TorchEncoderViT(nn.Module):
    """nn.TransformerEncoder, post-norm and ReLU (PyTorch's defaults), a class token."""

    def __init__(self, norm_first: bool = False) -> None:
        super().__init__()
        self.norm_first = norm_first
        self.patch = nn.Conv2d(3, DIM, 8, 8)
        self.cls = nn.Parameter(torch.randn(1, 1, DIM))
        self.pos = nn.Parameter(torch.randn(1, 17, DIM) * 0.5)
        layer = nn.TransformerEncoderLayer(DIM, 4, MLP, dropout=0.1, batch_first=True, norm_first=norm_first,
                                           activation="gelu" if norm_first else "relu")
        self.encoder = nn.TransformerEncoder(layer, 2, norm=nn.LayerNorm(DIM) if norm_first else None,
                                             enable_nested_tensor=False)
        self.head = nn.Linear(DIM, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = _tokens(self.patch(x).flatten(2).transpose(1, 2), self.cls, self.pos)
        with mha_weights(self) if EAGER else contextlib.nullcontext():
            x = self.encoder(x)
        return self.head(x.mean(1) if self.norm_first else x[:, 0])


class SdpaAttention(nn.Module):
    """F.scaled_dot_product_attention with a mask; `EAGER` writes the same attention out."""

    def __init__(self, dim: int, heads: int, mask: torch.Tensor) -> None:
        super().__init__()
        self.h = heads
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.register_buffer("mask", mask)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).reshape(b, t, 3, self.h, d // self.h).permute(2, 0, 3, 1, 4)
        if EAGER:
            s = q @ k.transpose(-2, -1) * (d // self.h) ** -0.5
            s = s.masked_fill(~self.mask, float("-inf")) if self.mask.dtype == torch.bool else s + self.mask
            attn = s.softmax(-1)
            keep(attn)
            o = attn @ v
        else:
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask)
        return self.proj(o.transpose(1, 2).reshape(b, t, d))


class SdpaMaskViT(nn.Module):
    """SDPA with a learned-looking additive float bias (H, T, T), or a bool mask that hides the patches from
    some rows; a class token; CIFAR at 32 px."""

    def __init__(self, kind: str = "float") -> None:
        super().__init__()
        g = torch.Generator().manual_seed(5)
        if kind == "float":
            mask = torch.randn(4, 17, 17, generator=g) * 0.5
        else:
            mask = (torch.rand(17, 17, generator=g) > 0.4) | torch.eye(17, dtype=torch.bool)
        self.patch_embed = nn.Conv2d(3, DIM, 8, 8)
        self.cls_token = nn.Parameter(torch.randn(1, 1, DIM))
        self.pos_embed = nn.Parameter(torch.randn(1, 17, DIM) * 0.5)
        self.blocks = nn.ModuleList([EncoderBlock(SdpaAttention(DIM, 4, mask)) for _ in range(2)])
        self.head = nn.Linear(DIM, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = _tokens(self.patch_embed(x).flatten(2).transpose(1, 2), self.cls_token, self.pos_embed)
        for blk in self.blocks:
            x = blk(x)
        return self.head(x[:, 0])


class Token0NoClsViT(nn.Module):
    """No class token: the first patch's token is pooled (x[:, 0]), SDPA attention, 16 tokens at 32 px."""

    def __init__(self) -> None:
        super().__init__()
        self.patch_embed = nn.Conv2d(3, DIM, 8, 8)
        self.pos_embed = nn.Parameter(torch.randn(1, 16, DIM) * 0.5)
        self.blocks = nn.ModuleList([EncoderBlock(SdpaAttention(DIM, 2, torch.zeros(16, 16))) for _ in range(3)])
        self.head = nn.Linear(DIM, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x).flatten(2).transpose(1, 2) + self.pos_embed
        for blk in self.blocks:
            x = blk(x)
        return self.head(x[:, 0])


# ------------------------------------------------------------------------------------------------ wrappers


class LitViT(nn.Module):
    """A LightningModule-style wrapper (`self.model`, training_step, configure_optimizers), written without
    Lightning; its checkpoints hold 'state_dict' with 'model.' keys."""

    def __init__(self) -> None:
        super().__init__()
        _seed(21)
        self.model = PerHeadViT()
        self.criterion = nn.CrossEntropyLoss()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], _index: int) -> torch.Tensor:
        x, y = batch
        return self.criterion(self(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


class LitTupleViT(LitViT):
    """The wrapper around a model that returns (logits, attention)."""

    def __init__(self) -> None:
        super().__init__()
        _seed(22)
        self.model = TupleOutputViT()  # type: ignore[assignment]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits, _maps = self.model(x)
        return logits


# ------------------------------------------------------------------------------------------------ factories


def _make(cls: type[nn.Module], seed: int, *args: object) -> nn.Module:
    _seed(seed)
    model = cls(*args)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():          # LayerNorms that are not the identity
        for m in model.modules():
            if isinstance(m, nn.LayerNorm):
                m.weight.add_(torch.randn(m.weight.shape, generator=g) * 0.2)
                m.bias.add_(torch.randn(m.bias.shape, generator=g) * 0.2)
    return model


def per_head() -> nn.Module: return _make(PerHeadViT, 1)
def mnist_loop_heads() -> nn.Module: return _make(MnistLoopHeadsViT, 2)
def shared_loop() -> nn.Module: return _make(SharedLoopViT, 3)
def einsum_unfold() -> nn.Module: return _make(EinsumUnfoldViT, 4)
def bmm() -> nn.Module: return _make(BmmViT, 5)
def mnist_linear_patch() -> nn.Module: return _make(MnistLinearPatchViT, 6)
def conv_stem() -> nn.Module: return _make(ConvStemViT, 7)
def registers() -> nn.Module: return _make(RegistersViT, 8)
def distilled() -> nn.Module: return _make(DistilledViT, 9)
def class_token_last() -> nn.Module: return _make(ClassTokenLastViT, 10)
def tuple_output() -> nn.Module: return _make(TupleOutputViT, 11)
def features_first_tuple() -> nn.Module: return _make(FeaturesFirstTupleViT, 12)
def dict_output() -> nn.Module: return _make(DictOutputViT, 13)
def hf_output() -> nn.Module: return _make(HFOutputViT, 14)
def embedding() -> nn.Module: return _make(EmbeddingViT, 15)
def projection() -> nn.Module: return _make(EmbeddingViT, 16, False)
def mha_pre_norm() -> nn.Module: return _make(MhaPreNormViT, 17)
def mha_post_norm() -> nn.Module: return _make(MhaPostNormViT, 18)
def torch_encoder() -> nn.Module: return _make(TorchEncoderViT, 19)
def torch_encoder_pre_norm() -> nn.Module: return _make(TorchEncoderViT, 20, True)
def sdpa_float_mask() -> nn.Module: return _make(SdpaMaskViT, 23, "float")
def sdpa_bool_mask() -> nn.Module: return _make(SdpaMaskViT, 24, "bool")
def token0_no_cls() -> nn.Module: return _make(Token0NoClsViT, 25)
def lightning() -> nn.Module: return _make(LitViT, 26)
def lightning_tuple() -> nn.Module: return _make(LitTupleViT, 27)
