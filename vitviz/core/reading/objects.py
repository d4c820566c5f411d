"""What a model object (`torch.nn.Module`) states that its state dict does not: its head count, LayerNorm eps,
MLP activation, attention scale, norm order, head activation, pooling and the config it carries.

`vitviz.load(module)` converts an object's state dict like a file's; these readings stand in for the overrides
a file would need, each with where it was read (`model object: ...`). torch's own classes (`nn.LayerNorm`,
`nn.TransformerEncoderLayer`, `nn.MultiheadAttention`) are read here; a library's classes by its family module
(`read_object(module, what)` for settings, `object_config(module)` for the config its objects carry: timm's
`global_pool` and `pretrained_cfg`, torchvision's `EncoderBlock`), found by the family registry.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from vitviz.core.reading.checkpoint import RawCheckpoint
from vitviz.core.reading.families import FAMILIES


def module_heads(module: torch.nn.Module) -> int | None:
    """The head count a model object states: timm `attn.num_heads`, torch `MultiheadAttention.num_heads`, or a
    transformers `config.num_attention_heads`."""
    config = getattr(module, "config", None)
    if isinstance(getattr(config, "num_attention_heads", None), int):
        return int(config.num_attention_heads)
    for m in module.modules():
        heads = getattr(m, "num_heads", None)
        if isinstance(heads, int) and heads > 0:
            return heads
    return None


_ACT_NAMES = {"ReLU": "relu", "SiLU": "silu", "Tanh": "tanh", "QuickGELU": "quick_gelu", "GELUTanh": "gelu_tanh"}
_ACT_FUNCTIONS = {"relu": "relu", "gelu": "gelu", "silu": "silu", "tanh": "tanh", "quick_gelu": "quick_gelu",
                  "gelu_tanh": "gelu_tanh", "gelu_new": "gelu_tanh"}
# What each activation the reference ViT offers computes, to recognise one by its values (`activation_kind`).
_ACT_VALUES = {
    "gelu": lambda x: torch.nn.functional.gelu(x),
    "gelu_tanh": lambda x: torch.nn.functional.gelu(x, approximate="tanh"),
    "quick_gelu": lambda x: x * torch.sigmoid(1.702 * x),
    "relu": torch.relu,
    "silu": torch.nn.functional.silu,
    "tanh": torch.tanh,
}


def activation_kind(act: Any) -> tuple[str, str] | None:
    """(activation name, how it was told) of an MLP activation a model object holds: a module instance
    (`nn.GELU(approximate=...)`, `nn.ReLU()`...) or function (`F.gelu`) by what it is, else -- a class vitviz does
    not know, such as transformers' `NewGELUActivation` -- by what it computes: called on 41 values in [-5, 5]
    and compared with each activation the reference ViT offers (exact and tanh GELU, QuickGELU, ReLU, SiLU, Tanh),
    taken only when exactly one matches (1e-5). None when it is none of them, takes parameters, or fails."""
    if act is None:
        return None
    if isinstance(act, torch.nn.GELU):
        return ("gelu_tanh" if act.approximate == "tanh" else "gelu"), f"{type(act).__name__}(approximate=" \
            f"{act.approximate!r})"
    name = type(act).__name__
    if isinstance(act, torch.nn.Module) and name in _ACT_NAMES:
        return _ACT_NAMES[name], name
    fn_name = getattr(act, "__name__", None)
    if not isinstance(act, torch.nn.Module) and fn_name in _ACT_FUNCTIONS \
            and getattr(act, "__module__", "").startswith("torch"):
        return _ACT_FUNCTIONS[fn_name], f"torch's {fn_name}"
    if not callable(act) or (isinstance(act, torch.nn.Module) and (any(True for _ in act.parameters())
                                                                    or any(True for _ in act.children()))):
        return None
    x = torch.linspace(-5.0, 5.0, 41)
    try:
        with torch.no_grad():
            y = act(x.clone())
    except Exception:  # noqa: BLE001 - not an elementwise function of one tensor: no activation vitviz knows
        return None
    if not isinstance(y, torch.Tensor) or y.shape != x.shape:
        return None
    y = y.detach().float().cpu()
    matches = [kind for kind, f in _ACT_VALUES.items() if torch.allclose(y, f(x), atol=1e-5, rtol=0)]
    if len(matches) != 1:
        return None
    shown = name if isinstance(act, torch.nn.Module) else (fn_name or name)
    return matches[0], f"{shown}, which computes {matches[0]} (checked on 41 values in [-5, 5])"


def module_settings(module: torch.nn.Module) -> dict[str, tuple[Any, str]]:
    """What a model object's own modules state about the settings a state dict cannot tell: its LayerNorms' eps
    (the final norms' own when they differ), its MLP activation, its attention scale, whether its blocks are
    post-norm (`nn.TransformerEncoderLayer.norm_first`), and what each family reads of its library's objects
    (`read_object`). {override: (value, source)}; a setting the object does not state plainly is left out (then it
    stays an assumption, and the live path runs the object instead).

    Raises:
        VitvizError: a family's object states a setting the reference ViT does not compute (timm's max pooling
            over the prefix tokens).
    """
    what = type(module).__name__
    out: dict[str, tuple[Any, str]] = {}
    norms = [(n, m) for n, m in module.named_modules() if isinstance(m, torch.nn.LayerNorm)]
    final = [m.eps for n, m in norms if n.split(".")[-1] in ("norm", "fc_norm", "ln_post", "layernorm")
             and n.count(".") <= 1]
    inner = {m.eps for n, m in norms if m.eps not in final or n.count(".") > 1}
    if len(inner) == 1:
        out["eps"] = (inner.pop(), f"model object: {what}'s LayerNorm eps")
        if final and len(set(final)) == 1 and final[0] != out["eps"][0]:
            out["eps_final"] = (final[0], f"model object: {what}'s final LayerNorm eps")
    elif not inner and len(set(final)) == 1:
        out["eps"] = (final[0], f"model object: {what}'s LayerNorm eps")
    acts: dict[str, str] = {}
    for n, m in module.named_modules():
        if "mlp" in n.split(".")[-2:] or n.endswith(("mlp.act", "linear1")) or ".mlp." in n + ".":
            if isinstance(m, (torch.nn.modules.dropout._DropoutNd, torch.nn.Identity, torch.nn.Linear,
                              torch.nn.LayerNorm)):
                continue
            found = activation_kind(m)
            if found is not None:
                acts.setdefault(found[0], found[1])
    layers = [m for m in module.modules() if isinstance(m, torch.nn.TransformerEncoderLayer)]
    if layers:
        first = layers[0]
        out["block_norm"] = ("pre" if first.norm_first else "post", f"model object: {what}'s norm_first")
        found = activation_kind(getattr(first, "activation", None))
        acts = {found[0]: f"its TransformerEncoderLayer's activation {found[1]}"} if found else acts
    if len(acts) == 1:
        kind, how = acts.popitem()
        out["act"] = (kind, f"model object: {what}'s MLP activation ({how})")
    attns = [m for m in module.modules() if isinstance(getattr(m, "scale", None), float)
             and hasattr(m, "num_heads") and hasattr(m, "head_dim")]
    scales = {float(m.scale) for m in attns}
    if len(scales) == 1:
        scale = scales.pop()
        if abs(scale - attns[0].head_dim ** -0.5) < 1e-12:
            out["attn_scale"] = (0.0, f"model object: {what}'s attention scale head_dim ** -0.5")
        else:
            out["attn_scale"] = (scale, f"model object: {what}'s attention scale")
    if "attn_scale" not in out and any(isinstance(m, torch.nn.MultiheadAttention) for m in module.modules()):
        out["attn_scale"] = (0.0, "model object: nn.MultiheadAttention scales by head_dim ** -0.5")
    head = head_activation(module)
    if head is not None:
        out["head_act"] = (head[0], f"model object: {what}'s head activation ({head[1]})")
    for family in FAMILIES:     # a library's classes: what its family reads of them (torch's own come first)
        if hasattr(family, "read_object"):
            for name, said in family.read_object(module, what).items():
                out.setdefault(name, said)
    return out


_HEAD_NAMES = ("head", "mlp_head", "classifier", "fc", "heads", "linear_head", "cls_head")


def head_activation(module: torch.nn.Module) -> tuple[str, str] | None:
    """The activation between the two Linears of a two-layer classifier head (a top-level child named like a head,
    e.g. `mlp_head = Sequential(Linear, Tanh, Linear)`): (kind, how it was read), or None when there is no such
    head or its activation is not one the reference ViT computes."""
    for name, child in module.named_children():
        if name not in _HEAD_NAMES:
            continue
        parts = [m for m in child.children() if not isinstance(m, (torch.nn.modules.dropout._DropoutNd,
                                                                   torch.nn.Identity, torch.nn.LayerNorm,
                                                                   torch.nn.Softmax))]
        if len(parts) == 3 and isinstance(parts[0], torch.nn.Linear) and isinstance(parts[2], torch.nn.Linear):
            found = activation_kind(parts[1])
            if found is not None:
                return found[0], f"{name}: Linear, {type(parts[1]).__name__}, Linear"
    return None


def raw_from_module(module: torch.nn.Module) -> RawCheckpoint:
    """A model object's weights, with the metadata it carries: a transformers config (eps, activation, labels,
    sizes), else the config a family reads off its library's object (`object_config`: timm's pretrained config)."""
    raw = raw_from_dict(module.state_dict())
    raw.path = Path(f"<{type(module).__name__} object>")
    config = getattr(module, "config", None)
    if hasattr(config, "to_dict"):
        raw.config = config.to_dict()
        return raw
    for family in FAMILIES:
        said = family.object_config(module) if hasattr(family, "object_config") else None
        if said:
            raw.config = said
            break
    return raw


def raw_from_dict(sd: dict[str, Any]) -> RawCheckpoint:
    """An in-memory state dict as a checkpoint read (float tensors as float32; anything not a tensor left out)."""
    tensors = {k: v.float() if v.is_floating_point() else v for k, v in sd.items() if isinstance(v, torch.Tensor)}
    return RawCheckpoint(Path("<state dict>"), tensors)
