"""transformers VitMatte (`VitMatteForImageMatting`): refused by name, with why.

Its ViTDet backbone takes the image and a trimap stacked as 4 input channels, and its attention depends on the
trimap; vitviz feeds models 1- or 3-channel images, so no view it can draw would be this model's attention. Before
this module a VitMatte folder reached the structural reader and ended in its catch-all "please report" (issue 31).
"""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from vitviz.core.reading.families.base import Converted
from vitviz.errors import UnknownLayoutError

if TYPE_CHECKING:
    import torch
    from vitviz.core.reading.checkpoint import RawCheckpoint

NAMES = ("hf-vitmatte",)
DETECT_ORDER = 5   # first: its backbone keys are ViTDet's, its decoder keys no other family has
HELP = "transformers VitMatte (image matting; refused: RGB + trimap input)"

_DECODER = re.compile(r"^decoder\.(convstream|matting_head|fusion_blocks)\.")


def detect(keys: set[str], raw: RawCheckpoint) -> str | None:
    if (raw.config or {}).get("model_type") == "vitmatte" or any(_DECODER.match(k) for k in keys):
        return "hf-vitmatte"
    return None


def convert(sd: dict[str, torch.Tensor], raw: RawCheckpoint, family: str | None = None,
            overrides: dict[str, Any] | None = None) -> Converted:
    proj = sd.get("backbone.embeddings.projection.weight")
    chans = f"{int(proj.shape[1])} input channels" if proj is not None and proj.ndim == 4 else "4 input channels"
    raise UnknownLayoutError(
        f"{raw.path}: transformers VitMatte (image matting, VitMatteForImageMatting): its ViTDet backbone takes "
        f"{chans} -- the RGB image and a trimap -- and its attention depends on the trimap, while vitviz feeds a "
        "model 1- or 3-channel images; not supported (no route in vitviz shows it: neither the file nor "
        "vitviz.load(model) can give it a trimap)")
