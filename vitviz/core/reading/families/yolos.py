"""transformers YOLOS (`YolosModel`, `YolosForObjectDetection`): refused by name, with why.

YOLOS appends learned detection tokens after the patches, [CLS, patches, det], and its position table covers all
three (CLS + patches + detection tokens), resampled in two parts; most sizes also add a mid-layer position table
to every block's input (`encoder.mid_position_embeddings`). The reference ViT puts every prefix token first and
adds one table before the blocks, so the table "did not fit the grid" (issue 31); now the refusal says what YOLOS
is and why it does not open.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vitviz.core.reading.families.base import Converted
from vitviz.errors import UnknownLayoutError

if TYPE_CHECKING:
    import torch
    from vitviz.core.reading.checkpoint import RawCheckpoint

NAMES = ("hf-yolos",)
DETECT_ORDER = 44   # before the hf readers: its keys are transformers ViT's plus detection tokens
HELP = "transformers YOLOS (refused: detection tokens after the patches)"


def detect(keys: set[str], raw: RawCheckpoint) -> str | None:
    if (raw.config or {}).get("model_type") == "yolos" or any(k.endswith("embeddings.detection_tokens")
                                                               for k in keys):
        return "hf-yolos"
    return None


def convert(sd: dict[str, torch.Tensor], raw: RawCheckpoint, family: str | None = None,
            overrides: dict[str, Any] | None = None) -> Converted:
    det = next((v for k, v in sd.items() if k.endswith("embeddings.detection_tokens")), None)
    n = f"{int(det.shape[1])} " if det is not None and det.ndim == 3 else ""
    mid = any(k.endswith("mid_position_embeddings") for k in sd)
    raise UnknownLayoutError(
        f"{raw.path}: transformers YOLOS (object detection): its {n}detection tokens follow the patches "
        "([CLS, patches, detection tokens]) and its position table covers all of them"
        + (", and a mid-layer position table is added before every block" if mid else "")
        + "; vitviz's reference ViT puts the extra tokens before the patches and adds one table before the blocks, "
          "so it cannot run YOLOS exactly: not supported yet")
