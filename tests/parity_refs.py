"""Reference implementations for the parity tests: build the original model, perturb it, get its eager attention.

Every `*_reference` returns (logits_or_features (1, C), [per-layer (1, H, T, T) attention]).
"""
from __future__ import annotations

import sys
import warnings
from collections import OrderedDict
from typing import Any, Callable

import torch
from torch import nn


def perturb(model: nn.Module, std: float = 0.05, seed: int = 0) -> nn.Module:
    """Move every parameter (LayerNorm weights and biases, layer scale, tokens) away from its initial value."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * std)
    return model.eval()


def timm_reference(model: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """timm with fused attention switched off; attention read at `attn_drop` (identity in eval)."""
    for blk in model.blocks:
        blk.attn.fused_attn = False
    return attn_drop_reference(model, x)


def recorded_forward(model: nn.Module, x: torch.Tensor, modules: list[nn.Module], read=None,
                     before: bool = False) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The model's output (no grad) and, per call of each of `modules` in the order they run, what it gave
    (`before`: what it was given), or `read(module)` of the module after its call; the hooks are removed after."""
    maps: list[torch.Tensor] = []
    if before:
        hooks = [m.register_forward_pre_hook(lambda _m, a: maps.append(a[0].detach().clone())) for m in modules]
    else:
        def kept(m: nn.Module, _i: object, o: torch.Tensor) -> None:
            maps.append(o.detach() if read is None else read(m).detach().clone())

        hooks = [m.register_forward_hook(kept) for m in modules]
    try:
        with torch.no_grad():
            out = model(x)
    finally:
        for h in hooks:
            h.remove()
    return out, maps


def attn_drop_reference(model: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The model's output and every block's softmax, read where it enters `attn.attn_drop` (identity in eval):
    timm and the original DINOv2 code both compute attention explicitly there."""
    return recorded_forward(model, x, [m for name, m in model.named_modules() if name.endswith("attn.attn_drop")])


def torchvision_reference(model: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """torchvision calls MHA with need_weights=False; ask each layer for its per-head weights instead."""
    maps: list[torch.Tensor] = []
    originals = []
    for layer in model.encoder.layers:
        mha = layer.self_attention
        orig = mha.forward
        originals.append((mha, orig))

        def forward(q, k, v, need_weights=False, _orig=orig, **kw):  # noqa: ANN001
            out, w = _orig(q, k, v, need_weights=True, average_attn_weights=False, **kw)
            maps.append(w.detach())
            return out, w
        mha.forward = forward
    try:
        with torch.no_grad():
            out = model(x)
    finally:
        for mha, orig in originals:
            mha.forward = orig
    return out, maps


def hf_reference(model: nn.Module, x: torch.Tensor, **kw) -> tuple[torch.Tensor, list[torch.Tensor]]:
    with torch.no_grad():
        out = model(pixel_values=x, output_attentions=True, **kw)
    logits = out.logits if hasattr(out, "logits") else out.last_hidden_state[:, 0]
    return logits, list(out.attentions)


class SeedBlock(nn.Module):
    """The tutorial's pre-norm block (seeds/004): nn.MultiheadAttention, default LayerNorm eps."""

    def __init__(self, dim: int, heads: int, mlp_dim: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attention = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp_dim), nn.GELU(), nn.Linear(mlp_dim, dim))
        self.weights: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.norm1(x)
        y, self.weights = self.attention(y, y, y, average_attn_weights=False)
        x = x + y
        return x + self.mlp(self.norm2(x))


class SeedViT(nn.Module):
    """The tutorial's tiny ViT: single-channel 8x8 digits, patch 2, dim 64, 4 heads."""

    def __init__(self, image_size: int = 8, patch_size: int = 2, in_channels: int = 1, num_classes: int = 10,
                 dim: int = 64, depth: int = 2, heads: int = 4, mlp_dim: int = 128) -> None:
        super().__init__()
        self.grid = image_size // patch_size
        self.patch_embedding = nn.Conv2d(in_channels, dim, patch_size, patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.position_embedding = nn.Parameter(torch.zeros(1, self.grid ** 2 + 1, dim))
        self.blocks = nn.ModuleList(SeedBlock(dim, heads, mlp_dim) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embedding(x).flatten(2).transpose(1, 2)  # (N, G*G, E)
        x = torch.cat([self.cls_token.expand(x.size(0), -1, -1), x], dim=1) + self.position_embedding
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x)[:, 0])


def seed_reference(model: SeedViT, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    with torch.no_grad():
        out = model(x)
    return out, [b.weights for b in model.blocks]


class WZViT(nn.Module):
    """The old-timm / WZ educational ViT walked through in seeds/000, with `pre_logits` (Dense + Tanh)."""

    def __init__(self, img: int = 32, patch: int = 8, dim: int = 192, depth: int = 2, heads: int = 3,
                 classes: int = 5, representation_size: int = 96) -> None:
        super().__init__()
        import timm

        self.inner = timm.models.vision_transformer.VisionTransformer(
            img_size=img, patch_size=patch, embed_dim=dim, depth=depth, num_heads=heads, num_classes=0)
        self.pre_logits = nn.Sequential(OrderedDict([("fc", nn.Linear(dim, representation_size)),
                                                     ("act", nn.Tanh())]))
        self.head = nn.Linear(representation_size, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.pre_logits(self.inner(x)))

    def state_dict_wz(self) -> dict[str, torch.Tensor]:
        sd = {k: v for k, v in self.inner.state_dict().items()}
        sd.update({f"pre_logits.{k}": v for k, v in self.pre_logits.state_dict().items()})
        sd.update({f"head.{k}": v for k, v in self.head.state_dict().items()})
        return sd


def hf_dinov2_to_original(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Invert transformers' convert_dinov2_to_hf.py: HF Dinov2Model keys -> the original DINOv2 hub layout."""
    out: dict[str, torch.Tensor] = {}
    for k, v in sd.items():
        k = k.replace("embeddings.patch_embeddings.projection", "patch_embed.proj")
        k = k.replace("embeddings.position_embeddings", "pos_embed").replace("embeddings.cls_token", "cls_token")
        k = k.replace("embeddings.mask_token", "mask_token").replace("embeddings.register_tokens", "register_tokens")
        k = k.replace("encoder.layer.", "blocks.").replace("attention.output.dense", "attn.proj")
        k = k.replace("layer_scale1.lambda1", "ls1.gamma").replace("layer_scale2.lambda1", "ls2.gamma")
        k = k.replace("mlp.weights_in", "mlp.w12").replace("mlp.weights_out", "mlp.w3")
        k = k.replace("layernorm.", "norm.") if k.startswith("layernorm.") else k
        out[k] = v
    for i in sorted({int(k.split(".")[1]) for k in out if k.startswith("blocks.")}):
        base = f"blocks.{i}.attention.attention."
        for kind in ("weight", "bias"):
            out[f"blocks.{i}.attn.qkv.{kind}"] = torch.cat([out.pop(f"{base}{n}.{kind}") for n in ("query", "key", "value")])
    if "mask_token" in out:
        out["mask_token"] = out["mask_token"].reshape(1, -1)
    return out


def built_once(built: dict[str, nn.Module], name: str, build: Callable[[], nn.Module],
               part: Callable[[nn.Module], nn.Module] | None = None) -> nn.Module:
    """`build()` made once per test module (kept in `built` under `name`), in eval mode, seeded, its construction
    warnings silenced; with `part`, that part's weights moved far from their initialisation (attention that is not
    near-uniform)."""
    if name not in built:
        torch.manual_seed(0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = build().eval()
        if part is not None:
            with torch.no_grad():
                for i, p in enumerate(part(model).parameters()):
                    p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(i)) * 0.2)
        built[name] = model
    return built[name]


def eager_recorder(record: list[torch.Tensor]) -> Callable[..., Any]:
    """An attention function for transformers' `AttentionInterface`: the module's modeling file's own eager attention,
    each call's weights (the first image's) appended to `record`."""
    def recorded(module: Any, query: Any, key: Any, value: Any, attention_mask: Any = None, **kwargs: Any) -> Any:
        out, weights = sys.modules[type(module).__module__].eager_attention_forward(
            module, query, key, value, attention_mask, **kwargs)
        record.append(weights[0].detach().float().clone())
        return out, weights
    return recorded
