"""What every checkpoint family shares: the converted result, hints with their sources, key renaming."""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    import torch


Hint = tuple[Any, str]  # (value, where it came from)


class Recipe(NamedTuple):
    """A family's eval preprocessing (checkpoint-formats.md §7): the resize is the crop / `crop_pct`, then a
    `mode` crop, resampled with `interpolation`, normalised with `mean` / `std`."""
    crop_pct: float
    interpolation: str
    mean: tuple[float, ...]
    std: tuple[float, ...]
    mode: str


@dataclass
class Converted:
    """A checkpoint in the canonical (timm) key layout, with the values its family fixes (`hints`)."""
    family: str
    tensors: dict[str, torch.Tensor]
    hints: dict[str, Hint] = field(default_factory=dict)
    dropped: list[str] = field(default_factory=list)   # keys deliberately ignored (foreign heads, mask token)


# Block keys of the canonical layout: what ReferenceViT's blocks load.
CANONICAL_BLOCK_KEY = re.compile(r"^blocks\.\d+\.(?:(?:norm1|norm2|attn\.qkv|attn\.proj|attn\.q_norm|attn\.k_norm|"
                                 r"mlp\.fc1|mlp\.fc2)\.(?:weight|bias)|ls[12]\.gamma)$")


def blocks_are_canonical(keys: set[str] | list[str]) -> bool:
    """Whether every `blocks.N.` key is one the reference blocks load (other layouts go to the structural
    reader, which places tensors by role and shape)."""
    return all(CANONICAL_BLOCK_KEY.match(k) for k in keys if k.startswith("blocks."))


def key_stems(keys: list[str], n: int = 10) -> list[str]:
    """The n most common key stems (digits replaced by N), for messages about unknown layouts."""
    stems = Counter(re.sub(r"\d+", "N", k) for k in keys)
    return [f"{s} (x{c})" if c > 1 else s for s, c in stems.most_common(n)]


def strip_prefixes(sd: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], list[str]]:
    """Strip wrapper prefixes (DDP, compile, DINO MultiCropWrapper, Lightning, a user's `self.net` / `self.vit`
    wrapper, vit-pytorch's Recorder) until stable; drop foreign heads."""
    dropped: list[str] = []
    changed = True
    while changed:
        changed = False
        for prefix in ("module.", "_orig_mod.", "model.", "timm_model.", "backbone.", "net.", "network.", "vit."):
            if sd and all(k.startswith(prefix) for k in sd):
                sd = {k[len(prefix):]: v for k, v in sd.items()}
                changed = True
        backbone = [k for k in sd if k.startswith("backbone.")]
        if backbone and all(k.startswith(("backbone.", "head.", "dino_head.", "ibot_head.")) for k in sd):
            # an OpenMMLab classifier (`head.layers.head`, `head.layers.pre_logits`) is the model's own head and
            # stays; DINO / iBOT projection heads (`head.mlp`, `head.last_layer`, `dino_head.`) are foreign
            own = [k for k in sd if k.startswith("head.layers.")]
            dropped += [k for k in sd if not k.startswith("backbone.") and k not in own]
            sd = {**{k[len("backbone."):]: v for k, v in sd.items() if k.startswith("backbone.")},
                  **{k: sd[k] for k in own}}
            changed = True
    return sd, dropped



def rename_key(key: str, rules: list[tuple[str, str]]) -> str:
    """`key` after every (pattern, replacement) rule, applied in order."""
    for pattern, repl in rules:
        key = re.sub(pattern, repl, key)
    return key


def rename(sd: dict[str, torch.Tensor], rules: list[tuple[str, str]]) -> dict[str, torch.Tensor]:
    """Every key of `sd` through `rename_key`."""
    return {rename_key(k, rules): v for k, v in sd.items()}
