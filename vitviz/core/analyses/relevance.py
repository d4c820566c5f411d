"""Class- and embedding-specific relevance from attention gradients: Chefer's generic rule, vit-explain's gradient
rollout, attention x gradient per layer and head, and LeGrad.

    from vitviz.core.analyses.relevance import class_relevance, legrad
    rel = class_relevance(model, "cat.jpg")          # the top class; rel.chefer is (gh, gw)
    rel = class_relevance(model, "cat.jpg", 243)     # any class index
    leg = legrad(model, "cat.jpg", text_embedding)   # a target embedding the size of the output; leg.map is (gh, gw)

Every method needs one score s -- a class logit, or <normalize(output), e> for a target embedding e (pass a unit
vector for the cosine similarity) -- and, for each layer l, the attention A_l (H, T, T) with its gradient
G_l = ds/dA_l. They run a separate forward pass of the same reference ViT with autograd on: the probabilities are
read from the `attn_probe` identities by forward hooks (the plain capture's direct-write `target` stays unset, and
the prepacked linears of `core.packed` step aside under autograd), and the gradients come from `torch.autograd.grad`
to exactly those tensors. The weights are frozen for the call (no parameter gradients; the input is the only leaf
that requires grad), the model stays in eval mode on its device, and the plain no-grad capture is not touched.

Query. A map is the row of the final relevance (or rollout) matrix that belongs to what the head reads, over the
patch columns: token 0 for `pooling='token'` (CLS; with the distillation token averaged in for a distilled model,
whose output averages two heads), the mean of the patch rows for 'avg', of all rows for 'avg_all', half CLS and half
patch mean for 'cls_avg' (`pooling_query`). For CLS models this is exactly the references' row 0. For pooled models
without CLS, which the references do not cover, the rows are weighted as the pooling weights the tokens. Prefix
columns (CLS, dist, registers) are never part of a map; the Chefer result keeps them apart (`chefer_prefix`).

Methods:
- Chefer et al. 2021, "Generic attention-model explainability" (ICCV), as in the authors' Transformer-MM-
  Explainability ViT notebook (`generate_relevance`): R = I; for each layer, first to last, R <- R + Ē_l R with
  Ē_l = mean over heads of clamp(G_l ⊙ A_l, min=0). Computed here as a row vector pulled back through the layers
  (v <- v + v Ē_l, last layer first): the same product in O(L·T²).
- Gradient rollout of jacobgil/vit-explain `vit_grad_rollout.py`. `exact_reference=True` (the default) reproduces
  what that code computes with current torch and timm, quirks included:
    1. its "gradients" come from a non-full `register_backward_hook` on `attn_drop`, an identity in eval that returns
       its input unchanged, so the hook sits on the softmax's autograd node and receives ds/dS, the gradient with
       respect to the pre-softmax scores S, not ds/dA (here ds/dS = A ⊙ (G - rowsum(A ⊙ G)));
    2. backward hooks fire last layer first, so layer l's attention is paired with layer L-1-l's gradient
       (vit-explain issue #6);
    3. heads are fused by the mean of A ⊙ W, then negative entries are set to 0;
    4. the lowest int(T·T·discard_ratio) entries of the whole (T, T) fused matrix are zeroed, CLS row and column
       included;
    5. a = (F + I) / 2 is divided by `a.sum(dim=-1)` without keepdim, which broadcasts: entry (i, j) is divided by
       the sum of row j (vit-explain issue #16);
    6. the map is divided by its maximum.
  `exact_reference=False` fixes 1, 2, 5 and 6 (each layer's own ds/dA, rows normalised, raw values) and discards per
  row among the patch columns, as `vitviz.core.analyses.rollout` does (prefix columns are kept).
- Attention x gradient per layer and head: the query row of A_l,h ⊙ G_l,h over the patches, signed (not clamped).
The products A ⊙ G are formed in the attention's dtype (float32: one rounding) and every sum over heads, rows and
layers in float64; the maps agree with the references to ~1e-7.
- LeGrad (Bousselham et al., arXiv 2404.03214), the recipe of `legrad/wrapper.py` `compute_legrad_clip`: for each
  layer l from `layer_index` on, the model's head applied to the mean of all of that layer's output tokens (prefix
  included) after the final norm gives e_l; s_l = <normalize(e_l), target> (or the class logit e_l[c]);
  ds_l/dA_l is clamped at 0, averaged over heads and then over the query rows; its patch columns are summed over the
  layers. `legrad_pixels` applies the reference's last step (bilinear upsampling by the patch size, min-max).
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Union

import numpy as np
import torch
import torch.nn.functional as F

from vitviz.core.running.capture import VitModel
from vitviz.core.running.model import ReferenceViT
from vitviz.core.options import ONE_VECTOR_POOLINGS
from vitviz.core.protocol import GRADIENTS, capabilities_of
from vitviz.core.spec import ModelSpec
from vitviz.errors import VitvizError

Target = Union[int, np.integer, np.ndarray, Sequence[float], None]



class RelevanceError(VitvizError, ValueError):
    """A relevance map was asked for something the model or its output cannot give (a class index out of range, a
    target embedding of the wrong size, a model that is not the reference ViT, an unknown pooling)."""


@dataclass(frozen=True, eq=False)
class Relevance:
    """Class- or embedding-specific maps of one image, from one forward and one backward pass.

    Attributes:
        chefer: (gh, gw) float32, Chefer et al.'s generic relevance: the query row of R over the patches.
        chefer_prefix: (P,) float32, the same row over the prefix tokens (CLS, dist, registers).
        grad_rollout: (gh, gw) float32, vit-explain's gradient rollout (see the module docstring for
            `exact_reference`); max-normalised when exact.
        attn_grad: (L, H, gh, gw) float32, the query row of A ⊙ dA per layer and head, signed.
        logits: (C,) float32, the model's output (class scores, or a headless model's features/embedding).
        target: the class index explained, or None for a target embedding.
        score: the score whose gradient was taken (the logit, or the embedding similarity).
        query: which row the maps are: 'cls' (or 'token 0' without CLS), 'cls+dist', 'patch mean', 'token mean' or
            'cls+patch mean' (`pooling_query`).
        discard_ratio: the gradient rollout's discard ratio.
        exact_reference: whether the gradient rollout is vit-explain's exact computation.
        spec: the model spec at this run's resolution (grid, prefix tokens).
        image: (H, W, 3) uint8, the image as the model saw it.
        source: the path or a description of the image.
    """

    chefer: np.ndarray
    chefer_prefix: np.ndarray
    grad_rollout: np.ndarray
    attn_grad: np.ndarray
    logits: np.ndarray
    target: int | None
    score: float
    query: str
    discard_ratio: float
    exact_reference: bool
    spec: ModelSpec
    image: np.ndarray
    source: str = ""


@dataclass(frozen=True, eq=False)
class LeGradMap:
    """LeGrad for one image and one target.

    Attributes:
        map: (gh, gw) float32, the sum of `per_layer` (raw; `legrad_pixels` gives the reference's pixel map).
        per_layer: (len(layers), gh, gw) float32, each layer's clamped gradient averaged over heads and queries.
        layers: the layers used (0-based), from `layer_index` to the last.
        target: the class index explained, or None for a target embedding.
        scores: (len(layers),) float32, each layer's score s_l.
        spec: the model spec at this run's resolution.
        image: (H, W, 3) uint8, the image as the model saw it.
    """

    map: np.ndarray
    per_layer: np.ndarray
    layers: tuple[int, ...]
    target: int | None
    scores: np.ndarray
    spec: ModelSpec
    image: np.ndarray


def pooling_query(spec: ModelSpec) -> tuple[np.ndarray, str]:
    """The (T,) float64 weights of the rows a map reads, as the model's pooling weights its tokens, and their name.

    Raises:
        RelevanceError: for a pooling this module does not know.
    """
    t, p = spec.num_tokens, spec.num_prefix
    q = np.zeros(t)
    if spec.pooling == "token":
        if spec.head_dist:  # output = (head(token 0) + head_dist(token 1)) / 2
            q[:2] = 0.5
            return q, "cls+dist"
        q[0] = 1.0
        return q, "cls" if spec.cls_token else "token 0"
    if spec.pooling == "avg":
        q[p:] = 1.0 / (t - p)
        return q, "patch mean"
    if spec.pooling == "avg_all":
        q[:] = 1.0 / t
        return q, "token mean"
    if spec.pooling == "cls_avg":
        q[0] = 0.5
        q[p:] += 0.5 / (t - p)
        return q, "cls+patch mean"
    raise RelevanceError(f"pooling {spec.pooling!r} has no relevance query; expected 'token', 'avg', 'avg_all' or "
                         "'cls_avg'")


def _check_model(model: VitModel) -> ReferenceViT:
    """The model's reference ViT, when its attention is exposed to autograd ('gradients' in its capabilities)."""
    if GRADIENTS not in capabilities_of(model):
        net = getattr(model, "net", None)
        raise RelevanceError(f"gradient maps need vitviz's reference ViT; this model runs as "
                             f"{type(net).__name__} ({model.spec.family}): its attention is not exposed to autograd")
    return model.net


@contextmanager
def _autograd_pass(model: VitModel) -> Iterator[ReferenceViT]:
    """The model's net, locked against other passes, with autograd on and its weights frozen until the context
    closes (requires_grad restored in `finally`)."""
    net = _check_model(model)
    with model._lock:  # the forward hooks sit on the shared net: one pass at a time, as in VitModel.forward_captured
        probes = [b.attn.attn_probe for b in net.blocks]
        if any(p.target is not None for p in probes):
            raise RelevanceError("an attention capture is bound to this model's probes; gradient maps need them free")
        trainable = [p for p in net.parameters() if p.requires_grad]
        for p in trainable:
            p.requires_grad_(False)
        try:
            with torch.inference_mode(False), torch.enable_grad():
                yield net
        finally:
            for p in trainable:
                p.requires_grad_(True)


def _forward(net: ReferenceViT, x: torch.Tensor, keep: Sequence[int] = ()) -> tuple[
        torch.Tensor, list[torch.Tensor], dict[int, torch.Tensor]]:
    """Run `net` on x (1, C, H, W) inside autograd.

    Returns:
        the output (1, C), every layer's attention (1, H, T, T) in the graph, and the outputs (1, T, D) of the
        blocks in `keep`.
    """
    attn: list[torch.Tensor] = []
    outs: dict[int, torch.Tensor] = {}

    def keep_block(index: int):  # noqa: ANN202 - a forward hook
        def hook(_m: torch.nn.Module, _inp: Any, out: torch.Tensor) -> None:
            outs[index] = out
        return hook

    handles = [b.attn.attn_probe.register_forward_hook(lambda _m, _i, out: attn.append(out)) for b in net.blocks]
    handles += [net.blocks[i].register_forward_hook(keep_block(i)) for i in keep]
    try:
        out = net(x)
    finally:
        for h in handles:
            h.remove()
    if len(attn) != len(net.blocks):
        raise RelevanceError(f"the forward pass produced {len(attn)} attention maps for {len(net.blocks)} layers")
    return out, attn, outs


def _input(model: VitModel, image: Any, image_size: tuple[int, int] | None) -> tuple[
        torch.Tensor, np.ndarray, ModelSpec, str]:
    """(1, C, H, W) input on the model's device, the only leaf that requires grad; display image, spec, source."""
    x, disp, spec, src, _seen = model.prepare(image, image_size)
    if x.shape[0] != 1:
        raise RelevanceError(f"gradient maps explain one image at a time; found a batch of {x.shape[0]}")
    param = next(model.net.parameters())
    with torch.inference_mode(False):  # a normal tensor even when the caller is in inference mode
        x = x.to(device=param.device, dtype=param.dtype).detach().clone().requires_grad_(True)
    return x, disp, spec, src


def _class_index(target: Any, out: torch.Tensor, spec: ModelSpec) -> int:
    c = int(out.shape[-1])
    if spec.num_classes == 0:
        raise RelevanceError(f"the model has no classifier (its output is a ({c},) feature vector), so there is no "
                             f"class to explain; pass a target embedding of shape ({c},)")
    index = int(out[0].argmax()) if target is None else int(target)
    if not 0 <= index < c:
        raise RelevanceError(f"class index {index} out of range: the model has {c} classes (0..{c - 1})")
    return index


def _score(out: torch.Tensor, target: Target, spec: ModelSpec) -> tuple[torch.Tensor, int | None]:
    """The scalar to explain from an output (1, C): the logit of a class (None: the top one), or
    <normalize(output), e> for a target embedding e of shape (C,)."""
    if target is None or (isinstance(target, (int, np.integer)) and not isinstance(target, bool)):
        index = _class_index(target, out, spec)
        return out[0, index], index
    if isinstance(target, bool):
        raise RelevanceError(f"target {target!r}: expected a class index or an embedding vector")
    try:
        vec = np.asarray(target, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise RelevanceError(f"target {target!r}: expected a class index or an embedding vector") from e
    c = int(out.shape[-1])
    if vec.shape != (c,):
        raise RelevanceError(f"target embedding of shape {vec.shape}; expected ({c},), the size of the model's output")
    if not np.isfinite(vec).all():
        raise RelevanceError("target embedding holds NaN or infinite values")
    e = torch.as_tensor(vec, dtype=out.dtype, device=out.device)
    return (F.normalize(out, dim=-1)[0] * e).sum(), None


def _check_ratio(discard_ratio: float) -> float:
    if not 0.0 <= float(discard_ratio) < 1.0:
        raise RelevanceError(f"discard_ratio must lie in [0, 1), found {discard_ratio}")
    return float(discard_ratio)


@dataclass(frozen=True, eq=False)
class RelevanceRows:
    """The token rows behind the maps (prefix columns included), float64 on the attention's device.

    Attributes:
        chefer: (T,) q^T R, Chefer et al.'s relevance, R = (I + Ē_{L-1}) ... (I + Ē_0).
        grad_rollout: (T,) q^T a_{L-1} ... a_0, vit-explain's gradient rollout (not max-normalised).
        attn_grad: (L, H, T) the query row of A ⊙ dA per layer and head.
    """

    chefer: torch.Tensor
    grad_rollout: torch.Tensor
    attn_grad: torch.Tensor


def relevance_rows(attn: Sequence[torch.Tensor], grads: Sequence[torch.Tensor], query: torch.Tensor,
                   num_prefix: int, discard_ratio: float = 0.9, exact_reference: bool = True) -> RelevanceRows:
    """Chefer relevance, gradient rollout and attention x gradient rows from every layer's attention and gradient,
    in one pass over the layers (last first; the module docstring has the recipes).

    Args:
        attn, grads: per layer, (H, T, T) or (1, H, T, T) attention and ds/dA, any float dtype and device.
        query: (T,) row weights (`pooling_query`).
        num_prefix: prefix tokens before the patches (the per-row discard of the fixed gradient rollout).
        discard_ratio: the share of entries the gradient rollout zeroes in each layer's fused matrix, in [0, 1).
        exact_reference: the gradient rollout as vit-explain computes it (True) or with its quirks fixed.
    """
    discard_ratio = _check_ratio(discard_ratio)
    depth, t = len(attn), attn[0].shape[-1]
    dev = attn[0].device
    f64 = torch.float64

    def layer(i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(H, T, T) attention and A ⊙ dA in their own dtype (float32: one rounding, ~6e-8 relative); the sums over
        heads, rows and layers below accumulate in float64."""
        a = attn[i].reshape(-1, t, t)
        return a, a * grads[i].reshape(-1, t, t).to(a.dtype)

    eye = torch.eye(t, dtype=f64, device=dev)
    q = query.to(device=dev, dtype=f64)
    rows = torch.nonzero(q).flatten()  # the query's rows (one for CLS)
    chefer, roll = q, q
    per_head = []
    for i in reversed(range(depth)):
        a, prod = layer(i)
        chefer = chefer + chefer @ prod.clamp(min=0).mean(dim=0, dtype=f64)  # Ē: (H, T, T) -> (T, T)
        per_head.append(torch.einsum("r,hrk->hk", q[rows], prod[:, rows].to(f64)))  # (H, T)
        if exact_reference:
            a_src, prod_src = layer(depth - 1 - i)  # quirk 2: backward hooks append last layer first
            ds = prod_src - a_src * prod_src.sum(dim=-1, keepdim=True)  # quirk 1: ds/dS = A ⊙ (G - rowsum(A ⊙ G))
            fused = (a * ds).mean(dim=0, dtype=f64).clamp(min=0)  # quirk 3: (H, T, T) -> (T, T)
            k = int(t * t * discard_ratio)  # quirk 4: the k lowest of the whole flattened matrix are zeroed
            if k:
                flat = fused.view(-1)
                kept = flat.topk(flat.numel() - k).indices  # the rest, cheaper to find than the k lowest
                fused = torch.zeros_like(flat).index_copy_(0, kept, flat[kept]).view(t, t)
            m = (fused + eye) / 2
            m = m / m.sum(dim=-1)  # quirk 5: (T, T) / (T,) divides column j by the sum of row j
        else:
            fused = prod.mean(dim=0, dtype=f64).clamp(min=0)  # (H, T, T) -> (T, T)
            k = int(np.floor(discard_ratio * (t - num_prefix) + 1e-9))
            if k:
                patches = fused[:, num_prefix:]  # (T, N) view
                patches.scatter_(1, patches.topk(k, dim=1, largest=False).indices, 0.0)
            m = (fused + eye) / 2
            m = m / m.sum(dim=-1, keepdim=True)
        roll = roll @ m
    return RelevanceRows(chefer=chefer, grad_rollout=roll, attn_grad=torch.stack(per_head[::-1]))


def _grid(vec: np.ndarray, spec: ModelSpec) -> np.ndarray:
    """(..., T) -> (..., gh, gw) float32: the patch columns on the grid (prefix columns dropped)."""
    gh, gw = spec.grid
    patches = vec[..., spec.num_prefix:]
    if patches.shape[-1] != gh * gw:
        raise RelevanceError(f"{patches.shape[-1]} patch tokens do not fill the {gh}x{gw} grid of the spec")
    return patches.reshape(*vec.shape[:-1], gh, gw).astype(np.float32)  # (..., N) -> (..., gh, gw)


def class_relevance(model: VitModel, image: Any, target: Target = None, *, discard_ratio: float = 0.9,
                    exact_reference: bool = True, image_size: tuple[int, int] | None = None) -> Relevance:
    """Chefer relevance, gradient rollout and attention x gradient for one class (or target embedding) of one image.

    Args:
        model: a loaded `VitModel` with vitviz's reference ViT (any device).
        image: a path, PIL image, (H, W[, C]) array or a ready (1, C, H, W) tensor, as for `VitModel.run`.
        target: a class index (None: the top class), or an embedding of the output's size (score
            <normalize(output), target>).
        discard_ratio: the gradient rollout's discard ratio (vit-explain's default 0.9).
        exact_reference: the gradient rollout exactly as vit-explain computes it (True) or with its quirks fixed.
        image_size: run at another (h, w), as `VitModel.run`.

    Raises:
        RelevanceError: class index out of range, wrong embedding size, a headless model without a target
            embedding, or a model that is not the reference ViT.
    """
    discard_ratio = _check_ratio(discard_ratio)
    _check_model(model)
    x, disp, spec, src = _input(model, image, image_size)
    q_np, q_name = pooling_query(spec)
    with _autograd_pass(model) as net:
        out, attn, _ = _forward(net, x)
        score, index = _score(out, target, spec)
        grads = torch.autograd.grad(score, attn)  # frees the graph
        rows = relevance_rows([a.detach() for a in attn], grads, torch.as_tensor(q_np), spec.num_prefix,
                              discard_ratio, exact_reference)
    roll_np = rows.grad_rollout.cpu().numpy()[spec.num_prefix:]
    if exact_reference:
        roll_np = roll_np / roll_np.max()  # quirk 6
    chefer_np = rows.chefer.cpu().numpy()
    return Relevance(
        chefer=_grid(chefer_np, spec), chefer_prefix=chefer_np[: spec.num_prefix].astype(np.float32),
        grad_rollout=_grid(np.concatenate([np.zeros(spec.num_prefix), roll_np]), spec),
        attn_grad=_grid(rows.attn_grad.cpu().numpy(), spec), logits=out.detach()[0].float().cpu().numpy(),
        target=index, score=float(score.detach()), query=q_name, discard_ratio=discard_ratio,
        exact_reference=exact_reference, spec=spec, image=disp, source=src)


def _embed_pooled(net: ReferenceViT, pooled: torch.Tensor) -> torch.Tensor:
    """The model's head on a pooled (B, D) vector, after the final norm, as LeGrad applies `ln_post` and `proj`."""
    n = net.norm_extra(net.norm(pooled))
    out = net.head(net.pre_logits(net.fc_norm(n)))
    if net.head_dist is not None:
        out = (out + net.head_dist(n)) / 2
    return out


def legrad(model: VitModel, image: Any, target: Target = None, *, layer_index: int = -2,
           image_size: tuple[int, int] | None = None) -> LeGradMap:
    """LeGrad for a target embedding (e.g. a CLIP text embedding, if the model's head projects to that space) or a
    class, following `legrad/wrapper.py` `compute_legrad_clip` (see the module docstring).

    Args:
        model: a loaded `VitModel` with vitviz's reference ViT.
        image: as for `VitModel.run`.
        target: an embedding of the output's size (score <normalize(e_l), target>, LeGrad's image-text
            similarity), or a class index (the logit; None: the model's top class).
        layer_index: the first layer used (negative counts from the end; LeWrapper's default -2).
        image_size: run at another (h, w).
    """
    net = _check_model(model)
    if model.spec.pooling not in ONE_VECTOR_POOLINGS:
        raise RelevanceError(f"LeGrad applies the head to one mean-pooled D-wide token; pooling "
                             f"{model.spec.pooling!r} needs {', '.join(ONE_VECTOR_POOLINGS)}")
    depth = len(net.blocks)
    start = layer_index + depth if layer_index < 0 else layer_index
    if not 0 <= start < depth:
        raise RelevanceError(f"layer_index {layer_index} out of range for a model with {depth} layers")
    x, disp, spec, _src = _input(model, image, image_size)
    with _autograd_pass(model) as net:
        out, attn, outs = _forward(net, x, keep=range(start, depth))
        fixed = target if target is not None else _class_index(None, out.detach(), spec)
        maps, scores, index = [], [], None
        for layer in range(start, depth):
            emb = _embed_pooled(net, outs[layer].mean(dim=1))  # (1, T, D) -> (1, D) -> (1, C)
            score, index = _score(emb, fixed, spec)
            grad = torch.autograd.grad(score, attn[layer], retain_graph=True)[0]  # (1, H, T, T)
            maps.append(grad[0].double().clamp(min=0).mean(dim=0).mean(dim=0))  # heads, then queries -> (T,)
            scores.append(float(score.detach()))
    per_layer = _grid(torch.stack(maps).cpu().numpy(), spec)  # (L', T) -> (L', gh, gw)
    return LeGradMap(map=per_layer.sum(axis=0, dtype=np.float64).astype(np.float32), per_layer=per_layer,
                     layers=tuple(range(start, depth)), target=index, scores=np.asarray(scores, np.float32),
                     spec=spec, image=disp)


def legrad_pixels(grid_map: np.ndarray, patch_size: int) -> np.ndarray:
    """LeGrad's output step: a (gh, gw) map upsampled bilinearly by `patch_size` (align_corners=False), then
    min-max normalised to [0, 1]: (gh * patch, gw * patch) float32."""
    m = torch.as_tensor(np.asarray(grid_map, dtype=np.float32))[None, None]  # (gh, gw) -> (1, 1, gh, gw)
    up = F.interpolate(m, scale_factor=patch_size, mode="bilinear")[0, 0]
    lo, hi = up.min(), up.max()
    return ((up - lo) / (hi - lo)).numpy() if hi > lo else torch.zeros_like(up).numpy()
