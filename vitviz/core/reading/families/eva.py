"""RoPE ViTs: timm's `Eva` class (EVA, EVA-02 incl. `eva02_*_clip`, DINOv3, Perception Encoder, Naver RoPE-ViT,
timm's `vit_*_rope_*`), the original DINOv3 `.pth` (facebookresearch/dinov3) and transformers' DINOv3.

What changes the numbers, and where it comes from:
- 2-D RoPE on the patch tokens' q and k (`spec.rope*`). No tensor says which kind, base, layout or grid scaling a
  file was trained with, except RoPE-Mixed's learned `rope.freqs` and the original DINOv3's stored `periods`. The
  settings come from the timm architecture name (config.json beside the file, training args), a transformers
  config, or the layout itself (`storage_tokens` / HF DINOv3 are DINOv3; a timm Eva file with a class token, four
  registers and no position table is DINOv3's shape, said as a guess). A file that could be a RoPE model but names
  none is refused, naming the `rope=` override -- never shown without positions.
- q / v biases with a zero k bias (EVA `q_bias` / `v_bias`, DINOv3's `bias_mask`, HF `key_bias=False`), fused into
  `attn.qkv.bias` with zeros where the k bias is;
- SwiGLU (`fc1_g` / `fc1_x`, DINOv3 `w1` / `w2` / `w3`, HF `gate_proj` / `up_proj`) packed into `mlp.fc1` as
  [gate; value], EVA-02's sub-LNs (`attn.norm`, `mlp.norm`), layer scale (`gamma_1` / `ls1.gamma` / `lambda1`),
  `norm_pre`, the MAP head of Perception Encoder (it pools over every token, prefix included).
"""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from vitviz.core.reading.families.base import Converted, Hint, Recipe, rename
from vitviz.core.reading.families.clip import HF_ACT, fuse_qkv
from vitviz.core.options import ROPE_PRESETS
from vitviz.core.spec import (
    IMAGENET_MEAN, IMAGENET_STD, INCEPTION_MEAN, INCEPTION_STD, OPENAI_CLIP_MEAN, OPENAI_CLIP_STD,
)
from vitviz.errors import UnknownLayoutError

if TYPE_CHECKING:
    import torch
    from vitviz.core.reading.checkpoint import RawCheckpoint

NAMES = ("eva", "eva02", "dinov3", "pe", "rope_vit", "timm_rope", "hf-dinov3", "hf-dinov3_vit")
DETECT_ORDER = 100   # detection tries the families in this order, lowest first
# What this family knows beyond its keys (read by `vitviz.core.reading.families`: see there).
HELP = "RoPE ViTs: EVA, DINOv3, PE, RoPE-ViT"
PREPROCESS = {"eva": Recipe(0.9, "bicubic", OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, "center"),
              "eva02": Recipe(0.9, "bicubic", OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, "center"),
              "dinov3": Recipe(1.0, "bicubic", IMAGENET_MEAN, IMAGENET_STD, "center"),
              "hf-dinov3": Recipe(1.0, "bilinear", IMAGENET_MEAN, IMAGENET_STD, "squash"),
              "pe": Recipe(1.0, "bicubic", INCEPTION_MEAN, INCEPTION_STD, "center"),
              "rope_vit": Recipe(0.875, "bicubic", IMAGENET_MEAN, IMAGENET_STD, "center"),
              "timm_rope": Recipe(0.95, "bicubic", IMAGENET_MEAN, IMAGENET_STD, "center")}
REGISTERED_SIZES = True
NAME_HINTS = ((r"dinov3", "dinov3", 100), (r"eva02|^eva_|rope", "eva", 70),
              (r"(^|[/_-])pe[_-]", "pe", 70))   # Perception Encoder: pe_core_*, vit_pe_*, facebook/PE-Core-*
HF_MODEL_TYPES = {"dinov3_vit": "hf-dinov3"}

# timm's VisionTransformerRelPos (`vit_relpos_*`, `vit_srelpos_*`): a relative position bias MLP (or table) per
# block or shared, no absolute table
_RELPOS = re.compile(r"(^|\.)(rel_pos|shared_rel_pos)\.(mlp\.|relative_position_bias_table)")
_EVA_BLOCK = re.compile(r"^blocks\.\d+\.(attn\.(q_bias|v_bias|q_proj\.|k_proj\.|v_proj\.|norm\.)|mlp\.(fc1_[gx]|norm)\.?"
                        r"|gamma_[12]$)")
# how to pass each preset, for messages
_PRESETS_TEXT = ("rope='dinov3' (DINOv3, LingBot), 'eva02' (EVA-02), 'pe' (Perception Encoder), 'rope_vit' (Naver "
                 "RoPE-ViT axial), 'timm_rope' (timm vit_*_rope_reg*_gap), or rope='none' if it has no positions")


def detect(keys: set[str], raw: RawCheckpoint) -> str | None:
    if "storage_tokens" in keys or "rope_embed.periods" in keys:
        return "dinov3"
    if "embeddings.patch_embeddings.weight" in keys and any(re.match(r"^(model\.)?layer\.\d+\.attention\.", k)
                                                            for k in keys):
        return "hf-dinov3"
    if "patch_embed.proj.weight" not in keys or not any(k.startswith("blocks.") for k in keys):
        return None
    if any(_RELPOS.search(k) for k in keys):
        return "eva"  # timm's VisionTransformerRelPos: refused by name in convert (no RoPE model)
    if any(".relative_position_bias_table" in k for k in keys):
        return None  # BEiT
    if rope_from_name(_architecture(raw)[0]):
        return "eva"
    if {"norm_pre.weight", "attn_pool.latent"} <= keys and "patch_embed.proj.bias" not in keys:
        return "eva"  # timm's Perception Encoder layout (no timm VisionTransformer has both)
    if "rope.freqs" in keys or any(_EVA_BLOCK.match(k) for k in keys) and not _deit3(keys):
        return "eva"
    if "pos_embed" not in keys and any(".attn.qkv.weight" in k for k in keys):
        return "eva"  # a timm-layout ViT without any position table: RoPE cannot be ruled out
    return None


def _deit3(keys: set[str]) -> bool:
    """DeiT III's layout (gamma_1 / gamma_2 with a fused qkv bias and a learned table) is the timm family's."""
    return "pos_embed" in keys and not any(re.search(r"\.(q_bias|v_bias|fc1_g|q_proj\.|attn\.norm\.|mlp\.norm\.)", k)
                                           for k in keys) and "rope.freqs" not in keys


def convert(sd: dict[str, torch.Tensor], raw: RawCheckpoint, family: str | None = None,
            overrides: dict[str, Any] | None = None) -> Converted:
    overrides = overrides or {}
    kind = detect(set(sd), raw)
    if kind == "dinov3" or family == "dinov3" and "storage_tokens" in sd:
        return _convert_dinov3(sd, raw, overrides)
    if kind == "hf-dinov3" or (family or "").startswith("hf-dinov3"):
        return _convert_hf(sd, raw)
    return _convert_timm(sd, raw, family, overrides)


# ----------------------------------------------------------------------------------------------------- timm Eva
def _architecture(raw: RawCheckpoint) -> tuple[str, dict[str, Any], str]:
    """(timm model name, model_args, where) from config.json beside the file or the training args."""
    cfg = raw.config or {}
    if isinstance(cfg.get("architecture"), str):
        return cfg["architecture"].lower(), dict(cfg.get("model_args") or {}), "metadata: config.json"
    args = raw.meta.get("args") if isinstance(raw.meta.get("args"), dict) else {}
    name = str(raw.meta.get("arch") or args.get("model") or "")
    return name.lower(), {}, "metadata: training args"


def rope_from_name(name: str) -> tuple[str, str] | None:
    """(preset, family) for a timm Eva architecture name; None when the name has no RoPE."""
    if "dinov3" in name or "lingbot" in name or "eupe" in name:
        return "dinov3", "dinov3"
    if "eva02" in name:
        return "eva02", "eva02"
    if name.startswith("vit_pe_") or "_pe_" in name:
        return "pe", "pe"
    if "rope_mixed" in name:
        return "rope_mixed", "rope_vit"
    if "_rope_" in name and "_reg" in name:
        return "timm_rope", "timm_rope"
    if "_rope_" in name or name.endswith("_rope"):
        return "rope_vit", "rope_vit"
    return None


def _convert_timm(sd: dict[str, torch.Tensor], raw: RawCheckpoint, family: str | None,
                  overrides: dict[str, Any]) -> Converted:
    keys = set(sd)
    bad = sorted({m.group(0) for k in keys if (m := re.search(r"attn\.(gate|k_norm_kv|kv_proj)|attn\.wq", k))})
    if bad or any(k.endswith(".gamma_1") for k in keys) and not any(k.endswith(".gamma_2") for k in keys):
        raise UnknownLayoutError(f"{raw.path}: a timm Eva variant with {', '.join(bad) or 'attention-only layer scale'}"
                                 " (gated attention / grouped kv / Sapiens2), which the reference ViT does not express")
    name, margs, where = _architecture(raw)
    if any(_RELPOS.search(k) for k in keys):
        raise UnknownLayoutError(
            f"{raw.path}: timm relative-position ViT (vit_relpos_* / vit_srelpos_* with rel_pos_type='bias': a "
            f"relative position bias table without class-token entries{'; ' + name if name else ''}; the default "
            "log-coordinate MLP opens): not supported yet; use --code FILE.py:FACTORY (a "
            "function returning timm.create_model(...) with these weights) or vitviz.load(model) with the model "
            "object, which runs timm's own code")
    out = rename(sd, [(r"\.gamma_([12])$", r".ls\1.gamma")])
    dropped = [k for k in out if k.endswith((".k_bias", "mask_token")) or k.startswith("lm_head.")]
    out = {k: v for k, v in out.items() if k not in dropped}
    _fuse_eva(out)
    hints: dict[str, Hint] = {"pos_interp": ("timm", "family: timm Eva (bicubic, antialias)"),
                              "mlp_kind": _mlp_kind(out)}
    if "norm_pre.weight" in out:
        hints["eps"] = (1e-5, "family: timm Eva with norm_pre (Perception Encoder: LayerNorm eps 1e-5)")
    preset_family = rope_from_name(name) if name else None
    rope_src = f"{where} architecture {name!r}"
    if "rope.freqs" in out:
        preset_family = ("rope_mixed", "rope_vit")
        rope_src = "shape: rope.freqs (learned per-layer, per-head frequencies: Naver RoPE-Mixed)"
        if out["rope.freqs"].ndim == 4:    # (2, depth, heads, head_dim / 2): the head count is in the file
            hints["num_heads"] = (int(out["rope.freqs"].shape[2]), "shape: rope.freqs (2, depth, heads, head_dim/2)")
    fam = preset_family[1] if preset_family else "eva"
    if margs.get("use_rot_pos_emb") is False and "rope.freqs" not in out:
        preset_family, rope_src = None, f"{where} model_args.use_rot_pos_emb False"
    elif preset_family is None and "rope" not in overrides:
        preset_family, rope_src = _guess_rope(out, keys, raw, name)
        fam = preset_family[1] if preset_family else ("timm" if _plain_vit(keys) else "eva")
    if fam == "timm":  # timm's VisionTransformer gates its SwiGLU with act_layer (GELU unless given): not in a tensor
        hints["mlp_kind"] = ("swiglu", "assumed: a gated MLP (mlp.fc1_g / fc1_x) gated with SiLU (SwiGLU); timm's "
                                       "VisionTransformer gates it with its act_layer, which no tensor shows")
    aim = _aimv2_source(name, where, raw) if fam == "timm" else None
    if aim:  # timm's aimv2_*: RmsNorm (eps 1e-5) everywhere, SwiGLU gated with SiLU (act_layer='silu')
        hints.update({"norm_kind": ("rms", f"{aim} (timm AIMv2: RmsNorm, no bias)"),
                      "eps": (1e-5, f"{aim} (timm AIMv2: RmsNorm eps 1e-5)"),
                      "mlp_kind": ("swiglu", f"{aim} (timm AIMv2: SwiGLU with act_layer='silu')")})
        width = int(out["patch_embed.proj.weight"].shape[0]) if "patch_embed.proj.weight" in out else 0
        if not margs.get("num_heads") and width % 128 == 0:
            # head dim 128 at every size (L 1024/8, H 1536/12, 1B 2048/16, 3B 3072/24): the model name's size word
            # would say 16 heads for 'large' and 'huge'
            hints["num_heads"] = (width // 128, f"{aim} (timm AIMv2: head dim 128, {width} / 128)")
    if preset_family is not None and preset_family[0] != "none":
        hints.update(_rope_hints(preset_family[0], rope_src))
        hints.update(_rope_from_config(preset_family[0], name, margs, where, rope_src))
    if fam == "dinov3":
        hints["eps"] = (1e-5, f"family: DINOv3 (timm and transformers use LayerNorm eps 1e-5)")
        hints.setdefault("dim_head", _dinov3_head_dim(out, "family: DINOv3"))
        if not (raw.config or {}).get("pretrained_cfg") and not margs.get("img_size"):
            hints["pos_image_size"] = ((256, 256), "family: DINOv3 (timm's default input 256 px)")
    elif fam == "pe":
        hints["eps"] = (1e-5, f"{rope_src} (Perception Encoder: LayerNorm eps 1e-5)")
    pool = (raw.config or {}).get("global_pool") or margs.get("global_pool")
    if "attn_pool.latent" in out:
        heads = margs.get("attn_pool_num_heads")
        if heads:
            hints["pool_heads"] = (int(heads), f"{where} model_args.attn_pool_num_heads")
        elif fam == "pe":
            hints["pool_heads"] = (8, f"{rope_src} (timm's Perception Encoder pools with 8 heads)")
        else:
            hints["pool_heads"] = (0, "guess: a timm Eva MAP head without a config: the model's head count")
        hints["pool_prefix"] = (True, "family: timm Eva (its MAP head attends to every token)")
        hints["pool_act"] = ("gelu", "family: timm Eva (its MAP head's MLP uses exact GELU)")
    elif pool in ("avg", "token") and "fc_norm.weight" not in out:
        hints["pooling"] = (pool, f"{where} global_pool")
    elif fam == "dinov3" and "fc_norm.weight" not in out and "cls_token" in out:
        hints["pooling"] = ("token", "family: DINOv3 (upstream pools the CLS token; timm's default is 'avg': pass "
                                     "pooling='avg' to match it)")
    if "cls_token" not in out and "fc_norm.weight" not in out and "attn_pool.latent" not in out:
        hints.setdefault("pooling", ("avg", "family: timm Eva without a class token (global average of patches)"))
    if not name and any(f"{k}.weight" in out for k in ("norm", "fc_norm")):
        eps = float(hints.get("eps", (1e-6,))[0])
        hints["eps_final"] = (eps, f"assumed: the final norm uses the blocks' eps {eps:g}, as timm builds it "
                                   "(nothing names the model)")
    if (raw.config or {}).get("model_args"):
        from vitviz.core.reading.families.timm import model_args_hints

        hints.update(model_args_hints(raw, out, hints, "vit" if fam == "timm" else "eva"))
    return Converted(family if family in NAMES and family not in ("eva",) else fam, out, hints, dropped)


def _aimv2_source(name: str, where: str, raw: RawCheckpoint) -> str | None:
    """Where the model is named AIMv2 (timm `aimv2_*`: its norms are RMSNorms, which no tensor tells from a
    LayerNorm without bias): the timm architecture or training args, or else the file's own name (a guess)."""
    if "aimv2" in name:
        return f"named: {where.split(': ', 1)[-1]} architecture {name!r}"
    from pathlib import Path

    file_name = Path(str(raw.path)).name.lower()
    if "aimv2" in file_name:
        return f"guess: the file name {file_name!r} says AIMv2 (timm aimv2_*)"
    return None


def _plain_vit(keys: set[str]) -> bool:
    """A timm `VisionTransformer` layout (fused qkv with its bias, a learned table) that is in this reader only
    for its SwiGLU MLP (`mlp_layer=SwiGLU`: `fc1_g` / `fc1_x`): none of Eva's own tensors (separate q/k/v, q/v
    biases, sub-LNs, layer scale as gamma_N)."""
    return "pos_embed" in keys and any(k.endswith(".attn.qkv.weight") for k in keys) and \
        any(".mlp.fc1_g." in k for k in keys) and \
        not any(re.search(r"\.attn\.(q_proj|q_bias|v_bias|norm)\.?|\.mlp\.norm\.|\.gamma_[12]$", k) for k in keys)


def _guess_rope(out: dict[str, torch.Tensor], keys: set[str], raw: RawCheckpoint,
                name: str) -> tuple[tuple[str, str] | None, str]:
    """The RoPE preset a file implies by its layout, or a refusal when it may have RoPE and nothing says which.
    A named architecture without RoPE in its name has none; a plain ViT with a SwiGLU MLP and a learned table is
    not EVA-02 (whose q/k/v are separate, with q/v biases)."""
    reg = out.get("reg_token")
    has_pos = "pos_embed" in out
    swiglu = _mlp_kind(out)[0] == "swiglu"
    if name and has_pos:
        return None, f"named: architecture {name!r} has no RoPE"
    if has_pos and swiglu and _plain_vit(keys):
        return None, "layout: a timm VisionTransformer with a SwiGLU MLP and a learned table (no RoPE)"
    if not has_pos and "cls_token" in out and reg is not None and reg.shape[1] == 4 and "blocks.0.ls1.gamma" in out:
        return ("dinov3", "dinov3"), ("guess: a timm Eva layout with a class token, 4 registers, layer scale and no "
                                      "position table is DINOv3's (pass rope='...' if it is another RoPE model)")
    if {"norm_pre.weight", "attn_pool.latent"} <= set(out):
        return ("pe", "pe"), ("guess: a timm layout with norm_pre, a MAP head and no patch bias is the Perception "
                              "Encoder's (learned table + RoPE); pass rope='none' if it has no RoPE")
    if has_pos and swiglu:
        return ("eva02", "eva02"), ("guess: a timm Eva layout (separate q/k/v, q/v biases) with SwiGLU and a learned "
                                    "table is EVA-02's (learned table + RoPE); pass rope='none' for EVA without RoPE")
    if has_pos:
        return None, "layout: EVA with a learned position table (no RoPE)"
    raise UnknownLayoutError(
        f"{raw.path}: a ViT without a learned position table{' (' + name + ')' if name else ''}, and nothing in or "
        "beside the file says how it knows positions: it is most likely a RoPE model (timm Eva: DINOv3, EVA-02, "
        "PE, RoPE-ViT), whose rotary settings no tensor stores. Opening it without positions would draw wrong "
        f"maps. Pass {_PRESETS_TEXT} (CLI --rope NAME), or keep timm's config.json beside the file")


def _rope_from_config(preset: str, name: str, margs: dict[str, Any], where: str, src: str) -> dict[str, Hint]:
    """What the architecture name and timm's model_args refine in a preset: Perception Encoder's reference grid
    (its registered image size / patch) and grid offset, and any explicit rope_* / ref_feat_shape argument."""
    from vitviz.core.reading.metadata import parse_model_name

    hints: dict[str, Hint] = {}
    info = parse_model_name(name) if name else None
    if preset == "pe" and info is not None and info.image and info.patch:
        hints["rope_ref_grid"] = ((info.image // info.patch,) * 2, f"{src} (timm's PE: ref_feat_shape = the "
                                                                  "registered grid)")
        if "gigantic" in name:
            hints["rope_offset"] = (0.0, f"{src} (timm's PE gigantic: no grid offset)")
    arg_src = f"{where} model_args"
    for arg, field, conv in (("rope_temperature", "rope_theta", float), ("rope_grid_offset", "rope_offset", float),
                             ("rope_rotate_half", "rope_half", bool)):
        if margs.get(arg) is not None:
            hints[field] = (conv(margs[arg]), f"{arg_src}.{arg}")
    if margs.get("rope_grid_indexing") in ("ij", "xy"):
        hints["rope_xy"] = (margs["rope_grid_indexing"] == "xy", f"{arg_src}.rope_grid_indexing")
    ref = margs.get("ref_feat_shape")
    if ref is not None:
        ref = (int(ref), int(ref)) if isinstance(ref, (int, float)) else (int(ref[0]), int(ref[1]))
        hints["rope_ref_grid"] = (ref, f"{arg_src}.ref_feat_shape")
    return hints


def _rope_hints(preset: str, source: str) -> dict[str, Hint]:
    values = ROPE_PRESETS[preset]
    rest = f"preset {preset!r} (see rope)" if source.startswith("guess") else source  # one guess, said once
    return {name: (value, source if name == "rope" else rest) for name, value in values.items()}


def _mlp_kind(out: dict[str, torch.Tensor]) -> Hint:
    fc1, fc2 = out.get("blocks.0.mlp.fc1.weight"), out.get("blocks.0.mlp.fc2.weight")
    if fc1 is not None and fc2 is not None and fc1.shape[0] == 2 * fc2.shape[1]:
        return ("swiglu", "shape: mlp.fc1 is twice mlp.fc2's input (SwiGLU: gate and value packed)")
    return ("gelu", "family: timm Eva (exact GELU)")


def _fuse_eva(out: dict[str, torch.Tensor]) -> None:
    """EVA's separate q/v biases, unfused q/k/v projections and SwiGLU halves -> the canonical fused tensors."""
    import torch

    for i in sorted({int(m.group(1)) for k in out if (m := re.match(r"blocks\.(\d+)\.", k))}):
        b = f"blocks.{i}."
        if b + "attn.q_proj.weight" in out:
            parts = {n: out.pop(f"{b}attn.{n}_proj.weight") for n in "qkv"}
            out[b + "attn.qkv.weight"] = torch.cat([parts["q"], parts["k"], parts["v"]])  # (3A, D)
            for n in "qv":
                if f"{b}attn.{n}_proj.bias" in out:
                    out[f"{b}attn.{n}_bias"] = out.pop(f"{b}attn.{n}_proj.bias")
            out.pop(f"{b}attn.k_proj.bias", None)
        if b + "attn.q_bias" in out:
            q, v = out.pop(b + "attn.q_bias"), out.pop(b + "attn.v_bias")
            out[b + "attn.qkv.bias"] = torch.cat([q, torch.zeros_like(q), v])  # the k bias is fixed at 0
        if b + "mlp.fc1_g.weight" in out:
            for kind in ("weight", "bias"):
                g, x = out.pop(f"{b}mlp.fc1_g.{kind}", None), out.pop(f"{b}mlp.fc1_x.{kind}", None)
                if g is not None and x is not None:
                    out[f"{b}mlp.fc1.{kind}"] = torch.cat([g, x])  # act(gate) * value, packed [gate; value]


# ------------------------------------------------------------------------------------------- original DINOv3
def _convert_dinov3(sd: dict[str, torch.Tensor], raw: RawCheckpoint, overrides: dict[str, Any]) -> Converted:
    """facebookresearch/dinov3 checkpoints: `storage_tokens`, `rope_embed.periods`, `attn.qkv.bias_mask`,
    `ls1.gamma`, SwiGLU `w1` / `w2` / `w3`."""
    import torch

    if "cls_norm.weight" in sd:
        raise UnknownLayoutError(f"{raw.path}: a DINOv3 model with untied CLS / patch norms (cls_norm, the 7B); "
                                 "expected one final norm")
    out: dict[str, torch.Tensor] = {}
    dropped = []
    for k, v in sd.items():
        if k in ("mask_token",) or k.startswith(("local_cls_norm.", "projectors.", "head.")) or k.endswith("bias_mask"):
            dropped.append(k)
            continue
        if k.endswith("attn.qkv.bias") and k.replace("bias", "bias_mask") in sd:
            v = v * sd[k.replace("bias", "bias_mask")].to(v.dtype)  # LinearKMaskedBias: the k bias masked to 0
        k = {"storage_tokens": "reg_token", "rope_embed.periods": "rope.periods"}.get(k, k)
        k = re.sub(r"\.mlp\.w3\.", ".mlp.fc2.", k)
        out[k] = v
    for i in sorted({int(m.group(1)) for k in out if (m := re.match(r"blocks\.(\d+)\.mlp\.w1\.", k))}):
        for kind in ("weight", "bias"):
            g, x = out.pop(f"blocks.{i}.mlp.w1.{kind}", None), out.pop(f"blocks.{i}.mlp.w2.{kind}", None)
            if g is not None and x is not None:
                out[f"blocks.{i}.mlp.fc1.{kind}"] = torch.cat([g, x])  # silu(w1 x) * w2 x
    src = "layout: facebookresearch/dinov3 (storage_tokens, rope_embed)"
    hints: dict[str, Hint] = {} if "rope" in overrides else _rope_hints("dinov3", src)
    if "rope.periods" in out:
        hints["rope_periods"] = (True, "shape: rope_embed.periods (the original uses its stored periods)")
    else:
        hints["rope_periods"] = (False, src)
    hints.update({"eps": (1e-5, "family: DINOv3 (LayerNorm eps 1e-5)"), "mlp_kind": _mlp_kind(out),
                  "dim_head": _dinov3_head_dim(out, "family: DINOv3"),
                  "pos_image_size": ((224, 224), "family: DINOv3 (evaluated at 224 px; any size works)"),
                  "pooling": ("token", "family: DINOv3 (the normed CLS token)")})
    return Converted("dinov3", out, hints, dropped)


# ------------------------------------------------------------------------------------------ transformers DINOv3
def _dinov3_head_dim(out: dict[str, torch.Tensor], source: str) -> Hint:
    """DINOv3's released head dims: 64 at S/B/L/H+ (384/6 ... 1280/20), 128 for the 7B (4096 wide, 32 heads)."""
    w = out.get("patch_embed.proj.weight")
    wide = w is not None and int(w.shape[0]) == 4096
    return (128 if wide else 64, f"{source} (head dim {128 if wide else 64}: "
                                 f"{'the 7B, 4096 wide, has 32 heads' if wide else 'the released S/B/L/H+ sizes'})")


def _hf_dinov3_config(cfg: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The DINOv3 backbone's own config and where it is: config.json itself for a `dinov3_vit` model, or its
    `backbone_config` for a model built on one (CHMv2, a `load_backbone` task model), whose top level states
    nothing about the backbone (its heads, size, eps and RoPE base are there)."""
    backbone = cfg.get("backbone_config")
    if cfg.get("model_type") != "dinov3_vit" and isinstance(backbone, dict) and (
            backbone.get("model_type") == "dinov3_vit" or "num_attention_heads" in backbone):
        return backbone, f"metadata: config.json backbone_config ({cfg.get('model_type') or 'a task model'})"
    return cfg, "metadata: config.json"


_HF_RULES = [
    (r"^embeddings\.cls_token$", "cls_token"), (r"^embeddings\.register_tokens$", "reg_token"),
    (r"^embeddings\.patch_embeddings\.", "patch_embed.proj."), (r"^(model\.)?layer\.(\d+)\.", r"blocks.\2."),
    (r"\.attention\.o_proj\.", ".attn.proj."), (r"\.layer_scale([12])\.lambda1$", r".ls\1.gamma"),
    (r"\.mlp\.down_proj\.", ".mlp.fc2."),
]


def _convert_hf(sd: dict[str, torch.Tensor], raw: RawCheckpoint) -> Converted:
    import torch

    cfg, cfg_src = _hf_dinov3_config(raw.config or {})
    sd = {re.sub(r"^dinov3_vit\.", "", k): v for k, v in sd.items()}
    dropped = [k for k in sd if k.startswith("embeddings.mask_token")]
    out = rename({k: v for k, v in sd.items()
                  if k not in dropped and not re.search(r"\.attention\.[qkv]_proj\.|\.mlp\.(gate|up)_proj\.", k)},
                 _HF_RULES)
    if out.get("reg_token") is not None and out["reg_token"].shape[1] == 0:
        out.pop("reg_token")
    prefix = "model.layer." if any(k.startswith("model.layer.") for k in sd) else "layer."
    tmp: dict[str, torch.Tensor] = {}
    fuse_qkv(sd, tmp, prefix + "{i}.attention.{n}_proj")
    out.update(tmp)
    for i in sorted({int(m.group(1)) for k in sd if (m := re.match(re.escape(prefix) + r"(\d+)\.mlp\.", k))}):
        base = f"{prefix}{i}.mlp."
        gated = base + "gate_proj.weight" in sd
        for kind in ("weight", "bias"):
            parts = [sd.get(f"{base}{n}_proj.{kind}") for n in (("gate", "up") if gated else ("up",))]
            if all(p is not None for p in parts):
                out[f"blocks.{i}.mlp.fc1.{kind}"] = torch.cat(parts)  # gated: [gate; up], act(gate) * up
    src = cfg_src if cfg else "family: transformers DINOv3ViTConfig defaults"
    hints: dict[str, Hint] = _rope_hints("dinov3", "family: transformers DINOv3 (rotate-half RoPE, centred "
                                                   "normalised coordinates)")
    hints["rope_theta"] = (float(cfg.get("rope_theta", 100.0)), src + (" rope_theta" if cfg else ""))
    hints["eps"] = (float(cfg.get("layer_norm_eps", 1e-5)), src)
    if cfg.get("num_attention_heads"):
        hints["num_heads"] = (int(cfg["num_attention_heads"]), src + " num_attention_heads")
    else:  # a rule of the released sizes (S/B/L/H+; the 7B's head dim is 128), never a fact of this file
        hints["dim_head"] = _dinov3_head_dim(out, "guess: no config states num_attention_heads (pass heads=N); "
                                                  "DINOv3")
    act = cfg.get("hidden_act", "gelu")
    hints["mlp_kind"] = ("swiglu", src) if cfg.get("use_gated_mlp") or any(".gate_proj." in k for k in sd) else \
        (HF_ACT.get(act, act), src)
    if isinstance(act, str) and HF_ACT.get(act, act) not in ("gelu", "silu") and hints["mlp_kind"][0] == "swiglu":
        raise UnknownLayoutError(f"{raw.path}: a gated MLP with {act!r}; expected SiLU (SwiGLU)")
    size = cfg.get("image_size", 224)
    hints["pos_image_size"] = ((size, size) if isinstance(size, int) else tuple(size), src)
    hints["pooling"] = ("token", "family: transformers DINOv3 (pooler_output: the normed CLS token)")
    return Converted("hf-dinov3", out, hints, dropped)
