"""Vision towers whose forward takes packed patches and grid sizes, not an image batch -- the Qwen-VL family
(Qwen2-VL, Qwen2.5-VL, Qwen3-VL) and the towers with its forward (GLM-4V ...): `forward(hidden_states, grid_thw)`
with `hidden_states` the image's patches flattened as its image processor flattens them -- merge blocks of
`spatial_merge_size` x `spatial_merge_size` patches in raster order, the patches raster order inside each block, every
patch `(C, temporal_patch_size, p, p)` with the image repeated over time -- and `grid_thw` = [[1, rows, cols]].

`PackedTower` wraps such a tower so that it takes a (B, C, H, W) image batch as every live model does: it cuts the
image as the processor would and runs the tower's own forward, one image at a time (its eager attention is computed
per image of a packed sequence anyway). It tells the live path what the tower's sequence is (`order`: which of its
tokens is which patch of the raster grid, through the merge blocks and, for Qwen2.5-VL, its window reordering), so
that the captured maps are shown on the image's grid. Windowed layers compute one softmax per window: the recorder
assembles them into the block-diagonal map the layer computes (zeros outside its windows).

Relatives packed otherwise are named by their config's model_type: `RASTER` towers take the patches row by row as
`pixel_values` (PaddleOCR-VL, HunYuan-VL, Kimi-K2.5: merged only after their blocks), `PIXEL_VALUES` towers take
merge blocks under that name (Ovis 2.5).

Nothing here imports transformers: the tower's config and its module's own helpers are read from the object.
"""
from __future__ import annotations

import inspect
import sys
from typing import Any

import torch
from torch import nn

DEFAULT_SIDE = 224      # the probe's side, rounded down to whole merge blocks: the processors take any such size
# Towers whose forward takes `(pixel_values, grid_thw)` with the image's patches in raster order, as their image
# processor's `patchify` lays them out, their patches merged only after their blocks: {config model_type: the shape
# of pixel_values}. PaddleOCR-VL's encoder (2-D rotary positions on q and k, its learned position table interpolated
# to each grid); HunYuan-VL's (its position table interpolated, merged by a convolution after the blocks); Kimi-K2.5's
# MoonViT (2-D rotary positions, an interpolated position table; `merge_kernel_size` for its merge blocks).
RASTER = {"paddleocr_vl_vision": "(1, T, C*t, p, p)", "hunyuan_vl_vision": "(T, C*t*p*p)",
          "kimi_k25_vision": "(T, C*t, p, p)", "muse_spark_vision": "(T, C*t*p*p)",
          "muse_glimmer_vision": "(T, C*t*p*p)"}
# Towers packed as the Qwen-VL family's (merge blocks) whose forward names the packed patches `pixel_values`:
# {config model_type: the model}. Ovis 2.5's (windowed and full-attention layers, `layer_types`); Cosmos 3 Edge's
# (a packed SigLIP 2: its learned table resampled to each grid in the merge blocks' order); Dots3 Note's (2-D RoPE,
# a Conv2d patch embedding).
PIXEL_VALUES = {"ovis2_5_vision": "Ovis 2.5", "cosmos3_edge_vision": "Cosmos 3 Edge",
                "dots3_note_vision_encoder": "Dots3 Note"}
# How an image processor lays out one packed patch's values where it is not the Qwen-VL processors' (C, t, p, p):
# {config model_type: layout}. Cosmos 3 Edge's as SigLIP 2's (a pixel's channels together); Muse Spark's / Muse
# Glimmer's time steps first (their raster patches, two steps each, reordered into windows of their position table's
# size before the blocks, merged after them).
PATCH_LAYOUTS = {"cosmos3_edge_vision": "(p, p, C, t)", "muse_spark_vision": "(t, C, p, p)",
                 "muse_glimmer_vision": "(t, C, p, p)"}
_AXES = {"(C, t, p, p)": (0, 1, 2, 3), "(t, C, p, p)": (1, 0, 2, 3), "(p, p, C, t)": (2, 3, 0, 1)}


def is_packed(module: Any) -> bool:
    """Whether `module` is a vision tower whose forward takes `(hidden_states, grid_thw)` and whose config states
    its patch, temporal patch and merge sizes (the Qwen-VL family's signature)."""
    if not isinstance(module, nn.Module) or isinstance(module, PackedTower):
        return False
    try:
        params = inspect.signature(module.forward).parameters
    except (TypeError, ValueError):
        return False
    config = getattr(module, "config", None)
    if "pixel_values" in params and "grid_thw" in params and getattr(config, "model_type", None) in RASTER:
        return isinstance(getattr(config, "patch_size", None), int) and merge_size(config) is not None
    packs = "hidden_states" in params or ("pixel_values" in params and getattr(config, "model_type", None)
                                          in PIXEL_VALUES)
    return packs and "grid_thw" in params and all(
        isinstance(getattr(config, k, None), int) for k in ("patch_size", "spatial_merge_size")) and \
        temporal_size(module) is not None


def temporal_size(tower: nn.Module) -> int | None:
    """How many time steps one packed patch holds: the config's `temporal_patch_size`, else what the tower's patch
    embedding (its first convolution or Linear) takes per patch -- a Conv3d's time kernel, a Conv2d's one step, a
    Linear's input width over C x p x p (ERNIE 4.5-VL, Cosmos 3 Edge: 1, where their image processors' own
    `temporal_patch_size` is for video). None where neither says (or the Linear's width is no whole number of
    steps)."""
    config = getattr(tower, "config", None)
    stated = getattr(config, "temporal_patch_size", None)
    if isinstance(stated, int) and not isinstance(stated, bool) and stated > 0:
        return stated
    p = getattr(config, "patch_size", None)
    chans = getattr(config, "in_channels", None) or getattr(config, "num_channels", None) or 3
    embed = next((m for m in tower.modules() if isinstance(m, (nn.Conv3d, nn.Conv2d, nn.Linear))), None)
    if not isinstance(p, int) or embed is None:
        return None
    if isinstance(embed, nn.Conv3d):
        return int(embed.kernel_size[0])
    if isinstance(embed, nn.Conv2d):
        return 1 if tuple(embed.kernel_size) == (p, p) and embed.in_channels == chans else None
    steps, left = divmod(int(embed.in_features), int(chans) * p * p)
    return steps if steps and not left else None


def merge_size(config: Any) -> int | None:
    """The side of a merge block in patches: `spatial_merge_size`, a square `merge_kernel_size` (Kimi-K2.5), or
    `merge_size` (Muse Spark: merged after the blocks); None where the config states none."""
    merge = getattr(config, "spatial_merge_size", None)
    kernel = getattr(config, "merge_kernel_size", None)
    if merge is None and isinstance(kernel, (list, tuple)) and len(kernel) == 2 and kernel[0] == kernel[1]:
        merge = kernel[0]
    merge = getattr(config, "merge_size", None) if merge is None else merge
    return merge if isinstance(merge, int) and not isinstance(merge, bool) and merge > 0 else None


class PackedTower(nn.Module):
    """A packed-patch vision tower (`is_packed`) that takes (B, C, H, W) images, its own forward run per image.

    Args:
        tower: the transformers module (`Qwen2VisionTransformerPretrainedModel`, `Glm4vVisionModel` ...).
        side: the input side vitviz runs it at (`image_size`), with `side_source` saying why.
        mean, std, stats_source: the image processor's normalisation and where it was read.
    """

    def __init__(self, tower: nn.Module, side: tuple[int, int], side_source: str, mean: tuple[float, ...],
                 std: tuple[float, ...], stats_source: str) -> None:
        super().__init__()
        config = tower.config
        self.tower = tower
        self.patch_size = int(config.patch_size)
        self.temporal = int(temporal_size(tower) or 1)
        self.merge = int(merge_size(config) or 1)
        self.raster = RASTER.get(getattr(config, "model_type", None), "")   # its pixel_values' shape (`RASTER`)
        self.layout = PATCH_LAYOUTS.get(getattr(config, "model_type", None), "(C, t, p, p)")
        self.argument = "hidden_states" if "hidden_states" in inspect.signature(tower.forward).parameters \
            else "pixel_values"     # what its forward calls the packed patches
        self.in_chans = int(getattr(config, "in_channels", getattr(config, "in_chans", 3)))
        self.image_size = side
        self.side_source = side_source
        self.mean, self.std, self.stats_source = tuple(mean), tuple(std), stats_source
        self.dim = int(getattr(config, "embed_dim", 0) or getattr(config, "hidden_size", 0))
        order = "in raster order (merged after the tower)" if self.raster else \
            f"in {self.merge}x{self.merge} merge blocks"
        self.what = (f"{type(tower).__name__}'s own forward on the image's patches packed as its image processor "
                     f"packs them ({self.patch_size} px patches {order}, the image repeated over {self.temporal} "
                     "time step(s), grid_thw [[1, rows, cols]]), one image at a time")

    @property
    def window_px(self) -> int | None:
        """The side of its attention windows in pixels: the config's `window_size`, or the tower's own (Muse Spark
        computes it: its position table's side in patches); None for a tower without windows."""
        for value in (getattr(self.tower.config, "window_size", None), getattr(self.tower, "window_size", None)):
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
        return None

    @property
    def block(self) -> int:
        """The side in pixels the input must be a whole multiple of: one merge block of patches."""
        return self.patch_size * self.merge

    def grid(self, size: tuple[int, int]) -> tuple[int, int]:
        """(rows, cols) of patches for an (H, W) input.

        Raises:
            ValueError: a side that is no whole number of merge blocks (the model's forward refuses it too).
        """
        h, w = int(size[0]), int(size[1])
        if h % self.block or w % self.block or not h or not w:
            raise ValueError(f"{type(self.tower).__name__} takes images whose sides are whole multiples of "
                             f"{self.block} px ({self.merge}x{self.merge} merge blocks of {self.patch_size} px "
                             f"patches); got {h}x{w}")
        return h // self.patch_size, w // self.patch_size

    def pack(self, image: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One (C, H, W) image -> (its patches (rows * cols, C * t * p * p) in the processor's order and layout -- a
        raster tower's (1, rows * cols, C * t, p, p) -- and grid_thw)."""
        c = int(image.shape[0])
        rows, cols = self.grid(tuple(image.shape[-2:]))
        p, m = self.patch_size, self.merge
        grid = torch.tensor([[1, rows, cols]], device=image.device)
        if self.raster:     # row by row: (rows, cols, c, p, p)
            x = image.reshape(c, rows, p, cols, p).permute(1, 3, 0, 2, 4)
        else:               # in merge blocks: (R, C', m, m, c, p, p)
            x = image.reshape(c, rows // m, m, p, cols // m, m, p).permute(1, 4, 2, 5, 0, 3, 6)
        lead = x.dim() - 3
        x = x.unsqueeze(lead + 1).expand(*x.shape[:lead + 1], self.temporal, p, p)      # (..., c, t, p, p)
        x = x.permute(*range(lead), *(lead + a for a in _AXES[self.layout]))           # the processor's layout
        if self.raster:     # (1, rows * cols, C * t, p, p), (rows * cols, C * t * p * p) or (rows * cols, C * t, p, p)
            shape = {"(1, T, C*t, p, p)": (1, rows * cols, c * self.temporal, p, p), "(T, C*t*p*p)": (rows * cols, -1),
                     "(T, C*t, p, p)": (rows * cols, c * self.temporal, p, p)}[self.raster]
            return x.reshape(shape), grid
        return x.reshape(rows * cols, -1), grid

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) -> (B, T, D): the tower's last hidden states (in its own token order) of each image."""
        out = []
        for image in x:
            patches, grid = self.pack(image)
            result = self.tower(**{self.argument: patches}, grid_thw=grid)
            hidden = getattr(result, "last_hidden_state", None)
            hidden = hidden if isinstance(hidden, torch.Tensor) else result[0]
            out.append(hidden[0] if hidden.dim() == 3 else hidden)      # (HunYuan-VL's has a batch axis of one)
        return torch.stack(out)

    def order(self, size: tuple[int, int]) -> tuple[int, ...]:
        """For each patch of the raster grid (row by row), the index of its token in the tower's sequence."""
        rows, cols = self.grid(size)
        if self.raster:     # (Muse Spark: its patches reordered into windows before its blocks)
            inside = self._window_position(rows, cols)
            return tuple(range(rows * cols)) if inside is None else tuple(int(i) for i in inside)
        m = self.merge
        packed = torch.arange(rows * cols).reshape(rows // m, cols // m, m, m).permute(0, 2, 1, 3).reshape(-1)
        inside = self._window_position(rows, cols)
        return tuple(int(i) for i in (packed if inside is None else inside[packed]))

    def _window_position(self, rows: int, cols: int) -> torch.Tensor | None:
        """Where each token of the processor's order is in the blocks' sequence, for a tower that reorders its
        tokens into windows (Qwen2.5-VL: `window_index` over merge blocks, from its module's own helper); None for
        one that keeps the processor's order."""
        helper = getattr(sys.modules.get(type(self.tower).__module__), "get_vision_window_index", None)
        if helper is None or self.window_px is None:
            return None
        merge = 1 if self.raster else self.merge        # (a raster tower's windows are of patches, merged after)
        index, _ = helper(torch.tensor([[1, rows, cols]]), spatial_merge_size=merge, window_size=self.window_px,
                          patch_size=self.patch_size)
        unit = merge * merge
        sequence = (index.reshape(-1, 1) * unit + torch.arange(unit)).reshape(-1)   # block position -> token
        position = torch.empty_like(sequence)
        position[sequence] = torch.arange(sequence.numel())
        return position

    def windowed(self) -> str:
        """Which blocks attend within windows, as its config states ('' for none)."""
        config = self.tower.config
        full = getattr(config, "fullatt_block_indexes", None)
        depth = getattr(config, "depth", None)
        kinds = getattr(config, "layer_types", None)    # Ovis 2.5: 'full_attention' / 'window_attention' per block
        stated = "config.fullatt_block_indexes"
        if full is None and isinstance(kinds, (list, tuple)) and "window_attention" in kinds:
            full, depth = [i for i, k in enumerate(kinds) if k != "window_attention"], len(kinds)
            stated = "config.layer_types"
        if not isinstance(full, (list, tuple)) or not isinstance(depth, int) or self.window_px is None:
            return ""
        windowed = [i for i in range(depth) if i not in full]
        return (f"blocks {', '.join(map(str, windowed))} attend within windows of {self.window_px} px "
                f"({stated}: blocks {', '.join(map(str, full))} attend over the whole image); "
                "a windowed layer's map is its windows' softmaxes, zero between windows")


def packed_tower(tower: nn.Module, size: Any = None, stats: tuple[Any, Any, str] | None = None,
                 model_type: str = "") -> PackedTower:
    """`tower` wrapped to take (B, C, H, W) images.

    Args:
        tower: a module `is_packed` accepts.
        size: the input size (side or (h, w)); default `DEFAULT_SIDE` rounded down to whole merge blocks.
        stats: (mean, std, source) as the model's preprocessor_config.json states them; default the defaults of
            the image processor class transformers pairs with `model_type` (said as assumed).
        model_type: the whole model's model_type ('qwen2_5_vl'), for its image processor class.
    """
    block = int(tower.config.patch_size) * int(merge_size(tower.config) or 1)
    if size is None:
        side = max(block, DEFAULT_SIDE // block * block)
        chosen = ((side, side), f"guess: {side} px ({DEFAULT_SIDE} px in whole {block} px merge blocks; the model's "
                                "image processor resizes each image to its own multiple of that size, vitviz runs "
                                "every image at one size: pass image_size= for another)")
    else:
        h, w = (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))
        chosen = ((h, w), "override")
    mean, std, source = stats if stats is not None else _processor_defaults(model_type, tower)
    return PackedTower(tower, chosen[0], chosen[1], tuple(float(v) for v in mean), tuple(float(v) for v in std),
                       source)


_CLIP = ((0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711))


def _processor_defaults(model_type: str, tower: nn.Module) -> tuple[Any, Any, str]:
    """(mean, std, source) of the image processor class transformers pairs with `model_type`, read from the class
    (its defaults: a checkpoint's own preprocessor_config.json may differ, so this is said as assumed)."""
    try:
        from transformers.models.auto.image_processing_auto import IMAGE_PROCESSOR_MAPPING_NAMES
    except ImportError:
        names: Any = {}
    else:
        names = IMAGE_PROCESSOR_MAPPING_NAMES
    kind = model_type or str(getattr(tower.config, "model_type", "")).removesuffix("_vision")
    entry = names.get(kind) or names.get(kind.removesuffix("_moe"))     # (Qwen3-VL-MoE: Qwen3-VL's processor)
    name = (entry.get("torchvision") or entry.get("pil")) if isinstance(entry, dict) else entry
    cls = None
    if isinstance(name, str):
        import transformers

        try:
            cls = getattr(transformers, name)
        except (AttributeError, ImportError):   # (transformers' lazy module raises either for a missing backend)
            cls = None
    mean, std = getattr(cls, "image_mean", None), getattr(cls, "image_std", None)
    if isinstance(mean, (list, tuple)) and isinstance(std, (list, tuple)) and len(mean) == len(std) == 3:
        return mean, std, (f"guess: transformers' {name} defaults (no preprocessor_config.json read: a checkpoint's "
                           "own may state other values; pass mean= and std=)")
    return (*_CLIP, f"guess: OpenAI CLIP mean/std, the Qwen-VL processors' default (no image processor found for "
                    f"model_type {kind!r}; pass mean= and std=)")
