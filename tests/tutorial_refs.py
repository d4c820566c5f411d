"""Reference models for the tutorial-layout parity tests: the ViTs people write themselves, in the styles their
checkpoints come in, each keeping (or giving access to) its eager per-head attention.

- `OldLucidrainsViT`: vit-pytorch's `ViT` as it was from the first gist (2020-10) to release 1.0 (2023-02),
  rebuilt from its history: `transformer.net` / `transformer.layers`, `Residual(PreNorm(...))` and `PreNorm`
  wrappers, `patch_to_embedding` / `to_patch_embedding` (with dual patchnorm), `dim ** -0.5` scaling,
  `mlp_head` with a hidden layer or a LayerNorm. (The current `ViT` and `SimpleViT` come from the installed
  `vit_pytorch` package.)
- `EncoderViT`: a ViT on `nn.TransformerEncoder`.
- `MhaViT`: `nn.MultiheadAttention` under its own names.
- `PerHeadViT`: one Linear per head for query, key and value (`attention.heads.H.query`), `output_projection`.
- `MyViT`: Brian Pulfer's "Vision Transformers from scratch" MNIST tutorial (github BrianPulfer/
  PapersReimplementations, `vit_torch.py`): per-head `q_mappings` / `k_mappings` / `v_mappings` ModuleLists of
  Linear(d_head, d_head), each applied to its head's slice of the token, softmaxes of (T, T) in Python loops over
  images and heads, a Linear `linear_mapper` over patches cut by loops in (c, p1, p2) order, a (1, D) `class_token`,
  a 1-D sin-cos table (a non-persistent buffer since 2022-09; before, the `pos_embed` Parameter with
  requires_grad=False, saved), and an `mlp` head ending in a Softmax. `MyViTFirst`: its first version (2022-02..09),
  one encoder block written out in the model, LayerNorms over the whole (T, D) sequence.
- `FlexViT`: separate or fused q/k/v, optional output projection, odd scales, no class token, mean pooling, two
  stacked final norms, `Linear -> act -> Linear` heads, a LayerNorm at the start of the MLP or the head, a Linear
  patch embedding over einops- or unfold-ordered patches, 1-channel 28 px inputs.

Every `*_reference(model, x)` returns (logits (1, C), [per-layer (1, H, T, T) attention]).
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from einops import rearrange
from einops.layers.torch import Rearrange
from torch import nn


# --------------------------------------------------------------------------------------- vit-pytorch, 2020-2023
class Residual(nn.Module):
    def __init__(self, fn: nn.Module) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x) + x


class PreNorm(nn.Module):
    def __init__(self, dim: int, fn: nn.Module) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(self.norm(x))


class LucAttention(nn.Module):
    """vit-pytorch's Attention of 2020-2021: no qkv bias, `to_out` a Linear or Sequential(Linear, Dropout)."""

    def __init__(self, dim: int, heads: int, dim_head: int, scale_by_dim: bool, out_seq: bool) -> None:
        super().__init__()
        inner = heads * dim_head
        self.heads = heads
        self.scale = dim ** -0.5 if scale_by_dim else dim_head ** -0.5
        self.to_qkv = nn.Linear(dim, inner * 3, bias=False)
        self.to_out = nn.Sequential(nn.Linear(inner, dim), nn.Dropout(0.0)) if out_seq else nn.Linear(inner, dim)
        self.attn: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = (rearrange(t, "b n (h d) -> b h n d", h=self.heads) for t in self.to_qkv(x).chunk(3, dim=-1))
        dots = torch.einsum("bhid,bhjd->bhij", q, k) * self.scale
        self.attn = dots.softmax(dim=-1)
        out = torch.einsum("bhij,bhjd->bhid", self.attn, v)
        return self.to_out(rearrange(out, "b h n d -> b n (h d)"))


class LucFeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int, dropouts: bool) -> None:
        super().__init__()
        layers = [nn.Linear(dim, hidden), nn.GELU()] + ([nn.Dropout(0.0)] if dropouts else []) + \
            [nn.Linear(hidden, dim)] + ([nn.Dropout(0.0)] if dropouts else [])
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class OldLucidrainsViT(nn.Module):
    """vit-pytorch's ViT by generation (the key layouts of checkpoint-formats.md §3.7):

    - 'gist' (2020-10-04): `patch_to_embedding`, `transformer.net` = flat Sequential of Residual(PreNorm(...)),
      `to_out` a Linear, FF `net.0`/`net.2`, `mlp_head` = Linear, GELU, Linear; scale dim ** -0.5; width = dim.
    - 'g0' (2020-10-10): `transformer.layers.N.0/1`, `mlp_head` = LayerNorm, Linear, GELU, Linear.
    - 'g0_late' (2021-02): `to_patch_embedding` = Sequential(Rearrange, Linear), dim_head, `to_out.0`, FF with
      dropouts (`net.0`/`net.3`), `mlp_head` = LayerNorm, Linear; scale dim_head ** -0.5.
    - 'g1' (2021-03 .. 2023-01): PreNorm without the Residual wrapper (`0.norm`, `0.fn.to_qkv`).
    - 'g2' (1.0.0, 2023-02): g1 + dual patchnorm (`to_patch_embedding.1` LN(patch), `.2` Linear, `.3` LN(dim)).
    """

    def __init__(self, gen: str, *, image: int = 32, patch: int = 8, dim: int = 48, depth: int = 2, heads: int = 2,
                 dim_head: int = 32, mlp: int = 64, classes: int = 5, channels: int = 3, pool: str = "cls") -> None:
        super().__init__()
        self.gen, self.patch, self.pool = gen, patch, pool
        n, k = (image // patch) ** 2, channels * patch * patch
        early = gen in ("gist", "g0")
        dim_head = dim // heads if early else dim_head
        self.pos_embedding = nn.Parameter(torch.randn(1, n + 1, dim))
        if early:
            self.patch_to_embedding = nn.Linear(k, dim)
        elif gen == "g2":
            self.to_patch_embedding = nn.Sequential(
                Rearrange("b c (h p1) (w p2) -> b (h w) (p1 p2 c)", p1=patch, p2=patch),
                nn.LayerNorm(k), nn.Linear(k, dim), nn.LayerNorm(dim))
        else:
            self.to_patch_embedding = nn.Sequential(
                Rearrange("b c (h p1) (w p2) -> b (h w) (p1 p2 c)", p1=patch, p2=patch), nn.Linear(k, dim))
        self.cls_token = nn.Parameter(torch.randn(1, 1, dim))

        def attn() -> nn.Module:
            return LucAttention(dim, heads, dim_head, scale_by_dim=early, out_seq=not gen == "gist")

        def ff() -> nn.Module:
            return LucFeedForward(dim, mlp, dropouts=gen != "gist")

        self.transformer = nn.Module()
        if gen == "gist":
            self.transformer.net = nn.Sequential(*[m for _ in range(depth) for m in (
                Residual(PreNorm(dim, attn())), Residual(PreNorm(dim, ff())))])
        elif gen in ("g0", "g0_late"):
            self.transformer.layers = nn.ModuleList(nn.ModuleList([Residual(PreNorm(dim, attn())),
                                                                   Residual(PreNorm(dim, ff()))]) for _ in range(depth))
        else:
            self.transformer.layers = nn.ModuleList(nn.ModuleList([PreNorm(dim, attn()), PreNorm(dim, ff())])
                                                    for _ in range(depth))
        if gen == "gist":
            self.mlp_head = nn.Sequential(nn.Linear(dim, mlp), nn.GELU(), nn.Linear(mlp, classes))
        elif gen == "g0":
            self.mlp_head = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, mlp), nn.GELU(), nn.Linear(mlp, classes))
        else:
            self.mlp_head = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, classes))

    def attentions(self) -> list[nn.Module]:
        return [m for m in self.modules() if isinstance(m, LucAttention)]

    def forward(self, img: torch.Tensor) -> torch.Tensor:
        p = self.patch
        if self.gen in ("gist", "g0"):
            x = self.patch_to_embedding(rearrange(img, "b c (h p1) (w p2) -> b (h w) (p1 p2 c)", p1=p, p2=p))
        else:
            x = self.to_patch_embedding(img)
        x = torch.cat((self.cls_token.expand(x.shape[0], -1, -1), x), dim=1) + self.pos_embedding
        if self.gen == "gist":
            x = self.transformer.net(x)
        else:
            for a, f in self.transformer.layers:
                x = a(x) if self.gen in ("g0", "g0_late") else a(x) + x
                x = f(x) if self.gen in ("g0", "g0_late") else f(x) + x
        x = x.mean(dim=1) if self.pool == "mean" else x[:, 0]
        return self.mlp_head(x)


def stored_attention_reference(model: nn.Module, x: torch.Tensor,
                               modules: list[nn.Module]) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Output and the `attn` each attention module kept during the forward pass."""
    with torch.no_grad():
        out = model(x)
    return out, [m.attn for m in modules]


def softmax_reference(model: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """vit-pytorch (ViT, SimpleViT): attention read where it leaves each `nn.Softmax` (`attend`)."""
    maps: list[torch.Tensor] = []
    hooks = [m.register_forward_hook(lambda _m, _i, o: maps.append(o.detach()))
             for m in model.modules() if isinstance(m, nn.Softmax)]
    try:
        with torch.no_grad():
            out = model(x)
    finally:
        for h in hooks:
            h.remove()
    return out, maps


# ---------------------------------------------------------------------------------- nn.TransformerEncoder ViT
class EncoderViT(nn.Module):
    """A ViT built on nn.TransformerEncoder (post-norm and ReLU unless asked otherwise, eps 1e-5)."""

    def __init__(self, *, norm_first: bool = False, activation: str = "relu", final_norm: bool = False,
                 image: int = 32, patch: int = 8, dim: int = 48, depth: int = 2, heads: int = 4, mlp: int = 96,
                 classes: int = 5) -> None:
        super().__init__()
        n = (image // patch) ** 2
        self.patch_embed = nn.Conv2d(3, dim, patch, patch)
        self.cls_token = nn.Parameter(torch.randn(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.randn(1, n + 1, dim))
        layer = nn.TransformerEncoderLayer(dim, heads, dim_feedforward=mlp, dropout=0.0, activation=activation,
                                           batch_first=True, norm_first=norm_first)
        self.transformer = nn.TransformerEncoder(layer, depth, norm=nn.LayerNorm(dim) if final_norm else None,
                                                 enable_nested_tensor=False)
        self.head = nn.Linear(dim, classes)

    def forward(self, img: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(img).flatten(2).transpose(1, 2)  # (B, D, gh, gw) -> (B, N, D)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        return self.head(self.transformer(x)[:, 0])


def mha_reference(model: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Models whose attention is nn.MultiheadAttention, called with need_weights=False (nn.TransformerEncoderLayer):
    each MHA is asked for its per-head weights, with autograd on so the encoder's fused fast path (which skips the
    MHA module) is not taken; the output is the same computation."""
    maps: list[torch.Tensor] = []
    patched = []
    for mha in [m for m in model.modules() if isinstance(m, nn.MultiheadAttention)]:
        orig = mha.forward

        def forward(q, k, v, *args, _orig=orig, **kw):  # noqa: ANN001, ANN002, ANN003
            kw.update(need_weights=True, average_attn_weights=False)
            out, w = _orig(q, k, v, *args, **kw)
            maps.append(w.detach())
            return out, w
        mha.forward = forward
        patched.append((mha, orig))
    try:
        with torch.enable_grad():
            out = model(x).detach()
    finally:
        for mha, orig in patched:
            mha.forward = orig
    return out, maps


# ------------------------------------------------------------------------------------------------ hand-written
class MhaBlock(nn.Module):
    def __init__(self, dim: int, heads: int, mlp: int) -> None:
        super().__init__()
        self.ln_a = nn.LayerNorm(dim)
        self.msa = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.ln_b = nn.LayerNorm(dim)
        self.ff = nn.Sequential(nn.Linear(dim, mlp), nn.GELU(), nn.Dropout(0.0), nn.Linear(mlp, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.ln_a(x)
        x = x + self.msa(y, y, y, need_weights=False)[0]
        return x + self.ff(self.ln_b(x))


class MhaViT(nn.Module):
    """nn.MultiheadAttention under its own names (`stem`, `class_token`, `pos_emb`, `encoder.N.msa`, `ff.0/3`),
    with the final LayerNorm either over all tokens (`ln`) or at the start of the head (`classifier.0`)."""

    def __init__(self, *, head_norm: bool = False, pos_2d: bool = False, image: int = 32, patch: int = 8,
                 dim: int = 48, depth: int = 2, heads: int = 4, mlp: int = 96, classes: int = 5) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, dim, patch, patch)
        self.class_token = nn.Parameter(torch.randn(1, 1, dim))
        g = image // patch
        self.pos_2d = pos_2d  # a (1, D, gh, gw) table added to the conv output; the class token gets none
        self.pos_emb = nn.Parameter(torch.randn(1, dim, g, g) if pos_2d else torch.randn(1, g * g + 1, dim))
        self.encoder = nn.ModuleList(MhaBlock(dim, heads, mlp) for _ in range(depth))
        self.head_norm = head_norm
        if head_norm:
            self.classifier = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, classes))
        else:
            self.ln = nn.LayerNorm(dim)
            self.classifier = nn.Linear(dim, classes)

    def forward(self, img: torch.Tensor) -> torch.Tensor:
        if self.pos_2d:
            x = (self.stem(img) + self.pos_emb).flatten(2).transpose(1, 2)
            x = torch.cat([self.class_token.expand(x.shape[0], -1, -1), x], dim=1)
        else:
            x = self.stem(img).flatten(2).transpose(1, 2)
            x = torch.cat([self.class_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_emb
        for block in self.encoder:
            x = block(x)
        return self.classifier(x[:, 0] if self.head_norm else self.ln(x)[:, 0])


class Head(nn.Module):
    """One attention head with its own query, key and value Linears (the from-scratch tutorial style)."""

    def __init__(self, dim: int, head_size: int) -> None:
        super().__init__()
        self.head_size = head_size
        self.query = nn.Linear(dim, head_size)
        self.key = nn.Linear(dim, head_size)
        self.value = nn.Linear(dim, head_size)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q, k, v = self.query(x), self.key(x), self.value(x)
        attn = torch.softmax(q @ k.transpose(-1, -2) / self.head_size ** 0.5, dim=-1)  # (B, T, T)
        return attn @ v, attn


class PerHeadAttention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = nn.ModuleList(Head(dim, dim // heads) for _ in range(heads))
        self.output_projection = nn.Linear(dim, dim)
        self.attn: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        outs = [h(x) for h in self.heads]
        self.attn = torch.stack([a for _, a in outs], dim=1)  # (B, H, T, T)
        return self.output_projection(torch.cat([o for o, _ in outs], dim=-1))


class PerHeadBlock(nn.Module):
    def __init__(self, dim: int, heads: int, mlp: int) -> None:
        super().__init__()
        self.layernorm_1 = nn.LayerNorm(dim)
        self.attention = PerHeadAttention(dim, heads)
        self.layernorm_2 = nn.LayerNorm(dim)
        self.mlp = nn.Module()
        self.mlp.dense_1 = nn.Linear(dim, mlp)
        self.mlp.dense_2 = nn.Linear(mlp, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.layernorm_1(x))
        return x + self.mlp.dense_2(F.gelu(self.mlp.dense_1(self.layernorm_2(x))))


class PerHeadViT(nn.Module):
    """The from-scratch tutorial layout: `embeddings.patch_embeddings.projection` (HF-like names),
    `encoder.blocks.N.attention.heads.H.query/key/value`, `attention.output_projection`, `mlp.dense_1/2`."""

    def __init__(self, *, image: int = 32, patch: int = 8, dim: int = 48, depth: int = 2, heads: int = 3,
                 mlp: int = 96, classes: int = 5) -> None:
        super().__init__()
        self.embeddings = nn.Module()
        self.embeddings.patch_embeddings = nn.Module()
        self.embeddings.patch_embeddings.projection = nn.Conv2d(3, dim, patch, patch)
        self.embeddings.cls_token = nn.Parameter(torch.randn(1, 1, dim))
        self.embeddings.position_embeddings = nn.Parameter(torch.randn(1, (image // patch) ** 2 + 1, dim))
        self.encoder = nn.Module()
        self.encoder.blocks = nn.ModuleList(PerHeadBlock(dim, heads, mlp) for _ in range(depth))
        self.classifier = nn.Linear(dim, classes)

    def attentions(self) -> list[nn.Module]:
        return [b.attention for b in self.encoder.blocks]

    def forward(self, img: torch.Tensor) -> torch.Tensor:
        e = self.embeddings
        x = e.patch_embeddings.projection(img).flatten(2).transpose(1, 2)
        x = torch.cat([e.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + e.position_embeddings
        for block in self.encoder.blocks:
            x = block(x)
        return self.classifier(x[:, 0])


class FlexAttention(nn.Module):
    def __init__(self, dim: int, heads: int, dim_head: int, kind: str, out_proj: bool, scale: str) -> None:
        super().__init__()
        inner = heads * dim_head
        self.h, self.dh, self.kind = heads, dim_head, kind
        if kind == "fused":
            self.qkv = nn.Linear(dim, 3 * inner)
        else:  # separate q / k / v modules without bias
            self.q, self.k, self.v = (nn.Linear(dim, inner, bias=False) for _ in range(3))
        self.proj = nn.Linear(inner, dim) if out_proj else nn.Identity()
        self.scale = {"head": dim_head ** -0.5, "dim": dim ** -0.5, "none": 1.0}[scale]
        self.attn: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1) if self.kind == "fused" else (self.q(x), self.k(x), self.v(x))
        q, k, v = (z.reshape(b, t, self.h, self.dh).transpose(1, 2) for z in (q, k, v))  # (B, H, T, hd)
        self.attn = torch.softmax(q @ k.transpose(-2, -1) * self.scale, dim=-1)
        return self.proj((self.attn @ v).transpose(1, 2).reshape(b, t, self.h * self.dh))


class FlexBlock(nn.Module):
    def __init__(self, dim: int, heads: int, dim_head: int, mlp: int, attn: str, out_proj: bool, scale: str,
                 act: type[nn.Module], mlp_norm_inside: bool) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = FlexAttention(dim, heads, dim_head, attn, out_proj, scale)
        self.inside = mlp_norm_inside
        if mlp_norm_inside:  # the MLP starts with its own LayerNorm; the block has no second norm
            self.mlp = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, mlp), act(), nn.Linear(mlp, dim))
        else:
            self.ln2 = nn.LayerNorm(dim)
            self.mlp = nn.Sequential(nn.Linear(dim, mlp), act(), nn.Dropout(0.0), nn.Linear(mlp, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(x if self.inside else self.ln2(x))


class FlexViT(nn.Module):
    """A hand-written ViT with a Linear patch embedding and the options people pick.

    Args:
        patches: 'einops' (`b c (h p1) (w p2) -> b (h w) (p1 p2 c)`) or 'unfold' ((c, p1, p2) order).
        attn: 'separate' (q / k / v modules) or 'fused' (`qkv`).
        scale: 'head' (head_dim ** -0.5), 'dim' (embed dim ** -0.5) or 'none'.
        cls: a class token in front; pool: 'token' (token 0, a patch without a class token) or 'mean'.
        final_norms: 0, 1 or 2 stacked LayerNorms over all tokens before pooling.
        head: 'linear', 'mlp' (Linear -> ReLU -> Linear) or 'ln_linear' (LayerNorm at the start of the head).
        pos_table: 'parameter' ((1, n, D)) or 'embedding' (an nn.Embedding(n, D) added row by row).
    """

    def __init__(self, *, image: int = 32, patch: int = 8, chans: int = 3, dim: int = 48, depth: int = 2,
                 heads: int = 3, dim_head: int = 16, mlp: int = 96, classes: int = 5, patches: str = "einops",
                 attn: str = "separate", out_proj: bool = True, scale: str = "head", cls: bool = True,
                 pool: str = "token", final_norms: int = 1, head: str = "linear", act: type[nn.Module] = nn.GELU,
                 mlp_norm_inside: bool = False, pos_table: str = "parameter") -> None:
        super().__init__()
        self.p, self.patches, self.pool = patch, patches, pool
        self.patch_embed = nn.Linear(chans * patch * patch, dim)
        self.cls_token = nn.Parameter(torch.randn(1, 1, dim)) if cls else None
        n = (image // patch) ** 2 + int(cls)
        self.pos_embed = nn.Embedding(n, dim) if pos_table == "embedding" else nn.Parameter(torch.randn(1, n, dim))
        self.blocks = nn.ModuleList(FlexBlock(dim, heads, dim_head, mlp, attn, out_proj, scale, act, mlp_norm_inside)
                                    for _ in range(depth))
        self.final = nn.Sequential(*[nn.LayerNorm(dim) for _ in range(final_norms)])
        if head == "mlp":
            self.head = nn.Sequential(nn.Linear(dim, 32), nn.ReLU(), nn.Linear(32, classes))
        elif head == "ln_linear":
            self.head = nn.Sequential(nn.LayerNorm(dim), nn.Linear(dim, classes))
        else:
            self.head = nn.Linear(dim, classes)

    def attentions(self) -> list[nn.Module]:
        return [b.attn for b in self.blocks]

    def forward(self, img: torch.Tensor) -> torch.Tensor:
        p = self.p
        if self.patches == "einops":
            x = rearrange(img, "b c (h p1) (w p2) -> b (h w) (p1 p2 c)", p1=p, p2=p)
        else:
            x = F.unfold(img, p, stride=p).transpose(1, 2)  # (B, C*P*P, N) -> (B, N, C*P*P)
        x = self.patch_embed(x)
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        x = x + (self.pos_embed.weight[None] if isinstance(self.pos_embed, nn.Embedding) else self.pos_embed)
        for block in self.blocks:
            x = block(x)
        x = self.final(x)
        return self.head(x.mean(dim=1) if self.pool == "mean" else x[:, 0])


# --------------------------------------------------------------------------- "Vision Transformers from scratch"
def patchify(images: torch.Tensor, n_patches: int) -> torch.Tensor:
    """The tutorial's patchify: (N, C, H, W) -> (N, n_patches**2, C*P*P), each patch flattened in (c, p1, p2)
    order, patches row by row."""
    n, c, h, w = images.shape
    assert h == w, "Patchify method is implemented for square images only"
    patches = torch.zeros(n, n_patches ** 2, h * w * c // n_patches ** 2)
    patch_size = h // n_patches
    for idx, image in enumerate(images):
        for i in range(n_patches):
            for j in range(n_patches):
                patch = image[:, i * patch_size:(i + 1) * patch_size, j * patch_size:(j + 1) * patch_size]
                patches[idx, i * n_patches + j] = patch.flatten()
    return patches


def get_positional_embeddings(sequence_length: int, d: int) -> torch.Tensor:
    """The tutorial's 1-D sin-cos table (T, D): sin(i / 10000^(j/d)) at even j, cos(i / 10000^((j-1)/d)) at odd j."""
    result = torch.ones(sequence_length, d)
    for i in range(sequence_length):
        for j in range(d):
            result[i][j] = np.sin(i / (10000 ** (j / d))) if j % 2 == 0 else np.cos(i / (10000 ** ((j - 1) / d)))
    return result


class MyMSA(nn.Module):
    """One Linear(d_head, d_head) per head for q, k and v, each applied to its head's slice of the token; a (T, T)
    softmax per image per head."""

    def __init__(self, d: int, n_heads: int = 2) -> None:
        super().__init__()
        self.d, self.n_heads = d, n_heads
        assert d % n_heads == 0, f"Can't divide dimension {d} into {n_heads} heads"
        d_head = int(d / n_heads)
        self.q_mappings = nn.ModuleList([nn.Linear(d_head, d_head) for _ in range(self.n_heads)])
        self.k_mappings = nn.ModuleList([nn.Linear(d_head, d_head) for _ in range(self.n_heads)])
        self.v_mappings = nn.ModuleList([nn.Linear(d_head, d_head) for _ in range(self.n_heads)])
        self.d_head = d_head
        self.softmax = nn.Softmax(dim=-1)

    def forward(self, sequences: torch.Tensor) -> torch.Tensor:
        result = []
        for sequence in sequences:
            seq_result = []
            for head in range(self.n_heads):
                q_mapping, k_mapping, v_mapping = self.q_mappings[head], self.k_mappings[head], self.v_mappings[head]
                seq = sequence[:, head * self.d_head:(head + 1) * self.d_head]
                q, k, v = q_mapping(seq), k_mapping(seq), v_mapping(seq)
                attention = self.softmax(q @ k.T / (self.d_head ** 0.5))  # (T, T)
                seq_result.append(attention @ v)
            result.append(torch.hstack(seq_result))
        return torch.cat([torch.unsqueeze(r, dim=0) for r in result])


class MyViTBlock(nn.Module):
    def __init__(self, hidden_d: int, n_heads: int, mlp_ratio: int = 4) -> None:
        super().__init__()
        self.hidden_d, self.n_heads = hidden_d, n_heads
        self.norm1 = nn.LayerNorm(hidden_d)
        self.mhsa = MyMSA(hidden_d, n_heads)
        self.norm2 = nn.LayerNorm(hidden_d)
        self.mlp = nn.Sequential(nn.Linear(hidden_d, mlp_ratio * hidden_d), nn.GELU(),
                                 nn.Linear(mlp_ratio * hidden_d, hidden_d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = x + self.mhsa(self.norm1(x))
        return out + self.mlp(self.norm2(out))


class MyViT(nn.Module):
    """The tutorial's model (`chw` = (C, H, W)); `pos_param=True` is its 2022-02..09 version, whose table was the
    `pos_embed` Parameter with requires_grad=False (in the state dict), else the non-persistent buffer
    `positional_embeddings` (not saved)."""

    def __init__(self, chw: tuple[int, int, int], n_patches: int = 7, n_blocks: int = 2, hidden_d: int = 8,
                 n_heads: int = 2, out_d: int = 10, pos_param: bool = False) -> None:
        super().__init__()
        self.chw, self.n_patches, self.n_blocks, self.n_heads, self.hidden_d = chw, n_patches, n_blocks, n_heads, \
            hidden_d
        assert chw[1] % n_patches == 0 and chw[2] % n_patches == 0
        self.patch_size = (chw[1] / n_patches, chw[2] / n_patches)
        self.input_d = int(chw[0] * self.patch_size[0] * self.patch_size[1])
        self.linear_mapper = nn.Linear(self.input_d, self.hidden_d)
        self.class_token = nn.Parameter(torch.rand(1, self.hidden_d))
        self.pos_param = pos_param
        if pos_param:
            self.pos_embed = nn.Parameter(get_positional_embeddings(n_patches ** 2 + 1, hidden_d).clone())
            self.pos_embed.requires_grad = False
        else:
            self.register_buffer("positional_embeddings", get_positional_embeddings(n_patches ** 2 + 1, hidden_d),
                                 persistent=False)
        self.blocks = nn.ModuleList([MyViTBlock(hidden_d, n_heads) for _ in range(n_blocks)])
        self.mlp = nn.Sequential(nn.Linear(self.hidden_d, out_d), nn.Softmax(dim=-1))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        n, c, h, w = images.shape
        table = self.pos_embed if self.pos_param else self.positional_embeddings
        patches = patchify(images, self.n_patches).to(table.device)
        tokens = self.linear_mapper(patches)
        tokens = torch.cat((self.class_token.expand(n, 1, -1), tokens), dim=1)
        out = tokens + table.repeat(n, 1, 1)
        for block in self.blocks:
            out = block(out)
        out = out[:, 0]
        return self.mlp(out)


def my_vit_reference(model: MyViT, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """(probabilities (B, C) -- the tutorial's output --, the logits before its Softmax (B, C), per-layer
    (B, H, T, T) attention): each block's `mhsa.softmax` is called once per image per head, in that order."""
    calls: dict[int, list[torch.Tensor]] = {i: [] for i in range(len(model.blocks))}
    logits: list[torch.Tensor] = []
    hooks = [b.mhsa.softmax.register_forward_hook(lambda _m, _i, o, i=i: calls[i].append(o.detach()))
             for i, b in enumerate(model.blocks)]
    hooks.append(model.mlp[0].register_forward_hook(lambda _m, _i, o: logits.append(o.detach())))
    try:
        with torch.no_grad():
            out = model(x)
    finally:
        for h in hooks:
            h.remove()
    b, heads = x.shape[0], model.n_heads
    maps = [torch.stack(calls[i]).reshape(b, heads, *calls[i][0].shape) for i in calls]  # (B*H, T, T) -> (B, H, T, T)
    return out, logits[0], maps


class MyViTFirst(nn.Module):
    """The tutorial's first version (2022-02 .. 2022-09): one encoder block at the top level, its LayerNorms over
    the whole (T, D) token sequence (`ln1`, `ln2`), `enc_mlp` = Linear(D, D) -> ReLU, the 1-D sin-cos table computed
    in the forward (never saved), patches of one channel."""

    def __init__(self, input_shape: tuple[int, int, int], n_patches: int = 7, hidden_d: int = 8, n_heads: int = 2,
                 out_d: int = 10) -> None:
        super().__init__()
        self.input_shape, self.n_patches, self.n_heads, self.hidden_d = input_shape, n_patches, n_heads, hidden_d
        self.patch_size = (input_shape[1] / n_patches, input_shape[2] / n_patches)
        self.input_d = int(input_shape[0] * self.patch_size[0] * self.patch_size[1])
        self.linear_mapper = nn.Linear(self.input_d, self.hidden_d)
        self.class_token = nn.Parameter(torch.rand(1, self.hidden_d))
        self.ln1 = nn.LayerNorm((self.n_patches ** 2 + 1, self.hidden_d))
        self.msa = MyMSA(self.hidden_d, n_heads)
        self.ln2 = nn.LayerNorm((self.n_patches ** 2 + 1, self.hidden_d))
        self.enc_mlp = nn.Sequential(nn.Linear(self.hidden_d, self.hidden_d), nn.ReLU())
        self.mlp = nn.Sequential(nn.Linear(self.hidden_d, out_d), nn.Softmax(dim=-1))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        n = images.shape[0]
        tokens = self.linear_mapper(patchify(images, self.n_patches))
        tokens = torch.stack([torch.vstack((self.class_token, tokens[i])) for i in range(len(tokens))])
        tokens = tokens + get_positional_embeddings(self.n_patches ** 2 + 1, self.hidden_d).repeat(n, 1, 1)
        out = tokens + self.msa(self.ln1(tokens))
        out = out + self.enc_mlp(self.ln2(out))
        return self.mlp(out[:, 0])
