"""timm CaiT (`cait_*`): refused by file, by name, with why and the route that shows it exactly.

What the reference ViT cannot express:
- talking-heads attention in the self-attention blocks (`attn.proj_l`, `attn.proj_w`): the heads' scores are mixed
  by a learned H x H map before the softmax, and the probabilities after it, so the weights applied to the values
  are no softmax (their rows need not sum to 1);
- class-attention layers after them (`blocks_token_only.N`): only the CLS token queries [CLS, patches], a
  (H, 1, N + 1) map, after N x N self-attention layers that have no CLS token at all.

The live path runs timm's own code (`vitviz.load(model)`, `--code`) and shows both exactly on one (N + 1) x (N + 1)
grid (`vitviz.core.running.live.record.AttentionLayout`: `applied`, `joined`): the self-attention layers' weights
as they are applied to the values (after proj_w, said), with the CLS row and column zero (not there yet), and the
class-attention layers' CLS row (the natural CLS map), the patch rows zero (they pass through);
tests/parity/test_parity_cait.py.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vitviz.core.reading.families.base import Converted
from vitviz.errors import UnknownLayoutError

if TYPE_CHECKING:
    import torch
    from vitviz.core.reading.checkpoint import RawCheckpoint

NAMES = ("cait",)
DETECT_ORDER = 8   # before every reader: blocks_token_only / talking-heads tensors are in no other layout
HELP = "timm CaiT (refused by file: talking heads and class attention; vitviz.load(model) or --code shows it)"
# No NAME_HINTS: timm's hints name cait_* files already

ROUTE = ("open it with timm's own code instead: vitviz.load(timm.create_model('cait_...', checkpoint_path=FILE)) "
         "in Python, or --code FILE.py:FACTORY (a function returning that model) on the command line; vitviz then "
         "shows every layer exactly: the self-attention layers' weights as the talking heads apply them to the "
         "values, and the class-attention layers' CLS attention over the patches")


def detect(keys: set[str], raw: RawCheckpoint) -> str | None:
    if any(k.startswith("blocks_token_only.") for k in keys) or any(".attn.proj_l." in k for k in keys):
        return "cait"
    return None


def convert(sd: dict[str, torch.Tensor], raw: RawCheckpoint, family: str | None = None,
            overrides: dict[str, Any] | None = None) -> Converted:
    depth = len({k.split(".")[1] for k in sd if k.startswith("blocks.") and ".attn." in k})
    ca = len({k.split(".")[1] for k in sd if k.startswith("blocks_token_only.")})
    raise UnknownLayoutError(
        f"{raw.path}: timm CaiT (cait_*: {depth} self-attention blocks, {ca} class-attention blocks): not supported "
        "by file. Its self-attention uses talking heads (proj_l mixes the heads' scores before the softmax, proj_w "
        "the probabilities after it, so the weights applied to the values are no softmax), and its class-attention "
        "layers let only the CLS token query [CLS, patches] after self-attention layers without a CLS token; "
        f"vitviz's reference ViT expresses neither exactly. {ROUTE[0].upper()}{ROUTE[1:]}")
