"""Head importance: what the model loses when each head is ablated alone, as a layers x heads grid.

    from vitviz.core.analyses.importance import head_importance
    imp = head_importance(model, ["a.png", "b.png"])           # drop of each image's top-class probability
    imp.drop                                                  # (L, H): mean over the images of clean - ablated
    imp.top(3)                                                # [(layer, head, drop), ...] largest drops first
    imp = head_importance(model, "a.png", attribution=True)   # and the first-order estimate beside it
    imp.estimate, imp.correlation                             # (L, H) and Pearson's r between the two grids

The exact scan runs L x H ablated forward passes per image, `batch_size` ablated copies of the image per pass
(each copy with a different head ablated: `vitviz.core.running.interventions.head_mask`), with `progress(done,
total)` after each pass and `cancel()` asked before each (True stops with `ScanCancelled`).

The metric is the chosen class's probability (`metric='probability'`, default for classifiers) or logit ('logit'),
the class being each image's top class unless `target` names one; for an embedding model (no classifier) it is
the cosine change of the output features, 1 - cos(ablated, clean) ('cosine'). A drop is clean - ablated (for
'cosine', the change itself): positive when the head helped.

Attribution patching (Nanda 2023; Syed et al. 2023, "Attribution patching outperforms automated circuit
discovery") estimates every drop from one forward and backward pass: with a_lh the head's output, v_lh what the
ablation puts there and g_lh = d metric / d a_lh at the clean run, drop ~ -sum((v_lh - a_lh) * g_lh). For the cosine
change the gradient at the clean run is zero (its extremum), so there is no first-order estimate: refused.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from vitviz.core.running.interventions import (
    ABLATION_MODES, Ablate, InterventionError, check_model, head_mask, image_name, inputs_at, is_set, record,
)
from vitviz.errors import VitvizError

METRICS = ("probability", "logit", "cosine")


class ScanCancelled(VitvizError):
    """The importance scan was stopped by its `cancel` callback."""


@dataclass(frozen=True, eq=False)
class HeadImportance:
    """The importance grid of one model over a set of images.

    Attributes:
        drop: (L, H) float64, mean over the images of (clean - ablated) metric; for 'cosine' 1 - cos.
        per_image: (N, L, H) float64, each image's drops.
        clean: (N,) the metric of each clean run (1.0 for 'cosine').
        metric: 'probability', 'logit' or 'cosine'.
        mode: the ablation: 'zero', 'mean' or 'resample'.
        targets: each image's class (None for 'cosine').
        sources: each image's name.
        labels: the targets' labels ('' where the model has none).
        estimate: (L, H) attribution patching's first-order estimate of `drop` (mean over images), or None.
        correlation: Pearson's r between `drop` and `estimate` over the L x H heads, or None.
        seconds: wall time of the exact scan; forwards: ablated forward passes it ran (batches).
        interventions: what else was done to the model during the scan (an open `model.intervening(...)`).
    """

    drop: np.ndarray
    per_image: np.ndarray
    clean: np.ndarray
    metric: str
    mode: str
    targets: tuple[int | None, ...]
    sources: tuple[str, ...]
    labels: tuple[str, ...]
    estimate: np.ndarray | None = None
    correlation: float | None = None
    seconds: float = 0.0
    forwards: int = 0
    interventions: tuple[str, ...] = ()

    def top(self, k: int = 5) -> list[tuple[int, int, float]]:
        """The k heads with the largest drop: [(layer, head, drop), ...]."""
        flat = np.argsort(-self.drop, axis=None, kind="stable")[:k]
        return [(int(i) // self.drop.shape[1], int(i) % self.drop.shape[1], float(self.drop.flat[i])) for i in flat]

    @property
    def title(self) -> str:
        """What the grid shows, e.g. "drop of P('star') when one head is ablated (zero), 1 image"."""
        what = {"probability": "P", "logit": "logit"}.get(self.metric)
        classes = sorted({label or f"class {t}" for t, label in zip(self.targets, self.labels) if t is not None})
        if what is None:
            subject = "cosine change of the features"
        else:
            subject = f"drop of {what}({', '.join(repr(c) for c in classes[:3])}{', ...' if len(classes) > 3 else ''})"
        n = len(self.sources)
        also = f", with {'; '.join(self.interventions)}" if self.interventions else ""
        return f"{subject} when one head is ablated ({self.mode}), {n} image{'s' if n > 1 else ''}{also}"

    def __repr__(self) -> str:
        (l_, h, d), = self.top(1)
        corr = "" if self.correlation is None else f", attribution r={self.correlation:.2f}"
        return (f"HeadImportance({self.title}: grid {self.drop.shape[0]}×{self.drop.shape[1]}, top L{l_}.H{h} "
                f"{d:+.4f}{corr})")

    def rows(self) -> list[dict[str, Any]]:
        """One row per head (layer, head, drop[, estimate]): the CSV the export writes."""
        out = []
        for (layer, head), d in np.ndenumerate(self.drop):
            row: dict[str, Any] = {"layer": layer, "head": head, "drop": float(d)}
            if self.estimate is not None:
                row["estimate"] = float(self.estimate[layer, head])
            out.append(row)
        return out


def _metric_name(metric: str | None, classifier: bool) -> str:
    metric = metric or ("probability" if classifier else "cosine")
    if metric not in METRICS:
        raise InterventionError(f"importance metric {metric!r}; expected one of {', '.join(METRICS)}")
    if not classifier and metric != "cosine":
        raise InterventionError(f"the {metric} of a class needs a classifier; this model's output is a feature "
                                "vector, so its importance is the cosine change of the features (metric='cosine')")
    return metric


def _score(out: torch.Tensor, metric: str, target: int | None, clean: torch.Tensor | None) -> torch.Tensor:
    """The metric of each row of out (B, C): probability / logit of `target`, or cos(out, clean)."""
    out = out.float()
    if metric == "probability":
        return out.softmax(dim=-1)[:, target]
    if metric == "logit":
        return out[:, target]
    return torch.nn.functional.cosine_similarity(out, clean.float().expand_as(out), dim=-1)


def _target(target: int | None, out: torch.Tensor, metric: str) -> int | None:
    if metric == "cosine":
        return None
    c = int(out.shape[-1])
    if target is None:
        return int(out[0].argmax())
    if not 0 <= int(target) < c:
        raise InterventionError(f"class {target} out of range: the model has {c} classes (0-{c - 1})")
    return int(target)


def _ablation_values(model: Any, mode: str, reference: Any, spec: Any) -> dict[int, torch.Tensor] | None:
    """What each head is replaced by: None (zeros), or per layer (H, T, hd) from the reference image(s)."""
    if mode == "zero":
        return None
    Ablate([(0, 0)], mode, reference)   # the same checks (reference set size) as one ablation
    depth = spec.depth
    seen = record(model, inputs_at(model, reference, spec), heads=range(depth), mean=True)["heads"]
    return {i: v[0] for i, v in seen.items()}


def head_importance(model: Any, images: Any, target: int | None = None, *, metric: str | None = None,
                    mode: str = "zero", reference: Any = None, batch_size: int = 16, attribution: bool = False,
                    image_size: tuple[int, int] | None = None,
                    progress: Callable[[int, int], None] | None = None,
                    cancel: Callable[[], bool] | None = None) -> HeadImportance:
    """The importance of every head for `images` (one image or a list; see the module doc).

    Raises:
        InterventionError: a model without vitviz's hook points, an unknown metric or mode, a class out of range,
            a reference set too small for 'mean', attribution for the cosine metric.
        ScanCancelled: `cancel()` returned True.
    """
    import time

    net = check_model(model)
    if mode not in ABLATION_MODES:
        raise InterventionError(f"ablation mode {mode!r}; expected one of {', '.join(ABLATION_MODES)}")
    if batch_size < 1:
        raise InterventionError(f"batch size {batch_size}; expected 1 or more")
    spec = model.spec_at(image_size)
    classifier = spec.num_classes > 0
    metric = _metric_name(metric, classifier)
    if attribution and metric == "cosine":
        raise InterventionError("attribution patching has no first-order estimate of the cosine change: its "
                                "gradient is zero at the clean run (cos = 1 is its maximum); use the exact scan")
    items = list(images) if is_set(images) else [images]
    if not items:
        raise InterventionError("the importance scan needs at least one image")
    values = _ablation_values(model, mode, reference, spec)
    depth, heads = spec.depth, spec.num_heads
    total = len(items) * depth * heads
    per_image = np.zeros((len(items), depth, heads))
    estimates = np.zeros((len(items), depth, heads)) if attribution else None
    clean_scores, targets, labels = [], [], []
    device = next(net.parameters()).device
    done = forwards = 0
    start = time.perf_counter()
    eye = torch.eye(depth * heads, dtype=torch.bool).view(depth * heads, depth, heads)
    for n, image in enumerate(items):
        x = inputs_at(model, image, spec).to(device)
        with model._lock, torch.inference_mode():
            out = net(x)
            t = _target(target, out, metric)
            clean = _score(out, metric, t, out)[0]
            for lo in range(0, depth * heads, batch_size):
                if cancel is not None and cancel():
                    raise ScanCancelled(f"importance scan stopped after {done} of {total} ablations")
                mask = eye[lo: lo + batch_size]
                with head_mask(net, mask.to(device), values):
                    scores = _score(net(x.expand(mask.shape[0], -1, -1, -1)), metric, t, out)
                forwards += 1
                drops = (1 - scores) if metric == "cosine" else clean - scores
                per_image[n].flat[lo: lo + mask.shape[0]] = drops.double().cpu().numpy()
                done += mask.shape[0]
                if progress is not None:
                    progress(done, total)
        if estimates is not None:
            estimates[n] = _attribution(model, net, x, metric, t, values)
        clean_scores.append(1.0 if metric == "cosine" else float(clean))
        targets.append(t)
        labels.append(spec.labels[t] if t is not None and t < len(spec.labels) else "")
    seconds = time.perf_counter() - start
    drop = per_image.mean(0)
    estimate = None if estimates is None else estimates.mean(0)
    corr = None
    if estimate is not None and drop.std() > 0 and estimate.std() > 0:
        corr = float(np.corrcoef(drop.ravel(), estimate.ravel())[0, 1])
    return HeadImportance(drop=drop, per_image=per_image, clean=np.array(clean_scores), metric=metric, mode=mode,
                          targets=tuple(targets), sources=tuple(image_name(i) for i in items),
                          labels=tuple(labels),
                          estimate=estimate, correlation=corr, seconds=seconds, forwards=forwards,
                          interventions=tuple(getattr(model, "interventions", ())))


def _attribution(model: Any, net: Any, x: torch.Tensor, metric: str, target: int | None,
                 values: dict[int, torch.Tensor] | None) -> np.ndarray:
    """Attribution patching's (L, H) estimate of the drops for one image x (1, C, H, W): one forward and backward
    pass, gradients of the metric to every head's output (weights frozen for the pass)."""
    outs: list[torch.Tensor] = []
    with model._lock, torch.inference_mode(False), torch.enable_grad():
        trainable = [p for p in net.parameters() if p.requires_grad]
        for p in trainable:
            p.requires_grad_(False)
        handles = [b.attn.head_probe.register_forward_hook(lambda _m, _i, out: outs.append(out))
                   for b in net.blocks]
        try:
            xg = x.detach().clone().requires_grad_(True)   # a leaf, so the graph reaches the heads
            score = _score(net(xg), metric, target, None)[0]
            grads = torch.autograd.grad(score, outs)
        finally:
            for h in handles:
                h.remove()
            for p in trainable:
                p.requires_grad_(True)
    est = []
    for i, (a, g) in enumerate(zip(outs, grads)):   # (1, H, T, hd) each
        a, g = a.detach()[0].double(), g[0].double()
        v = torch.zeros_like(a) if values is None else values[i].to(a.device).double()
        est.append(-((v - a) * g).sum(dim=(-1, -2)))
    return torch.stack(est).cpu().numpy()


__all__ = ["HeadImportance", "METRICS", "ScanCancelled", "head_importance"]
