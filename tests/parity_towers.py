"""Reference helpers for the 2026 families' parity tests (CLIP / SigLIP towers, RoPE ViTs, BEiT, JAX):
the original implementation's eager attention, including a pooling head's, read where it is computed.

Every reference returns (output (1, C), [per-layer (1, H, T, T) attention], pool (1, H', N') or None).
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
from torch import nn

from parity_refs import attn_drop_reference


@contextlib.contextmanager
def mha_weights(module: nn.Module, maps: list[torch.Tensor]) -> Iterator[None]:
    """Every `nn.MultiheadAttention` in `module` asked for its per-head weights (open_clip 3.x and transformers'
    SigLIP head call it with need_weights=False); they are appended to `maps` in call order."""
    originals = []
    for m in module.modules():
        if isinstance(m, nn.MultiheadAttention):
            orig = m.forward

            def forward(q, k, v, need_weights=False, _orig=orig, **kw):  # noqa: ANN001
                kw.pop("average_attn_weights", None)
                out, w = _orig(q, k, v, need_weights=True, average_attn_weights=False, **kw)
                maps.append(w.detach())
                return out, w
            m.forward = forward
            originals.append((m, orig))
    try:
        yield
    finally:
        for m, orig in originals:
            m.forward = orig


def mha_reference(module: nn.Module, fn: Callable[[torch.Tensor], torch.Tensor],
                  x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    maps: list[torch.Tensor] = []
    with mha_weights(module, maps), torch.no_grad():
        out = fn(x)
    return out, maps


def timm_pool_reference(model: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor],
                                                                       torch.Tensor | None]:
    """timm (VisionTransformer or Eva) with fused attention off: output, each block's softmax, and the MAP head's
    softmax (1, H, N), recomputed from its own q / kv modules on the tokens it was given."""
    for blk in model.blocks:
        blk.attn.fused_attn = False
    pool_mod = getattr(model, "attn_pool", None)
    kept: list[torch.Tensor] = []
    hook = pool_mod.register_forward_pre_hook(lambda m, args: kept.append(args[0])) if pool_mod is not None else None
    try:
        out, maps = attn_drop_reference(model, x)
    finally:
        if hook is not None:
            hook.remove()
    if pool_mod is None:
        return out, maps, None
    with torch.no_grad():
        tokens = kept[0]
        b, n, _ = tokens.shape
        h, hd = pool_mod.num_heads, pool_mod.head_dim
        q = pool_mod.q(pool_mod.latent).reshape(1, -1, h, hd).transpose(1, 2)
        k = pool_mod.kv(tokens).reshape(b, n, 2, h, hd).permute(2, 0, 3, 1, 4)[0]
        pool = ((q * pool_mod.scale) @ k.transpose(-2, -1)).softmax(-1)[:, :, 0]  # (1, H, N)
    return out, maps, pool
