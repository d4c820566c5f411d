"""transformers AIMv2 vision towers (`Aimv2VisionModel`, `model_type: aimv2_vision_model`; the vision tower of a
whole `Aimv2Model`): RMSNorm without bias (the patch embedding's, the blocks', the final one), SwiGLU
(`gate_proj` / `up_proj` / `down_proj`, SiLU), separate q/k/v, no class token, a learned position table.

Its attention-pooling head (`use_head`: a learned query, `head.cls_token`, attends over the tokens through
`head.k_proj` / `head.v_proj`, then `head.output_proj`) is the reference ViT's MAP head with the query projection
the identity and no MLP after it (`attn_pool.q` = I, `attn_pool.mlp.fc2` = 0: the same function, nothing made
up); its output is the model's `pooler_output`, shown as features, and its attention is `pool_attention`. The
native-resolution variant (`is_native`: sin-cos positions computed per size, halves swapped) is refused by name.
timm's `aimv2_*` files are read by the `eva` reader (their `fc1_g` / `fc1_x` layout).
"""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from vitviz.core.reading.families.base import Converted, Hint, Recipe, rename
from vitviz.core.reading.families.clip import fuse_qkv
from vitviz.core.reading.families.hf import HF_ACT, _hf_preprocess
from vitviz.core.spec import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD
from vitviz.errors import UnknownLayoutError

if TYPE_CHECKING:
    import torch
    from vitviz.core.reading.checkpoint import RawCheckpoint

NAMES = ("hf-aimv2",)
DETECT_ORDER = 48   # before hf (50); no other family has `encoder.layers.N.rms_norm1`
HELP = "transformers AIMv2 vision towers (RMSNorm, SwiGLU)"
PREPROCESS = {"hf-aimv2": Recipe(1.0, "bicubic", OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, "center")}
# REGISTERED_SIZES False (the default): AIMv2's sizes (1024 / 8 heads, 1536 / 12) are not the registered table's
NAME_HINTS = ((r"aimv2", "hf-aimv2", 80),)
HF_MODEL_TYPES = {"aimv2_vision_model": "hf-aimv2", "aimv2": "hf-aimv2"}

_RULES = [
    (r"^embeddings\.patch_embed\.", "patch_embed.proj."), (r"^embeddings\.rms_norm\.", "patch_embed.norm."),
    (r"^encoder\.layers\.(\d+)\.", r"blocks.\1."), (r"\.rms_norm1\.", ".norm1."), (r"\.rms_norm2\.", ".norm2."),
    (r"\.attention\.out_proj\.", ".attn.proj."), (r"\.ffn\.down_proj\.", ".mlp.fc2."), (r"^rms_norm\.", "norm."),
]


def _vision_keys(keys: set[str]) -> set[str]:
    return {k[len("vision_model."):] if k.startswith("vision_model.") else k for k in keys}


# apple/ml-aim's own layout (the AIMv2 release's PyTorch files), as timm's `_convert_aimv2` reads it
_APPLE = [(r"^preprocessor\.patchifier\.", "patch_embed."), (r"^preprocessor\.pos_embed$", "pos_embed"),
          (r"^trunk\.post_trunk_norm\.", "norm."), (r"^trunk\.", ""), (r"\.norm_1\.", ".norm1."),
          (r"\.norm_2\.", ".norm2."), (r"\.mlp\.fc3\.", ".mlp.fc2_x."), (r"\.mlp\.fc2\.", ".mlp.fc2_out.")]


def detect(keys: set[str], raw: RawCheckpoint) -> str | None:
    if "preprocessor.patchifier.proj.weight" in keys:
        return "hf-aimv2"
    inner = _vision_keys(keys)
    if "embeddings.rms_norm.weight" in inner and any(re.match(r"^encoder\.layers\.\d+\.rms_norm1\.", k) for k in inner):
        return "hf-aimv2"
    return None


def _vision_config(cfg: dict[str, Any]) -> tuple[dict[str, Any], str]:
    if isinstance(cfg.get("vision_config"), dict):
        return cfg["vision_config"], "metadata: config.json vision_config"
    return cfg, "metadata: config.json"


def convert(sd: dict[str, torch.Tensor], raw: RawCheckpoint, family: str | None = None,
            overrides: dict[str, Any] | None = None) -> Converted:
    import torch

    if "preprocessor.patchifier.proj.weight" in sd:
        return _convert_apple(sd, raw)
    cfg, src = _vision_config(raw.config or {})
    named = src if cfg else "family: transformers Aimv2VisionConfig defaults"
    if cfg.get("is_native"):
        raise UnknownLayoutError(f"{raw.path}: AIMv2 native-resolution tower (is_native: sin-cos positions computed "
                                 "for each input size, their halves swapped): not supported yet")
    act = str(cfg.get("hidden_act", "silu"))
    if HF_ACT.get(act, act) != "silu":
        raise UnknownLayoutError(f"{raw.path}: AIMv2 with hidden_act {act!r}; expected SiLU (SwiGLU)")
    dropped = [k for k in sd if not k.startswith("vision_model.")] if any(k.startswith("vision_model.") for k in sd) \
        else []
    sd = {k[len("vision_model."):] if k.startswith("vision_model.") else k: v
          for k, v in sd.items() if k not in dropped}
    out = rename({k: v for k, v in sd.items() if not re.search(r"\.attention\.[qkv]_proj\.|\.ffn\.(gate|up)_proj\.|"
                                                               r"^head\.|position_embedding", k)}, _RULES)
    fuse_qkv(sd, out, "encoder.layers.{i}.attention.{n}_proj")
    for i in sorted({int(m.group(1)) for k in sd if (m := re.match(r"^encoder\.layers\.(\d+)\.ffn\.", k))}):
        for kind in ("weight", "bias"):
            g, u = sd.get(f"encoder.layers.{i}.ffn.gate_proj.{kind}"), sd.get(f"encoder.layers.{i}.ffn.up_proj.{kind}")
            if g is not None and u is not None:
                out[f"blocks.{i}.mlp.fc1.{kind}"] = torch.cat([g, u])   # act(gate) * up, packed [gate; up]
    pos = sd.get("embeddings.position_embedding.weight")
    if pos is not None:
        out["pos_embed"] = pos.unsqueeze(0)   # nn.Embedding (N, D) -> (1, N, D), patches only
    hints: dict[str, Hint] = {
        "norm_kind": ("rms", f"{named} (Aimv2RMSNorm: weight only)"),
        "eps": (float(cfg.get("rms_norm_eps", 1e-5)), named),
        "mlp_kind": ("swiglu", f"{named} (hidden_act {act!r} gating gate_proj, times up_proj)"),
        "pos_prefix": (0, f"{named} (no class token: the table covers the patches)"),
        "pos_interp": ("hf", "family: transformers AIMv2 (no resampling of its own: bicubic as transformers ViT)"),
    }
    if cfg.get("num_attention_heads"):
        hints["num_heads"] = (int(cfg["num_attention_heads"]), named)
    size = cfg.get("image_size")
    if size:
        hints["pos_image_size"] = ((size, size) if isinstance(size, int) else tuple(size), named)
    if "head.cls_token" in sd:
        _map_head(sd, out)
        hints["pool_heads"] = (int(cfg.get("num_attention_heads") or 0), f"{named} (the pooling head's heads are "
                                                                         "the model's)")
        hints["pool_prefix"] = (False, f"{named} (no prefix tokens)")
        hints["pool_act"] = ("gelu", "not used: the head has no MLP (its MLP here is zero)")
        hints["pooling"] = ("map", f"{named} use_head (Aimv2AttentionPoolingHead: pooler_output)")
    else:
        hints["pooling"] = ("avg", f"{named} (no head: the patches' average of the final norm)")
    pre = _hf_preprocess(raw.preprocessor)
    if pre:
        hints["preprocess"] = (pre, "metadata: preprocessor_config.json")
    return Converted("hf-aimv2", out, hints, dropped)


def _map_head(sd: dict[str, torch.Tensor], out: dict[str, torch.Tensor]) -> None:
    """Aimv2AttentionPoolingHead as the reference MAP head: its learned query is used as it is (q = identity, no
    bias), k / v fused, `output_proj` as the head's projection, and nothing after it (a zero MLP adds 0)."""
    import torch

    latent = sd["head.cls_token"]
    d = int(latent.shape[-1])
    k, v = sd["head.k_proj.weight"], sd["head.v_proj.weight"]
    zeros = torch.zeros(d, dtype=latent.dtype)
    out["attn_pool.latent"] = latent
    out["attn_pool.q.weight"], out["attn_pool.q.bias"] = torch.eye(d, dtype=latent.dtype), zeros.clone()
    out["attn_pool.kv.weight"] = torch.cat([k, v])
    out["attn_pool.kv.bias"] = torch.cat([sd.get("head.k_proj.bias", zeros), sd.get("head.v_proj.bias", zeros)])
    out["attn_pool.proj.weight"] = sd["head.output_proj.weight"]
    out["attn_pool.proj.bias"] = sd.get("head.output_proj.bias", zeros.clone())
    out["attn_pool.norm.weight"], out["attn_pool.norm.bias"] = torch.ones(d, dtype=latent.dtype), zeros.clone()
    out["attn_pool.mlp.fc1.weight"] = torch.zeros(1, d, dtype=latent.dtype)
    out["attn_pool.mlp.fc1.bias"] = torch.zeros(1, dtype=latent.dtype)
    out["attn_pool.mlp.fc2.weight"] = torch.zeros(d, 1, dtype=latent.dtype)
    out["attn_pool.mlp.fc2.bias"] = zeros.clone()


def _convert_apple(sd: dict[str, torch.Tensor], raw: RawCheckpoint) -> Converted:
    """apple/ml-aim AIMv2 files (`preprocessor.patchifier`, `trunk.blocks.N.norm_1`, `mlp.fc1` / `fc3` / `fc2`,
    `trunk.post_trunk_norm`): the key layout is AIMv2's alone, so RMSNorm and SwiGLU are derived from it; a
    head (`head.*`) is set aside, the features are the patches' average of the final norm."""
    import torch

    dropped = sorted(k for k in sd if k.startswith("head."))
    out = rename({k: v for k, v in sd.items() if k not in dropped}, _APPLE)
    for i in sorted({int(m.group(1)) for k in out if (m := re.match(r"^blocks\.(\d+)\.mlp\.fc2_x\.", k))}):
        b = f"blocks.{i}.mlp."
        for kind in ("weight", "bias"):
            g, x = out.pop(f"{b}fc1.{kind}", None), out.pop(f"{b}fc2_x.{kind}", None)
            if g is not None and x is not None:
                out[f"{b}fc1.{kind}"] = torch.cat([g, x])   # silu(fc1 x) * fc3 x, packed [gate; value]
            down = out.pop(f"{b}fc2_out.{kind}", None)
            if down is not None:
                out[f"{b}fc2.{kind}"] = down
    layout = "derived: apple/ml-aim AIMv2 key layout (preprocessor.patchifier, trunk.blocks.N.norm_1)"
    width = int(out["patch_embed.proj.weight"].shape[0])
    hints: dict[str, Hint] = {
        "norm_kind": ("rms", f"{layout}: RMSNorm, weight only"),
        "mlp_kind": ("swiglu", f"{layout}: silu(fc1) * fc3"),
        "eps": (1e-5, "family: AIMv2 (RMSNorm eps 1e-5, as timm's port)"),
        "pos_prefix": (0, f"{layout}: no class token"),
        "pooling": ("avg", "family: AIMv2 backbone (the patches' average of the final norm)"),
    }
    if width % 128 == 0:
        hints["dim_head"] = (128, "family: AIMv2 (head dim 128 at every size: L 1024/8, H 1536/12, 1B 2048/16, "
                                  "3B 3072/24)")
    return Converted("hf-aimv2", out, hints, dropped)
