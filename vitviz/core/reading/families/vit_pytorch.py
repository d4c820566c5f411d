"""lucidrains/vit-pytorch: `ViT` (every generation since the first gist) and `SimpleViT`.

The tensors are placed by `structural`; this module adds what the vit-pytorch code fixes and its files do not
show (checkpoint-formats.md §3.7). The code is copied and edited more often than imported, so the settings its
users change (activation, norm order, eps, attention scale, token order) are said as assumed, and flagged:

- LayerNorm eps 1e-5 (nn.LayerNorm defaults), exact GELU, pre-norm blocks, patches flattened by
  `Rearrange('b c (h p1) (w p2) -> b (h w) (p1 p2 c)')` (folded into the conv; with dual patchnorm the
  LayerNorm over the patch pixels is kept, its weights reordered to match);
- `SimpleViT`: a 2-D sin-cos position embedding computed, not stored, and mean pooling;
- pooling: `pool='cls'` (token 0) unless the class token is `(0, D)` (pool='mean' since 2025-11: the mean of the
  patches); older `pool='mean'` files average every token, class token included (`pooling='avg_all'`);
- attention scale: `dim ** -0.5` of the embed dim in the code before 2021-01-21 (files whose `mlp_head` has a
  hidden layer are certainly that old), `dim_head ** -0.5` after;
- heads: only heads x dim_head is in the file (and heads=1 when `to_out` is absent); otherwise the default
  `dim_head=64` gives a said guess.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vitviz.core.reading.families.base import Converted, Hint
from vitviz.core.reading.families.structural import Facts, facts_from_metadata, read

if TYPE_CHECKING:
    import torch
    from vitviz.core.reading.checkpoint import RawCheckpoint

NAMES = ("vit_pytorch",)
DETECT_ORDER = 120   # detection tries the families in this order, lowest first
# What this family knows beyond its keys (read by `vitviz.core.reading.families`: see there).
HELP = "lucidrains vit-pytorch"


def detect(keys: set[str], raw: RawCheckpoint) -> str | None:
    patch = any(k.startswith(("to_patch_embedding.", "patch_to_embedding.")) for k in keys)
    return "vit_pytorch" if patch and any(".to_qkv." in k or ".to_q." in k for k in keys) else None


def convert(sd: dict[str, torch.Tensor], raw: RawCheckpoint, family: str | None = None,
            overrides: dict[str, Any] | None = None) -> Converted:
    keys = set(sd)
    dim = _embed_dim(sd)
    simple = "linear_head.weight" in keys or "linear_head.1.weight" in keys or \
        ("pos_embedding" not in keys and "cls_token" not in keys)
    old = "patch_to_embedding.weight" in keys or any(".fn.fn." in k or k.startswith("transformer.net.") for k in keys)
    head_hidden = _head_has_hidden_layer(sd)
    extra: dict[str, Hint] = {"dim_head": (64, "guess: vit-pytorch's default dim_head=64 (heads = q/k/v width / 64)")}
    if head_hidden:
        extra["attn_scale"] = (dim ** -0.5, f"family: vit-pytorch before 2020-12 (mlp_head with a hidden layer) "
                               f"scales by dim ** -0.5 = {dim}**-0.5")
    elif old:
        extra["attn_scale"] = (0.0, "guess: dim_head ** -0.5 (vit-pytorch from 2021-01-21; files saved before then "
                               f"scaled by dim ** -0.5: pass attn_scale={dim ** -0.5:.6g})")
    else:
        extra["attn_scale"] = (0.0, "assumed: dim_head ** -0.5, vit-pytorch's Attention scale (a copy of the code "
                               "may scale otherwise)")
    if not any(".to_out." in k for k in keys):  # `project_out = not (heads == 1 and dim_head == dim)`
        extra["num_heads"] = (1, "family: vit-pytorch leaves out to_out only for heads=1, dim_head=dim")
    if simple:
        extra["pos_kind"] = ("sincos2d", "family: vit-pytorch SimpleViT (posemb_sincos_2d, computed)")
    cls = sd.get("cls_token")
    if simple:
        pooling: Hint = ("avg", "family: vit-pytorch SimpleViT mean pooling")
    elif cls is not None and cls.numel() == 0:
        pooling = ("avg", "family: vit-pytorch pool='mean' (a (0, D) class token)")
    else:
        pooling = ("token", "default: vit-pytorch pool='cls' (pass pooling='avg_all' for a model built with "
                   "pool='mean', which averaged every token, the class token included)")
    # vit-pytorch's code is copied and edited more than it is imported, and a name in training args names no
    # registered model: what its code fixes and no tensor shows is assumed, so it is flagged
    facts = Facts(
        family="vit_pytorch", eps=(1e-5, "assumed: nn.LayerNorm's default eps 1e-5, as vit-pytorch builds its norms "
                                         "(no tensor holds the eps)"),
        mlp_kind=("gelu", "assumed: exact GELU, as vit-pytorch's FeedForward (an edited copy may use another "
                          "activation)"),
        block_norm=("pre", "assumed: pre-norm, as vit-pytorch's blocks (the norm order is in no tensor)"),
        token_order=("prefix_first", "assumed: the class token in front of the patches, as vit-pytorch puts it"),
        patch_order=("p1p2c", "family: vit-pytorch Rearrange 'b c (h p1) (w p2) -> b (h w) (p1 p2 c)'"),
        head_act=("gelu", "family: vit-pytorch's first mlp_head (Linear, GELU, Linear)"),
        pooling_cls=pooling, pooling_no_cls=pooling, extra=extra,
    )
    facts = facts_from_metadata(facts, raw, mean_pool="avg_all" if cls is not None and cls.numel() else "avg")
    return read(sd, raw, facts, overrides or {})


def _embed_dim(sd: dict[str, torch.Tensor]) -> int:
    for k, v in sd.items():
        if k.endswith("to_qkv.weight") or k.endswith("to_q.weight"):
            return int(v.shape[1])
    return 0


def _head_has_hidden_layer(sd: dict[str, torch.Tensor]) -> bool:
    """The first vit-pytorch heads (2020-10 to 2020-12): mlp_head = [LayerNorm,] Linear, GELU, Linear."""
    linears = [k for k, v in sd.items() if k.startswith("mlp_head.") and k.endswith(".weight") and v.ndim == 2]
    return len(linears) >= 2
