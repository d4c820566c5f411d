"""ViTDet backbones as transformers writes them: `VitDetModel` / `VitDetBackbone` (`embeddings.projection`,
`embeddings.position_embeddings`, `encoder.layer.N.{norm1, attention.qkv, attention.proj, attention.rel_pos_h,
attention.rel_pos_w, norm2, mlp.fc1, mlp.fc2}`; no final norm, no neck).

They are read as SAM / ViTDet windowed models (`vitviz.core.running.windowed`, the keys of `vitviz.core.reading.families.sam`):
one stage of pre-norm blocks, those in `window_block_indices` attending inside `window_size` windows (the grid
padded bottom and right to whole windows, never shifted), the others globally, each with the decomposed relative
position bias when `use_relative_position_embeddings` (the table resampled linearly at another grid, as
`get_rel_pos` does). The absolute table is (1, 1 + N, D): a class-token slot ViTDet never adds (its
`get_absolute_positions` drops it), then the square pretrain grid, resampled bicubically (align_corners=False, no
antialias: vitviz's 'hf' recipe) to the feature grid whenever the two differ; vitviz keeps the grid part as SAM's
(1, gh, gw, D) `pos_embed` and sets the class slot aside (`dropped`).

The blocks in `residual_block_indices` are followed by `VitDetResBottleneckBlock` (1x1, 3x3, 1x1 convolutions
without bias, each followed by a channel LayerNorm of eps 1e-6, added to its input): vitviz's `ResBottleneck`,
`blocks.N.residual.*`. Not read: activations other than exact GELU.
"""
from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Any

from vitviz.core.reading.families.base import Converted, Hint, rename
from vitviz.errors import UnknownLayoutError

if TYPE_CHECKING:
    import torch
    from vitviz.core.reading.checkpoint import RawCheckpoint

NAMES = ("hf-vitdet",)
DETECT_ORDER = 25   # detection tries the families in this order, lowest first (before hf: no ViT has these keys)
WINDOWED = "sam"   # its files convert to the windowed reference model, sam layout
# What this family knows beyond its keys (read by `vitviz.core.reading.families`: see there).
HELP = "transformers VitDetModel / VitDetBackbone (ViTDet)"
# No PREPROCESS of its own: hf-vitdet takes hf's recipe; the converter says ViTDet's own (ImageNet)
HF_MODEL_TYPES = {"vitdet": "hf-vitdet"}

FAM = "transformers VitDetModel"
_QKV = re.compile(r"^encoder\.layer\.\d+\.attention\.qkv\.weight$")


def detect(keys: set[str], raw: RawCheckpoint) -> str | None:
    if "embeddings.projection.weight" in keys and any(_QKV.match(k) for k in keys):
        return "hf-vitdet"
    return None


def _pair(v: Any) -> tuple[int, int]:
    return (int(v[0]), int(v[-1])) if isinstance(v, (list, tuple)) else (int(v), int(v))


def convert(sd: dict[str, torch.Tensor], raw: RawCheckpoint, family: str | None = None,
            overrides: dict[str, Any] | None = None) -> Converted:
    if detect(set(sd), raw) is None:
        raise UnknownLayoutError(f"{raw.path}: family {family!r} named, but this is no transformers VitDetModel "
                                 "(no embeddings.projection.weight and encoder.layer.N.attention.qkv.weight)")
    cfg = raw.config or {}
    residual = sorted({int(m.group(1)) for k in sd if (m := re.match(r"^encoder\.layer\.(\d+)\.residual\.", k))})
    listed = sorted(int(i) for i in cfg.get("residual_block_indices") or ())
    if "residual_block_indices" in cfg and listed != residual:
        raise UnknownLayoutError(f"{raw.path}: config.json residual_block_indices {listed}, but the file holds "
                                 f"residual bottlenecks (encoder.layer.N.residual) after blocks {residual}")
    act = cfg.get("hidden_act")
    if act not in (None, "gelu"):
        raise UnknownLayoutError(f"{raw.path}: ViTDet with hidden_act {act!r} is not supported (exact GELU only)")
    dropped: list[str] = []
    sd = dict(sd)
    pos = sd.pop("embeddings.position_embeddings", None)
    if pos is not None:
        n = int(pos.shape[1]) - 1
        side = math.isqrt(max(n, 0))
        if pos.ndim != 3 or pos.shape[0] != 1 or n < 1 or side * side != n:
            raise UnknownLayoutError(f"{raw.path}: embeddings.position_embeddings {tuple(pos.shape)}; expected "
                                     "ViTDet's (1, 1 + N, D) with a square pretrain grid of N positions")
        sd["pos_embed"] = pos[:, 1:].reshape(1, side, side, pos.shape[-1])
        dropped.append("embeddings.position_embeddings[:, 0] (the class-token slot ViTDet never adds)")
    sd = rename(sd, [(r"^embeddings\.projection\.", "patch_embed.proj."), (r"^encoder\.layer\.(\d+)\.", r"blocks.\1."),
                     (r"\.attention\.", ".attn.")])
    unknown = sorted(k for k in sd if not (k.startswith("blocks.") or k.startswith("patch_embed.") or k == "pos_embed"))
    if unknown:
        raise UnknownLayoutError(f"{raw.path}: ViTDet tensors vitviz does not know: {', '.join(unknown[:5])}")
    depth = len({k.split(".")[1] for k in sd if k.startswith("blocks.")})
    where = "metadata: config.json"
    hints: dict[str, Hint] = {
        "order": ("pad_roll", f"family: {FAM} pads the grid to whole windows (window_partition; no shift)"),
        "shift_rule": ("built", f"family: {FAM} never shifts its windows"),
        "mask_value": (0.0, f"family: {FAM} has no shift mask"),
        "global_grid": ("native", f"family: {FAM}'s global blocks' tables span image_size // patch_size"),
        "pos_interp": ("hf", f"family: {FAM} get_absolute_positions resamples the pretrain grid bicubically "
                             "(align_corners=False, no antialias)"),
        "mlp_kind": ("gelu", f"{where} hidden_act" if act else f"default: {FAM} hidden_act gelu"),
    }
    if cfg.get("model_type"):
        hints["identity"] = (cfg["model_type"], f"named: transformers model_type {cfg['model_type']!r} (config.json)")
    hints["eps"] = (float(cfg["layer_norm_eps"]), f"{where} layer_norm_eps") \
        if cfg.get("layer_norm_eps") is not None else (1e-6, f"default: {FAM} layer_norm_eps 1e-6")
    if cfg.get("num_attention_heads") is not None:
        hints["num_heads"] = (int(cfg["num_attention_heads"]), f"{where} num_attention_heads")
    if "window_size" in cfg or "window_block_indices" in cfg:
        window = int(cfg.get("window_size") or 0)
        windowed = {int(i) for i in cfg.get("window_block_indices") or ()} if window > 0 else set()
        hints["window"] = (max(window, 1), f"{where} window_size")
        hints["global_blocks"] = (tuple(i for i in range(depth) if i not in windowed),
                                  f"{where} window_block_indices (the blocks not listed attend globally)")
    if cfg.get("image_size") is not None:
        hints["image_size"] = (_pair(cfg["image_size"]), f"{where} image_size")
    else:   # a bare file: the global blocks' tables (the longest, beside the windows' shorter ones) span the grid
        lengths = {(int(v.shape[0]), int(sd[k[:-1] + "w"].shape[0])) for k, v in sd.items()
                   if k.endswith(".attn.rel_pos_h") and k[:-1] + "w" in sd}
        patch = sd.get("patch_embed.proj.weight")
        if len(lengths) > 1 and patch is not None:
            lh, lw = max(lengths)
            p = int(patch.shape[-1])
            hints["image_size"] = ((p * (lh + 1) // 2, p * (lw + 1) // 2), "shape: the longest blocks.N.attn."
                                   "rel_pos_h / rel_pos_w (2G-1, head_dim), a global block's, span the native grid")
    size = hints["image_size"][0] if "image_size" in hints else None
    from vitviz.core.reading.families.sam import _sam_preprocess

    pre = _sam_preprocess(size[0] if size else 1024)
    hints["preprocess"] = (pre, f"assumed: {FAM} ships no image processor; ImageNet mean/std (detectron2's "
                           "ViTDet), the image squashed to the model size")
    return Converted("hf-vitdet", sd, hints, dropped)
