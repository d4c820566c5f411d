"""JAX / Flax ViT checkpoints (`.npz`): Google's vit_jax (`Transformer/encoderblock_N/...`, optionally under
`opt/target/`) and big_vision (`params/...`, SigLIP image towers under `params/img/`, scanned blocks with a leading
depth axis, the MAP head `MAPHead_0`).

The key table and transforms are timm's `_load_weights` (vision_transformer.py) read backwards: kernels are
(in, out) and become (out, in); the attention kernels (D, H, hd) give the head count outright; the patch kernel
is HWIO. No JAX is needed: `vitviz.core.reading.npz` reads the archive with NumPy.
"""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from vitviz.core.reading.families.base import Converted, Hint, Recipe
from vitviz.core.spec import INCEPTION_MEAN, INCEPTION_STD
from vitviz.errors import InconsistentCheckpointError, UnknownLayoutError

if TYPE_CHECKING:
    import torch
    from vitviz.core.reading.checkpoint import RawCheckpoint

NAMES = ("jax", "jax-siglip")
DETECT_ORDER = 90   # detection tries the families in this order, lowest first
# What this family knows beyond its keys (read by `vitviz.core.reading.families`: see there).
HELP = "JAX / big_vision .npz"
PREPROCESS = {"jax": Recipe(0.875, "bilinear", INCEPTION_MEAN, INCEPTION_STD, "center"),
              "jax-siglip": Recipe(1.0, "bicubic", INCEPTION_MEAN, INCEPTION_STD, "squash")}
REGISTERED_SIZES = True
PREFIXES = ("opt/target/", "params/img/", "params/", "")


def _prefix(keys: set[str]) -> str | None:
    for p in PREFIXES:
        if f"{p}embedding/kernel" in keys:
            return p
    return None


def detect(keys: set[str], raw: RawCheckpoint) -> str | None:
    return "jax" if _prefix(keys) is not None and any("Transformer/" in k for k in keys) else None


def convert(sd: dict[str, torch.Tensor], raw: RawCheckpoint, family: str | None = None,
            overrides: dict[str, Any] | None = None) -> Converted:
    import torch

    keys = set(sd)
    p = _prefix(keys)
    if p is None:
        raise UnknownLayoutError(f"{raw.path}: an .npz without `embedding/kernel`; expected a vit_jax / big_vision "
                                 "ViT checkpoint")
    if f"{p}conv_root/kernel" in keys:
        raise UnknownLayoutError(f"{raw.path}: a hybrid ResNet + ViT (conv_root, block*/unit*); only plain ViTs are "
                                 "supported")
    scanned = f"{p}Transformer/encoderblock/LayerNorm_0/scale" in keys
    big_vision = p.startswith("params/") or f"{p}pos_embedding" in keys or scanned
    mha, mlp, ln2 = (0, 0, 1) if big_vision else (1, 3, 2)

    def get(name: str) -> torch.Tensor:
        if f"{p}{name}" not in sd:
            raise InconsistentCheckpointError(f"{raw.path}: missing {p}{name}; expected a complete JAX ViT")
        return sd[f"{p}{name}"]

    out: dict[str, torch.Tensor] = {}
    kernel = get("embedding/kernel")
    if kernel.ndim != 4:
        raise UnknownLayoutError(f"{raw.path}: patch kernel of shape {tuple(kernel.shape)}; expected (P, P, C, D) "
                                 "(a NaFlex Dense patch embedding is not supported)")
    out["patch_embed.proj.weight"] = kernel.permute(3, 2, 0, 1).contiguous()  # (P, P, C, D) HWIO -> (D, C, P, P)
    if f"{p}embedding/bias" in keys:
        out["patch_embed.proj.bias"] = get("embedding/bias")
    if f"{p}cls" in keys:
        out["cls_token"] = get("cls").reshape(1, 1, -1)
    pos = sd.get(f"{p}pos_embedding" if big_vision else f"{p}Transformer/posembed_input/pos_embedding")
    if pos is None:
        pos = sd.get(f"{p}Transformer/posembed_input/pos_embedding", sd.get(f"{p}pos_embedding"))
    if pos is not None:
        out["pos_embed"] = pos.reshape(1, -1, pos.shape[-1])  # (1, L, D)
    out["norm.weight"], out["norm.bias"] = get("Transformer/encoder_norm/scale"), get("Transformer/encoder_norm/bias")
    if f"{p}head/kernel" in keys:
        out["head.weight"], out["head.bias"] = get("head/kernel").t().contiguous(), get("head/bias")
    if f"{p}pre_logits/kernel" in keys:
        out["pre_logits.fc.weight"] = get("pre_logits/kernel").t().contiguous()
        out["pre_logits.fc.bias"] = get("pre_logits/bias")
    if scanned:
        depth = int(get("Transformer/encoderblock/LayerNorm_0/scale").shape[0])
    else:
        depth = len({int(m.group(1)) for k in keys if (m := re.match(re.escape(p) + r"Transformer/encoderblock_(\d+)/",
                                                                       k))})
    heads = 0
    for i in range(depth):
        base, idx = (("Transformer/encoderblock/", i) if scanned else (f"Transformer/encoderblock_{i}/", None))

        def blk(name: str) -> torch.Tensor:
            t = get(base + name)
            return t[idx] if idx is not None else t

        att = f"MultiHeadDotProductAttention_{mha}/"
        b = f"blocks.{i}."
        out[b + "norm1.weight"], out[b + "norm1.bias"] = blk("LayerNorm_0/scale"), blk("LayerNorm_0/bias")
        qkv = [blk(f"{att}{n}/kernel") for n in ("query", "key", "value")]  # (D, H, hd) each
        heads = int(qkv[0].shape[1])
        out[b + "attn.qkv.weight"] = torch.cat([k.flatten(1).t() for k in qkv])  # (3A, D)
        out[b + "attn.qkv.bias"] = torch.cat([blk(f"{att}{n}/bias").reshape(-1) for n in ("query", "key", "value")])
        out[b + "attn.proj.weight"] = blk(f"{att}out/kernel").permute(2, 0, 1).flatten(1)  # (H, hd, D) -> (D, A)
        out[b + "attn.proj.bias"] = blk(f"{att}out/bias")
        out[b + "norm2.weight"], out[b + "norm2.bias"] = blk(f"LayerNorm_{ln2}/scale"), blk(f"LayerNorm_{ln2}/bias")
        for r in range(2):
            out[b + f"mlp.fc{r + 1}.weight"] = blk(f"MlpBlock_{mlp}/Dense_{r}/kernel").t().contiguous()
            out[b + f"mlp.fc{r + 1}.bias"] = blk(f"MlpBlock_{mlp}/Dense_{r}/bias")
    siglip = f"{p}MAPHead_0/probe" in keys
    if siglip:
        out.update(_map_head(get, "MAPHead_0/"))
    used = {k for k in keys if k.startswith(p) and _is_model_key(k[len(p):])}
    dropped = sorted(set(sd) - used)
    hints: dict[str, Hint] = {
        "num_heads": (heads, f"shape: {p}Transformer/.../query/kernel (D, H, hd)"),
        "eps": (1e-6, "family: flax LayerNorm eps 1e-6"),
        "pos_interp": ("timm", "family: JAX weights as timm runs them at another size (bicubic, antialias)"),
    }
    if siglip or p == "params/img/":
        hints["mlp_kind"] = ("gelu_tanh", "family: big_vision SigLIP tower (tanh-GELU, as timm runs it)")
        if "head.weight" in out:
            hints["embed_out"] = (True, "family: the head of a SigLIP image tower projects into the joint "
                                        "embedding space")
    else:
        hints["mlp_kind"] = ("gelu", "family: vit_jax weights as timm and torchvision run them (exact GELU; flax's "
                                     "nn.gelu is the tanh approximation: pass act='gelu_tanh' to follow JAX)")
    if "cls_token" not in out and not siglip:
        hints["pooling"] = ("avg", "family: big_vision pool_type 'gap' (encoder_norm, then the mean of the patches)")
    return Converted("jax-siglip" if siglip or p == "params/img/" else "jax", out, hints, dropped)


def _map_head(get: Any, base: str) -> dict[str, torch.Tensor]:
    """big_vision `MAPHead_0` -> timm `attn_pool` (timm `_load_weights`)."""
    import torch

    att = base + "MultiHeadDotProductAttention_0/"
    out = {"attn_pool.latent": get(base + "probe").reshape(1, -1, get(base + "probe").shape[-1]),
           "attn_pool.q.weight": get(att + "query/kernel").flatten(1).t(),
           "attn_pool.q.bias": get(att + "query/bias").reshape(-1),
           "attn_pool.kv.weight": torch.cat([get(f"{att}{n}/kernel").flatten(1).t() for n in ("key", "value")]),
           "attn_pool.kv.bias": torch.cat([get(f"{att}{n}/bias").reshape(-1) for n in ("key", "value")]),
           "attn_pool.proj.weight": get(att + "out/kernel").permute(2, 0, 1).flatten(1),  # (H, hd, D) -> (D, A)
           "attn_pool.proj.bias": get(att + "out/bias"),
           "attn_pool.norm.weight": get(base + "LayerNorm_0/scale"),
           "attn_pool.norm.bias": get(base + "LayerNorm_0/bias")}
    for r in range(2):
        out[f"attn_pool.mlp.fc{r + 1}.weight"] = get(f"{base}MlpBlock_0/Dense_{r}/kernel").t().contiguous()
        out[f"attn_pool.mlp.fc{r + 1}.bias"] = get(f"{base}MlpBlock_0/Dense_{r}/bias")
    return out


def _is_model_key(k: str) -> bool:
    return k.startswith(("embedding/", "cls", "pos_embedding", "Transformer/", "head/", "pre_logits/", "MAPHead_0/"))
