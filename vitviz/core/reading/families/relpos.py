"""timm's relative-position ViTs (`VisionTransformerRelPos`: `vit_relpos_*`, `vit_srelpos_*`): no position table;
every block (or one shared module) adds a relative position bias made by a small MLP over log-spaced patch
offsets (`RelPosMlp`, 'cr' mode), zero on the class token. The reference ViT computes the same bias
(`spec.rel_pos_mlp`), for any grid as timm's `set_input_size` does.

What no tensor says: LayerNorm eps 1e-6 (timm's default for this class), the res-post-norm blocks of
`vit_relpos_*_rpn_*` (`ResPostRelPosBlock`: same keys as pre-norm), the pooling of a model with a class token
(`*_cls_*`: the token; `*_clsgap_*`: the average with fc_norm). The architecture name settles them; without one
they are the class's defaults, flagged. The 'swin' MLP mode (sigmoid x 16) and the table variant
(`rel_pos_type='bias'`) are refused by name.
"""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from vitviz.core.reading.families.base import Converted, Hint, Recipe
from vitviz.core.spec import INCEPTION_MEAN, INCEPTION_STD
from vitviz.errors import UnknownLayoutError

if TYPE_CHECKING:
    import torch
    from vitviz.core.reading.checkpoint import RawCheckpoint

NAMES = ("timm_relpos",)
DETECT_ORDER = 95   # before eva (100), which refuses the table variant by name
HELP = "timm vit_relpos_* / vit_srelpos_* (relative position MLP)"
PREPROCESS = {"timm_relpos": Recipe(0.9, "bicubic", INCEPTION_MEAN, INCEPTION_STD, "center")}
REGISTERED_SIZES = True
NAME_HINTS = ((r"s?relpos", "timm_relpos", 60),)

_MLP = re.compile(r"^(blocks\.\d+\.attn\.rel_pos|shared_rel_pos)\.mlp\.fc[12]\.(weight|bias)$")
_CLASS = "family: timm VisionTransformerRelPos"


def detect(keys: set[str], raw: RawCheckpoint) -> str | None:
    if "patch_embed.proj.weight" in keys and any(_MLP.match(k) for k in keys):
        return "timm_relpos"
    return None


def _architecture(raw: RawCheckpoint) -> tuple[str, dict[str, Any], str]:
    cfg = raw.config or {}
    if isinstance(cfg.get("architecture"), str):
        return cfg["architecture"].lower(), dict(cfg.get("model_args") or {}), "timm architecture"
    args = raw.meta.get("args") if isinstance(raw.meta.get("args"), dict) else {}
    return str(raw.meta.get("arch") or args.get("model") or "").lower(), {}, "training args model"


def _file_name(raw: RawCheckpoint) -> str:
    """The file's own name when it names a relpos architecture (a guess: anyone can name a file)."""
    from pathlib import Path

    stem = Path(str(raw.path)).name.lower()
    return stem if "relpos" in stem else ""


def convert(sd: dict[str, torch.Tensor], raw: RawCheckpoint, family: str | None = None,
            overrides: dict[str, Any] | None = None) -> Converted:
    keys = set(sd)
    name, margs, where = _architecture(raw)
    kind = str(margs.get("rel_pos_type") or "mlp")
    mlp_keys = [k for k in keys if _MLP.match(k)]
    if "swin" in kind or not any(k.endswith("fc2.bias") for k in mlp_keys) or \
            any(k.endswith("relative_position_bias_table") for k in keys):
        raise UnknownLayoutError(
            f"{raw.path}: timm relative-position ViT{' ' + name if name else ''} with rel_pos_type "
            f"{kind if 'swin' in kind else 'swin or bias'!r} (a sigmoid-scaled MLP or a bias table): not supported "
            "yet, only timm's default log-coordinate MLP ('mlp'); open it with timm's own code instead: "
            "vitviz.load(timm.create_model(...)) or --code FILE.py:FACTORY")
    unknown = sorted(k for k in keys if k.startswith("blocks.") and not _MLP.match(k) and not re.match(
        r"^blocks\.\d+\.((norm1|norm2|attn\.qkv|attn\.proj|attn\.q_norm|attn\.k_norm|mlp\.fc1|mlp\.fc2)\."
        r"(weight|bias)|ls[12]\.gamma)$", k))
    if unknown:
        raise UnknownLayoutError(f"{raw.path}: timm relative-position ViT with block tensors the reference ViT does "
                                 f"not load: {', '.join(unknown[:5])}")
    named = f"named: {where} {name!r}" if name else ""
    hints: dict[str, Hint] = {"eps": (1e-6, f"{named or _CLASS} (LayerNorm eps 1e-6)")}
    file_name = "" if name else _file_name(raw)
    if name or file_name:
        rpn = "_rpn" in (name or file_name)
        hints["block_norm"] = ("res_post" if rpn else "pre",
                               f"{named or f'guess: the file name {file_name!r}'} "
                               f"({'ResPostRelPosBlock' if rpn else 'RelPosBlock'})")
    else:
        hints["block_norm"] = ("pre", f"{_CLASS} (RelPosBlock, pre-norm; vit_relpos_*_rpn_* are res-post-norm, "
                                      "and their keys are the same)")
    pool = margs.get("global_pool")
    if isinstance(pool, str) and pool in ("avg", "token"):
        hints["pooling"] = (pool, f"metadata: config.json model_args.global_pool")
    elif "cls_token" in sd and "fc_norm.weight" not in sd:
        hints["pooling"] = ("token", f"{named} (global_pool='token')" if name else
                            f"{_CLASS} (with a class token and no fc_norm: vit_relpos_*_cls_* pool the token)")
    elif "cls_token" in sd:
        hints["pooling"] = ("avg", f"{named or _CLASS} (fc_norm over the average of the patches: *_clsgap_*)")
    if not name:
        hints["eps_final"] = (1e-6, f"{_CLASS} (the final norms use the blocks' eps)")
    elif "_plus" in name and not margs.get("num_heads"):   # base_plus: 896 wide, 14 heads (the size word says 12)
        width = int(sd["patch_embed.proj.weight"].shape[0])
        if width % 64 == 0:
            hints["num_heads"] = (width // 64, f"{named} (timm's *_plus_* models: head dim 64, {width} / 64)")
    return Converted("timm_relpos", dict(sd), hints, [])
