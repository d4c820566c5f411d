"""The zoo sweep: every transformers model type whose image side is a transformer over patches, and a sample of
timm's transformer modules, built tiny with random weights, saved as users have them and opened with vitviz.

    PYTHONPATH=$PWD python scripts/trial_zoo.py                  # the whole sweep (2 workers), REPORT.md + results.json
    PYTHONPATH=$PWD python scripts/trial_zoo.py --only vit,swin  # only these model types / timm architectures
    PYTHONPATH=$PWD python scripts/trial_zoo.py --hf-only --resume   # keep the cases already in results.json

Cases. transformers: every model type of the auto mappings of an image task (classification, feature extraction,
image-text-to-text, depth, detection, segmentation, backbones, video ...) is built from its config class's
defaults shrunk generically (`tiny_config`: widths, layers, heads, image sizes and every sub-config, with
per-type overrides in `HF_OVERRIDES`), its weights perturbed so that attention is not near-uniform, and saved with
`save_pretrained` (what `hf:ORG/NAME` downloads) into a folder not named after it (a refusal must name the model in
its own words). A type whose original computes no attention over the image (a CNN) is listed as 'not a ViT' and
counted apart, as are those of `HF_OUT_OF_SCOPE` (audio only; a library transformers needs is not installed).
timm: `TIMM_SAMPLE` architectures spread over every module of timm that holds a transformer, built with tiny keyword
arguments (`TIMM_OVERRIDES` where the generic ones build none), saved as a timm hub folder (config.json with
`architecture` + model.safetensors) and as a bare state dict.

Routes. by file: `vitviz.load(folder)` (timm: the hub folder and the bare state dict); live: `vitviz.load(model)`.
Each route is run on a small image, and vitviz's per-layer attention is compared with the attention the original
computes on the very input vitviz fed its copy (`result.input`): every softmax and scaled_dot_product_attention
of the original's image forward is recorded (`Recorder`, a TorchFunctionMode: independent of vitviz), with the
weights its code then multiplies the values with (CaiT's talking heads change the softmax's output first; vitviz
shows those, and says so). A model whose tokens join late (CaiT's CLS at its class-attention layers) is shown on
one grid; the original's maps are laid on it the way it concatenates its tokens, and every value is compared.
SigLIP 2 (NaFlex) is called with the patches its processor cuts (transformers' `convert_image_to_patches`). A
Qwen-VL-style tower (packed patches and `grid_thw`; its relatives that take them as `pixel_values`, in merge blocks
or in raster order) is called on the image packed as vitviz packs it, its softmaxes grouped per block and its tokens
placed on the grid by where the packing put their pixels and its own window reordering (`packed_reference`). A timm
original that refuses the size vitviz chose (a bare state dict states none) is set to it by timm's own
`set_input_size`, its windows kept (`resized_original`), and the route says so.

Verdicts of a route (`classify`):
    exact            every layer vitviz shows equals an attention map of the original (in order), none left out
    flagged          it differs, and vitviz said an assumption (spec.assumptions, a GuessWarning, skipped layers)
    wrong            it differs (values, or no map of the original has its shape), and nothing was said
    unchecked        it ran, but the original gave no attention to compare with (its forward failed)
    refused-clear    a VitvizError naming the model (model_type / class / architecture) and a route that works
    refused-unclear  a VitvizError that does not
    crash            any other exception, or the process died (memory cap, signal)
    hang             the case ran past its time limit

Every case runs in its own forked process (the parent has imported torch, transformers, timm and vitviz once)
under a memory cap (RLIMIT_AS) and a time limit; at most `--workers` (default 2) at once. Results are merged into
results.json as each case ends (under a lock), so an interrupted sweep resumes with `--resume`.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import faulthandler
import fcntl
import importlib
import inspect
import json
import math
import multiprocessing as mp
import os
import re
import resource
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path
from typing import Any, Callable

QUIET_OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1",
                 "TQDM_DISABLE": "1", "TRANSFORMERS_VERBOSITY": "error"}


def quiet_offline() -> None:
    """The sweep never asks a hub and prints no progress bars: set for the run by `main` (its forked cases inherit
    it), not at import, so importing the harness (its tests do) changes nothing in the importing process."""
    for key, value in QUIET_OFFLINE.items():
        os.environ.setdefault(key, value)

HERE = Path(__file__).resolve().parent
OUT = HERE / "trial_zoo"
ROOT = HERE.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

VERDICTS = ("exact", "flagged", "wrong", "unchecked", "refused-clear", "refused-unclear", "crash", "hang")
ATOL = 1e-4
WIDTH, FFN, LAYERS, HEADS = 32, 64, 2, 4

# ------------------------------------------------------------------------------------------------ the cases
# Image tasks of transformers' auto mappings: a model type in any of them is a candidate; the first mapping (in
# this order) that has it gives the class built (the class a hub repository of that type is usually saved as).
HF_TASKS = ("IMAGE_TEXT_TO_TEXT", "MULTIMODAL_LM", "VISUAL_QUESTION_ANSWERING", "ZERO_SHOT_IMAGE_CLASSIFICATION",
            "IMAGE_CLASSIFICATION", "DEPTH_ESTIMATION", "SEMANTIC_SEGMENTATION", "INSTANCE_SEGMENTATION",
            "UNIVERSAL_SEGMENTATION", "IMAGE_SEGMENTATION", "OBJECT_DETECTION", "ZERO_SHOT_OBJECT_DETECTION",
            "KEYPOINT_DETECTION", "POSE_ESTIMATION", "IMAGE_MATTING", "MASK_GENERATION", "VIDEO_CLASSIFICATION",
            "IMAGE_TO_IMAGE", "MASKED_IMAGE_MODELING", "DOCUMENT_QUESTION_ANSWERING", "TEXT_RECOGNITION",
            "TABLE_RECOGNITION", "NORMAL_ESTIMATION", "POINTMAP_ESTIMATION", "CAUSAL_IMAGE_MODELING",
            "KEYPOINT_MATCHING", "RETRIEVAL", "BACKBONE", "IMAGE")

# Per-type config values the generic shrinking cannot know (a field that must equal another, a minimum size).
HF_OVERRIDES: dict[str, dict[str, Any]] = {
    "dpt": {"num_hidden_layers": 4, "backbone_out_indices": [0, 1, 2, 3]},   # one neck input per layer (0-based)
    # Perception LM: a timm Perception Encoder tower through TimmWrapper (its default names resnet50, no arguments)
    "perception_lm": {"vision_config.architecture": "vit_pe_core_large_patch14_336",
                      "vision_config.model_args": {"embed_dim": 32, "depth": 2, "num_heads": 4, "img_size": 56,
                                                   "global_pool": ""}},
    "granite4_vision": {"downsample_rate": "1/2", "deepstack_layer_map": [[0, 0], [1, 1]],
                        "vision_config.hidden_size": 64},    # (its Q-Former's heads: the tower's width // 64)
    # FastVLM: timm's FastViT-HD through TimmWrapper (its features: the last stage's width, doubled)
    "fast_vlm": {"vision_config.model_args": {"inference_mode": True, "layers": [1, 1, 1, 1, 1],
                                              "embed_dims": [16, 16, 32, 32, 32]}, "vision_config.hidden_size": 64},
    "janus": {"vq_config.base_channels": 32, "vq_config.latent_channels": 32, "vq_config.image_token_embed_dim": 32},
    "hunyuan_vl": {"text_config.head_dim": 8},
    "gemma4": {"text_config.hidden_size_per_layer_input": 8},      # per-layer token embeddings: 262144 x 256 each
    "deepseek_ocr2": {"text_config.mlp_layer_types": ["dense", "dense"]},
    "molmo2": {"adapter_config.vision_feature_layer": [-1, -2]},
    "sapiens2": {"head_config.upsample_out_channels": [16], "head_config.conv_out_channels": [16]},
    # (the rest: sizes that must agree once shrunk -- RoPE sections summing to half the head width, an adapter's
    # width equal to its tower's, group norms dividing the widths -- and tables the defaults leave empty)
    "align": {"vision_config.width_coefficient": 0.25, "vision_config.depth_coefficient": 0.3,
              "vision_config.hidden_dim": 64},
    "bit": {"num_groups": 4},
    "chameleon": {"vocabulary_map": {"<image>": 8}},
    "cohere_compass": {"text_config.rope_parameters": {
        t: {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [1, 1, 2]}
        for t in ("full_attention", "sliding_attention")}},
    "cosmos3_edge": {"text_config.rope_parameters.mrope_section": [2, 1, 1]},
    "ernie4_5_vl_moe": {"text_config.rope_parameters.mrope_section": [1, 1, 2]},
    "detr": {"encoder_attention_heads": 8, "decoder_attention_heads": 8},   # its mask head: width + heads, x8
    "dots3_note": {"vision_config.adapter_in_dim": 32, "vision_config.adapter_out_dim": 32,
                   "audio_config.adapter_input_size": 32, "audio_config.adapter_out_dim": 32},
    "apertus1p5": {"audio_config.codebook_dim": 32, "vision_config.base_channels": 32,
                   "vision_config.num_res_blocks": 1, "vision_config.embed_dim": 16,
                   "vision_config.latent_channels": 16},
    "emu3": {"vocabulary_map": {"<image>": 8, "<|extra_200|>": 9}, "vq_config.base_channels": 32,
             "vq_config.num_res_blocks": 1, "vq_config.codebook_size": 64, "vq_config.hidden_size": 32},
    "imagegpt": {"n_embd": 32, "n_layer": 2, "n_head": 4},
    "perceiver": {"d_latents": 64, "num_latents": 32, "num_self_attends_per_block": 2},
    "qwen2_5_omni": {"enable_audio_output": False},         # (no talker / token2wav: its vision side is the same)
    "qwen3_omni_moe": {"enable_audio_output": False},
    "gemma3n": {"text_config.num_kv_shared_layers": 0, "text_config.hidden_size_per_layer_input": 8,
                "text_config.vocab_size_per_layer_input": 128,
                "vision_config.model_args": {"channel_multiplier": 0.25}},
    "diffusion_gemma": {"text_config.num_experts": 4, "text_config.top_k_experts": 2,
                        "text_config.moe_intermediate_size": 64},
    "muse_spark": {"audio_config.num_hidden_layers": 4},    # (one entry per layer of its per-stage lists)
    "timm_backbone": {"backbone": "vit_tiny_patch16_224"},      # (its default names no timm model)
    "efficientloftr": {"hidden_size": 256},      # (its last stage's width, which the shrinking keeps)
    # PP-OCR's server text detectors: their IntraCL blocks' convolutions (kernel, stride, padding) as PaddleOCR's
    # LKPAN states them (the config's default leaves them empty)
    **{t: {"kernel_list": [3, 2, 2], "intraclass_block_config": {
        "reduce_channel": [1, 1, 0], "return_channel": [1, 1, 0],
        "vertical_long_to_small_conv_longratio": [[7, 1], [1, 1], [3, 0]],
        "vertical_long_to_small_conv_midratio": [[5, 1], [1, 1], [2, 0]],
        "vertical_long_to_small_conv_shortratio": [[3, 1], [1, 1], [1, 0]],
        "horizontal_small_to_long_conv_longratio": [[1, 7], [1, 1], [0, 3]],
        "horizontal_small_to_long_conv_midratio": [[1, 5], [1, 1], [0, 2]],
        "horizontal_small_to_long_conv_shortratio": [[1, 3], [1, 1], [0, 1]],
        "symmetric_conv_long_longratio": [7, 1, 3], "symmetric_conv_long_midratio": [5, 1, 2],
        "symmetric_conv_long_shortratio": [3, 1, 1]}} for t in ("pp_ocrv5_server_det", "pp_ocrv6_medium_det")},
}
# Model types of the image task mappings that are not swept, and why (listed apart in the report).
HF_OUT_OF_SCOPE: dict[str, str] = {
    **{t: "audio only (speech recognition): no image input and no vision sub-config; in the multimodal-LM mapping "
          "for its audio" for t in ("fun_asr_nano", "kyutai_speech_to_text", "nemo_speechlm", "vibevoice_asr")},
    "dinat": "needs the natten library (compiled neighborhood-attention kernels), not installed here: transformers "
             "refuses to build it",
    "layoutlmv2": "needs detectron2 (its ResNeXt visual backbone), not installed here; its image side is a CNN",
}

# timm modules that hold a transformer over patches (or windows / stages of them) and how many architectures of
# each are sampled (spread evenly over the module's sorted names).
TIMM_MODULES = {
    "vision_transformer": 14, "eva": 8, "deit": 3, "beit": 3, "vision_transformer_relpos": 3,
    "vision_transformer_sam": 2, "vision_transformer_hybrid": 2, "naflexvit": 2, "cait": 2, "xcit": 2,
    "swin_transformer": 2, "swin_transformer_v2": 2, "swin_transformer_v2_cr": 2, "crossvit": 2, "levit": 2,
    "mvitv2": 2, "pit": 2, "twins": 2, "pvt_v2": 2, "hiera": 2, "hieradet_sam2": 1, "davit": 2, "tiny_vit": 2,
    "maxxvit": 2, "coat": 1, "convit": 1, "tnt": 1, "nest": 1, "volo": 1, "gcvit": 1, "vitamin": 2,
    "deepseek_vit": 1, "gemma4_vit": 1, "qwen3_vit": 1, "efficientformer": 1, "efficientformer_v2": 1,
    "mobilevit": 1, "fastvit": 1, "nextvit": 1, "edgenext": 1,
}


def hf_candidates() -> dict[str, str]:
    """{model_type: class name} for every model type of an image task mapping."""
    import transformers.models.auto.modeling_auto as ma

    out: dict[str, str] = {}
    for task in HF_TASKS:
        for model_type, cls in getattr(ma, f"MODEL_FOR_{task}_MAPPING_NAMES", {}).items():
            if model_type not in out:
                out[model_type] = cls[0] if isinstance(cls, (tuple, list)) else cls
    return dict(sorted(out.items()))


def timm_sample() -> list[str]:
    """The sampled timm architectures: `TIMM_MODULES[m]` names of module m, evenly spread."""
    import timm
    from timm.models import _registry

    by_module: dict[str, list[str]] = {}
    for name in timm.list_models():
        by_module.setdefault(_registry._model_to_module[name], []).append(name)
    names: list[str] = []
    for module, count in TIMM_MODULES.items():
        got = sorted(by_module.get(module, ()))
        step = max(len(got) / max(count, 1), 1.0)
        names += sorted({got[int(i * step)] for i in range(min(count, len(got)))})
    return names


# ------------------------------------------------------------------------------------------------ tiny configs
_WIDTH_KEYS = {"hidden_size", "embed_dim", "d_model", "hidden_dim", "width", "projection_dim", "out_hidden_size",
               "vision_embed_dim", "text_embed_dim", "proj_dim", "embed_dim_per_stage", "encoder_hidden_size",
               "decoder_hidden_size", "text_hidden_size", "vision_hidden_size", "dim", "hidden_act_dim",
               "cross_attention_hidden_size", "output_dim", "neck_hidden_size", "fusion_hidden_size"}
_STAGE_WIDTHS = (16, 32, 64, 128, 256, 512)
_STAGE_HEADS = (1, 2, 4, 8, 8, 8)


def _layer_key(key: str) -> bool:
    return key in {"depth", "num_layers", "num_hidden_layers", "layers"} or (
        key.endswith("_layers") and not key.startswith(("vision_feature", "select", "return", "out_"))
        and "index" not in key)


def shrink(d: dict[str, Any]) -> dict[str, Any]:
    """A config dict made tiny, recursively (sub-config dicts too): widths `WIDTH`, feed-forward `FFN`, `LAYERS`
    layers, `HEADS` heads (per-stage lists shrunk element-wise), image sizes of a 4x4 patch grid."""
    out = dict(d)
    patch = out.get("patch_size")
    stages = len(d["depths"]) if isinstance(d.get("depths"), (list, tuple)) else 0
    # (a staged model's num_layers counts its stages, which are not shrunk: its per-stage lists stay)
    depth = 0 if stages else next((d[k] for k in ("num_hidden_layers", "num_layers", "depth")
                                   if isinstance(d.get(k), int)), 0)
    for key, v in d.items():      # what is per layer, or names a layer, follows the layers' shrinking
        if depth > LAYERS and isinstance(v, list) and len(v) == depth and key != "depths":
            out[key] = v[:LAYERS]
        elif depth > LAYERS and isinstance(v, dict) and v and all(str(i).isdigit() for i in v):
            out[key] = {i: c for i, c in v.items() if int(i) < LAYERS}
        elif isinstance(v, list) and v and all(isinstance(i, int) and not isinstance(i, bool) for i in v) and (
                "indices" in key or "indexes" in key or key.endswith(("_layer", "_layers", "layer_ids"))) and \
                "num" not in key:      # (a count per stage, HGNetV2's stage_numb_of_layers, is no layer index)
            top = LAYERS if "out" in key or "feature" in key else LAYERS - 1
            clipped = [min(i, top) if i >= 0 else i for i in v]
            out[key] = clipped if "out" in key or "feature" in key else sorted(set(clipped))
        elif key == "out_features" and isinstance(v, list) and all(isinstance(f, str) for f in v):
            out[key] = [re.sub(r"\d+$", lambda m: str(min(int(m.group()), LAYERS)), f) for f in v]
    if "window_size" in out and isinstance(out["window_size"], int) and out["window_size"] > 4:
        merge = out.get("spatial_merge_size")
        # Qwen2.5-VL-style windows are in pixels, of whole merged units: two by two units (4 was none, a modulo by 0)
        out["window_size"] = 2 * merge * patch if isinstance(merge, int) and isinstance(patch, int) else 4
    side = 4 * patch * 2 ** max(stages - 1, 0) if isinstance(patch, int) else None
    for key, v in d.items():
        if isinstance(v, dict) and ("model_type" in v or key.endswith("_config")) and not (
                v and all(str(i).isdigit() for i in v)):     # (not a per-layer dict: per_layer_config)
            out[key] = shrink(v)
        elif isinstance(v, bool) or v is None:
            continue
        elif isinstance(v, int):
            if key in _WIDTH_KEYS and v > WIDTH:
                out[key] = WIDTH
            elif ("intermediate" in key or "ffn" in key or key == "mlp_dim") and v > FFN:
                out[key] = FFN
            elif _layer_key(key) and v > LAYERS and not (stages and key == "num_layers"):
                out[key] = LAYERS
            elif (key in {"num_attention_heads", "num_heads"} or key.endswith("_attention_heads")) and v > HEADS:
                out[key] = HEADS
            elif key == "num_key_value_heads" and v > 2:
                out[key] = 2 if v < d.get("num_attention_heads", v + 1) else HEADS
            elif key == "head_dim" and v > WIDTH // HEADS:
                out[key] = WIDTH // HEADS
            elif key in {"num_experts", "num_local_experts", "n_routed_experts"} and v > 4:
                out[key] = 4
            elif key in {"num_experts_per_tok", "moe_topk", "num_experts_per_token"} and v > 2:
                out[key] = 2
            elif key == "image_size" and side and v > side:
                out[key] = side
        elif isinstance(v, (list, tuple)) and v and all(isinstance(i, int) and not isinstance(i, bool) for i in v):
            n = len(v)
            if key == "depths":
                out[key] = [1] * n
            elif key in {"hidden_sizes", "embed_dims", "embed_dim", "dims", "hidden_dims", "channels"} and n <= 6:
                out[key] = list(_STAGE_WIDTHS[:n])
            elif key in {"num_heads", "num_attention_heads", "heads"} and n <= 6:
                out[key] = list(_STAGE_HEADS[:n])
            elif key == "image_size" and n == 2 and side and min(v) > side:
                out[key] = [side, side]
    _backbone_outputs(d, out, stages, depth)
    return out


def _backbone_outputs(d: dict[str, Any], out: dict[str, Any], stages: int, depth: int) -> None:
    """A backbone's `out_features` / `out_indices` after the shrinking, distinct (transformers refuses duplicates):
    a staged backbone keeps its stages (their count is not shrunk), so they stay as they were (as a backbone's
    whose layers are not shrunk do); a plain one's k
    outputs become its last k layers, with at least k layers (a DPT-style neck takes one per output)."""
    feats, idx = d.get("out_features"), d.get("out_indices")
    k = len(feats) if isinstance(feats, list) else len(idx) if isinstance(idx, list) else 0
    if not k:
        return
    layer_key = next((key for key in ("num_hidden_layers", "num_layers", "depth") if isinstance(d.get(key), int)), "")
    if stages or not layer_key or depth <= LAYERS:     # (a timm or CNN backbone's 'layer1' ... too)
        for key in ("out_features", "out_indices", "stage_names"):
            if key in d:
                out[key] = d[key]
        return
    n = max(LAYERS, k)
    out[layer_key] = n
    if isinstance(feats, list):
        out["out_features"] = [f"stage{i}" for i in range(n - k + 1, n + 1)]
    if isinstance(idx, list):
        out["out_indices"] = list(range(n - k + 1, n + 1))
    if isinstance(d.get("stage_names"), list):
        out["stage_names"] = ["stem"] + [f"stage{i}" for i in range(1, n + 1)]


def tiny_config(model_type: str) -> Any:
    """The config class's defaults made tiny (`shrink`), with `HF_OVERRIDES[model_type]` applied on top."""
    from transformers import CONFIG_MAPPING

    cls = CONFIG_MAPPING[model_type]
    base = cls().to_dict()
    for k in ("transformers_version", "architectures", "_name_or_path"):
        base.pop(k, None)
    small = shrink(base)
    for key, value in HF_OVERRIDES.get(model_type, {}).items():
        node = small
        *path, last = key.split(".")
        for p in path:
            node = node[p]
        node[last] = value
    small.pop("model_type", None)
    return cls(**small)


def perturb(model: Any, std: float = 0.05, seed: int = 0) -> Any:
    """Random weights far enough from initialisation that attention is not near-uniform (differences show)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.is_floating_point():
                p.add_(torch.randn(p.shape, generator=g) * std)
    return model.eval()


def _mae_unmasked(model: Any) -> None:
    """ViT-MAE's forward masks a random 75 % of the patches and shuffles the rest; vitviz shows its encoder on
    every patch in order: the reference is the forward with mask_ratio 0 and noise that keeps the order."""
    import torch

    model.config.mask_ratio = 0.0
    forward = model.forward

    def unmasked(pixel_values: Any = None, **kw: Any) -> Any:
        p = model.config.patch_size
        n = (pixel_values.shape[-2] // p) * (pixel_values.shape[-1] // p)
        return forward(pixel_values=pixel_values, noise=torch.arange(n, dtype=torch.float32)[None], **kw)

    model.forward = unmasked


# How the reference runs, where the original's forward is not what vitviz shows by design (said in its docstring).
REF_PREP: dict[str, Callable[[Any], None]] = {"vit_mae": _mae_unmasked}


def build_hf(model_type: str, class_name: str) -> Any:
    import torch
    import transformers

    cls = getattr(transformers, class_name)
    torch.manual_seed(0)
    model = cls._from_config(tiny_config(model_type))
    return perturb(model)


TIMM_TRIES: tuple[dict[str, Any], ...] = (
    dict(img_size=64, embed_dim=64, depth=2, num_heads=4),
    dict(img_size=64, embed_dim=(32, 64, 64, 64), depths=(1, 1, 1, 1), num_heads=(1, 2, 2, 2), window_size=4),
    dict(img_size=64, embed_dim=32, depths=(1, 1, 1, 1), num_heads=(1, 2, 4, 8), window_size=4),
    dict(img_size=64, embed_dim=(32, 64, 64, 64), depths=(1, 1, 1, 1), num_heads=(1, 2, 2, 2)),
    dict(img_size=64, embed_dims=(32, 64, 64, 64), depths=(1, 1, 1, 1), num_heads=(1, 2, 2, 2)),
    dict(img_size=64, embed_dim=64, depth=2),
    dict(img_size=64),
    dict(),
)
# Tiny arguments per architecture where `TIMM_TRIES` builds none (its own argument names, a list per block); '_via':
# the module's create function, called with the architecture's name, where the registered function fixes the
# arguments itself (passing them again is "multiple values").
TIMM_OVERRIDES: dict[str, dict[str, Any]] = {
    "coat_lite_medium": dict(img_size=64, embed_dims=(64, 64, 64, 64), serial_depths=(1, 1, 1, 1), num_heads=8),
    "crossvit_18_dagger_408": dict(embed_dim=(32, 64), depth=((1, 1, 0),), num_heads=(2, 2), mlp_ratio=(2, 2, 1)),
    "davit_base": dict(embed_dims=(16, 32, 64, 128), depths=(1, 1, 1, 1), num_heads=(1, 2, 4, 8)),
    "davit_huge_fl": dict(embed_dims=(16, 32, 64, 128), depths=(1, 1, 1, 1), num_heads=(1, 2, 4, 8)),
    "deepseek_vit_412m": dict(img_size=56, embed_dim=64, depth=2, num_heads=4),       # patch 14
    "fastvit_ma36": dict(layers=(1, 1, 1, 1), embed_dims=(16, 32, 64, 128)),
    "gcvit_base": dict(_via="gcvit._create_gcvit", depths=(1, 1, 1, 1), num_heads=(1, 2, 4, 8), embed_dim=16),
    "hiera_base_224": dict(embed_dim=32, num_heads=1, stages=(1, 1, 1, 1)),
    "hiera_large_224": dict(embed_dim=32, num_heads=1, stages=(1, 1, 1, 1)),
    "hieradet_small": dict(embed_dim=32, num_heads=1, stages=(1, 1, 1, 1), global_att_blocks=()),
    # MViTv2: its config is a registered MultiScaleVitCfg (`_cfg`: one registered for the sweep, with and without
    # the class token, picked by timm's own cfg_variant argument)
    "mvitv2_base": dict(cfg_variant="zoo_tiny", _cfg=dict(depths=(1, 1, 1, 1), embed_dim=16, num_heads=1)),
    "mvitv2_large_cls": dict(cfg_variant="zoo_tiny_cls", _cfg=dict(
        depths=(1, 1, 1, 1), embed_dim=16, num_heads=1, use_cls_token=True)),
    "nextvit_base": dict(depths=(1, 1, 5, 1)),      # (its third stage: whole groups of 4 conv + 1 attention block)
    "nest_base": dict(_via="nest._create_nest", embed_dims=(32, 64, 128), num_heads=(1, 2, 4), depths=(1, 1, 1),
                      img_size=64, patch_size=4),
    "pit_b_224": dict(img_size=64, patch_size=16, stride=8, base_dims=(16, 16, 16), depth=(1, 1, 1), heads=(2, 4, 8)),
    "tnt_b_patch16_224": dict(img_size=64, embed_dim=64, inner_dim=16, depth=2, num_heads_outer=4,
                              num_heads_inner=2),
    "vit_5b_patch16_sapiens2": dict(img_size=64, embed_dim=64, depth=2, num_heads=4, num_kv_heads=(4, 4)),
    "vit_large_patch16_sapiens2": dict(img_size=64, embed_dim=64, depth=2, num_heads=4, num_kv_heads=(4, 4)),
    "vit_base_mci_224": dict(img_size=64, depth=1),            # its conv stem fixes the width (768)
    "vitamin_base_224": dict(img_size=64, depth=1),            # its conv stages fix the width
    "vitamin_large_256": dict(img_size=64, depth=1),
}
TIMM_MAX_PARAMS = 30_000_000
HF_MAX_PARAMS = 60_000_000     # a model the generic shrinking left large (a sub-config it does not know)


def build_timm(arch: str) -> tuple[Any, dict[str, Any]]:
    """The architecture built with the first of `TIMM_TRIES` it takes and runs at (1, 3, 64, 64); its kwargs."""
    import timm
    import torch

    errors = []
    patch = re.search(r"patch(\d+)", arch)
    side = 4 * int(patch.group(1)) if patch else 64     # a whole number of patches (timm's size check is strict)
    tries = [dict(TIMM_OVERRIDES[arch])] if arch in TIMM_OVERRIDES else [
        {**kw, "img_size": side} if "img_size" in kw else kw for kw in TIMM_TRIES]
    for kw in tries:
        via = kw.pop("_via", "")
        if "_cfg" in kw:
            from timm.models import mvitv2

            mvitv2.model_cfgs[kw["cfg_variant"]] = mvitv2.MultiScaleVitCfg(**kw.pop("_cfg"))
        try:
            torch.manual_seed(0)
            if via:
                module, fn = via.split(".")
                create = getattr(importlib.import_module(f"timm.models.{module}"), fn)
                model = create(arch, pretrained=False, num_classes=5, **kw)
            else:
                model = timm.create_model(arch, pretrained=False, num_classes=5, **kw)
            if sum(p.numel() for p in model.parameters()) > TIMM_MAX_PARAMS:
                raise ValueError("too large at these arguments")
            with torch.no_grad():
                model.eval()(torch.zeros(1, 3, *_timm_size(model)))
            return perturb(model), {**kw, "num_classes": 5}
        except Exception as e:  # noqa: BLE001 - the next set of arguments
            errors.append(f"{kw}: {type(e).__name__}: {str(e)[:120]}")
    raise RuntimeError("no tiny arguments build it: " + " | ".join(errors[-3:]))


def _timm_size(model: Any) -> tuple[int, int]:
    size = getattr(model, "pretrained_cfg", {}).get("input_size", (3, 64, 64))[1:]
    for m in model.modules():
        img = getattr(m, "img_size", None)
        if isinstance(img, (tuple, list)) and len(img) == 2:
            return tuple(img)
        if isinstance(img, int):
            return (img, img)
    return tuple(size)


# ------------------------------------------------------------------------------------------------ the reference
class Recorder:
    """Every attention probability map the original computes in a forward: the output of each softmax over the
    last dim of a >= 3-d tensor, and the probabilities of each scaled_dot_product_attention (written out).

    `applied[i]`: the weights the original multiplies the values with after map i, read from its own code path --
    the left operand of the first matrix product after that softmax whose left operand has the map's shape (None
    when there is none). It differs from the map where the module changes the softmax's output before applying it
    (CaiT's talking heads: proj_w mixes the heads' probabilities); an SDPA map is applied as it is."""

    def __init__(self) -> None:
        self.maps: list[Any] = []
        self.applied: list[Any] = []

    def __enter__(self) -> "Recorder":
        import torch
        import torch.nn.functional as F
        from torch.overrides import TorchFunctionMode

        rec = self
        softmaxes = {torch.softmax, torch.Tensor.softmax, F.softmax, torch.nn.functional.softmax}
        sdpa = {F.scaled_dot_product_attention}
        products = {torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.bmm}
        waiting: list[tuple[int, tuple[int, ...]]] = []      # the last softmax map still awaiting its product

        class Mode(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
                kwargs = kwargs or {}
                out = func(*args, **kwargs)
                if func in softmaxes and isinstance(out, torch.Tensor) and out.ndim >= 3:
                    dim = kwargs.get("dim", args[1] if len(args) > 1 else -1)
                    if dim in (-1, out.ndim - 1):
                        rec.maps.append(out.detach().float().clone())
                        rec.applied.append(None)
                        waiting[:] = [(len(rec.maps) - 1, tuple(out.shape))]
                elif func in sdpa:
                    rec.maps.append(_sdpa_probs(*args, **kwargs))
                    rec.applied.append(rec.maps[-1])
                    waiting.clear()
                elif func in products and waiting and args and isinstance(args[0], torch.Tensor) \
                        and tuple(args[0].shape) == waiting[0][1]:
                    rec.applied[waiting[0][0]] = args[0].detach().float().clone()
                    waiting.clear()
                return out

        self._mode = Mode()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._mode.__exit__(*exc)


def _sdpa_probs(q: Any, k: Any, v: Any = None, attn_mask: Any = None, dropout_p: float = 0.0,
                is_causal: bool = False, scale: float | None = None, enable_gqa: bool = False) -> Any:
    import torch

    q, k = q.detach().float(), k.detach().float()
    if enable_gqa and k.shape[-3] != q.shape[-3]:
        k = k.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3)
    s = (q @ k.transpose(-2, -1)) * (scale if scale is not None else q.shape[-1] ** -0.5)
    if is_causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
    if attn_mask is not None:
        s = s.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool else s + attn_mask.float()
    return s.softmax(-1)


def image_forwards(model: Any) -> list[tuple[str, Callable[[Any], Any]]]:
    """The ways the original's image side may run on a (1, C, H, W) tensor, tried in this order: its
    `get_image_features`, the model on pixel_values alone, a vision submodule's forward, the model on the tensor."""
    ways: list[tuple[str, Callable[[Any], Any]]] = []
    if hasattr(model, "get_image_features") and _required(model.get_image_features) <= {"pixel_values"}:
        ways.append(("get_image_features", lambda x: model.get_image_features(pixel_values=x)))
    if "pixel_values" in _params(model.forward) and _required(model.forward) <= {"pixel_values"}:
        ways.append(("forward", lambda x: model(pixel_values=x)))
    for name in ("vision_tower", "vision_model", "visual", "vision_encoder", "image_encoder", "vision", "backbone",
                 "encoder"):
        inner = getattr(model, "model", None)
        vlm = getattr(inner, "vlm", None)       # PI0 / PI0.5: a PaliGemma inside the action model
        for owner in (model, inner, getattr(model, "base_model", None), vlm, getattr(vlm, "model", None)):
            sub = getattr(owner, name, None) if owner is not None else None
            if isinstance(sub, __import__("torch").nn.Module) and _required(sub.forward) <= {"pixel_values"}:
                key = "pixel_values" if "pixel_values" in _params(sub.forward) else None
                ways.append((name, lambda x, sub=sub, key=key: sub(**{key: x}) if key else sub(x)))
    image_encoder = getattr(getattr(getattr(getattr(model, "depth_pro", None), "encoder", None), "image_encoder",
                                    None), "model", None)
    if isinstance(image_encoder, __import__("torch").nn.Module):   # Depth Pro: the tower vitviz shows
        ways.append(("depth_pro.encoder.image_encoder", lambda x: image_encoder(pixel_values=x)))
    if not _required(model.forward) - {"x", "input", "inputs", "images", "pixel_values"}:
        ways.append(("positional", lambda x: model(x)))
    naflex = next((fn for fn in (getattr(model, "get_image_features", None), model.forward)
                   if fn is not None and "spatial_shapes" in _params(fn)), None)
    if naflex is not None:
        ways.append(("processor patches (NaFlex)", lambda x: naflex(**_naflex_inputs(model, x))))
    return ways


def _naflex_inputs(model: Any, x: Any) -> dict[str, Any]:
    """A SigLIP 2 (NaFlex) model's inputs for one image as its processor makes them: the image cut into patches by
    transformers' own `convert_image_to_patches` (no padding: every patch attended), their grid, an all-ones mask."""
    import torch
    from transformers.models.siglip2.image_processing_siglip2 import convert_image_to_patches

    cfg = getattr(model.config, "vision_config", None) or model.config
    p = cfg.patch_size
    patches = convert_image_to_patches(x[0], p)[None]
    return {"pixel_values": patches, "pixel_attention_mask": torch.ones(1, patches.shape[1], dtype=torch.int32),
            "spatial_shapes": torch.tensor([[x.shape[-2] // p, x.shape[-1] // p]])}


def _params(fn: Any) -> set[str]:
    try:
        return set(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return set()


def _required(fn: Any) -> set[str]:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return set()
    return {n for n, p in sig.parameters.items() if p.default is inspect.Parameter.empty
            and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}


def packed_tower_of(model: Any) -> Any:
    """The model's vision tower whose forward takes packed patches and `grid_thw`, or None: the Qwen-VL family's (a
    forward of `hidden_states` and `grid_thw`, a config stating patch, temporal patch and merge sizes) and its
    relatives that name the packed patches `pixel_values` (merge blocks, Ovis 2.5; raster order, PaddleOCR-VL,
    HunYuan-VL, Kimi-K2.5, Muse Spark), whose config states a patch size and a merge size (`spatial_merge_size`,
    Kimi-K2.5's square `merge_kernel_size`, Muse Spark's `merge_size`: `packing.merge_size`); a `hidden_states` tower's time steps per patch as its config or its patch embedding
    says (ERNIE 4.5-VL's: `packing.temporal_size`)."""
    import torch

    from vitviz.core.running.live.packing import merge_size, temporal_size

    for m in model.modules():
        cfg = getattr(m, "config", None)
        params = _params(m.forward) if isinstance(m, torch.nn.Module) else set()
        if "grid_thw" not in params or not isinstance(getattr(cfg, "patch_size", None), int):
            continue
        merge = merge_size(cfg) is not None
        if merge and ("hidden_states" in params and temporal_size(m) is not None or "pixel_values" in params):
            return m
    return None


def packed_reference(tower: Any, x: Any) -> list[Any]:
    """The attention maps a packed-patch tower computes on `x` (1, C, H, W), each (1, H, T, T) on the image's grid
    (row by row), as (map, None) pairs.

    The tower is called with the image packed exactly as vitviz's `PackedTower.pack` packs it (`hidden_states` or
    `pixel_values`, as its forward names them; merge blocks or raster order; `grid_thw` [[1, rows, cols]]). Its
    attention is recorded independently of vitviz: every softmax of its eager attention (`Recorder`), grouped per
    block by hooks on its blocks, a block's softmaxes (one per window or packed image) laid on the diagonal in
    sequence order. Each token is put on the grid by where the packing put its pixels (an image of patch coordinates
    packed the same way) and, for a tower that moves its tokens before its blocks
    (Qwen2.5-VL's windows), by which embedded patch each row of its first block's input is (an exact match)."""
    import torch

    from vitviz.core.running.live.packing import PackedTower

    packer = PackedTower(tower, tuple(x.shape[-2:]), "", (0.0,) * 3, (1.0,) * 3, "")
    patches, grid = packer.pack(x[0])
    rows, cols = int(grid[0, 1]), int(grid[0, 2])
    n = rows * cols
    coords = torch.zeros_like(x[0])
    coords[0] = torch.arange(x.shape[-2]).div(packer.patch_size, rounding_mode="floor")[:, None].float()
    coords[1] = torch.arange(x.shape[-1]).div(packer.patch_size, rounding_mode="floor")[None, :].float()
    where = packer.pack(coords)[0].reshape(n, -1)                    # (a raster tower's patches: (1, T, ...) too)
    marked = torch.zeros_like(x[0])
    marked[1] = 1.0                                                  # where a patch's first value of channel 1 is
    second = int(packer.pack(marked)[0].reshape(n, -1)[0].nonzero()[0])
    cell = (where[:, 0] * cols + where[:, second]).long()           # packed position -> raster cell
    argument = "hidden_states" if "hidden_states" in _params(tower.forward) else "pixel_values"
    blocks = getattr(tower, "blocks", None)
    if not isinstance(blocks, torch.nn.ModuleList):
        blocks = next((m for m in tower.modules() if isinstance(m, torch.nn.ModuleList) and len(m)), None)
    if blocks is None:
        raise RuntimeError(f"{type(tower).__name__}: no list of blocks to group its softmaxes by")
    seen: dict[str, Any] = {}
    spans: list[list[int]] = []
    with Recorder() as rec:      # (each hook returns None: it changes nothing of the forward)
        hooks = [b.register_forward_pre_hook(lambda _m, _a: spans.append([len(rec.maps)])) for b in blocks]
        hooks += [b.register_forward_hook(lambda _m, _a, _o: spans[-1].append(len(rec.maps))) for b in blocks]
        hooks.append(blocks[0].register_forward_pre_hook(
            lambda _m, a, kw: seen.update(block=a[0] if a else kw.get("hidden_states")), with_kwargs=True))
        embed = getattr(tower, "patch_embed", getattr(tower, "embeddings", None))
        if isinstance(embed, torch.nn.Module):
            hooks.append(embed.register_forward_hook(lambda _m, _a, o: seen.update(embed=o)))
        try:
            with torch.no_grad():
                tower(**{argument: patches}, grid_thw=grid)
        finally:
            for h in hooks:
                h.remove()
    moved = torch.arange(n)                                          # block position -> packed position
    block_in, embedded = seen.get("block"), seen.get("embed")
    if isinstance(block_in, torch.Tensor) and isinstance(embedded, torch.Tensor):
        a, b = block_in.reshape(n, -1).float(), embedded.reshape(n, -1).float()
        if a.shape == b.shape:
            d = torch.cdist(a, b, compute_mode="donot_use_mm_for_euclid_dist")
            best = d.argmin(dim=1)
            if torch.equal(best.sort().values, torch.arange(n)) and float(d.min(dim=1).values.max()) < 1e-6:
                moved = best
    order = torch.empty(n, dtype=torch.long)
    order[cell[moved]] = torch.arange(n)                             # raster cell -> position in the blocks
    out = []
    for start, end in spans:
        parts = [m[0] for m in rec.maps[start:end]]
        if not parts:
            continue
        total = sum(p.shape[-1] for p in parts)
        if total != n:
            raise RuntimeError(f"{type(tower).__name__}: a block's softmaxes cover {total} of {n} tokens")
        full = torch.zeros(parts[0].shape[0], n, n)
        at = 0
        for p in parts:
            full[:, at:at + p.shape[-1], at:at + p.shape[-1]] = p
            at += p.shape[-1]
        out.append((full[:, order][:, :, order][None], None))
    return out


def resized_original(model: Any, size: tuple[int, int]) -> Any:
    """A copy of a timm model set to take `size` by its own `set_input_size`, each stage's windows kept as they are
    (the file's relative position tables are of those windows); None for a model without it."""
    if not type(model).__module__.startswith("timm.") or not callable(getattr(model, "set_input_size", None)):
        return None
    resized = copy.deepcopy(model)
    kw: dict[str, Any] = {"img_size": tuple(int(v) for v in size)}
    stages = getattr(resized, "layers", None)
    windows = [getattr(getattr(st, "blocks", [None])[0], "window_size", None) for st in stages or ()]
    if windows and all(isinstance(w, (tuple, list)) for w in windows):
        kw["window_size"] = [tuple(w) for w in windows]
    resized.set_input_size(**kw)
    return resized


def reference_maps(model: Any, x: Any, notes: list[str] | None = None) -> list[Any]:
    """The attention maps the original computes on `x` (a (1, C, H, W) tensor), in order, from the first of
    `image_forwards` that runs: (softmax map, the weights applied to the values after it or None) pairs. A model
    with a packed-patch tower (`packed_tower_of`) is run as `packed_reference` runs it. A timm model that refuses
    the size of `x` (built tiny, where vitviz chose another size for a file that states none) is run at that size
    by its own `set_input_size` (`resized_original`), said in `notes`."""
    import torch

    errors = []
    if notes is not None:
        try:
            return reference_maps(model, x)
        except RuntimeError as e:
            resized = resized_original(model, tuple(x.shape[-2:]))
            if resized is None:
                raise
            notes.append(f"the original set to {x.shape[-2]}x{x.shape[-1]} px by timm's set_input_size (windows "
                         f"kept): it refused that size as built ({str(e)[:120]})")
            return reference_maps(resized, x)
    tower = packed_tower_of(model)
    if tower is not None:
        try:
            return packed_reference(tower, x)
        except Exception as e:  # noqa: BLE001 - said with the other ways' errors
            errors.append(f"packed tower {type(tower).__name__}: {type(e).__name__}: {str(e)[:200]}")
    for name, run in image_forwards(model):
        try:
            with torch.no_grad(), Recorder() as rec:
                run(x)
            return list(zip(rec.maps, rec.applied))
        except Exception as e:  # noqa: BLE001 - the next way
            errors.append(f"{name}: {type(e).__name__}: {str(e)[:150]}")
    raise RuntimeError("; ".join(errors) or f"no forward of {type(model).__name__} takes pixel_values alone")


# ------------------------------------------------------------------------------------------------ the verdict
def vitviz_maps(result: Any) -> list[Any]:
    """vitviz's per-layer attention: (H, T, T) of a ViT, (windows, H, n, n) of a windowed model's block."""
    blocks = getattr(result, "blocks", None)
    if blocks is not None:
        return [b for b in blocks]
    return [a for a in result.attentions]


def _joined(m: Any) -> int:
    """How many all-zero rows a map of vitviz's (H, T, T) has: a model whose tokens join late (CaiT's CLS at its
    class-attention layers) is shown on one T x T grid, a self-attention layer in the lower right (the joining
    tokens' rows zero) and a class-attention layer's rows on top (the other rows zero). A softmax row is never zero."""
    import numpy as np

    if m.ndim != 3 or m.shape[-1] != m.shape[-2]:
        return 0
    return int((np.abs(m).max(axis=(0, 2)) == 0).sum())


def _on_grid(m: Any, r: Any) -> Any:
    """The original's map `r` (1, H, q, k) laid on the T x T grid of vitviz's joined map `m` (H, T, T) the way
    the original concatenates its tokens ([joining tokens, the rest], CaiT's [CLS, patches]): a self-attention map
    (q == k < T) in the lower right, a class-attention map (q < k == T) as the top q rows; None if it fits neither."""
    import numpy as np

    if r.ndim != 4 or r.shape[0] != 1 or r.shape[1] != m.shape[0] or not _joined(m):
        return None
    t, (q, k) = m.shape[-1], r.shape[-2:]
    full = np.zeros(m.shape, np.float32)
    if q == k < t:
        full[:, t - k:, t - k:] = r[0]
    elif q < k == t:
        full[:, :q, :] = r[0]
    else:
        return None
    return full


def compare(mine: list[Any], ref: list[Any]) -> dict[str, Any]:
    """Each of vitviz's maps matched, in order, to the original's first later map of as many values within `ATOL`.

    `ref`: the original's maps, each a tensor or a (softmax map, applied weights or None) pair (`Recorder`): a
    shown map matches either (vitviz shows the weights applied to the values where the module changes its softmax's
    output before them, and says so). A map of vitviz's with all-zero rows (tokens that join late, `_joined`) is
    compared with the original's maps laid on its grid (`_on_grid`), its zero rows included.

    Returns {'matched', 'shown', 'left_out' (the original's maps of a shown shape not matched), 'worst' (the largest
    difference to a same-sized map where a layer matched none; None when no map had its size)}."""
    import numpy as np

    pairs = [r if isinstance(r, tuple) else (r, None) for r in ref]
    refs = [[c.numpy() for c in pair if c is not None] for pair in pairs]

    def laid(m: Any, c: Any) -> Any:
        if c.size == m.size:
            return c.reshape(m.shape)
        return _on_grid(m, c) if m.ndim == 3 else None

    pos, matched, worst, used = 0, 0, 0.0, set()
    no_size = False
    mine = [np.asarray(m, dtype=np.float32) for m in mine]
    for m in mine:
        best, hit = math.inf, None
        for j in range(pos, len(refs)):
            for c in refs[j]:
                c = laid(m, c)
                if c is None:
                    continue
                d = float(np.abs(c - m).max())
                best = min(best, d)
                if d < ATOL:
                    hit = j
                    break
            if hit is not None:
                break
        if hit is None:
            no_size |= best == math.inf
            worst = max(worst, best)
            continue
        matched, pos = matched + 1, hit + 1
        used.add(hit)
    left_out = sum(1 for j, r in enumerate(refs) if j not in used and any(laid(m, r[0]) is not None for m in mine))
    return {"matched": matched, "shown": len(mine), "left_out": left_out, "ref_maps": len(refs),
            "worst": None if no_size and worst == math.inf else worst}


def classify(cmp: dict[str, Any] | None, said: list[str]) -> str:
    """exact / flagged / wrong / unchecked from a `compare` result and what vitviz said (assumptions, warnings)."""
    if cmp is None or cmp["ref_maps"] == 0:
        return "unchecked"
    if cmp["shown"] and cmp["matched"] == cmp["shown"] and cmp["left_out"] == 0:
        return "exact"
    return "flagged" if said else "wrong"


ROUTE_WORDS = re.compile(r"vitviz\.load\(|--code|code=|live=True|live path|\blive\b|--[a-z][a-z-]+|\b[a-z_]+=\S")


def classify_refusal(err: BaseException, names: list[str]) -> str:
    """refused-clear when the error is a VitvizError naming one of `names` (or `names` is empty: nothing can name
    a bare state dict) and a route; refused-unclear when it is a VitvizError that does not; crash otherwise."""
    from vitviz.errors import VitvizError

    if not isinstance(err, VitvizError):
        return "crash"
    text = str(err)
    low = text.lower()
    named = not names or any(n and n.lower() in low for n in names)
    return "refused-clear" if named and ROUTE_WORDS.search(text) else "refused-unclear"


def _image() -> Any:
    import numpy as np

    rng = np.random.default_rng(3)
    return rng.integers(0, 256, (72, 88, 3), dtype=np.uint8)


# Assumptions that cannot explain a difference here: the original is run on the very input vitviz made.
INPUT_FIELDS = {"preprocess", "mean", "std", "interpolation", "resize", "crop_mode", "crop_pct", "image_size",
                "labels", "in_chans"}
_INPUT_ONLY = re.compile(r": (" + "|".join(sorted(INPUT_FIELDS)) + r")( = .*)? is (a guess|assumed)")


def run_route(open_it: Callable[[], Any], original: Any, names: list[str]) -> dict[str, Any]:
    """One route: open with vitviz, run on the image, compare with the original on vitviz's input; the verdict."""
    import torch

    from vitviz.core.spec import GuessWarning

    t0 = time.time()
    said: list[str] = []
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            vm = open_it()
            result = vm.run(_image())
        said += [f"{w.category.__name__}: {w.message}" for w in caught if issubclass(w.category, GuessWarning)]
    except BaseException as e:  # noqa: BLE001 - the verdict says what it was
        if isinstance(e, KeyboardInterrupt):
            raise
        verdict = classify_refusal(e, names)
        out = {"verdict": verdict, "error": f"{type(e).__name__}: {e}"[:1500], "seconds": round(time.time() - t0, 1)}
        if verdict == "crash":
            out["traceback"] = traceback.format_exc()[-2500:]
        return out
    spec = result.spec
    said = [w for w in said if not _INPUT_ONLY.search(w)]
    said += [f"assumed {k}: {v}" for k, v in getattr(spec, "assumptions", ()) if k not in INPUT_FIELDS]
    skipped = getattr(vm, "skipped", None)
    if skipped:
        said.append(f"skipped: {skipped}")
    out: dict[str, Any] = {"family": getattr(spec, "family", "?"), "said": said[:8],
                           "path": str(spec.source_of("path"))[:300] if hasattr(spec, "source_of") else ""}
    x = torch.from_numpy(result.input).unsqueeze(0)
    notes: list[str] = []
    try:
        ref = reference_maps(original, x, notes)
    except Exception as e:  # noqa: BLE001 - the original cannot say: unchecked
        out.update(verdict="unchecked", error=f"original: {type(e).__name__}: {e}"[:500])
    else:
        cmp = compare(vitviz_maps(result), ref)
        out.update(cmp, verdict=classify(cmp, said))
        if notes:
            out["reference"] = "; ".join(notes)
    out["seconds"] = round(time.time() - t0, 1)
    return out


# ------------------------------------------------------------------------------------------------ one case
def run_hf(model_type: str, class_name: str, work: Path) -> dict[str, Any]:
    import torch

    import vitviz

    if model_type in HF_OUT_OF_SCOPE:
        return {"status": "out of scope", "error": HF_OUT_OF_SCOPE[model_type]}
    try:
        model = build_hf(model_type, class_name)
    except Exception as e:  # noqa: BLE001
        return {"status": "build-failed", "error": f"{type(e).__name__}: {e}"[:600]}
    if not any(re.search("attention|attn", type(m).__name__, re.I) or isinstance(m, torch.nn.MultiheadAttention)
               for m in model.modules()):
        return {"status": "not a ViT", "error": "no attention module in the model"}
    params = sum(p.numel() for p in model.parameters())
    if params > HF_MAX_PARAMS:
        return {"status": "build-failed", "error": f"not tiny: {params:,} parameters after shrinking its config"}
    pristine = copy.deepcopy(model)
    _eager(pristine)
    REF_PREP.get(model_type, lambda m: None)(pristine)
    # is there attention over the image? (a CNN, an audio model: not part of the zoo)
    size = _hf_size(model)
    tower = packed_tower_of(model)
    if tower is not None:     # (a packed-patch tower takes whole merge blocks only)
        from vitviz.core.running.live.packing import merge_size

        block = tower.config.patch_size * int(merge_size(tower.config))
        size = (2 * block, 3 * block)
    try:
        probe = reference_maps(pristine, torch.randn(1, 3, *size, generator=torch.Generator().manual_seed(1)))
    except Exception as e:  # noqa: BLE001
        probe, why = None, f"{type(e).__name__}: {e}"[:300]
    if probe is not None and not probe:
        return {"status": "not a ViT", "error": "the original computes no attention over an image"}
    folder = work / "snapshot"     # (not named after the model: a refusal must name it in its own words)
    model.save_pretrained(folder, safe_serialization=True)
    cfg = json.loads((folder / "config.json").read_text())
    names = [model_type, *cfg.get("architectures", [])]
    routes = {"file": run_route(lambda: vitviz.load(str(folder), device="cpu"), pristine, names),
              "live": run_route(lambda: vitviz.load(model, device="cpu"), pristine, [type(model).__name__,
                                                                                     model_type])}
    out = {"status": "run", "class": class_name, "routes": routes}
    if probe is None:
        out["note"] = f"probe forward at {size} failed: {why}"
    return out


def _hf_size(model: Any) -> tuple[int, int]:
    cfg = model.config
    for c in (getattr(cfg, "vision_config", None), getattr(cfg, "backbone_config", None), cfg):
        s = getattr(c, "image_size", None) if c is not None else None
        if isinstance(s, int):
            return (s, s)
        if isinstance(s, (list, tuple)) and len(s) == 2:
            return tuple(s)
        if isinstance(s, dict) and "height" in s:
            return (s["height"], s["width"])
    return (64, 64)


def _eager(model: Any) -> None:
    """The original's attention written out (eager), so that the recorder sees every softmax."""
    with contextlib.suppress(Exception):
        model.set_attn_implementation("eager")
    for m in model.modules():
        if hasattr(m, "fused_attn"):
            m.fused_attn = False


def run_timm(arch: str, work: Path) -> dict[str, Any]:
    import timm.models._hub as hub
    import torch

    import vitviz

    try:
        model, kw = build_timm(arch)
    except Exception as e:  # noqa: BLE001
        return {"status": "build-failed", "error": f"{type(e).__name__}: {e}"[:600]}
    pristine = copy.deepcopy(model)
    _eager(pristine)
    folder = work / "hub"
    folder.mkdir(parents=True)
    args = {k: v for k, v in kw.items() if k != "num_classes"}
    try:
        hub.save_for_hf(model, str(folder), model_args=args, safe_serialization=True)
    except RuntimeError as e:     # tensors shared between modules (CoaT's cpe): safetensors refuses them
        if "share memory" not in str(e):
            raise
        hub.save_for_hf(model, str(folder), model_args=args, safe_serialization=False)
    bare = work / f"{arch}.pth"
    torch.save(model.state_dict(), bare)
    routes = {"hub": run_route(lambda: vitviz.load(str(folder), device="cpu"), pristine, [arch]),
              "sd": run_route(lambda: vitviz.load(str(bare), device="cpu"), pristine, []),
              "live": run_route(lambda: vitviz.load(model, device="cpu"), pristine, [type(model).__name__, arch])}
    return {"status": "run", "kwargs": {k: list(v) if isinstance(v, tuple) else v for k, v in kw.items()},
            "routes": routes}


def _child(key: str, spec: tuple[str, str], out_file: str, mem_gib: float, timeout: float) -> None:
    """A forked case: capped, one thread, its result written to `out_file`."""
    limit = int(mem_gib * 2 ** 30)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    import torch

    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    stack = open(out_file + ".stack", "w")   # where a hang's stack is written, shortly before the parent kills it
    faulthandler.dump_traceback_later(max(timeout - 5, 1), file=stack)
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="zoo-") as tmp:
        try:
            if spec[0] == "hf":
                res = run_hf(key.split(":", 1)[1], spec[1], Path(tmp))
            else:
                res = run_timm(key.split(":", 1)[1], Path(tmp))
        except BaseException as e:  # noqa: BLE001 - the harness's own failure, said as such
            res = {"status": "harness-error", "error": f"{type(e).__name__}: {e}"[:600],
                   "traceback": traceback.format_exc()[-2000:]}
    res["seconds"] = round(time.time() - t0, 1)
    Path(out_file).write_text(json.dumps(res, default=str))


# ------------------------------------------------------------------------------------------------ the parent
def merge(results: Path, key: str, value: dict[str, Any]) -> None:
    """Merge one case into results.json under an exclusive lock (parallel sweeps share the file)."""
    results.parent.mkdir(parents=True, exist_ok=True)
    with open(results.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        data = json.loads(results.read_text()) if results.exists() else {}
        data.setdefault("cases", {})[key] = value
        tmp = results.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True, default=str))
        tmp.replace(results)


def _dead(key: str, proc: mp.Process, seconds: float, timeout: float) -> dict[str, Any]:
    """A case whose process ended without a result: every route it was running is a hang or a crash."""
    routes = ("file", "live") if key.startswith("hf:") else ("hub", "sd", "live")
    if proc.exitcode is None or seconds >= timeout:
        what = {"verdict": "hang", "error": f"no result after {timeout:.0f} s (killed)"}
    else:
        what = {"verdict": "crash", "error": f"the process died (exit code {proc.exitcode}: "
                                             f"{'a signal' if (proc.exitcode or 0) < 0 else 'memory cap or exit'})"}
    return {"status": "run", "routes": {r: dict(what) for r in routes}, "seconds": round(seconds, 1)}


def sweep(cases: dict[str, tuple[str, str]], results: Path, workers: int, timeout: float, mem_gib: float) -> None:
    ctx = mp.get_context("fork")
    pending = list(cases.items())
    running: dict[str, tuple[mp.Process, float, str]] = {}
    tmpdir = Path(tempfile.mkdtemp(prefix="zoo-results-"))
    done = 0
    while pending or running:
        while pending and len(running) < workers:
            key, spec = pending.pop(0)
            out_file = str(tmpdir / (re.sub(r"[^\w.-]", "_", key) + ".json"))
            proc = ctx.Process(target=_child, args=(key, spec, out_file, mem_gib, timeout), daemon=True)
            proc.start()
            running[key] = (proc, time.time(), out_file)
        time.sleep(0.2)
        for key, (proc, start, out_file) in list(running.items()):
            elapsed = time.time() - start
            if proc.is_alive() and elapsed < timeout:
                continue
            if proc.is_alive():
                proc.kill()
                proc.join()
            else:
                proc.join()
            del running[key]
            path = Path(out_file)
            res = json.loads(path.read_text()) if path.exists() else _dead(key, proc, elapsed, timeout)
            stack = Path(out_file + ".stack")
            if not path.exists() and stack.exists() and stack.stat().st_size:
                where = stack.read_text()
                if "run_route" not in where:     # still building or saving the original: the harness's, not vitviz's
                    res = {"status": "build-failed", "error": f"not built and saved within {timeout:.0f} s: "
                                                              + where[-600:]}
                for route in res.get("routes", {}).values():
                    route["traceback"] = where[-3000:]
            merge(results, key, res)
            done += 1
            verdicts = " ".join(f"{r}={v['verdict']}" for r, v in res.get("routes", {}).items())
            print(f"[{done}/{len(cases)}] {key}: {res['status']} {verdicts} ({elapsed:.0f} s)", flush=True)


def report(results: Path, md: Path, elapsed: float | None) -> str:
    """The Markdown report: counts per route, then every case's verdicts and what was said."""
    data = json.loads(results.read_text())
    cases = data.get("cases", {})
    if elapsed is not None:
        data["sweep_seconds"] = round(elapsed)
        results.write_text(json.dumps(data, indent=1, sort_keys=True, default=str))
    lines = ["# The zoo sweep", "", "Generated by `PYTHONPATH=$PWD python scripts/trial_zoo.py` "
             f"({'%.0f s' % data['sweep_seconds'] if 'sweep_seconds' in data else 'time not measured'} for the "
             "last whole sweep, cases run again since with `--only` / `--resume` merged in; verdicts are defined in "
             "the script's docstring).", ""]
    lines += counts_table(cases)
    for lib, prefix in (("transformers", "hf:"), ("timm", "timm:")):
        keys = sorted(k for k in cases if k.startswith(prefix))
        apart = [(k, cases[k]) for k in keys if cases[k].get("status") != "run"]
        lines += ["", f"## {lib}: every case", "", "| case | " + " | ".join(_routes(prefix)) + " | notes |",
                  "|---|" + "---|" * (len(_routes(prefix)) + 1)]
        for k in keys:
            c = cases[k]
            if c.get("status") != "run":
                continue
            cells = []
            notes = []
            for r in _routes(prefix):
                v = c["routes"].get(r, {})
                cells.append(v.get("verdict", "-"))
                if v.get("verdict") not in (None, "exact") or v.get("reference"):
                    notes.append(f"{r}: {_short(v)}")
            lines.append(f"| {k.split(':', 1)[1]} | " + " | ".join(cells) + " | " + "<br>".join(notes) + " |")
        if apart:
            lines += ["", f"Not in the {lib} counts:", ""]
            lines += [f"- {k.split(':', 1)[1]}: {c.get('status')} — {_clip(c.get('error', ''), 200)}"
                      for k, c in apart]
    text = "\n".join(lines) + "\n"
    md.write_text(text)
    return text


def _routes(prefix: str) -> tuple[str, ...]:
    return ("file", "live") if prefix == "hf:" else ("hub", "sd", "live")


def _clip(text: str, n: int) -> str:
    text = " ".join(str(text).split()).replace("|", "/")
    return text if len(text) <= n else text[:n - 1] + "…"


def _short(v: dict[str, Any]) -> str:
    if "error" in v:
        return _clip(v["error"], 220)
    bits = [f"{v.get('matched')}/{v.get('shown')} layers match"]
    if v.get("left_out"):
        bits.append(f"{v['left_out']} of the original's maps not shown")
    if v.get("worst") is not None:
        bits.append(f"max diff {v['worst']:.2g}")
    if v.get("reference"):
        bits.append("reference: " + _clip(v["reference"], 110))
    if v.get("said"):
        bits.append("said: " + _clip("; ".join(v["said"]), 150))
    return _clip(", ".join(bits), 300)


def counts_table(cases: dict[str, Any]) -> list[str]:
    """| route | cases | exact | flagged | ... | for transformers' and timm's routes."""
    head = "| route | " + " | ".join(VERDICTS) + " |"
    rows = [head, "|---|" + "---|" * len(VERDICTS)]
    for lib, prefix, routes in (("transformers", "hf:", (("file", "by file (save_pretrained folder)"),
                                                         ("live", "live (vitviz.load(model))"))),
                                ("timm", "timm:", (("hub", "by file (timm hub folder)"),
                                                   ("sd", "by file (bare state dict)"),
                                                   ("live", "live (vitviz.load(model))")))):
        run = [c for k, c in cases.items() if k.startswith(prefix) and c.get("status") == "run"]
        for r, label in routes:
            n = {v: sum(1 for c in run if c["routes"].get(r, {}).get("verdict") == v) for v in VERDICTS}
            rows.append(f"| {lib} {label}, {len(run)} | " + " | ".join(str(n[v]) for v in VERDICTS) + " |")
    return rows


def main(argv: list[str] | None = None) -> int:
    quiet_offline()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="", help="comma-separated model types / timm architectures")
    group = ap.add_mutually_exclusive_group()
    group.add_argument("--hf-only", action="store_true")
    group.add_argument("--timm-only", action="store_true")
    ap.add_argument("--resume", action="store_true", help="keep the cases already in results.json")
    ap.add_argument("--redo", default="", help="with --resume: run again the cases with a route of these "
                    "comma-separated verdicts (or this status: build-failed, harness-error), e.g. wrong,crash,hang")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per case")
    ap.add_argument("--mem-gib", type=float, default=6.0, help="address-space cap per case")
    ap.add_argument("--out", type=Path, default=OUT, help="folder of results.json and REPORT.md")
    args = ap.parse_args(argv)

    import timm  # noqa: F401 - imported once in the parent: every forked case shares it
    import torch  # noqa: F401
    import transformers  # noqa: F401

    import vitviz  # noqa: F401
    import vitviz.core.running.load  # noqa: F401

    only = {s.strip() for s in args.only.split(",") if s.strip()}
    cases: dict[str, tuple[str, str]] = {}
    if not args.timm_only:
        cases.update({f"hf:{t}": ("hf", c) for t, c in hf_candidates().items() if not only or t in only})
    if not args.hf_only:
        arches = timm_sample() + [a for a in only if a not in timm_sample() and _is_timm(a)]
        cases.update({f"timm:{a}": ("timm", "") for a in arches if not only or a in only})
    results = args.out / "results.json"
    if not args.resume and results.exists() and not only and not (args.hf_only or args.timm_only):
        results.unlink()
    if args.resume and results.exists():
        have = json.loads(results.read_text()).get("cases", {})
        redo = {s.strip() for s in args.redo.split(",") if s.strip()}
        again = {k for k, c in have.items() if c.get("status") in redo
                 or any(v.get("verdict") in redo for v in c.get("routes", {}).values())}
        cases = {k: v for k, v in cases.items() if k not in have or k in again}
    t0 = time.time()
    print(f"{len(cases)} cases, {args.workers} workers", flush=True)
    sweep(cases, results, args.workers, args.timeout, args.mem_gib)
    whole = not only and not args.resume and not (args.hf_only or args.timm_only)
    if results.exists():
        text = report(results, args.out / "REPORT.md", time.time() - t0 if whole else None)
        print("\n".join(counts_table(json.loads(results.read_text())["cases"])))
        del text
    print(f"{time.time() - t0:.0f} s", flush=True)
    return 0


def _is_timm(name: str) -> bool:
    import timm

    return name in timm.list_models()


if __name__ == "__main__":
    sys.exit(main())
