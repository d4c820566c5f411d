"""Capturing attention: `VitModel` (preprocess, run, forward_captured) and the sink the softmax writes into.

    model = vitviz.load("vit_b_16-c867db91.pth")   # -> VitModel (built by vitviz.core.running.load)
    result = model.run("cat.jpg")                  # -> AttentionResult with (L, H, T, T) attentions

`ImageModel` holds what every model that satisfies `vitviz.core.protocol.Model` shares (spec, device, preparing
an image, `run`); `VitModel` (the reference ViT) and `LiveModel` (`vitviz.core.running.live`, the user's module) each add
their own `forward_captured`, `pos_embed`, `to` and `capabilities`.
"""
from __future__ import annotations

import threading
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vitviz.core.summary import model_summary
from vitviz.core.running.model import AttentionProbe, PoolProbe, ReferenceViT
from vitviz.core.protocol import ATTENTION, EARLY_STOP, FEATURES, GRADIENTS, MAP_HEAD, POS_TABLE, REFERENCE, ROWS
from vitviz.core.running.runtime import SMALLER, HostCopy, check_host_memory, device_memory, move_module, \
    packing_fits
from vitviz.core.running.packed import set_packed
from vitviz.core.spec import AttentionResult, ModelSpec, split_output, whole_patches
from vitviz.core.reading.validate import check_finite_forward
from vitviz.errors import DeviceError, VitvizError


class LayerSink:
    """Collects each layer's attention straight into one host array (B, L, H, T, T) as the forward pass runs
    (or (B, L, H, k, T): only the query rows `rows`).

    Each layer is copied out (`HostCopy`: from a CUDA device through pinned staging buffers, asynchronously, cast
    to float16 on the device when asked) as soon as its softmax is done -- or, `bound` to the probes on the CPU,
    the softmax writes into the array itself -- so the model's device never holds more than one layer's maps, and
    the host never holds a list of layers plus their stack. `numpy` waits for the copies before it hands the array
    out.
    """

    def __init__(self, num_layers: int, half: bool = False, rows: Sequence[int] | None = None) -> None:
        self.num_layers, self.half = num_layers, half
        self.rows = None if rows is None else list(rows)
        self._index: torch.Tensor | None = None
        self.array: torch.Tensor | None = None
        self.host: HostCopy | None = None   # made for the device of the first layer
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
        if self.host is None:
            self.host = HostCopy(layer.device)
        if self.array is None:   # once per capture
            self.array = self.host.empty((layer.shape[0], self.num_layers, *layer.shape[1:]),
                                         torch.float16 if self.half else torch.float32)
        self.host.copy(self.array[:, self.count], layer)
        self.count += 1

    def numpy(self) -> np.ndarray:
        """The whole array, once every layer's copy has arrived."""
        assert self.array is not None and self.count == self.num_layers, "the forward pass did not reach every layer"
        return self.array.numpy() if self.host is None else self.host.numpy(self.array)


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


class _Each:
    """A capture sink that hands each layer to a function and keeps nothing."""

    def __init__(self, each: Any) -> None:
        self.append = each


def pool_rows(pool: list[np.ndarray], spec: ModelSpec, index: int = 0) -> np.ndarray | None:
    """Image `index`'s MAP-head attention as (H', T) float32 over all tokens (zeros on prefix tokens the head does
    not see), from what `forward_captured(pool=...)` collected; None when nothing was."""
    if not pool:
        return None
    rows = pool[-1][index, :, 0]  # (B, H', 1, N') -> (H', N')
    out = np.zeros((rows.shape[0], spec.num_tokens), np.float32)
    out[:, spec.num_tokens - rows.shape[1]:] = rows
    return out


# The parts of the reference ViT a parameter count is split into: (part, the name prefixes of its parameters).
PARAM_PARTS = (("patch embedding", ("patch_embed.",)), ("position embedding", ("pos_embed",)),
               ("prefix tokens", ("cls_token", "dist_token", "reg_token")), ("blocks", ("blocks.",)),
               ("final norm", ("norm.", "fc_norm.")), ("head", ("head", "pre_logits")))


class ImageModel:
    """What every loaded model shares (`vitviz.core.protocol.Model`): its module `net`, its spec, the device it runs
    on, preparing an image and `run`. Subclasses give `forward_captured`, `pos_embed`, `to` and `capabilities`."""

    def __init__(self, net: torch.nn.Module, spec: ModelSpec, device: torch.device,
                 dropped: list[str] | None = None) -> None:
        self.net, self.spec, self._device = net, spec, device
        self.dropped: list[str] = dropped if dropped is not None else []  # checkpoint keys not used
        self.interventions: tuple[str, ...] = ()  # what `intervening` applies to every pass while it is open
        self._lock = threading.RLock()  # the hooks sit on the shared net: one pass (or intervened pass) at a time

    def __repr__(self) -> str:
        return model_summary(self)

    @property
    def device(self) -> str:
        return str(self._device)

    @property
    def capabilities(self) -> frozenset[str]:
        """What this model can give (`vitviz.core.protocol`): asked instead of its class or family."""
        raise NotImplementedError

    def parameter_counts(self) -> dict[str, int]:
        """Parameters per part of the model, by name prefix (`PARAM_PARTS`; plain ints, so a panel needs no torch):
        every part of the reference ViT, even an empty one; 'other' only when something falls outside them."""
        counts = {name: 0 for name, _ in PARAM_PARTS}
        counts["other"] = 0
        for key, param in self.net.named_parameters():
            part = next((name for name, prefixes in PARAM_PARTS if key.startswith(prefixes)), "other")
            counts[part] += int(param.numel())
        return {k: v for k, v in counts.items() if v or k != "other"}

    def described_assumptions(self) -> tuple[tuple[str, str], ...]:
        """Each setting its spec assumes, with what it assumes and how to say otherwise, as `vitviz.load` warns it
        (`hyperparams.describe_guess`)."""
        from vitviz.core.reading.hyperparams import describe_guess

        return tuple((name, describe_guess(self.spec, name)) for name, _source in self.spec.assumptions)

    def hook_points(self) -> list[torch.nn.Module]:
        """The modules a forward pass can be stopped before: its transformer blocks (`net.blocks`: the reference
        ViT's, or a user's module's when it has them), else the modules a live model found its attention in
        (`LiveModel.layers`); [] when there are none (a user's module with neither)."""
        blocks = getattr(self.net, "blocks", None)
        children = getattr(blocks, "children", None)
        points = [b for b in children() if hasattr(b, "register_forward_pre_hook")] if callable(children) else []
        if points:
            return points
        found: dict[int, Any] = {}
        for name, _mechanism in getattr(self, "layers", None) or ():
            try:
                module = self.net.get_submodule(name) if name else None
            except (AttributeError, TypeError, ValueError):    # a name read from the call stack, not a submodule path
                module = None
            if module is not None and module is not self.net and hasattr(module, "register_forward_pre_hook"):
                found[id(module)] = module
        return list(found.values())

    def forward_captured(self, x: torch.Tensor, half: bool = False, logits: bool = True,
                         upto: int | None = None, rows: Sequence[int] | None = None,
                         pool: list[np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError

    def _move(self, device: str | None) -> torch.device:
        """Move `net` to `device`; out of memory there, it goes back where it was and DeviceError says why."""
        self._device = move_module(self.net, device, self._device,
                                   f"{self.spec.source}: {self.spec.num_params / 1e6:.1f} M parameters do not fit")
        return self._device

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
        ready tensor, which has no original. An `AttentionResult` made at this size with this preprocessing recipe
        gives its own input again (a copy), its display image and source: an image run once more (intervened) is
        not decoded and resized again; of another size or recipe (another model's mean and std), its source is read
        anew.
        """
        from vitviz.core.running import images
        spec = self.spec_at(image_size)
        if isinstance(image, AttentionResult):
            if tuple(image.spec.image_size) != tuple(spec.image_size) or image.input.shape[0] != spec.in_chans \
                    or image.spec.preprocess != spec.preprocess:   # another size or recipe: its input is not ours
                image = image.source
            else:
                seen = None if image.source_size is None else (image.source_size, image.source_box)
                x = torch.tensor(np.asarray(image.input, np.float32))[None]
                return x, image.image, spec, image.source, seen   # type: ignore[return-value]
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

    def _tokens(self, x: torch.Tensor) -> int:
        p = self.spec.patch_size
        return self.spec.num_prefix + (int(x.shape[-2]) // p) * (int(x.shape[-1]) // p)

    def _maps_bytes(self, x: torch.Tensor, layers: int, half: bool, rows: int | None = None) -> int:
        """Bytes of the (B, L, H, T or rows, T) attention array a run of `x` captures."""
        tokens = self._tokens(x)
        return int(x.shape[0]) * layers * self.spec.num_heads * (rows or tokens) * tokens * (2 if half else 4)

    def intervening(self, *intervene: Any) -> Any:
        """A context in which every pass of this model is intervened on (`vitviz.core.running.interventions`:
        Ablate, PatchAttention, PatchResidual, Knockout); yields their descriptions. Other threads' passes wait."""
        from vitviz.core.running.interventions import applied
        return applied(self, intervene)

    def run(self, image: Any, image_size: tuple[int, int] | None = None, half: bool = False,
            logits: bool = True, intervene: Any = None) -> AttentionResult:
        """Run one image and capture every layer's attention.

        Args:
            image: a path, PIL image, (H, W[, C]) array, a ready (1, C, H, W) tensor (used as is), or an earlier
                result of this model (its input again: `prepare`).
            image_size: run at another (h, w); the position embedding is resampled with the family's recipe.
            half: store attentions as float16 (half the memory): each probability rounded once, within 2^-11
                (4.9e-4) of float32's relatively (2^-25 absolutely below 2^-14), 2^-12 absolutely at most; the
                forward itself runs as without (tests/core/running/test_float16_maps.py).
            logits: False skips everything after the last softmax (faster; the result's logits are empty).
            intervene: an intervention or a list of them (`vitviz.core.running.interventions`) for this run only;
                the result's `interventions` says what was done (with any of an open `intervening` context).
        """
        x, disp, spec, src, seen = self.prepare(image, image_size)
        size, box = seen or (None, None)
        pool: list[np.ndarray] = []   # a MAP head's attention, when the model has one ('map_head'); else empty
        if intervene is None:
            attn, out = self.forward_captured(x, half, logits, pool=pool)
            done = self.interventions
        else:
            from vitviz.core.running.interventions import applied
            with applied(self, intervene, spec) as done:
                attn, out = self.forward_captured(x, half, logits, pool=pool)
        scores, features = split_output(out[0], spec)
        return AttentionResult(attentions=attn[0], logits=scores, input=x[0].cpu().numpy(), image=disp,
                               spec=spec, source=src, features=features, source_box=box, source_size=size,
                               pool_attention=pool_rows(pool, spec), interventions=tuple(done))


@contextmanager
def out_of_memory_said(device: torch.device | str, x: torch.Tensor) -> Iterator[None]:
    """A forward pass that runs out of memory (on the GPU, or an allocation refused on the host) raises DeviceError
    naming the input and what to try, instead of torch's own error: the captured and the streamed forward alike."""
    try:
        yield
    except torch.cuda.OutOfMemoryError as e:
        torch.cuda.empty_cache()
        raise DeviceError(f"out of memory on {device} for input {tuple(x.shape)} "
                          f"({e}); try a smaller image size or device='cpu'") from e
    except (MemoryError, RuntimeError) as e:
        if not isinstance(e, MemoryError) and "allocate" not in str(e):
            raise
        raise DeviceError(f"not enough memory for input {tuple(x.shape)} ({type(e).__name__}: {e}); "
                          f"{SMALLER}") from e


class VitModel(ImageModel):
    """A loaded checkpoint: the reference ViT, its spec, and the device it runs on."""

    net: ReferenceViT

    def __init__(self, net: ReferenceViT, spec: ModelSpec, device: torch.device, dropped: list[str]) -> None:
        super().__init__(net, spec, device, dropped)
        self.packed_layers = 0  # Linear layers running with prepacked oneDNN weights (see core.packed)

    @property
    def capabilities(self) -> frozenset[str]:
        """Everything the reference ViT's hooks give; a MAP head's map when it pools with one, the position table
        when it has one."""
        caps = {ATTENTION, EARLY_STOP, ROWS, REFERENCE, GRADIENTS, FEATURES}
        if self.spec.pooling == "map":
            caps.add(MAP_HEAD)
        if self.net.pos_embed is not None:
            caps.add(POS_TABLE)
        return frozenset(caps)

    def to(self, device: str | None) -> "VitModel":
        """Move the model; a model too large for the device raises DeviceError and stays where it was."""
        dev = self._move(device)
        self.packed_layers = set_packed(self.net, dev.type == "cpu" and packing_fits(self.net))
        return self

    def forward_captured(self, x: torch.Tensor, half: bool = False, logits: bool = True,
                         upto: int | None = None, rows: Sequence[int] | None = None,
                         pool: list[np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(B, C, H, W) -> attentions (B, L, H, T, T) and the model's output (B, C) as NumPy, on whatever device.

        The output is class scores, or a headless backbone's pooled features (B, D): `split_output` tells them
        apart, as `run` does. One call at a time per model (the capture hooks are shared), so calls are serialised.

        With `logits=False` the forward pass stops right after the softmax of layer `upto` (default: the last),
        skipping the work no attention depends on; logits are then (B, 0) and attentions (B, upto + 1, H, T, T).
        With `rows` only those query tokens' rows are kept: attentions (B, L, H, len(rows), T), a fraction of the
        memory (e.g. [0] for CLS maps of a large model at high resolution).
        A model with a MAP pooling head (`spec.pooling == 'map'`) appends that head's attention (B, H', 1, N') to
        `pool` when it is a list and the full forward pass runs (`logits=True`); without one `pool` stays empty.
        """
        with self._lock, torch.inference_mode():
            if pool is None or not logits:
                return self._forward_captured(x, half, logits, upto, rows)
            pools = [m for m in self.net.modules() if isinstance(m, PoolProbe)]
            handles = [m.register_forward_hook(lambda _m, _i, out: pool.append(out.detach().cpu().numpy()))
                       for m in pools]
            try:
                return self._forward_captured(x, half, logits, upto, rows)
            finally:
                for h in handles:
                    h.remove()

    def forward_streamed(self, x: torch.Tensor, each: Any) -> np.ndarray:
        """(B, C, H, W) -> the model's output (B, C) as NumPy, each layer's attention (B, H, T, T) given to `each`
        as its softmax is done and kept by nobody (`vitviz.core.analyses.verify` compares layer by layer)."""
        with self._lock, torch.inference_mode(), capture_attention(self.net, _Each(each)):
            return self.net(x.to(self._device)).float().cpu().numpy()

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
        direct = rows is None and not half and not device_memory(self._device)   # the softmax writes to the host
        shape = (int(x.shape[0]), self.spec.num_heads, tokens, tokens)
        try:
            with out_of_memory_said(self._device, x):
                with capture_attention(self.net, sink), (sink.bound(probes, shape) if direct else nullcontext()):
                    xd = x.to(self._device)
                    if logits:
                        out = self.net(xd).float().cpu().numpy()
                    else:
                        self.net.forward_attention(xd, upto)
                        out = np.zeros((x.shape[0], 0), np.float32)
                maps = sink.numpy()
        except ValueError as e:  # upto out of range
            raise VitvizError(str(e)) from e
        check_finite_forward(maps, x, self.spec, str(self.spec.source))   # NaN maps are refused, their cause named
        return maps, out

    def pos_embed(self, grid: tuple[int, int] | None = None) -> np.ndarray | None:
        """(N_pos, D) position embedding, grid part resampled to `grid`; None when the model has none."""
        if self.net.pos_embed is None:
            return None
        with torch.no_grad():
            g = grid or self.spec.pos_grid
            prefix = self.net.pos_embed[0, : self.spec.pos_prefix]
            pos = torch.cat([prefix, self.net.grid_pos_embed(tuple(g))[0]], dim=0)
        return pos.float().cpu().numpy()
