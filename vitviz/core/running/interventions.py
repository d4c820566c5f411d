"""Interventions on the reference ViT: ablate heads, patch attention or block outputs, knock out attention to tokens.

    from vitviz.core.running.interventions import Ablate, PatchAttention, PatchResidual, Knockout
    r = model.run("a.png", intervene=Ablate([(3, 1), (5, 2)]))                 # zero ablation of two heads
    r = model.run("a.png", intervene=Ablate([(3, 1)], "mean", reference=imgs))  # mean over >= 2 images
    r = model.run("a.png", intervene=Ablate([(3, 1)], "resample", reference="b.png"))
    r = model.run("a.png", intervene=PatchAttention(3, 1, "b.png"))   # B's attention pattern in layer 3 head 1
    r = model.run("a.png", intervene=PatchResidual(4, "b.png", tokens=[0]))  # block 4's CLS output from B
    r = model.run("a.png", intervene=Knockout([0]))                    # no query attends to CLS, in any layer
    with model.intervening(Ablate([(3, 1)])):                          # every pass while open (export, passes)
        ...
    r.interventions                                                    # ('ablate L3.H1 (zero)',)

Where each acts, on the hook points of `vitviz.core.running.model`:

- `Ablate`: a head's output (B, H, T, hd) -- attention @ values, before the heads are joined and projected
  (`head_probe`) -- is replaced by zeros, by its mean over a reference set of images (per token position), or by
  its value on another image (resampling). The same as a forward pre-hook on timm's `attn.proj` or transformers'
  `attention.o_proj` that overwrites that head's slice of the joined heads.
- `PatchAttention`: the softmax of layer L, head H (or every head) is replaced by the source image's (`attn_probe`);
  the values stay the image's own.
- `PatchResidual`: block L's output tokens (the residual stream after the block) at `tokens` (default: all) are
  replaced by the source image's.
- `Knockout`: the attention of every query to the chosen key tokens is set to 0 and each row renormalised: the same
  as masking those scores with -inf before the softmax (one token can never be knocked out of all rows: at least
  one key must stay).

Sources (the image to patch from, the reference set) are run once, clean, at the size of the intervened run, when
the intervention is applied. Only vitviz's reference ViT (`VitModel`) has these hook points: a model run by its own
code (`LiveModel`) or a windowed model (Swin, SAM) is refused, saying why. A clean run is untouched: the probes are
identities and no hook stays after the context closes.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from vitviz.core.options import ABLATION_MODES
from vitviz.core.protocol import LIVE_REFUSAL, WINDOWED_REFUSAL   # the refusals live in the torch-free vocabulary
from vitviz.core.spec import ModelSpec
from vitviz.errors import VitvizError

MEAN_MIN_IMAGES = 2   # a mean over one image is that image's value: a resampling, not a mean ablation


class InterventionError(VitvizError, ValueError):
    """An intervention the model cannot do (exactly): a layer, head or token out of range, an unknown mode, a
    reference set too small, a source of another size, or a model without vitviz's hook points."""


def image_name(image: Any) -> str:
    if isinstance(image, (str, Path)):
        return Path(image).name
    return "tensor" if isinstance(image, torch.Tensor) else type(image).__name__


def _tokens_text(tokens: Sequence[int] | None) -> str:
    return "all tokens" if tokens is None else "token" + ("s " if len(tokens) > 1 else " ") + \
        ",".join(map(str, tokens))


@dataclass(frozen=True)
class Ablate:
    """Ablate each (layer, head) of `heads`: 'zero', 'mean' (over `reference`, >= 2 images) or 'resample' (from
    `reference`, one image)."""

    heads: Sequence[tuple[int, int]]
    mode: str = "zero"
    reference: Any = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "heads", tuple((int(l_), int(h)) for l_, h in self.heads))
        if not self.heads:
            raise InterventionError("an ablation needs at least one (layer, head)")
        if self.mode not in ABLATION_MODES:
            raise InterventionError(f"ablation mode {self.mode!r}; expected one of {', '.join(ABLATION_MODES)}")
        if self.mode == "zero" and self.reference is not None:
            raise InterventionError("a zero ablation takes no reference images")
        if self.mode == "resample" and (self.reference is None or is_set(self.reference)):
            raise InterventionError("a resampling ablation takes one reference image (the one the head's output is "
                                    "taken from)")
        if self.mode == "mean":
            n = len(self.reference) if is_set(self.reference) else 0 if self.reference is None else 1
            if n < MEAN_MIN_IMAGES:
                raise InterventionError(f"a mean ablation needs a reference set of at least {MEAN_MIN_IMAGES} "
                                        f"images; got {n}")

    def describe(self) -> str:
        heads = "+".join(f"L{l_}.H{h}" for l_, h in self.heads)
        if self.mode == "zero":
            how = "zero"
        elif self.mode == "mean":
            how = f"mean over {len(self.reference)} images"
        else:
            how = f"resampled from {image_name(self.reference)}"
        return f"ablate {heads} ({how})"


@dataclass(frozen=True)
class PatchAttention:
    """Use `source`'s attention pattern in layer `layer`, head `head` (None: every head) while running the image."""

    layer: int
    head: int | None
    source: Any

    def describe(self) -> str:
        head = " (all heads)" if self.head is None else f".H{self.head}"
        return f"attention of L{self.layer}{head} from {image_name(self.source)}"


@dataclass(frozen=True)
class PatchResidual:
    """Replace block `layer`'s output at `tokens` (None: every token) by `source`'s."""

    layer: int
    source: Any
    tokens: Sequence[int] | None = None

    def __post_init__(self) -> None:
        if self.tokens is not None:
            object.__setattr__(self, "tokens", tuple(int(t) for t in self.tokens))

    def describe(self) -> str:
        return f"block {self.layer} output at {_tokens_text(self.tokens)} from {image_name(self.source)}"


@dataclass(frozen=True)
class Knockout:
    """No query attends to the key `tokens` (e.g. [0] for CLS, the registers' indices) in `layers` x `heads`
    (None: all); each attention row is renormalised over the keys left."""

    tokens: Sequence[int]
    layers: Sequence[int] | None = None
    heads: Sequence[int] | None = None

    def __post_init__(self) -> None:
        for name in ("tokens", "layers", "heads"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, tuple(int(v) for v in value))
        if not self.tokens:
            raise InterventionError("a knockout needs at least one token")

    def describe(self) -> str:
        layers = "all layers" if self.layers is None else "layers " + ",".join(map(str, self.layers))
        heads = "all heads" if self.heads is None else "heads " + ",".join(map(str, self.heads))
        return f"knock out attention to {_tokens_text(self.tokens)} in {layers}, {heads}"


Intervention = Ablate | PatchAttention | PatchResidual | Knockout


def is_set(value: Any) -> bool:
    """A reference set (list / tuple of images, or a batch tensor of more than one) rather than one image."""
    if isinstance(value, torch.Tensor):
        return value.ndim == 4 and value.shape[0] > 1
    return isinstance(value, (list, tuple))


def as_list(intervene: Any) -> list[Intervention]:
    """One intervention or an iterable of them -> a list (None -> [])."""
    if intervene is None:
        return []
    items = [intervene] if isinstance(intervene, (Ablate, PatchAttention, PatchResidual, Knockout)) \
        else list(intervene)
    for item in items:
        if not isinstance(item, (Ablate, PatchAttention, PatchResidual, Knockout)):
            raise InterventionError(f"{item!r} is not an intervention; expected Ablate, PatchAttention, "
                                    "PatchResidual or Knockout")
    return items


def check_model(model: Any) -> Any:
    """The model's reference ViT; a model without its hook points is refused, saying why."""
    from vitviz.core.running.model import ReferenceViT

    net = getattr(model, "net", None)
    if isinstance(net, ReferenceViT):
        return net
    kind = type(model).__name__
    if kind == "LiveModel":
        why = LIVE_REFUSAL
    elif kind == "WindowedModel":
        why = WINDOWED_REFUSAL
    else:
        why = f"it runs as {type(net).__name__}, without vitviz's head and attention hook points"
    raise InterventionError(f"interventions need vitviz's reference ViT; this model ({model.spec.family}, "
                            f"{kind}) cannot take them exactly: {why}")


def _check_layer(layer: int, depth: int, what: str = "layer") -> int:
    if not 0 <= int(layer) < depth:
        raise InterventionError(f"{what} {layer} out of range: the model has {depth} layers (0-{depth - 1})")
    return int(layer)


def _check_head(head: int, heads: int) -> int:
    if not 0 <= int(head) < heads:
        raise InterventionError(f"head {head} out of range: the model has {heads} heads per layer (0-{heads - 1})")
    return int(head)


def _check_tokens(tokens: Iterable[int], count: int, spec: ModelSpec) -> list[int]:
    out = []
    for t in tokens:
        if not 0 <= int(t) < count:
            raise InterventionError(f"token {t} out of range: the input has {count} tokens (0-{count - 1}; "
                                    f"prefix {', '.join(spec.prefix_names) or 'none'})")
        out.append(int(t))
    return out


def _check_one(source: Any) -> None:
    if is_set(source):
        raise InterventionError("a patch takes its values from one source image; got a set of "
                                f"{len(source)} (a mean over images is Ablate(..., 'mean', reference=...))")


def check(items: Sequence[Intervention], spec: ModelSpec) -> None:
    """Refuse an intervention out of this spec's range (layers, heads, tokens at the spec's image size)."""
    depth, heads, count = spec.depth, spec.num_heads, spec.num_tokens
    for item in items:
        if isinstance(item, Ablate):
            for layer, head in item.heads:
                _check_layer(layer, depth)
                _check_head(head, heads)
        elif isinstance(item, PatchAttention):
            _check_layer(item.layer, depth)
            if item.head is not None:
                _check_head(item.head, heads)
            _check_one(item.source)
        elif isinstance(item, PatchResidual):
            _check_layer(item.layer, depth, "block")
            _check_one(item.source)
            if item.tokens is not None:
                _check_tokens(item.tokens, count, spec)
        else:
            _check_tokens(item.tokens, count, spec)
            if len(set(item.tokens)) >= count:
                raise InterventionError(f"a knockout of all {count} tokens leaves no key to attend to; keep at "
                                        "least one")
            for layer in item.layers or ():
                _check_layer(layer, depth)
            for head in item.heads or ():
                _check_head(head, heads)


def inputs_at(model: Any, images: Any, spec: ModelSpec) -> torch.Tensor:
    """(N, C, H, W) inputs of `images` (one or several) at `spec`'s size; a tensor of another size is refused."""
    if isinstance(images, torch.Tensor) and images.ndim == 4:
        parts = [images[i: i + 1] for i in range(images.shape[0])]
    else:
        parts = list(images) if is_set(images) else [images]
    out = []
    for image in parts:
        x = model.prepare(image, spec.image_size)[0]
        if tuple(x.shape[-2:]) != tuple(spec.image_size):
            raise InterventionError(f"source {image_name(image)} is {tuple(x.shape[-2:])} px; the intervened run is "
                                    f"{tuple(spec.image_size)} px (give an image, or a tensor of that size)")
        out.append(x)
    return torch.cat(out)


def record(model: Any, x: torch.Tensor, heads: Sequence[int] = (), attention: Sequence[int] = (),
           blocks: Sequence[int] = (), batch: int = 8, mean: bool = False) -> dict[str, dict[int, torch.Tensor]]:
    """A clean pass of x (N, C, H, W): the head outputs (N, H, T, hd) of layers `heads`, the softmax (N, H, T, T) of
    layers `attention` and the outputs (N, T, D) of `blocks`, on the model's device, in `batch`-sized passes.
    `mean`: only their mean over the N images (float32, (1, ...)), summed as the passes go: a large reference set
    is never held whole."""
    net = check_model(model)
    out: dict[str, dict[int, list[torch.Tensor]]] = {"heads": {}, "attention": {}, "blocks": {}}
    count = int(x.shape[0])
    points = [("heads", i, net.blocks[i].attn.head_probe) for i in heads]
    points += [("attention", i, net.blocks[i].attn.attn_probe) for i in attention]
    points += [("blocks", i, net.blocks[i]) for i in blocks]

    def keep(kind: str, index: int):  # noqa: ANN202 - a forward hook
        def hook(_m: torch.nn.Module, _inp: Any, value: torch.Tensor) -> None:
            kept = out[kind].setdefault(index, [])
            if not mean:
                kept.append(value.detach().clone())
            elif kept:
                kept[0] += value.detach().float().sum(0, keepdim=True) / count
            else:
                kept.append(value.detach().float().sum(0, keepdim=True) / count)
        return hook

    device = next(net.parameters()).device
    with model._lock, torch.inference_mode():
        handles = [m.register_forward_hook(keep(kind, i)) for kind, i, m in points]
        try:
            for start in range(0, int(x.shape[0]), batch):
                net(x[start: start + batch].to(device))
        finally:
            for h in handles:
                h.remove()
    return {kind: {i: torch.cat(v) for i, v in d.items()} for kind, d in out.items()}


@dataclass
class _Bound:
    """The hooks one intervention needs: (module, forward hook) pairs."""

    hooks: list[tuple[torch.nn.Module, Any]] = field(default_factory=list)


def _replace_heads(layer_heads: list[int], values: torch.Tensor | None):  # noqa: ANN202 - a forward hook
    """A head_probe hook that sets the heads `layer_heads` of (B, H, T, hd) to `values` (H', T, hd) or 0."""
    def hook(_m: torch.nn.Module, _inp: Any, out: torch.Tensor) -> torch.Tensor:
        out = out.clone()
        for j, h in enumerate(layer_heads):
            out[:, h] = 0 if values is None else values[j].to(out.dtype)
        return out
    return hook


def _bind(model: Any, item: Intervention, spec: ModelSpec) -> _Bound:
    net = model.net
    bound = _Bound()
    if isinstance(item, Ablate):
        layers: dict[int, list[int]] = {}
        for layer, head in item.heads:
            layers.setdefault(layer, []).append(head)
        means: dict[int, torch.Tensor] = {}
        if item.mode != "zero":   # (H, T, hd) per layer: the mean over the reference set, or the one image's value
            seen = record(model, inputs_at(model, item.reference, spec), heads=sorted(layers), mean=True)["heads"]
            means = {i: v[0] for i, v in seen.items()}
        for layer, heads in layers.items():
            values = None if item.mode == "zero" else means[layer][heads]
            bound.hooks.append((net.blocks[layer].attn.head_probe, _replace_heads(heads, values)))
    elif isinstance(item, PatchAttention):
        src = record(model, inputs_at(model, item.source, spec), attention=[item.layer])["attention"][item.layer]

        def patch(_m: torch.nn.Module, _inp: Any, out: torch.Tensor, head=item.head, src=src[0]) -> torch.Tensor:
            out = out.clone()
            if head is None:
                out[:] = src
            else:
                out[:, head] = src[head]
            return out
        bound.hooks.append((net.blocks[item.layer].attn.attn_probe, patch))
    elif isinstance(item, PatchResidual):
        src = record(model, inputs_at(model, item.source, spec), blocks=[item.layer])["blocks"][item.layer][0]
        index = None if item.tokens is None else torch.tensor(item.tokens, dtype=torch.long, device=src.device)

        def residual(_m: torch.nn.Module, _inp: Any, out: torch.Tensor, src=src, index=index) -> torch.Tensor:
            out = out.clone()
            if index is None:
                out[:] = src.to(out.dtype)
            else:
                out[:, index] = src[index].to(out.dtype)
            return out
        bound.hooks.append((net.blocks[item.layer], residual))
    else:
        keys = sorted(set(item.tokens))

        def knockout(_m: torch.nn.Module, _inp: Any, out: torch.Tensor, heads=item.heads, keys=keys) -> torch.Tensor:
            keep = torch.ones(out.shape[-1], dtype=out.dtype, device=out.device)
            keep[keys] = 0
            cut = out * keep   # out of place: the hook also runs inside autograd (gradient maps)
            cut = cut / cut.sum(dim=-1, keepdim=True)
            if heads is None:
                return cut
            chosen = torch.zeros(out.shape[1], dtype=torch.bool, device=out.device)
            chosen[list(heads)] = True
            return torch.where(chosen[None, :, None, None], cut, out)
        for layer in (range(spec.depth) if item.layers is None else item.layers):
            bound.hooks.append((net.blocks[layer].attn.attn_probe, knockout))
    return bound


@contextmanager
def applied(model: Any, intervene: Any, spec: ModelSpec | None = None) -> Iterator[tuple[str, ...]]:
    """Apply interventions to `model`'s passes while the context is open; yields their descriptions.

    The sources are run first (clean); the model's lock is held throughout, so a pass of another thread waits
    instead of running intervened. `spec`: the spec of the runs (its image size), default the model's.
    """
    items = as_list(intervene)
    check_model(model)
    spec = spec or model.spec
    check(items, spec)
    with model._lock, ExitStack() as stack:
        hooks = [hook for item in items for hook in _bind(model, item, spec).hooks]
        for module, hook in hooks:
            stack.callback(module.register_forward_hook(hook).remove)
        before = getattr(model, "interventions", ())
        model.interventions = tuple(before) + tuple(item.describe() for item in items)
        stack.callback(setattr, model, "interventions", before)
        yield model.interventions


@contextmanager
def head_mask(net: Any, mask: torch.Tensor, values: dict[int, torch.Tensor] | None = None) -> Iterator[None]:
    """Ablate heads per batch element: mask (B, L, H) bool says which heads of each element are ablated, to 0 or
    to `values[layer]` (H, T, hd). For the importance scan: several ablated copies of one image in one pass."""
    def hook_for(layer: int):  # noqa: ANN202 - a forward hook
        m = mask[:, layer, :, None, None]

        def hook(_m: torch.nn.Module, _inp: Any, out: torch.Tensor) -> torch.Tensor:
            fill = torch.zeros((), dtype=out.dtype, device=out.device) if values is None \
                else values[layer].to(out.device, out.dtype)
            return torch.where(m.to(out.device), fill, out)
        return hook

    layers = [i for i in range(mask.shape[1]) if bool(mask[:, i].any())]
    handles = [net.blocks[i].attn.head_probe.register_forward_hook(hook_for(i)) for i in layers]
    try:
        yield
    finally:
        for h in handles:
            h.remove()
