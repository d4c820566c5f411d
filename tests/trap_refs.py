"""Originals for the assumption traps (tests/core/reading/test_hyperparams.py): tiny ViTs (dim 32, depth 2) written the
ways people write them, each with one switch that no tensor shows, so that two models differing in that switch
alone are saved as the same bytes.

- `TrapViT`: a hand-written ViT under its own names (`to_patch.conv`, `cls`, `pos`, `layers.N.ln_a / att.to_qkv /
  att.out / ln_b / ff.N`, `ln_f`, `head`), with the switches people set in their own code: the norm order
  ('pre', 'post', or 'res_post': each sub-layer's output normed inside the residual), the MLP activation, the
  blocks' and the final norm's eps, the attention scale, the class token in front of the patches or appended
  after them (and pooled from there), a LayerNorm at the start of the MLP besides the block's own, and a
  two-stage patch embedding (a Conv2d, then a Linear).
- `chefer_vit`: a timm-named ViT whose blocks use eps 1e-6 and whose final norm an `nn.LayerNorm` (1e-5), as the
  Transformer-Explainability code builds it.
- `relu_vit_pytorch`: vit-pytorch's `ViT` with its FeedForward's GELU swapped for ReLU, as an edited copy has it.

Each keeps its eager per-head attention (`attentions()`: modules with `.attn`), for `stored_attention_reference`.
"""
from __future__ import annotations

import torch
from torch import nn

DIM, DEPTH, HEADS, PATCH, IMAGE, CLASSES, MLP = 32, 2, 2, 8, 32, 5, 64


class TrapAttention(nn.Module):
    """Fused q/k/v, explicit softmax, scaled by `scale` (head_dim ** -0.5 when None)."""

    def __init__(self, dim: int, heads: int, scale: float | None) -> None:
        super().__init__()
        self.heads = heads
        self.scale = (dim // heads) ** -0.5 if scale is None else scale
        self.to_qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)
        self.attn: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.to_qkv(x).reshape(b, t, 3, self.heads, -1).permute(2, 0, 3, 1, 4)  # (3, B, H, T, hd)
        self.attn = (q @ k.transpose(-2, -1) * self.scale).softmax(dim=-1)
        return self.out((self.attn @ v).transpose(1, 2).reshape(b, t, -1))  # (B, H, T, hd) -> (B, T, D)


class TrapLayer(nn.Module):
    def __init__(self, norm: str, act: type[nn.Module] | object, eps: float, scale: float | None,
                 mlp_ln: bool) -> None:
        super().__init__()
        self.norm = norm
        self.ln_a = nn.LayerNorm(DIM, eps=eps)
        self.att = TrapAttention(DIM, HEADS, scale)
        self.ln_b = nn.LayerNorm(DIM, eps=eps)
        ff: list[nn.Module] = [nn.Linear(DIM, MLP), act(), nn.Linear(MLP, DIM)]  # type: ignore[operator]
        self.ff = nn.Sequential(*([nn.LayerNorm(DIM, eps=eps)] if mlp_ln else []), *ff)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.norm == "post":  # norm(x + f(x)), nn.TransformerEncoderLayer's default
            x = self.ln_a(x + self.att(x))
            return self.ln_b(x + self.ff(x))
        if self.norm == "res_post":  # x + norm(f(x)), timm ResPostBlock / Swin v2
            x = x + self.ln_a(self.att(x))
            return x + self.ln_b(self.ff(x))
        x = x + self.att(self.ln_a(x))
        return x + self.ff(self.ln_b(x))


class TrapViT(nn.Module):
    """A hand-written ViT: see the module docstring for the switches."""

    def __init__(self, *, norm: str = "pre", act: type[nn.Module] | object = nn.GELU, eps: float = 1e-5,
                 eps_final: float | None = None, scale: float | None = None, cls_last: bool = False,
                 mlp_ln: bool = False, two_stage: int = 0) -> None:
        super().__init__()
        self.cls_last, self.two_stage = cls_last, two_stage
        self.to_patch = nn.Module()
        if two_stage:  # Conv2d (D', 3, P, P) then Linear (D, D')
            self.to_patch.conv = nn.Conv2d(3, two_stage, PATCH, PATCH)
            self.to_patch.lin = nn.Linear(two_stage, DIM)
        else:
            self.to_patch.conv = nn.Conv2d(3, DIM, PATCH, PATCH)
        n = (IMAGE // PATCH) ** 2
        self.cls = nn.Parameter(torch.randn(1, 1, DIM))
        self.pos = nn.Parameter(torch.randn(1, n + 1, DIM))
        self.layers = nn.ModuleList(TrapLayer(norm, act, eps, scale, mlp_ln) for _ in range(DEPTH))
        self.ln_f = nn.LayerNorm(DIM, eps=eps if eps_final is None else eps_final)
        self.head = nn.Linear(DIM, CLASSES)

    def attentions(self) -> list[nn.Module]:
        return [layer.att for layer in self.layers]

    def forward(self, img: torch.Tensor) -> torch.Tensor:
        x = self.to_patch.conv(img).flatten(2).transpose(1, 2)  # (B, D', gh, gw) -> (B, N, D')
        if self.two_stage:
            x = self.to_patch.lin(x)
        cls = self.cls.expand(x.shape[0], -1, -1)
        x = torch.cat([x, cls] if self.cls_last else [cls, x], dim=1) + self.pos
        for layer in self.layers:
            x = layer(x)
        x = self.ln_f(x)
        return self.head(x[:, -1] if self.cls_last else x[:, 0])


def timm_vit(**kw: object) -> nn.Module:
    """timm's VisionTransformer at the traps' size (32 px, patch 8, dim 32, depth 2, 2 heads, 5 classes)."""
    import timm

    args = dict(pretrained=False, num_classes=CLASSES, img_size=IMAGE, patch_size=PATCH, embed_dim=DIM,
                depth=DEPTH, num_heads=HEADS)
    args.update(kw)
    return timm.create_model(str(args.pop("name", "vit_tiny_patch16_224")), **args)


def chefer_vit(final_eps: float = 1e-5) -> nn.Module:
    """Transformer-Explainability's ViT (Chefer et al.): timm's key names and eps 1e-6 in the blocks, but the
    final norm an `nn.LayerNorm(embed_dim)` with its default eps."""
    model = timm_vit()
    norm = nn.LayerNorm(DIM, eps=final_eps)
    norm.load_state_dict(model.norm.state_dict())
    model.norm = norm
    return model


def relu_vit_pytorch(relu: bool = True) -> nn.Module:
    """vit-pytorch's ViT, its FeedForward's GELU swapped for ReLU (an edited copy of the code) when `relu`."""
    from vit_pytorch import ViT

    model = ViT(image_size=IMAGE, patch_size=PATCH, num_classes=CLASSES, dim=DIM, depth=DEPTH, heads=HEADS,
                mlp_dim=MLP, dim_head=16)
    if relu:
        for module in model.modules():
            if isinstance(module, nn.Sequential):
                for i, child in enumerate(module):
                    if isinstance(child, nn.GELU):
                        module[i] = nn.ReLU()
    return model
