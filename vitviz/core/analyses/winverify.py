"""Verifying a windowed model (Swin) against its original implementation, built from the same file.

`vitviz.core.analyses.verify.verify` hands a model with the `WINDOWS` capability here. The original is built by
the library whose config names the file: a timm hub folder (config.json 'architecture' + 'model_args') with
`timm.create_model` (`strict_img_size=False`: timm then builds its shift masks at each run, so it takes another
size), a transformers folder (config.json 'architectures') with that class and eager attention; the file's tensors
are loaded into it (every parameter from the file, nothing left over, `verify._built` / `towers.from_tensors`).

On the seeded probe of `verify.probe_input` at the native size and native + 2 patches per side, the original's own
softmax is read where it computes it (timm: each block's `attn.softmax` module with its fused attention off;
transformers: each block's self-attention module's attention weights), one block at a time on the original's
thread (`verify._Theirs`), and vitviz's windowed model compares its own block of that index with it as its softmax
probe gives it (`verify._LayerByLayer`): (windows, heads, n, n) against the original's (B x windows, heads, n, n)
of a batch of one, window order and all, so that neither model's stack of blocks is held. The output (class scores
or pooled features) is compared too. Tolerances are verify's (`ATOL_ATTENTION`, `ATOL_OUTPUT`).

Not built (the verdict stays 'unverified', saying why): a Swin state dict no config names (timm's or torchvision's
layout without a config, microsoft's Swin-Transformer checkpoints), and SAM / ViTDet image encoders.
"""
from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from vitviz.core.analyses import verify as v
from vitviz.errors import VitvizError

# what is and is not built here, said in every windowed verdict that is not a comparison
BUILT = ("vitviz verify builds windowed originals for Swin files a config names (a timm hub folder, a "
         "transformers folder)")
SAM_UNVERIFIED = (BUILT + "; not yet SAM / ViTDet image encoders: vitviz's are proven equal to timm's and "
                  "transformers' by its own test suite on small models, but this file is not checked")
UNNAMED_UNVERIFIED = (BUILT + "; this file has no config.json naming its architecture (a bare state dict: "
                      "torchvision's, timm's or microsoft's layout), so the original's settings would be vitviz's "
                      "own reading of it and prove nothing; vitviz's Swin is proven equal to torchvision's, timm's "
                      "and transformers' by its own test suite on small models, but this file is not checked")


def verify_windowed(model: Any, sizes: Any, device: str | None, progress: v.Progress | None) -> v.Verification:
    """`verify(model)` for a windowed model: its original built from its file and compared block by block."""
    say = progress or (lambda _f, _t: None)
    spec = model.spec
    assumptions = tuple(name for name, _ in spec.assumptions)

    def unverified(reason: str, library: str = "") -> v.Verification:
        version = v._version(library) if library and not v._not_importable(library) else ""
        return v.Verification(v.UNVERIFIED, library=library, version=version, assumptions=assumptions,
                              reason=reason)

    if spec.family == "live":
        return unverified("a live model runs its own code as written: nothing was converted, so there is nothing "
                          "to verify")
    if spec.arch == "sam" or spec.family not in ("timm-swin", "hf-swin"):
        return unverified(SAM_UNVERIFIED if spec.arch == "sam" else UNNAMED_UNVERIFIED)
    path = Path(spec.source)
    if not path.exists():
        return unverified(f"the model was not loaded from a file ({spec.source}); the original is built with a "
                          "file's own weights")
    raw = v._read(path, model)
    config = raw.config or {}
    library = "timm" if spec.family == "timm-swin" else "transformers"
    if library == "timm" and not isinstance(config.get("architecture"), str):
        return unverified(UNNAMED_UNVERIFIED, library)
    if library == "transformers" and not (v._folder(path) / "config.json").is_file():
        return unverified(UNNAMED_UNVERIFIED, library)
    if (missing := v._not_importable(library)):
        return unverified(missing, library)
    dev = torch.device(device or model.device)
    checked = _sizes(spec, sizes)
    say(0.0, f"Building the {library} original…")
    try:
        original = (_timm_original if library == "timm" else _transformers_original)(path, raw, dev)
    except v._NotBuildable as e:
        return unverified(str(e), library)
    except v._WeightsDoNotFit as e:
        version = v._version(library)
        return v.Verification(v.DIFFERS, library=library, version=version, original=e.what,
                              against=f"{library} {version}", assumptions=assumptions, reason=str(e))
    return _compare(model, original, checked, assumptions, dev, say)


def _sizes(spec: Any, sizes: Any) -> list[tuple[int, int]]:
    """verify's sizes: the native one and native + 2 patches per side, or those given (whole patches)."""
    native = (int(spec.image_size[0]), int(spec.image_size[1]))
    p = int(spec.patch_size)
    if sizes is None:
        return [native, (native[0] + v._EXTRA_PATCHES * p, native[1] + v._EXTRA_PATCHES * p)]
    expected = f"expected input sizes N or (h, w) in whole {p} px patches, e.g. [{native[0]}]"
    if isinstance(sizes, (str, bytes)) or not hasattr(sizes, "__iter__"):
        raise VitvizError(f"sizes={sizes!r}: {expected}")
    out = []
    for s in sizes:
        size = (s, s) if v._whole(s) else tuple(s) if isinstance(s, (tuple, list)) and len(s) == 2 else None
        if size is None or not all(v._whole(x) for x in size) or size[0] % p or size[1] % p or min(size) < p:
            raise VitvizError(f"size {s!r}: {expected}")
        out.append((int(size[0]), int(size[1])))
    if not out:
        raise VitvizError("sizes=(): expected at least one input size")
    return out


# ---------------------------------------------------------------------------------------------------------------
# The originals: each block's softmax handed over as it is computed


def _streamed(net: nn.Module, points: list[nn.Module], read: Callable[[Any], torch.Tensor], x: torch.Tensor,
              each: v.Each, call: Callable[[nn.Module, torch.Tensor], Any]) -> Any:
    """`call(net, x)` with each of `points`' outputs read (`read`) and given to `each` as a copy, as computed."""
    def hook(_m: nn.Module, _i: Any, out: Any) -> None:
        each(read(out).detach().float().cpu().clone().numpy())

    handles = [m.register_forward_hook(hook) for m in points]
    try:
        with torch.inference_mode():
            return call(net, x.to(v._device_of(net)))
    finally:
        for h in handles:
            h.remove()


def _timm_original(path: Path, raw: Any, device: torch.device) -> v._Original:
    """timm.create_model from the folder's config.json, its eager softmax read at every `attn.softmax`."""
    import timm

    arch = raw.config["architecture"]
    if not timm.is_model(arch):
        raise v._WeightsDoNotFit(f"timm has no architecture {arch!r} (named by {v._folder(path).name}/config.json)",
                                 f"timm '{arch}'")
    what = (f"timm.create_model('{arch}', strict_img_size=False) from {v._folder(path).name}/config.json")
    net = v._built(lambda: timm.create_model(f"local-dir:{v._folder(path)}", pretrained=False,
                                             strict_img_size=False), raw.tensors, what, path)
    for m in net.modules():
        if hasattr(m, "fused_attn"):
            m.fused_attn = False   # its eager softmax, not F.scaled_dot_product_attention
    net = net.float().eval().to(device)
    points = [m for name, m in net.named_modules() if name.endswith("attn.softmax")]
    if not points:
        raise v._NotBuildable(f"{what} has no attn.softmax module: its attention cannot be read where it is computed")

    def run(_size: tuple[int, int], x: torch.Tensor, each: v.Each) -> tuple[list[np.ndarray], np.ndarray | None]:
        out = _streamed(net, points, lambda o: o, x, each, lambda n, t: n(t))
        return [], out[0].float().cpu().numpy()

    return v._Original("timm", timm.__version__, what, run)


_HF_ATTENTION = ("SwinAttention", "Swinv2SelfAttention")   # each returns (output, attention weights)


def _transformers_original(path: Path, raw: Any, device: torch.device) -> v._Original:
    """The config.json's class with eager attention, its attention weights read at each block's self-attention
    module. Built afresh for each size: transformers' Swin v1 keeps, in its modules, a shift it dropped for one
    size's grid."""
    import transformers

    from vitviz.core.reading.towers import from_tensors

    folder = v._folder(path)
    config = transformers.AutoConfig.from_pretrained(str(folder), local_files_only=True, attn_implementation="eager")
    arch = next(iter(getattr(config, "architectures", None) or []), None)
    cls = getattr(transformers, arch, None) if arch else None
    what = (f"transformers.{arch} ({folder.name}/config.json, eager attention)" if cls is not None else
            f"transformers.AutoModel ({folder.name}/config.json model_type {config.model_type!r}, eager attention)")
    cls = cls or transformers.AutoModel

    def build() -> nn.Module:
        net, info = from_tensors(cls, config, raw.tensors)
        params = {n for n, _ in net.named_parameters()}
        bad = sorted(k for k in info.get("missing_keys", ()) if k in params) + \
            sorted(info.get("unexpected_keys", ())) + sorted(str(k) for k in info.get("mismatched_keys", ()))
        if bad:
            raise v._WeightsDoNotFit(f"{path}: its weights do not fit {what}: {', '.join(bad[:6])}", what)
        return net.float().eval().to(device)

    if not _hf_points(build()):   # the file's weights fit (or it differs), before anything is compared
        raise v._NotBuildable(f"{what} has no self-attention module vitviz reads ({', '.join(_HF_ATTENTION)})")

    def forward(net: nn.Module, x: torch.Tensor) -> Any:
        return net(pixel_values=x, output_attentions=True)

    def run(_size: tuple[int, int], x: torch.Tensor, each: v.Each) -> tuple[list[np.ndarray], np.ndarray | None]:
        net = build()
        out = _streamed(net, _hf_points(net), lambda o: o[1], x, each, forward)
        vec = getattr(out, "logits", None)
        vec = vec if vec is not None else out.pooler_output
        return [], vec[0].float().cpu().numpy()

    return v._Original("transformers", transformers.__version__, what, run)


def _hf_points(net: nn.Module) -> list[nn.Module]:
    return [m for m in net.modules() if type(m).__name__ in _HF_ATTENTION]


# ---------------------------------------------------------------------------------------------------------------
# Comparing block by block


def _compare(model: Any, original: v._Original, sizes: list[tuple[int, int]], assumptions: tuple[str, ...],
             device: torch.device, say: v.Progress) -> v.Verification:
    """Both forwards on the probe at each size, in step, each block compared as both compute it."""
    per_layer, outputs, checked, skipped, problems = [], [], [], [], []
    first: int | None = None
    for i, size in enumerate(sizes):
        say(i / len(sizes), f"Comparing at {size[0]}x{size[1]} ({i + 1}/{len(sizes)})…")
        try:
            layers, layer_first, notes, out_diff, note = _at_size(model, original, size, device)
        except v._CannotRun as e:
            skipped.append((size, str(e)))
            continue
        except v._TheirsFailed as failed:
            e = failed.error
            if not checked and not skipped:
                raise v.VerifyError(f"{original.description}: its forward failed on a {size[0]}x{size[1]} probe "
                                    f"({type(e).__name__}: {e})") from e
            skipped.append((size, f"the original cannot run at {size[0]}x{size[1]} ({type(e).__name__}: "
                                  f"{str(e)[:200]})"))
            continue
        problems += notes + ([note] if note else [])
        if layer_first is not None:
            first = layer_first if first is None else min(first, layer_first)
        checked.append(size)
        per_layer.append(layers)
        outputs.append(out_diff)
    if not checked:
        raise v.VerifyError(f"{original.description}: no size could be compared ("
                            + "; ".join(f"{s[0]}x{s[1]}: {why}" for s, why in skipped) + ")")
    max_output = max(outputs)
    ok = first is None and not problems and max_output <= v.ATOL_OUTPUT
    say(1.0, "")
    return v.Verification(
        v.VERIFIED if ok else v.DIFFERS, library=original.library, version=original.version,
        original=original.description, against=f"{original.library} {original.version}",
        max_attention=max((d for layers in per_layer for _, d in layers), default=0.0), max_output=max_output,
        per_layer=tuple(per_layer), first_differing_layer=first, sizes=tuple(checked), assumptions=assumptions,
        reason="; ".join(dict.fromkeys(problems)), skipped=tuple(skipped), output_per_size=tuple(outputs))


def _at_size(model: Any, original: v._Original, size: tuple[int, int], device: torch.device) -> tuple[Any, ...]:
    """(per block differences, first block beyond tolerance, notes, output difference, output note) at `size`."""
    try:
        geometry = model.spec_at(size).geometry()
    except VitvizError as e:   # a size vitviz says the original's rule cannot run
        raise v._CannotRun(str(e)) from None
    x = v.probe_input(model.spec, size)
    theirs = v._Theirs(original, size, x)
    sink = v._LayerByLayer(theirs, size)
    net = model.net
    hooks = [blk.attn.probe.register_forward_hook(lambda _m, _i, out: sink.append(out.detach()[None]))
             for blk in net.all_blocks()]
    ours: BaseException | None = None
    out_ours = None
    with v._exact_float32(device), v._exact_float32(torch.device(model.device)), \
            getattr(model, "_lock", None) or nullcontext():
        theirs.start()
        try:
            with torch.inference_mode():
                feats = net.forward_features(x.to(model.device), geometry)
                out_ours = net.head(net.pool(feats))[0].float().cpu().numpy()
        except v._TheirsStopped:
            pass
        except BaseException as e:  # noqa: BLE001 - ours failed: the original is let finish, then it is raised
            ours = e
        finally:
            for h in hooks:
                h.remove()
            theirs.finish()
    if ours is not None:
        raise ours
    theirs.raise_failure()
    if not sink.finite:   # refused as a capture refuses NaN maps, its cause named
        model.forward_captured(x)
    layers, first, notes = sink.differences()
    if out_ours is None:
        return (layers, first, notes, float("inf"), "the original's forward stopped before its output")
    return (layers, first, notes, *v._output_difference(out_ours, theirs.out, size))

