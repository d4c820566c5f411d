"""Loading a checkpoint into the reference ViT and capturing its attention.

    model = load("vit_b_16-c867db91.pth")        # -> VitModel
    result = model.run("cat.jpg")                # -> AttentionResult with (L, H, T, T) attentions
"""
from __future__ import annotations

import os
import threading
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vitviz.core.checkpoint import RawCheckpoint, read_checkpoint
from vitviz.core.families import convert
from vitviz.core.infer import OVERRIDES, infer_spec
from vitviz.core.model import AttentionProbe, ReferenceViT
from vitviz.core.memory import SMALLER, check_host_memory, packing_fits
from vitviz.core.packed import set_packed
from vitviz.core.spec import AttentionResult, ModelSpec, split_output, whole_patches
from vitviz.errors import DeviceError, InconsistentCheckpointError, VitvizError


def available_devices() -> list[str]:
    """Devices a model can run on here: 'cpu', plus 'cuda' (or 'cuda:N') when available."""
    devices = ["cpu"]
    if torch.cuda.is_available():
        n = torch.cuda.device_count()
        devices += ["cuda"] if n == 1 else [f"cuda:{i}" for i in range(n)]
    return devices


def resolve_device(device: str | None) -> torch.device:
    """'auto'/None -> CUDA when available, else CPU; a requested but missing CUDA raises DeviceError."""
    if device in (None, "", "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise DeviceError(f"unknown device {device!r}; expected auto, cpu, cuda or cuda:N "
                          f"(available here: {', '.join(available_devices())})") from e
    if dev.type not in ("cpu", "cuda"):
        raise DeviceError(f"device {device!r} is not supported; expected auto, cpu, cuda or cuda:N "
                          f"(available here: {', '.join(available_devices())})")
    if dev.type == "cuda" and dev.index is not None and torch.cuda.is_available() \
            and dev.index >= torch.cuda.device_count():
        raise DeviceError(f"device {device!r} requested, but there are {torch.cuda.device_count()} CUDA devices "
                          f"(available: {', '.join(available_devices())})")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise DeviceError(f"device {device!r} requested, but CUDA is not available here "
                          f"(available: {', '.join(available_devices())})")
    return dev


class LayerSink:
    """Collects each layer's attention straight into one host array (B, L, H, T, T) as the forward pass runs
    (or (B, L, H, k, T): only the query rows `rows`).

    Each layer is copied out (and cast to float16 when asked) as soon as its softmax is done -- or, `bound` to the
    probes, the softmax writes into the array itself -- so the model's device never holds more than one layer's
    maps, and the host never holds a list of layers plus their stack.
    """

    def __init__(self, num_layers: int, half: bool = False, rows: Sequence[int] | None = None) -> None:
        self.num_layers, self.half = num_layers, half
        self.rows = None if rows is None else list(rows)
        self._index: torch.Tensor | None = None
        self.array: torch.Tensor | None = None
        self.count = 0

    @contextmanager
    def bound(self, probes: list[AttentionProbe], shape: tuple[int, ...]) -> Iterator[None]:
        """Let the softmax of each layer write straight into this array (float32, all rows, on the CPU): no copy.

        `shape` is one layer's (B, H, T, T); the probes get their slices as `target` until the context closes.
        """
        self.array = torch.empty((shape[0], self.num_layers, *shape[1:]), dtype=torch.float32)
        for i, probe in enumerate(probes[: self.num_layers]):
            probe.target = self.array[:, i]
        try:
            yield
        finally:
            for probe in probes:
                probe.target = None

    def append(self, layer: torch.Tensor) -> None:
        if self.array is not None and self.count < self.num_layers and \
                layer.data_ptr() == self.array[:, self.count].data_ptr():
            self.count += 1  # the softmax wrote here itself
            return
        if self.rows is not None:  # only these query rows: (B, H, k, T)
            if self._index is None or self._index.device != layer.device:
                self._index = torch.tensor(self.rows, dtype=torch.long, device=layer.device)
            layer = layer.index_select(2, self._index)
        if self.array is None:
            shape = (layer.shape[0], self.num_layers, *layer.shape[1:])
            self.array = torch.empty(shape, dtype=torch.float16 if self.half else torch.float32)
        self.array[:, self.count].copy_(layer)
        self.count += 1

    def numpy(self) -> np.ndarray:
        assert self.array is not None and self.count == self.num_layers, "the forward pass did not reach every layer"
        return self.array.numpy()


@contextmanager
def capture_attention(net: torch.nn.Module, keep: Any) -> Iterator[Any]:
    """Append every block's post-softmax attention (B, H, T, T) to `keep` (a list or a `LayerSink`) while the
    context is open.

    The hooks only read the probability tensor, so the model's output is unchanged; they are removed in
    `finally` even when the forward pass fails.
    """
    def hook(_m: torch.nn.Module, _inp: Any, out: torch.Tensor) -> None:
        keep.append(out.detach())

    handles = [m.register_forward_hook(hook) for m in net.modules() if isinstance(m, AttentionProbe)]
    try:
        yield keep
    finally:
        for h in handles:
            h.remove()


class VitModel:
    """A loaded checkpoint: the reference ViT, its spec, and the device it runs on."""

    def __init__(self, net: ReferenceViT, spec: ModelSpec, device: torch.device, dropped: list[str]) -> None:
        self.net, self.spec, self._device = net, spec, device
        self.dropped = dropped
        self._lock = threading.Lock()  # the capture hooks sit on the shared net: one forward pass at a time
        self.packed_layers = 0  # Linear layers running with prepacked oneDNN weights (see core.packed)

    @property
    def device(self) -> str:
        return str(self._device)

    def to(self, device: str | None) -> "VitModel":
        """Move the model; a model too large for the device raises DeviceError and stays where it was."""
        dev = resolve_device(device)
        try:
            self.net.to(dev)
        except torch.cuda.OutOfMemoryError as e:
            self.net.to(self._device)
            torch.cuda.empty_cache()
            raise DeviceError(f"{self.spec.source}: {self.spec.num_params / 1e6:.1f} M parameters do not fit "
                              f"on {dev} ({e}); use device='cpu'") from e
        self._device = dev
        self.packed_layers = set_packed(self.net, dev.type == "cpu" and packing_fits(self.net))
        return self

    def spec_at(self, image_size: tuple[int, int] | None) -> ModelSpec:
        """The spec for a run at `image_size` (position embedding resampled), or the native spec."""
        if image_size is None or tuple(image_size) == tuple(self.spec.image_size):
            return self.spec
        h, w = int(image_size[0]), int(image_size[1])
        p = self.spec.patch_size
        if h < p or w < p:
            raise VitvizError(f"image size {(h, w)} is smaller than one patch ({p} px)")
        size = whole_patches((h, w), p)
        return replace(self.spec, image_size=size, preprocess=self.spec.preprocess.at_size(size))

    def prepare(self, image: Any, image_size: tuple[int, int] | None = None) -> tuple[
            torch.Tensor, np.ndarray, ModelSpec, str, tuple[tuple[int, int], tuple[float, float, float, float]] | None]:
        """Turn a path / PIL image / array / (1, C, H, W) tensor into (input, display image, spec, source, box).

        `box` is the original image's (h, w) and the region (left, top, right, bottom) the model saw; None for a
        ready tensor, which has no original.
        """
        from vitviz.core import images

        spec = self.spec_at(image_size)
        if isinstance(image, torch.Tensor):
            x = image if image.ndim == 4 else image.unsqueeze(0)
            if x.shape[1] != spec.in_chans:
                raise VitvizError(f"input tensor has {x.shape[1]} channels; the model expects {spec.in_chans}")
            p = spec.patch_size
            size = whole_patches((int(x.shape[-2]), int(x.shape[-1])), p)
            if min(size) == 0:
                raise VitvizError(f"input tensor of {tuple(x.shape[-2:])} px is smaller than one {p} px patch")
            if size != tuple(x.shape[-2:]):
                warnings.warn(f"input tensor {tuple(x.shape[-2:])} is not a multiple of the {p} px patch; the model "
                              f"sees its top-left {size[0]}x{size[1]}", stacklevel=3)
            spec = replace(spec, image_size=size) if size != tuple(spec.image_size) else spec
            x = x[..., : size[0], : size[1]].float()
            disp = images.display_from_tensor(x, spec.preprocess.mean, spec.preprocess.std)
            return x, disp, spec, "tensor", None
        src = str(image) if isinstance(image, (str, Path)) else type(image).__name__
        img = images.load_image(image, channels=spec.in_chans)
        x, disp = images.preprocess(img, spec.preprocess, channels=spec.in_chans)
        size = (img.height, img.width)
        return x, disp, spec, src, (size, images.source_box(size, spec.preprocess))

    def forward_captured(self, x: torch.Tensor, half: bool = False, logits: bool = True,
                         upto: int | None = None, rows: Sequence[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(B, C, H, W) -> attentions (B, L, H, T, T) and the model's output (B, C) as NumPy, on whatever device.

        The output is class scores, or a headless backbone's pooled features (B, D): `split_output` tells them
        apart, as `run` does. One call at a time per model (the capture hooks are shared), so calls are serialised.

        With `logits=False` the forward pass stops right after the softmax of layer `upto` (default: the last),
        skipping the work no attention depends on; logits are then (B, 0) and attentions (B, upto + 1, H, T, T).
        With `rows` only those query tokens' rows are kept: attentions (B, L, H, len(rows), T), a fraction of the
        memory (e.g. [0] for CLS maps of a large model at high resolution).
        """
        with self._lock, torch.inference_mode():
            return self._forward_captured(x, half, logits, upto, rows)

    def _forward_captured(self, x: torch.Tensor, half: bool, logits: bool, upto: int | None,
                          rows: Sequence[int] | None) -> tuple[np.ndarray, np.ndarray]:
        if logits and upto is not None:
            raise VitvizError("upto= stops the forward pass early, so it needs logits=False")
        depth = len(self.net.blocks)
        upto = upto + depth if upto is not None and -depth <= upto < 0 else upto  # -1: the last layer
        tokens = self._tokens(x)
        if rows is not None and (not rows or not all(0 <= int(r) < tokens for r in rows)):
            raise VitvizError(f"rows {list(rows)}: expected token indices in 0..{tokens - 1} (the input has "
                              f"{tokens} tokens)")
        sink = LayerSink(depth if upto is None else upto + 1, half, rows)
        check_host_memory(self._maps_bytes(x, sink.num_layers, half, None if rows is None else len(rows)), x, half)
        probes = [m for m in self.net.modules() if isinstance(m, AttentionProbe)]
        direct = rows is None and not half and self._device.type == "cpu"
        shape = (int(x.shape[0]), self.spec.num_heads, tokens, tokens)
        try:
            with capture_attention(self.net, sink), (sink.bound(probes, shape) if direct else nullcontext()):
                xd = x.to(self._device)
                if logits:
                    out = self.net(xd).float().cpu().numpy()
                else:
                    self.net.forward_attention(xd, upto)
                    out = np.zeros((x.shape[0], 0), np.float32)
            return sink.numpy(), out
        except torch.cuda.OutOfMemoryError as e:
            torch.cuda.empty_cache()
            raise DeviceError(f"out of memory on {self._device} for input {tuple(x.shape)} "
                              f"({e}); try a smaller image size or device='cpu'") from e
        except ValueError as e:  # upto out of range
            raise VitvizError(str(e)) from e
        except (MemoryError, RuntimeError) as e:
            if not isinstance(e, MemoryError) and "allocate" not in str(e):
                raise
            raise DeviceError(f"not enough memory for input {tuple(x.shape)} ({type(e).__name__}: {e}); "
                              f"{SMALLER}") from e

    def _tokens(self, x: torch.Tensor) -> int:
        p = self.spec.patch_size
        return self.spec.num_prefix + (int(x.shape[-2]) // p) * (int(x.shape[-1]) // p)

    def _maps_bytes(self, x: torch.Tensor, layers: int, half: bool, rows: int | None = None) -> int:
        """Bytes of the (B, L, H, T or rows, T) attention array a run of `x` captures."""
        tokens = self._tokens(x)
        return int(x.shape[0]) * layers * self.spec.num_heads * (rows or tokens) * tokens * (2 if half else 4)

    def run(self, image: Any, image_size: tuple[int, int] | None = None, half: bool = False,
            logits: bool = True) -> AttentionResult:
        """Run one image and capture every layer's attention.

        Args:
            image: a path, PIL image, (H, W[, C]) array, or a ready (1, C, H, W) tensor (used as is).
            image_size: run at another (h, w); the position embedding is resampled with the family's recipe.
            half: store attentions as float16 (half the memory; values rounded to ~1e-3 relative).
            logits: False skips everything after the last softmax (faster; the result's logits are empty).
        """
        x, disp, spec, src, seen = self.prepare(image, image_size)
        size, box = seen or (None, None)
        attn, out = self.forward_captured(x, half, logits)
        scores, features = split_output(out[0], spec)
        return AttentionResult(attentions=attn[0], logits=scores, input=x[0].cpu().numpy(), image=disp,
                               spec=spec, source=src, features=features, source_box=box, source_size=size)

    def pos_embed(self, grid: tuple[int, int] | None = None) -> np.ndarray | None:
        """(N_pos, D) position embedding, grid part resampled to `grid`; None when the model has none."""
        if self.net.pos_embed is None:
            return None
        with torch.no_grad():
            g = grid or self.spec.pos_grid
            prefix = self.net.pos_embed[0, : self.spec.pos_prefix]
            pos = torch.cat([prefix, self.net.grid_pos_embed(tuple(g))[0]], dim=0)
        return pos.float().cpu().numpy()


def _module_heads(module: torch.nn.Module) -> int | None:
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


def _raw_from_module(module: torch.nn.Module) -> RawCheckpoint:
    """A model object's weights, with the metadata it carries: a transformers config (eps, activation, labels,
    sizes) or timm's pretrained config (architecture name, preprocessing)."""
    raw = _raw_from_dict(module.state_dict())
    raw.path = Path(f"<{type(module).__name__} object>")
    config = getattr(module, "config", None)
    if hasattr(config, "to_dict"):
        raw.config = config.to_dict()
    elif isinstance(getattr(module, "pretrained_cfg", None), dict) and module.pretrained_cfg.get("architecture"):
        cfg = dict(module.pretrained_cfg)
        size = getattr(getattr(module, "patch_embed", None), "img_size", None)
        if size is not None:  # the registry's size is the default; the model may have been built at another
            cfg["input_size"] = (cfg.get("input_size", (3,))[0], *tuple(size))
        raw.config = {"architecture": cfg["architecture"], "pretrained_cfg": cfg}
    return raw


def _raw_from_dict(sd: dict[str, Any]) -> RawCheckpoint:
    tensors = {k: v.float() if v.is_floating_point() else v for k, v in sd.items() if isinstance(v, torch.Tensor)}
    return RawCheckpoint(Path("<state dict>"), tensors)


def load(path: "str | Path | dict[str, Any] | torch.nn.Module", **overrides: Any) -> VitModel:
    """Load any supported ViT checkpoint into the reference model.

    Args:
        path: a file, a folder (HF / timm hub), an in-memory state dict, or a model object (its state dict; the
            head count is read from it).
        **overrides: heads, family, image_size (int or (h, w)), eps, mean, std, interpolation, labels,
            pos_interp, act, nest_key, device ('auto', 'cpu', 'cuda', 'cuda:1').
    """
    unknown = set(overrides) - set(OVERRIDES)
    if unknown:
        raise VitvizError(f"unknown override(s) {sorted(unknown)}; expected any of {', '.join(OVERRIDES)}")
    device = resolve_device(overrides.get("device"))
    if isinstance(path, torch.nn.Module):  # a model in memory (timm, torchvision, transformers)
        heads = _module_heads(path)
        from_object = bool(heads and not overrides.get("heads"))
        if from_object:
            overrides = {**overrides, "heads": heads}
        raw = _raw_from_module(path)
    elif isinstance(path, dict):
        raw = _raw_from_dict(path)
    elif isinstance(path, (str, bytes, os.PathLike)):
        raw = read_checkpoint(os.fsdecode(path), overrides.get("nest_key"))
    else:
        raise VitvizError(f"cannot load a {type(path).__name__}; expected a checkpoint path, a model folder, "
                          "a state dict or a torch.nn.Module")
    conv = convert(raw, overrides.get("family"))
    spec = infer_spec(conv, raw, overrides)
    if isinstance(path, torch.nn.Module) and from_object:  # not the caller's override: the object said so
        spec = replace(spec, provenance=tuple((k, f"model object: {type(path).__name__} num_heads" if k == "num_heads"
                                               else v) for k, v in spec.provenance))
    net = ReferenceViT(spec)
    _load_exact(net, conv.tensors, spec.source)
    net.eval()
    spec = replace(spec, num_params=sum(p.numel() for p in net.parameters()))
    net.spec = spec
    model = VitModel(net, spec, torch.device("cpu"), conv.dropped)
    return model.to(str(device))


def _load_exact(net: ReferenceViT, sd: dict[str, torch.Tensor], where: str) -> None:
    """Load every tensor, asserting each key and shape; anything left over or missing is an error."""
    own = net.state_dict()
    missing = sorted(set(own) - set(sd))
    extra = sorted(set(sd) - set(own))
    wrong = [f"{k}: file {tuple(sd[k].shape)} vs model {tuple(own[k].shape)}"
             for k in own if k in sd and tuple(sd[k].shape) != tuple(own[k].shape)]
    if missing or extra or wrong:
        parts = []
        if wrong:
            parts.append(f"shapes that contradict the rest of the file: {'; '.join(wrong[:5])}")
        if missing:
            parts.append(f"missing tensors: {', '.join(missing[:8])}")
        if extra:
            parts.append(f"unexpected tensors: {', '.join(extra[:8])}")
        raise InconsistentCheckpointError(f"{where}: " + " | ".join(parts))
    net.load_state_dict(sd, strict=True)
