"""Hierarchical models run by their own code, shown per stage as windowed models are (`StagedModel`): Hiera (timm
`hiera_*`, transformers `HieraModel`) and Florence-2's DaViT (`Florence2VisionBackbone`).

Hiera attends inside mask units (square tiles of the stage's grid) in its first stages and globally in the last,
over tokens it keeps "unrolled" (reordered so that each mask unit, and each 2 x 2 group a query pooling takes the
maximum of, lies contiguous), and pools its queries 2 x 2 in the first block of every later stage. Its attention is
captured where its code computes it (the recorder's `windows` mode: every attention call as (B, heads, windows,
queries, keys), its own softmax output or SDPA's probabilities recomputed), and each block's maps are moved from the
unrolled order to the windows of a `BlockGeometry` on the stage's grid (row-major windows, row-major tokens), so
that vitviz's windowed maps place every token where the model took it from:

- unrolled position t of stage 0 -> grid cell: Hiera's unroll (`unrolled_cells`, the algorithm of timm's `Unroll`
  and transformers' `unroll`) applied to the cells' indices; a query pooling keeps position t of the first of its
  groups, whose cell halves;
- within a block, token t is window t % W, place t // W (both libraries' `reshape(B, -1, W, ...)`).

Mask-unit blocks are windowed (the unit, e.g. 8 x 8 tokens at stage 0); the last stages' blocks are global (one
window of the whole grid). Blocks that pool their queries attend from the next stage's grid to this one's: no square
map of one grid, so they are not shown (said: `skipped`). The module runs at the size it was built for (its position
table is not resampled here).

DaViT alternates spatial window attention (windows of its stage's grid, padded at the bottom and right, folded into
the batch: (B * windows, heads, n, n)) with attention over channels (groups x channels x channels, not spatial): the
spatial blocks are shown per stage on their windows (each stage with its own heads), the channel blocks are said
and not shown. Its stage grids are read off the window attention's own input (B, H, W, C) on the probe.
"""
from __future__ import annotations

import math
import threading
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import torch
from torch import nn

from vitviz.core.running.live.errors import LiveModelError, LiveWarning, user_call
from vitviz.core.running.live.record import _Recorder, _run
from vitviz.core.running.runtime import check_host_memory, resolve_device
from vitviz.core.running.windowed import WindowedHandle
from vitviz.core.spec import IMAGENET_MEAN, IMAGENET_STD, Preprocess
from vitviz.core.winspec import COMPUTE_FIELDS, BlockGeometry, WindowedSpec
from vitviz.errors import NonFiniteError, VitvizError


@dataclass(frozen=True)
class _Block:
    """One attention module of the model, in order: its name, heads, width, query stride and windows."""

    name: str
    heads: int
    dim: int
    q_stride: int
    mask_units: bool


def unrolled_cells(size: tuple[int, int], schedule: list[tuple[int, int]]) -> np.ndarray:
    """(N,) the row-major grid cell of each position of Hiera's unrolled sequence on a `size` grid: its unroll
    (timm `Unroll.forward`, transformers `unroll`) applied to the cells' own indices."""
    x = torch.arange(size[0] * size[1]).reshape(1, size[0], size[1], 1)
    b, cur = 1, list(size)
    for strides in schedule:
        cur = [i // s for i, s in zip(cur, strides)]
        shape = [b] + sum([[i, s] for i, s in zip(cur, strides)], []) + [1]
        x = x.reshape(shape)
        n = len(shape)
        x = x.permute([0] + list(range(2, n - 1, 2)) + list(range(1, n - 1, 2)) + [n - 1]).flatten(0, len(strides))
        b *= math.prod(strides)
    return x.reshape(-1).numpy()


def find_mask_units(module: nn.Module) -> tuple[tuple[int, int], list[tuple[int, int]], list[_Block]] | None:
    """(stage-0 token grid, unroll schedule, attention blocks) of a Hiera (timm or transformers); None for anything
    else."""
    grid = schedule = None
    for m in module.modules():
        unroll = getattr(m, "unroll", None)
        if isinstance(unroll, nn.Module) and hasattr(unroll, "schedule") and hasattr(unroll, "size"):   # timm
            grid, schedule = tuple(int(v) for v in unroll.size), [tuple(s) for s in unroll.schedule]
            break
        config = getattr(m, "config", None)
        if hasattr(m, "unroll_schedule") and config is not None:                                        # transformers
            size, stride = config.image_size, config.patch_stride
            grid = (int(size[0]) // int(stride[0]), int(size[1]) // int(stride[1]))
            schedule = [tuple(s) for s in m.unroll_schedule]
            break
    blocks = [_Block(name, int(getattr(m, "heads", getattr(m, "num_heads", 0))),
                     int(getattr(m, "dim_out", getattr(m, "hidden_size_output", 0))),
                     int(getattr(m, "q_stride", getattr(m, "query_stride", 1))), bool(m.use_mask_unit_attn))
              for name, m in module.named_modules() if hasattr(m, "use_mask_unit_attn") and hasattr(m, "window_size")]
    if grid is None or not blocks or len(grid) != 2 or any(len(s) != 2 for s in schedule or []):
        return None
    return grid, list(schedule or []), blocks


Placer = Callable[[torch.Tensor, BlockGeometry], np.ndarray]


class StagedModel(WindowedHandle):
    """A hierarchical module run as written, its attention shown per block on windows of its stage's grid (see
    the module's docstring); `run` (`WindowedHandle.run`) gives a `WindowedResult`, as a `WindowedModel`'s.
    `names` are its attention calls in order, `shown` the ones shown, each moved onto its block's windows by its
    `placers` entry."""

    def __init__(self, module: nn.Module, spec: WindowedSpec, device: torch.device, names: list[str],
                 shown: list[int], placers: list[Placer], skipped: list[tuple[str, str, tuple[int, ...]]]) -> None:
        self.net, self.spec, self._device = module, spec, device
        self.dropped: list[str] = []
        self.names, self.shown, self._placers = names, shown, placers
        self.skipped = skipped
        self._lock = threading.Lock()

    def spec_at(self, image_size: tuple[int, int] | None) -> WindowedSpec:
        """The spec: only the size the module was built for (its own position table, not resampled here)."""
        if image_size is not None and tuple(image_size) != tuple(self.spec.image_size):
            raise VitvizError(f"{self.spec.source}: runs at {self.spec.image_size[0]}x{self.spec.image_size[1]} "
                              f"only (the size its code was built for), not {tuple(image_size)}")
        return self.spec

    def prepare(self, image: Any, image_size: tuple[int, int] | None = None) -> tuple[Any, ...]:
        """As `VitModel.prepare` (the same code: only the spec differs)."""
        from vitviz.core.running.capture import VitModel

        return VitModel.prepare(self, image, image_size)  # type: ignore[arg-type]  # it asks only spec_at / spec

    def capture_bytes(self, spec: WindowedSpec, batch: int, half: bool) -> int:
        return batch * sum(g.num_windows * spec.heads[g.stage] * g.window_tokens ** 2 for g in spec.geometry()) \
            * (2 if half else 4)

    def forward_captured(self, x: torch.Tensor, half: bool = False, logits: bool = True,
                         upto: int | None = None) -> tuple[list[np.ndarray], np.ndarray, None]:
        """(B, C, H, W) -> per shown block (B, windows, heads, n, n) attention and the output (B, K) (class scores,
        or the features: the mean of the last stage's tokens), as `WindowedModel.forward_captured`."""
        spec = self.spec_at((int(x.shape[-2]), int(x.shape[-1])))
        geometry = spec.geometry()
        if upto is not None and logits:
            raise VitvizError("upto= stops the forward pass early, so it needs logits=False")
        check_host_memory(self.capture_bytes(spec, int(x.shape[0]), half), x, half)
        recorder = _Recorder(int(x.shape[0]), windows=True)
        with self._lock, torch.inference_mode():
            out = user_call(lambda: _run(self.net, x.to(self._device), recorder), spec.source,
                            "the model's own forward", f"input {tuple(x.shape)}")
        calls = recorder.window_maps or []
        if [name for name, _ in calls] != self.names:
            raise LiveModelError(f"{spec.source}: this forward computed attention in {len(calls)} calls, where "
                                 f"{len(self.names)} were found when it was loaded")
        dtype = np.float16 if half else np.float32
        maps = [place(calls[i][1], g).astype(dtype) for i, g, place in zip(self.shown, geometry, self._placers)]
        for g, m in zip(geometry, maps):
            if not np.isfinite(m[..., 0]).all():
                raise NonFiniteError(f"{spec.source}: block {g.block} ({g.describe()}) gives NaN or infinite "
                                     "attention for this input")
        if upto is not None:
            maps = maps[: (upto % len(maps)) + 1]
        if not logits:
            return maps, np.zeros((x.shape[0], 0), np.float32), None
        return maps, _output(out, int(x.shape[0])), None

    def forward_streamed(self, x: torch.Tensor, each: Callable[[torch.Tensor], None]) -> np.ndarray:
        """(B, C, H, W) -> the output (B, K), each shown block's (B, windows, heads, n, n) attention given to `each`
        in order (`vitviz.core.analyses.verify` compares block by block); the blocks are placed on their windows
        after the forward, so they are held until then."""
        maps, out, _ = self.forward_captured(x)
        for m in maps:
            each(torch.from_numpy(m))
        return out

    def pos_embed(self, grid: tuple[int, int] | None = None) -> None:
        return None


def _unrolled(cells: np.ndarray) -> Placer:
    """Hiera's placer: (B, H, W, n, n) in its unrolled order -> (B, windows, H, n, n) in the geometry's, each
    token to the window and place that hold its grid cell (`cells`: the cell of each unrolled position)."""
    def place(probs: torch.Tensor, geo: BlockGeometry) -> np.ndarray:
        p = probs.cpu().numpy()
        b, h, w, n, _ = p.shape
        window = np.arange(w * n) % w                       # the model's own split: t = place * W + window
        slot = geo.slot_of[cells]                           # (N, 2): the geometry's (window, token) of each cell
        out = np.zeros((b, geo.num_windows, h, geo.window_tokens, geo.window_tokens), np.float32)
        for old in range(w):
            mine = np.flatnonzero(window == old)            # its tokens, in place order
            new, order = int(slot[mine[0], 0]), slot[mine, 1]
            out[:, new][:, :, order[:, None], order[None, :]] = p[:, :, old]
        return out
    return place


def _folded(probs: torch.Tensor, geo: BlockGeometry) -> np.ndarray:
    """DaViT's placer: (B * windows, H, 1, n, n), windows row-major per image (as the geometry's) -> (B, windows,
    H, n, n)."""
    p = probs.cpu().numpy()
    return p.reshape(-1, geo.num_windows, p.shape[1], p.shape[-2], p.shape[-1])


def _output(out: Any, batch: int) -> np.ndarray:
    """(B, K): the logits, else the pooled output, else the mean of the last hidden state's tokens (of a feature
    map's cells)."""
    t = out if isinstance(out, torch.Tensor) else getattr(out, "logits", None)
    if t is None:
        t = getattr(out, "pooler_output", None)
    if t is None:     # the mean of the last stage's tokens: (B, N, C), or a (B, C, H, W) feature map
        last = getattr(out, "last_hidden_state", None)
        t = last.mean(dim=1) if isinstance(last, torch.Tensor) and last.dim() == 3 else \
            last.mean(dim=(-2, -1)) if isinstance(last, torch.Tensor) and last.dim() == 4 else None
    if not isinstance(t, torch.Tensor) or t.dim() != 2 or t.shape[0] != batch:
        return np.zeros((batch, 0), np.float32)
    return t.detach().float().cpu().numpy()


def load_mask_units(module: nn.Module, found: tuple[tuple[int, int], list[tuple[int, int]], list[_Block]],
                    overrides: Mapping[str, Any], source: str, how: str = "") -> StagedModel:
    """Describe a Hiera by one probe forward at its own size and wrap it (`find_mask_units` found it)."""
    grid0, schedule, blocks = found
    stride = _patch_stride(module)
    size = (grid0[0] * stride, grid0[1] * stride)
    device = resolve_device(overrides["device"]) if overrides.get("device") else \
        next((p.device for p in module.parameters()), torch.device("cpu"))
    module.to(device)
    chans = int(getattr(module, "in_chans", 0) or getattr(getattr(module, "config", None), "num_channels", 3) or 3)
    x = torch.randn(1, chans, *size, generator=torch.Generator().manual_seed(0)).to(device)
    recorder = _Recorder(1, windows=True)
    with torch.inference_mode():
        out = user_call(lambda: _run(module, x, recorder), source, "its forward", f"a probe input {tuple(x.shape)}")
    calls = recorder.window_maps or []
    if [name for name, _ in calls] != [b.name for b in blocks]:
        raise LiveModelError(f"{source}: its forward computed attention in {[n for n, _ in calls][:6]}, not once in "
                             f"each of its {len(blocks)} attention modules; vitviz cannot place its windows")
    cells = unrolled_cells(grid0, schedule)
    stage, g = 0, grid0
    per_stage: dict[int, list[int]] = {}
    shown, stage_cells, windows, skipped = [], [], [], []
    heads: dict[int, int] = {}
    dims: dict[int, int] = {}
    for i, (blk, (_name, probs)) in enumerate(zip(blocks, calls)):
        if blk.q_stride > 1:            # pools the queries: this block's output is on the next stage's grid
            if blk.q_stride != 4:
                raise LiveModelError(f"{source}: {blk.name} pools its queries by {blk.q_stride}; vitviz places "
                                     "Hiera's 2 x 2 pooling only")
            n = cells.size // 4
            cells = _halved(cells[:n], g)
            stage, g = stage + 1, ((g[0] + 1) // 2, (g[1] + 1) // 2)
            skipped.append((blk.name, "pooled queries: from the next stage's grid to this one's",
                            tuple(probs.shape)))
            continue
        w = int(probs.shape[2])
        unit = _unit(cells, w, g) if w > 1 else g
        shown.append(i)
        stage_cells.append(cells.copy())
        windows.append((0, 0) if w == 1 else unit)
        per_stage.setdefault(stage, []).append(i)
        heads[stage], dims[stage] = blk.heads, blk.dim
    stages = sorted(per_stage)
    if not shown or stages != list(range(len(stages))):
        raise LiveModelError(f"{source}: no block of its first stage attends over one grid; vitviz cannot show it")
    logits = _output(out, 1)
    num_classes = int(logits.shape[1]) if getattr(out, "logits", None) is not None or \
        isinstance(out, torch.Tensor) else 0
    pcfg = getattr(module, "pretrained_cfg", None)
    mean, std = (tuple(pcfg["mean"]), tuple(pcfg["std"])) if isinstance(pcfg, dict) and pcfg.get("mean") else \
        (IMAGENET_MEAN, IMAGENET_STD)
    pre = Preprocess(crop=size, resize=min(size), mode="squash", interpolation="bicubic", mean=mean, std=std)
    capture = f"capture: {type(module).__name__}'s attention modules and unroll"
    not_used = "not used: the module's own code runs"
    prov = {name: not_used for name in COMPUTE_FIELDS}
    prov.update({
        "arch": f"{capture} (Hiera: stages halving the grid, shown as a Swin's)",
        "image_size": f"attribute: its token grid {grid0[0]}x{grid0[1]} x patch stride {stride}",
        "patch_size": f"attribute: patch stride {stride} (an overlapping convolution: tokens every {stride} px)",
        "depths": f"{capture}: the blocks shown per stage (those pooling their queries are not: {len(skipped)})",
        "heads": f"{capture}: heads per stage", "dims": f"{capture}: width per stage",
        "windows": (f"{capture}: mask units where use_mask_unit_attn, else global; token places by Hiera's unroll "
                    f"(schedule {schedule})"),
        "shifts": "family: Hiera (no shifted windows)", "in_chans": f"shape: the probe input ({chans} channels)",
        "num_classes": f"capture: the output {tuple(logits.shape)}" if num_classes else "none: no logits",
        "pooling": "not used: the module's own code runs",
        "preprocess": ("metadata: the model's pretrained_cfg (timm), squashed to its size" if pcfg else
                       "guess: ImageNet mean/std, the image squashed to the model's size"),
        "path": f"live: {type(module).__name__}'s own forward runs; attention captured per block inside its mask "
                f"units{(' (' + how + ')') if how else ''}",
    })
    spec = WindowedSpec(
        family="live", source=source, arch="swin", image_size=size, patch_size=stride, in_chans=chans,
        depths=tuple(len(per_stage[s]) for s in stages), heads=tuple(heads[s] for s in stages),
        dims=tuple(dims[s] for s in stages), mlp_hidden=tuple(0 for _ in stages), windows=tuple(windows),
        shifts=tuple((0, 0) for _ in windows), num_classes=num_classes, preprocess=pre,
        num_params=sum(p.numel() for p in module.parameters()), provenance=tuple(prov.items()))
    if skipped:
        warnings.warn(f"{source}: {len(skipped)} block(s) pool their queries ({skipped[0][0]} ...): they attend "
                      "from the next stage's grid to this one's, which no map of one grid shows -- not shown; every "
                      "other block is shown on its stage's grid, inside its mask units where it uses them (not "
                      "global)", LiveWarning, stacklevel=3)
    return StagedModel(module, spec, device, [b.name for b in blocks], shown, [_unrolled(c) for c in stage_cells],
                       skipped)


def _patch_stride(module: nn.Module) -> int:
    """The pixels between two stage-0 tokens: timm's `patch_stride`, transformers' `config.patch_stride`."""
    for value in (getattr(module, "patch_stride", None), *(getattr(getattr(m, "config", None), "patch_stride", None)
                                                          for m in module.modules())):
        if isinstance(value, (tuple, list)) and len(value) == 2 and value[0] == value[1]:
            return int(value[0])
    raise LiveModelError("a Hiera without a square patch stride (patch_stride); vitviz supports square ones only")


def _halved(cells: np.ndarray, grid: tuple[int, int]) -> np.ndarray:
    """The cells of the tokens a 2 x 2 pooling keeps (the first of each group), on the halved grid."""
    r, c = np.divmod(cells, grid[1])
    return (r // 2) * ((grid[1] + 1) // 2) + c // 2


def _unit(cells: np.ndarray, windows: int, grid: tuple[int, int]) -> tuple[int, int]:
    """(rows, cols) of one mask unit: the extent of window 0's cells, checked to be a tile of the grid."""
    r, c = np.divmod(cells[np.arange(cells.size) % windows == 0], grid[1])
    unit = (int(r.max() - r.min() + 1), int(c.max() - c.min() + 1))
    if unit[0] * unit[1] != cells.size // windows or grid[0] % unit[0] or grid[1] % unit[1]:
        raise LiveModelError(f"Hiera mask units of {cells.size // windows} tokens that are no tile of the "
                             f"{grid[0]}x{grid[1]} grid")
    return unit


__all__ = ["StagedModel", "find_mask_units", "find_windows_and_channels", "load_mask_units",
           "load_windows_and_channels", "unrolled_cells"]


def find_windows_and_channels(module: nn.Module) -> tuple[list[str], list[str]] | None:
    """(window attention modules, channel attention modules) of a DaViT (Florence-2's vision tower), by their
    classes' names; None for anything else."""
    window = [n for n, m in module.named_modules()
              if type(m).__name__.endswith("WindowAttention") and hasattr(m, "window_size") and hasattr(m, "num_heads")]
    channel = [n for n, m in module.named_modules() if type(m).__name__.endswith("ChannelAttention")]
    return (window, channel) if window and channel else None


def load_windows_and_channels(module: nn.Module, found: tuple[list[str], list[str]], overrides: Mapping[str, Any],
                              source: str, how: str = "") -> StagedModel:
    """A DaViT run as written: its spatial window blocks shown per stage, its channel blocks said (not spatial)."""
    window, channel = found
    size, size_src = _input_size(module, overrides)
    device = resolve_device(overrides["device"]) if overrides.get("device") else \
        next((p.device for p in module.parameters()), torch.device("cpu"))
    module.to(device)
    chans = int(getattr(getattr(module, "config", None), "num_channels", 0) or 3)
    x = torch.randn(1, chans, *size, generator=torch.Generator().manual_seed(0)).to(device)
    grids: dict[str, tuple[int, ...]] = {}

    def seen(name: str, _m: nn.Module, args: tuple[Any, ...]) -> None:
        grids.setdefault(name, tuple(args[0].shape))

    hooks = [module.get_submodule(n).register_forward_pre_hook(partial(seen, n)) for n in window]
    recorder = _Recorder(1, windows=True)
    try:
        with torch.inference_mode():
            user_call(lambda: _run(module, x, recorder), source, "its forward", f"a probe input {tuple(x.shape)}")
    finally:
        for h in hooks:
            h.remove()
    calls = recorder.window_maps or []
    names = [n for n, _ in calls]
    if sorted(names) != sorted(window + channel) or any(len(grids.get(n, ())) != 4 for n in window):
        raise LiveModelError(f"{source}: its attention calls ({names[:6]}) are not one per window and channel "
                             "attention module, or its window attention does not take a (B, H, W, C) grid; vitviz "
                             "cannot place its windows")
    shown, windows, skipped, per_stage, heads, dims, grid_of = [], [], [], {}, {}, {}, []
    for i, (name, probs) in enumerate(calls):
        if name in channel:
            skipped.append((name, "attention over channels (groups x channels x channels): not spatial",
                            tuple(probs.shape)))
            continue
        m = module.get_submodule(name)
        g = grids[name][1:3]
        if not grid_of or grid_of[-1] != g:
            grid_of.append(g)
        stage = len(grid_of) - 1
        shown.append(i)
        windows.append((int(m.window_size), int(m.window_size)))
        per_stage.setdefault(stage, []).append(i)
        heads[stage], dims[stage] = int(m.num_heads), int(getattr(m, "dim", 0))
    stride = size[0] // grid_of[0][0]
    spec_grids = WindowedSpec(family="live", source=source, arch="swin", image_size=size, patch_size=stride,
                              in_chans=chans, depths=tuple(1 for _ in grid_of), heads=(1,) * len(grid_of),
                              dims=(1,) * len(grid_of), mlp_hidden=(0,) * len(grid_of),
                              windows=((1, 1),) * len(grid_of), shifts=((0, 0),) * len(grid_of)).stage_grids()
    if tuple(tuple(g) for g in grid_of) != spec_grids:
        raise LiveModelError(f"{source}: its stages' grids {grid_of} are not {size[0]}x{size[1]} px / {stride}, "
                             "halved at every stage; vitviz cannot place its windows")
    capture = f"capture: {type(module).__name__}'s window attention modules and their inputs on a probe"
    prov = {name: "not used: the module's own code runs" for name in COMPUTE_FIELDS}
    prov.update({
        "arch": f"{capture} (DaViT: stages halving the grid, shown as a Swin's)",
        "image_size": size_src, "patch_size": f"{capture}: the first stage's grid {grid_of[0]} (every {stride} px)",
        "depths": f"{capture}: the spatial blocks per stage (the {len(skipped)} channel blocks are not spatial)",
        "heads": f"{capture}: num_heads per stage", "dims": f"{capture}: width per stage",
        "windows": f"{capture}: window_size, windows row-major, padded at the bottom and right",
        "shifts": "family: DaViT (no shifted windows)", "in_chans": f"shape: the probe input ({chans} channels)",
        "num_classes": "none: features (the mean of the last stage's tokens)",
        "preprocess": "guess: ImageNet mean/std, the image squashed to the model's size",
        "path": f"live: {type(module).__name__}'s own forward runs; spatial window attention captured per block"
                f"{(' (' + how + ')') if how else ''}",
    })
    pre = Preprocess(crop=size, resize=min(size), mode="squash", interpolation="bicubic", mean=IMAGENET_MEAN,
                     std=IMAGENET_STD)
    stages = sorted(per_stage)
    spec = WindowedSpec(
        family="live", source=source, arch="swin", image_size=size, patch_size=stride, in_chans=chans,
        depths=tuple(len(per_stage[s]) for s in stages), heads=tuple(heads[s] for s in stages),
        dims=tuple(dims[s] for s in stages), mlp_hidden=tuple(0 for _ in stages), windows=tuple(windows),
        shifts=tuple((0, 0) for _ in windows), order="pad_roll", num_classes=0, preprocess=pre,
        num_params=sum(p.numel() for p in module.parameters()), provenance=tuple(prov.items()))
    warnings.warn(f"{source}: {len(skipped)} channel attention block(s) ({skipped[0][0]} ...) attend over "
                  "channels, not over the image: not shown; the spatial window blocks are shown per stage",
                  LiveWarning, stacklevel=3)
    return StagedModel(module, spec, device, names, shown, [_folded] * len(shown), skipped)


def _input_size(module: nn.Module, overrides: Mapping[str, Any]) -> tuple[tuple[int, int], str]:
    """The probe's size: image_size= given, the config's image_size, else 224 (said as a guess)."""
    given = overrides.get("image_size")
    if given:
        return ((given, given) if isinstance(given, int) else (int(given[0]), int(given[1]))), "override"
    size = getattr(getattr(module, "config", None), "image_size", None)
    if isinstance(size, int):
        return (size, size), "metadata: config.image_size"
    return (224, 224), "guess: 224 px (nothing in the module states its input size; pass image_size=)"
