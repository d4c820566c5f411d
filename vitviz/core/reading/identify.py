"""Identifying a file nothing names: the architectures of a library whose parameters have exactly its names and shapes.

    found = candidates(raw.tensors)                 # -> [Candidate('timm', 'vit_small_patch16_224', ...), ...]
    found = candidates(raw.tensors, "timm:vit_small_patch16_224")   # one architecture, or [] when it does not fit

A bare `torch.save(model.state_dict())` of a timm or torchvision ViT carries no name. Its key layout says which
library made it; the library's registered architectures say which of them it can be: each is built on the `meta`
device (no memory, no weights downloaded) and its state dict's names and shapes compared with the file's. The
class head and the position table are compared after building each match again with the file's own class count and
grid (a file fine-tuned on 10 classes at 384 px is still a `vit_small_patch16_224`). What fits is a *candidate*:
`vitviz.core.analyses.verify` loads the file into it and compares what it computes with vitviz's conversion; only that
comparison proves anything.

Building every registered timm ViT on the meta device takes seconds (163 in `vision_transformer` alone), so the
shape signatures are kept per library version in `$VITVIZ_CACHE` (default `$XDG_CACHE_HOME/vitviz`) as
`shapes-<library>-<version>.json`
(a missing or unreadable cache is rebuilt; an unwritable one is only slower). No Qt.
"""
from __future__ import annotations

import hashlib
import importlib
import json
import os
import re
import tempfile
import warnings
from unittest import mock
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from vitviz.core.files import cache_dir as _cache_dir, read_small_json
from vitviz.errors import VitvizError

# The modules of timm whose architectures a timm-layout plain-ViT file can be (vitviz's reference ViT computes
# them); a key only some of them have picks among them.
TIMM_MODULES = ("vision_transformer", "deit")
TORCHVISION_ARCHS = ("vit_b_16", "vit_b_32", "vit_l_16", "vit_l_32", "vit_h_14")
# facebookresearch/dinov2's hub backbones: (its `dinov2.models.vision_transformer` function, its FFN), built as
# its hub builds them (patch 14, layer scale 1.0, no block chunks)
DINOV2_ARCHS = {"dinov2_vits14": ("vit_small", "mlp"), "dinov2_vitb14": ("vit_base", "mlp"),
                "dinov2_vitl14": ("vit_large", "mlp"), "dinov2_vitg14": ("vit_giant2", "swiglufused")}
# transformers' plain-ViT classes vitviz reads, each with its model type's default configuration (the size
# transformers itself builds: ViT-B/16 224, DINOv2-B/14 518, ...): (config class, model class)
TRANSFORMERS_ARCHS = {
    "ViTModel": ("ViTConfig", "ViTModel"), "ViTForImageClassification": ("ViTConfig", "ViTForImageClassification"),
    "DeiTModel": ("DeiTConfig", "DeiTModel"),
    "DeiTForImageClassification": ("DeiTConfig", "DeiTForImageClassification"),
    "DeiTForImageClassificationWithTeacher": ("DeiTConfig", "DeiTForImageClassificationWithTeacher"),
    "Dinov2Model": ("Dinov2Config", "Dinov2Model"),
    "Dinov2ForImageClassification": ("Dinov2Config", "Dinov2ForImageClassification"),
    "BeitModel": ("BeitConfig", "BeitModel"),
    "BeitForImageClassification": ("BeitConfig", "BeitForImageClassification"),
}
LIBRARIES = ("timm", "torchvision", "dinov2", "open_clip", "transformers")
MAX_CANDIDATES = 12     # beyond this many fitting architectures the search says so and keeps the first ones


@dataclass(frozen=True)
class Candidate:
    """A library architecture whose parameters have the file's names and shapes.

    Attributes:
        library: 'timm' or 'torchvision'.
        arch: the registered name ('vit_small_patch16_224', 'vit_b_16').
        kwargs: what it is built with to fit the file (its class count, its input size).
        prefix: a training wrapper's key prefix the file carries ('module.'), removed to fit.
    """

    library: str
    arch: str
    kwargs: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)
    prefix: str = ""

    @property
    def name(self) -> str:
        """'timm:vit_small_patch16_224' (what `--against` takes)."""
        return f"{self.library}:{self.arch}"

    def build(self, device: torch.device | str = "cpu") -> nn.Module:
        """The architecture with the fitting kwargs, on `device` (random weights: load the file's into it)."""
        return _BUILD[self.library](self.arch, dict(self.kwargs), torch.device(device))


def parse_against(against: str) -> tuple[str, str]:
    """'auto' -> ('auto', ''), 'timm' -> ('timm', ''), 'timm:vit_small_patch16_224' -> ('timm', 'vit_small...')."""
    library, _, arch = str(against).partition(":")
    return library.strip(), arch.strip()


def layout_library(tensors: dict[str, torch.Tensor]) -> tuple[str, str] | None:
    """(library, wrapper prefix) whose key layout the file has: timm's `blocks.N.attn.qkv` with `patch_embed.proj`,
    torchvision's `encoder.layers.encoder_layer_N` with `conv_proj`; None for any other layout."""
    keys = set(tensors)
    if any(k.endswith("embeddings.patch_embeddings.projection.weight") for k in keys) and any(
            k.endswith(("layers.0.attention.q_proj.weight", "encoder.layer.0.attention.attention.query.weight"))
            for k in keys):
        return "transformers", ""   # its classes' own prefixes ('vit.', 'deit.') are part of their names
    for prefix in ("", "module.", "_orig_mod.", "model."):
        keys = {k[len(prefix):] for k in tensors if k.startswith(prefix)}
        if "visual.conv1.weight" in keys and any(k.startswith("visual.transformer.resblocks.0.attn.") for k in keys):
            return "open_clip", prefix + "visual."   # a whole CLIP: its image tower is what vitviz shows
        if "patch_embed.proj.weight" in keys and "mask_token" in keys and any(
                k.startswith(("blocks.0.attn.qkv.", "blocks.0.0.attn.qkv.")) for k in keys):
            return "dinov2", prefix   # the DINOv2 repository's own files keep its masked-image token
        if "patch_embed.proj.weight" in keys and any(k.startswith("blocks.0.attn.qkv.") for k in keys):
            return "timm", prefix
        if "conv_proj.weight" in keys and any(k.startswith("encoder.layers.encoder_layer_0.") for k in keys):
            return "torchvision", prefix
    return None


def candidates(tensors: dict[str, torch.Tensor], against: str = "auto",
               progress: Callable[[float, str], None] | None = None) -> list[Candidate]:
    """The architectures whose parameters have exactly the file's names and shapes, best first (a registered name
    in the order its library lists it). `against` restricts the search: 'timm', 'torchvision', or one
    architecture 'timm:NAME' (then [] when it does not fit). A layout no library here makes gives [].

    Raises:
        VitvizError: `against` names a library or architecture this search does not know.
    """
    library, arch = parse_against(against)
    if library not in ("auto", *LIBRARIES):
        raise VitvizError(f"against={against!r}: identifying a file by its shapes knows {', '.join(LIBRARIES)} "
                          "(e.g. 'timm:vit_small_patch16_224'); other libraries need a config that names the model")
    found = layout_shapes(tensors)
    if found is None:
        return []
    layout, prefix, shapes = found
    if library not in ("auto", layout):
        return []
    names = _registered(layout)
    if arch:
        if arch not in names and not (layout == "timm" and _timm_is_model(arch)):
            raise VitvizError(f"against={against!r}: {layout} has no architecture {arch!r}")
        names = [arch]
    kwargs = fitting_kwargs(layout, shapes)
    wanted = signature(layout, shapes)
    cached = _Signatures(layout)
    out: list[Candidate] = []
    for i, name in enumerate(names):
        if progress is not None and i % 16 == 0:
            progress(i / max(1, len(names)), f"{layout} architectures: {i}/{len(names)}")
        sig = cached.get(name)
        if sig != wanted:
            continue
        candidate = Candidate(layout, name, kwargs, prefix)
        if _fits(candidate, shapes):
            out.append(candidate)
            if len(out) >= MAX_CANDIDATES:
                break
    cached.save()
    return out


def signature(library: str, shapes: dict[str, tuple[int, ...]]) -> str:
    """A hash of the names and shapes that do not depend on the class count or the input size (the class head and
    the position table's length are left out; the table's width stays)."""
    kept = []
    for k, s in sorted(shapes.items()):
        if library == "timm" and (k.startswith(("head.", "head_dist.")) or k in ("head", "head_dist")):
            continue
        if library == "torchvision" and k.startswith("heads."):
            continue
        if library == "transformers" and k.split(".")[0] in ("classifier", "cls_classifier",
                                                            "distillation_classifier"):
            continue
        if k in ("pos_embed", "encoder.pos_embedding", "positional_embedding") or k.endswith(
                "embeddings.position_embeddings"):
            s = (s[-1],)
        kept.append(f"{k}:{'x'.join(map(str, s))}")
    return hashlib.sha1("\n".join(kept).encode()).hexdigest()[:16]


# ---------------------------------------------------------------------------------------------------------------
# Per library


def _registered(library: str) -> list[str]:
    if library == "timm":
        import timm

        return [n for module in TIMM_MODULES for n in timm.list_models(module=module)]
    if library == "dinov2":
        return list(DINOV2_ARCHS)
    if library == "transformers":
        return list(TRANSFORMERS_ARCHS)
    if library == "open_clip":
        import open_clip

        found = [n for n in open_clip.list_models() if "vision_cfg" in (open_clip.get_model_config(n) or {})
                 and not (open_clip.get_model_config(n) or {})["vision_cfg"].get("timm_model_name")]
        # the image-only names first (ViT-B-32 before roberta-ViT-B-32, whose image tower is the same)
        return sorted(found, key=lambda n: (not n.startswith("ViT-"), len(n), n))
    return list(TORCHVISION_ARCHS)


def _timm_is_model(arch: str) -> bool:
    import timm

    return bool(timm.is_model(arch))


def layout_shapes(tensors: dict[str, torch.Tensor]) -> tuple[str, str, dict[str, tuple[int, ...]]] | None:
    """(library, prefix, shapes): the library whose key layout the file has (`layout_library`) and the shapes of
    its tensors under that prefix, named as the library's modules name them; None for any other layout."""
    found = layout_library(tensors)
    if found is None:
        return None
    library, prefix = found
    return library, prefix, {k[len(prefix):]: tuple(v.shape) for k, v in tensors.items() if k.startswith(prefix)}


def fitting_kwargs(library: str, shapes: dict[str, tuple[int, ...]]) -> dict[str, Any]:
    """The class count and the input size the file's head and position table hold (`shapes` as `layout_shapes`
    gives them)."""
    if library == "timm":
        head = shapes.get("head.weight")
        kwargs: dict[str, Any] = {"num_classes": int(head[0]) if head else 0}
        patch = shapes.get("patch_embed.proj.weight")
        pos = shapes.get("pos_embed")
        if patch and pos:
            kwargs["_pos_tokens"] = int(pos[1])
            kwargs["_patch"] = (int(patch[2]), int(patch[3]))
        return kwargs
    if library == "transformers":
        out: dict[str, Any] = {}
        head = next((v for k, v in shapes.items() if k in ("classifier.weight", "cls_classifier.weight")), None)
        if head:
            out["num_labels"] = int(head[0])
        patch = next((v for k, v in shapes.items() if k.endswith("patch_embeddings.projection.weight")), None)
        pos = next((v for k, v in shapes.items() if k.endswith("embeddings.position_embeddings")), None)
        size = _square_size(patch, pos and pos[1], (1, 2))   # a class token, and a distillation token (DeiT)
        if size:
            out["image_size"] = size
        return out
    if library == "open_clip":
        patch, pos = shapes.get("conv1.weight"), shapes.get("positional_embedding")
        size = _square_size(patch, pos and pos[0])
        return {"img_size": size} if size else {}
    if library == "dinov2":
        patch, pos = shapes.get("patch_embed.proj.weight"), shapes.get("pos_embed")
        size = _square_size(patch, pos and pos[1])
        return {"img_size": size} if size else {}
    head = shapes.get("heads.head.weight")
    kwargs = {"num_classes": int(head[0]) if head else 1000}
    size = _square_size(shapes.get("conv_proj.weight"), (shapes.get("encoder.pos_embedding") or (0, 0))[1])
    if size:
        kwargs["image_size"] = size
    return kwargs


def _square_size(patch: tuple[int, ...] | None, tokens: int | None, prefixes: tuple[int, ...] = (1,)) -> int | None:
    """The square input size whose patch grid, after the first of `prefixes` (class token, distillation token)
    that leaves a square, fills a position table of `tokens` rows: side * the patch size (`patch`: its conv
    weight's shape); None without either, or when no prefix leaves a square."""
    if not patch or not tokens:
        return None
    for prefix in prefixes:
        side = int(round(max(0, int(tokens) - prefix) ** 0.5))
        if side and side * side == int(tokens) - prefix:
            return side * int(patch[2])
    return None


def _timm_build(arch: str, kwargs: dict[str, Any], device: torch.device) -> nn.Module:
    """timm.create_model(arch) with the file's class count and the input size whose grid fills its position table
    (with or without the prefix tokens in it, as the architecture builds it)."""
    import timm

    pos_tokens, patch = kwargs.pop("_pos_tokens", None), kwargs.pop("_patch", None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.device("meta"):
            probe = timm.create_model(arch, pretrained=False, weight_init="skip", **kwargs)
        if pos_tokens is not None and patch is not None:
            prefix = 0 if getattr(probe, "no_embed_class", False) else int(getattr(probe, "num_prefix_tokens", 0))
            side = int(round(max(0, pos_tokens - prefix) ** 0.5))
            if side * side == pos_tokens - prefix and side:
                kwargs["img_size"] = (side * patch[0], side * patch[1])
        with torch.device(device):
            return timm.create_model(arch, pretrained=False, **({"weight_init": "skip"} if device.type == "meta"
                                                                else {}), **kwargs)


def _torchvision_build(arch: str, kwargs: dict[str, Any], device: torch.device) -> nn.Module:
    import torchvision

    with torch.device(device):
        return torchvision.models.get_model(arch, weights=None, **kwargs)


def _dinov2_build(arch: str, kwargs: dict[str, Any], device: torch.device) -> nn.Module:
    """The DINOv2 repository's backbone as its hub builds it, at the file's size (518 px by default)."""
    from dinov2.models import vision_transformer as vits

    function, ffn = DINOV2_ARCHS[arch]
    linspace = torch.linspace

    def on_cpu(*args: Any, **kw: Any) -> torch.Tensor:   # its drop-path rates are read with .item()
        return linspace(*args, **{**kw, "device": "cpu"})

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.device(device), mock.patch.object(vits.torch, "linspace", on_cpu):
            return getattr(vits, function)(patch_size=14, img_size=int(kwargs.get("img_size", 518)), init_values=1.0,
                                           ffn_layer=ffn, block_chunks=0)


def open_clip_config(arch: str, img_size: int | None = None) -> dict[str, Any]:
    """open_clip's model config of `arch`, its image tower at `img_size` (the file's) when given."""
    import copy

    import open_clip

    cfg = copy.deepcopy(open_clip.get_model_config(arch))
    if img_size:
        cfg["vision_cfg"]["image_size"] = int(img_size)
    return cfg


def _open_clip_build(arch: str, kwargs: dict[str, Any], device: torch.device) -> nn.Module:
    """The image tower open_clip builds for its model config `arch` (`CLIP(...).visual`), at the file's size."""
    from open_clip.model import _build_vision_tower

    cfg = open_clip_config(arch, kwargs.get("img_size"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.device(device):
            return _build_vision_tower(int(cfg["embed_dim"]), cfg["vision_cfg"],
                                       quick_gelu=bool(cfg.get("quick_gelu", False)))


def transformers_config(arch: str, kwargs: dict[str, Any]) -> Any:
    """The default configuration of `arch`'s model type with the file's class count and input size, eager
    attention (its softmax is what `output_attentions` returns)."""
    import transformers

    config_cls = getattr(transformers, TRANSFORMERS_ARCHS[arch][0])
    extra = {k: v for k, v in kwargs.items() if k in ("num_labels", "image_size")}
    config = config_cls(**extra)
    config._attn_implementation = "eager"
    return config


def _transformers_build(arch: str, kwargs: dict[str, Any], device: torch.device) -> nn.Module:
    import transformers

    config = transformers_config(arch, kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.device(device):
            return getattr(transformers, TRANSFORMERS_ARCHS[arch][1])(config)


_BUILD: dict[str, Callable[[str, dict[str, Any], torch.device], nn.Module]] = {
    "timm": _timm_build, "torchvision": _torchvision_build, "dinov2": _dinov2_build, "open_clip": _open_clip_build,
    "transformers": _transformers_build}


def _fits(candidate: Candidate, shapes: dict[str, tuple[int, ...]]) -> bool:
    """Whether the architecture built to fit has exactly the file's parameter names and shapes."""
    try:
        net = candidate.build("meta")
    except Exception:  # noqa: BLE001 - an architecture that cannot be built at the file's size does not fit
        return False
    own = {k: tuple(v.shape) for k, v in net.state_dict().items()}
    return own == shapes


def _version(library: str) -> str:
    """The library's release ('0.29.1' of '0.29.1+cu130': a local build tag changes no architecture)."""
    version = str(getattr(importlib.import_module(library), "__version__", ""))
    if not version:
        from importlib import metadata

        try:
            version = metadata.version(library)
        except metadata.PackageNotFoundError:
            version = ""
    return version.split("+")[0]


def bundled(library: str, version: str) -> Path:
    """The signatures vitviz ships for one library version (`resources/identify/`, written by
    `python scripts/identify_signatures.py`), so that a first search with that version costs no build."""
    from vitviz.resources_path import resource

    return resource(f"identify/shapes-{library}-{re.sub(r'[^0-9A-Za-z._+-]', '_', version)}.json")


def write_signatures(library: str, folder: Path) -> Path:
    """Build every registered architecture's signature of `library` (as installed) and write them to `folder`."""
    sigs = _Signatures.__new__(_Signatures)
    sigs.library, sigs.version = library, _version(library)
    sigs.data, sigs.changed = {}, True
    for name in _registered(library):
        sigs.get(name)
    sigs.path = folder / bundled(library, sigs.version).name
    sigs.save()
    return sigs.path


class _Signatures:
    """Each registered architecture's `signature`, built on the meta device once per library version and kept in
    the user's cache folder."""

    def __init__(self, library: str) -> None:
        self.library = library
        self.version = _version(library)
        self.path = _cache_dir() / f"shapes-{library}-{re.sub(r'[^0-9A-Za-z._+-]', '_', self.version)}.json"
        self.data: dict[str, str] = {}
        self.changed = False
        for where in (bundled(library, self.version), self.path):   # what vitviz ships, then what was built here
            data = read_small_json(where, 4 << 20)
            if isinstance(data, dict):
                self.data.update({str(k): str(v) for k, v in data.items()})

    def get(self, arch: str) -> str:
        if arch not in self.data:
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    net = _BUILD[self.library](arch, {}, torch.device("meta"))
                self.data[arch] = signature(self.library, {k: tuple(v.shape) for k, v in net.state_dict().items()})
                self.changed = True
            except Exception:  # noqa: BLE001 - an architecture that cannot be built on its own fits nothing (not
                return ""     # kept: another version of its library may build it)
        return self.data[arch]

    def save(self) -> None:
        if not self.changed:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".shapes-", suffix=".tmp")
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(self.data, f, sort_keys=True)
            os.chmod(tmp, 0o644)
            os.replace(tmp, self.path)
        except OSError:
            pass


def names(found: Iterable[Candidate]) -> list[str]:
    """['timm:vit_small_patch16_224', ...]."""
    return [c.name for c in found]


def candidate_names(model: Any, progress: Callable[[float, str], None] | None = None) -> list[str]:
    """What a loaded model can be checked against (the window's Verify against…): the timm architecture its
    config names first, then the architectures whose parameters fit its file exactly; [] for a model not loaded
    from a file."""
    from vitviz.core.reading.checkpoint import read_checkpoint

    spec = model.spec
    named = re.match(r"named: timm architecture '([^']+)'", str(spec.source_of("identity")))
    out = [f"timm:{named.group(1)}"] if named else []
    try:
        tensors = read_checkpoint(Path(spec.source)).tensors
    except (OSError, ValueError, VitvizError):   # not from a file (a model built by code alone)
        return out
    return list(dict.fromkeys(out + names(candidates(tensors, progress=progress))))
