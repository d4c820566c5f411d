"""Composite transformers models (vision-language models, depth estimators) and the Vision Transformer towers
inside them, named by a folder's `config.json` before any tensor is read.

A transformers folder says what it is: `model_type`, `architectures`, and for a composite model the config of
its image side (`vision_config`, `backbone_config`). `identify` reads that first, so that

- a composite model whose image side is a model vitviz reads exactly (LLaVA's CLIP tower, PaliGemma / Gemma 3 /
  Idefics3 / SmolVLM's SigLIP tower, GIT's and Kosmos-2's CLIP tower, Depth Anything's DINOv2 backbone, DPT's
  own ViT or DINOv2 backbone, ZoeDepth's BEiT backbone, BLIP / BLIP-2 / InstructBLIP's ViT, a sub-config's
  sub-config too: ColPali's `vlm_config.vision_config`; AltCLIP's, OWL-ViT's and Janus's CLIP / SigLIP towers, a
  VisionEncoderDecoder's ViT, Depth Pro's image encoder, the one of its three towers said in `CHOSEN`) opens as that
  tower
  (`Tower`): only the tensors under the tower's prefix are read from the (possibly sharded) weights, and the
  tower's own sub-config is the config its family reads;
- a model vitviz cannot read is refused by name (`CompositeModelError`), with what vitviz cannot do with it and
  the route that works (its own code run live: `vitviz.load(module)` or `--code`).

Nothing here imports torch: the decision is made on the parsed JSON alone.
"""
from __future__ import annotations

import importlib
from importlib import metadata
from dataclasses import dataclass, field
from typing import Any

from vitviz.errors import CompositeModelError

# Where a composite model keeps its vision tower: {model_type: (the key of the tower's sub-config, the prefixes of
# the tower's tensors in the whole model's files, newest first)}. transformers >= 5 nests the parts under `model.`
# in memory; files keep either form.
_LLAVA = ("model.vision_tower.", "vision_tower.")
# PI0 / PI0.5 (robot policies around a PaliGemma): in memory `model.vlm`, in their files PaliGemma's own names
_PI0 = ("model.vlm.vision_tower.", "paligemma_with_expert.paligemma.model.vision_tower.")
TOWERS: dict[str, tuple[str, tuple[str, ...]]] = {
    "llava": ("vision_config", _LLAVA), "llava_next": ("vision_config", _LLAVA),
    "llava_onevision": ("vision_config", _LLAVA), "vipllava": ("vision_config", _LLAVA),
    "paligemma": ("vision_config", _LLAVA), "gemma3": ("vision_config", _LLAVA),
    "idefics3": ("vision_config", ("model.vision_model.",)), "smolvlm": ("vision_config", ("model.vision_model.",)),
    "depth_anything": ("backbone_config", ("backbone.",)), "dpt": ("backbone_config", ("backbone.",)),
    "zoedepth": ("backbone_config", ("backbone.",)),
    "blip": ("vision_config", ("vision_model.",)), "blip-2": ("vision_config", ("vision_model.",)),
    "instructblip": ("vision_config", ("vision_model.",)),
    "git": ("vision_config", ("git.image_encoder.",)), "kosmos-2": ("vision_config", ("vision_model.",)),
    "internvl": ("vision_config", _LLAVA),
    # found by the zoo sweep (scripts/trial_zoo.py): LLaVA-style models of a CLIP / SigLIP / Idefics3 tower
    "aria": ("vision_config", _LLAVA), "aya_vision": ("vision_config", _LLAVA),
    "cohere2_vision": ("vision_config", _LLAVA), "llava_next_video": ("vision_config", _LLAVA),
    "shieldgemma2": ("vision_config", _LLAVA), "video_llava": ("vision_config", ("model.image_tower.", "image_tower.")),
    "granite4_vision": ("vision_config", _LLAVA),    # (a CLIP tower, its Q-Former / deepstack projectors beside it)
    # a PaliGemma / ModernVBERT inside a retriever or a robot policy (`vlm_config`), T5Gemma 2's encoder: SigLIP
    "colpali": ("vlm_config.vision_config", ("vlm.vision_tower.", "vlm.model.vision_tower.")),
    "colmodernvbert": ("vlm_config.vision_config", ("vlm.vision_model.",)),
    "pi0": ("vlm_config.vision_config", _PI0), "pi05": ("vlm_config.vision_config", _PI0),
    "t5gemma2": ("encoder.vision_config", ("model.encoder.vision_tower.",)),
    "lfm2_vl": ("vision_config", _LLAVA),     # (a SigLIP 2 NaFlex tower)
    "idefics2": ("vision_config", ("model.vision_model.",)),    # (Idefics3's tower before it: bucketed positions)
    "instructblipvideo": ("vision_config", ("vision_model.",)),   # (InstructBLIP's ViT, run on each frame)
    "got_ocr2": ("vision_config", _LLAVA), "pp_chart2table": ("vision_config", _LLAVA),     # (a SAM ViT-B encoder)
    # CLIP towers of their own names: AltCLIP's blocks `encoder.layer.N`, OWL-ViT's `pre_layernorm`
    "altclip": ("vision_config", ("vision_model.",)),
    # an image encoder under a text decoder (TrOCR, Donut's relatives): its `encoder` config, its tensors `encoder.`
    "vision-encoder-decoder": ("encoder", ("encoder.",)),
    # Depth Pro: three DINOv2 towers; its image encoder (the whole image at the tower's size) is the one shown, its
    # patch encoder (overlapping crops of a pyramid of scales) and field-of-view encoder are not
    "janus": ("vision_config", ("model.vision_model.",)),    # (a SigLIP tower; its VQ-VAE image generator beside it)
    "depth_pro": ("image_model_config", ("depth_pro.encoder.image_encoder.model.", "encoder.image_encoder.model.")),
    "owlvit": ("vision_config", ("vision_model.", "owlvit.vision_model.")),
    "owlv2": ("vision_config", ("vision_model.", "owlv2.vision_model.")),
}
# Models with more than one vision tower: which one is shown, said in the identity (`Tower.describe`).
CHOSEN = {"depth_pro": ": its image encoder (image_model_config), which sees the whole image; its patch encoder "
                       "(overlapping crops at several scales) and field-of-view encoder are not shown"}
# The towers vitviz reads exactly: {the tower config's model_type: the family it is read as}.
READABLE = {"clip_vision_model": "hf-clip", "git_vision_model": "hf-clip", "kosmos_2_vision_model": "hf-clip",
            "siglip_vision_model": "hf-siglip", "idefics3_vision": "hf-siglip", "smolvlm_vision": "hf-siglip",
            "dinov2": "hf-dinov2", "dinov2_with_registers": "hf-dinov2", "blip_vision_model": "hf-blip",
            "blip_2_vision_model": "hf-blip", "instructblip_vision_model": "hf-blip", "beit": "hf-beit",
            "internvl_vision": "hf-internvit", "siglip2_vision_model": "hf-siglip2", "idefics2_vision": "hf-siglip",
            "instructblipvideo_vision_model": "hf-blip", "got_ocr2_vision": "hf-sam",
            "pp_chart2table_vision": "hf-sam", "altclip_vision_model": "hf-clip", "owlvit_vision_model": "hf-clip",
            "owlv2_vision_model": "hf-clip", "vit": "hf-vit",
            "janus_vision_model": "hf-siglip"}
# Towers transformers' auto classes do not map: their own class, by the tower config's model_type.
_TOWER_CLASSES = {"blip_vision_model": "BlipVisionModel", "blip_2_vision_model": "Blip2VisionModel",
                  "instructblip_vision_model": "InstructBlipVisionModel", "git_vision_model": "GitVisionModel",
                  "kosmos_2_vision_model": "Kosmos2VisionModel", "idefics2_vision": "Idefics2VisionTransformer",
                  "instructblipvideo_vision_model": "InstructBlipVideoVisionModel",
                  "altclip_vision_model": "AltCLIPVisionModel", "janus_vision_model": "JanusVisionModel",
                  # (the tower the file holds under `owlvit.vision_model.`: no `vision_model.` wrapper)
                  "owlvit_vision_model": "OwlViTVisionTransformer", "owlv2_vision_model": "Owlv2VisionTransformer"}
# Vision towers vitviz runs by their own transformers code (their attention captured where it is computed, the live
# path), built from the whole model's config.json as the composite model builds them, with the file's tower tensors:
# {the tower config's model_type: (transformers module, class)}. Never `trust_remote_code`: only classes transformers
# ships.
BY_CODE = {
    "qwen2_vl_vision": ("qwen2_vl", "Qwen2VisionTransformerPretrainedModel"),
    "qwen2_5_vl_vision": ("qwen2_5_vl", "Qwen2_5_VisionTransformerPretrainedModel"),
    "qwen3_vl_vision": ("qwen3_vl", "Qwen3VLVisionModel"),
    "qwen3_vl_moe_vision": ("qwen3_vl_moe", "Qwen3VLMoeVisionModel"),
    "qwen3_5_vision": ("qwen3_5", "Qwen3_5VisionModel"), "qwen3_5_moe_vision": ("qwen3_5_moe", "Qwen3_5MoeVisionModel"),
    "glm4v_vision": ("glm4v", "Glm4vVisionModel"), "glm4v_moe_vision": ("glm4v_moe", "Glm4vMoeVisionModel"),
    "glm_ocr_vision": ("glm_ocr", "GlmOcrVisionModel"), "glm5_next_vision": ("glm5_next", "Glm5NextVisionModel"),
    "exaone4_5_vision": ("exaone4_5", "Exaone4_5_VisionModel"),
    "pixtral": ("pixtral", "PixtralVisionModel"),
    "paddleocr_vl_vision": ("paddleocr_vl", "PaddleOCRVisionModel"),
    "hunyuan_vl_vision": ("hunyuan_vl", "HunYuanVLVisionTransformer"),
    "kimi_k25_vision": ("kimi_k25", "Kimi_K25VisionModel"), "ovis2_5_vision": ("ovis2_5", "Ovis2_5VisionModel"),
    "qwen2_5_omni_vision_encoder": ("qwen2_5_omni", "Qwen2_5OmniVisionEncoder"),
    "qwen3_omni_moe_vision_encoder": ("qwen3_omni_moe", "Qwen3OmniMoeVisionEncoder"),
    "cohere_compass_vision": ("cohere_compass", "CohereCompassVisionModel"),
    # packed as the Qwen-VL family's, one time step per patch (their patch embeddings': `packing.temporal_size`)
    "cosmos3_edge_vision": ("cosmos3_edge", "Cosmos3EdgeVisionModel"),
    "dots3_note_vision_encoder": ("dots3_note", "Dots3NoteVisionModel"),
    "ernie4_5_vl_moe_vision": ("ernie4_5_vl_moe", "Ernie4_5_VLMoeVisionTransformerPretrainedModel"),
    # raster patches of two time steps, in windows (`packing.PATCH_LAYOUTS`)
    "muse_spark_vision": ("muse_spark", "MuseSparkVisionModel"),
    "muse_glimmer_vision": ("muse_glimmer", "MuseGlimmerVisionModel"),
}
# Composite models whose vision tower runs by its code: {model_type: (sub-config key, tensor prefixes)}; LLaVA-style
# models (TOWERS) with such a tower (a Pixtral vision_config) take the same route. A Pixtral folder of its own is
# the tower itself. A key with a dot is a sub-config's sub-config (an Omni model's thinker's `vision_config`).
_VISUAL = ("model.visual.", "visual.")
_THINKER = ("thinker_config.vision_config", ("thinker.model.visual.", "thinker.visual."))
BY_CODE_MODELS: dict[str, tuple[str, tuple[str, ...]]] = {
    "qwen2_vl": ("vision_config", _VISUAL), "qwen2_5_vl": ("vision_config", _VISUAL),
    "qwen3_vl": ("vision_config", _VISUAL), "qwen3_vl_moe": ("vision_config", _VISUAL),
    "qwen3_5": ("vision_config", _VISUAL), "qwen3_5_moe": ("vision_config", _VISUAL),
    "glm4v": ("vision_config", _VISUAL), "glm4v_moe": ("vision_config", _VISUAL), "glm46v": ("vision_config", _VISUAL),
    "glm_ocr": ("vision_config", _VISUAL), "glm5_next": ("vision_config", _VISUAL),
    "exaone4_5": ("vision_config", _VISUAL),
    "mistral3": ("vision_config", _LLAVA), "pixtral": ("", ("",)),
    # found by the zoo sweep: relatives of a Qwen-VL / GLM-4V / Pixtral tower
    "glmga": ("vision_config", _VISUAL),
    # towers packed in raster order or under `pixel_values` (live.packing.RASTER, PIXEL_VALUES); all but PaddleOCR-VL
    # saved in their original checkpoints' layouts (ORIGINAL_LAYOUTS): Cosmos 3 Omni's Qwen3-VL tower at the file's
    # root, Mistral Large 4's Pixtral tower under `vision_encoder.` in Mistral's names, HunYuan-VL's under `vit.` ...
    "cosmos3_omni": ("vision_config", (*_VISUAL, "")),
    "paddleocr_vl": ("vision_config", _VISUAL),
    "hunyuan_vl": ("vision_config", ("model.vision_tower.", "vision_tower.", "vit.")),
    "kimi_k25": ("vision_config", _LLAVA),
    "ovis2_5": ("vision_config", (*_LLAVA, "visual_tokenizer.vit.vision_model.")),
    "mistral_large4": ("vision_config", (*_LLAVA, "vision_encoder.")),
    "hyperclovax_vision_v2": ("vision_config", ("model.vision_model.", "vision_model.")),
    "lighton_ocr": ("vision_config", ("model.vision_encoder.", "vision_encoder.")),
    # Qwen2.5-Omni / Qwen3-Omni: a Qwen2.5-VL / Qwen3-VL tower in the thinker (the whole model: audio and speech
    # output beside it); Cohere Compass: a Qwen3-VL-style tower (deepstack mergers)
    "qwen2_5_omni": _THINKER, "qwen3_omni_moe": _THINKER,
    "qwen2_5_omni_thinker": ("vision_config", _VISUAL), "qwen3_omni_moe_thinker": ("vision_config", _VISUAL),
    "cohere_compass": ("vision_config", _VISUAL),
    # one time step per patch, merge blocks; Dots3 Note's and ERNIE 4.5-VL's files in their original layouts
    "cosmos3_edge": ("vision_config", _VISUAL),
    "dots3_note": ("vision_config", ("model.vision_tower.", "vision_tower.", "vision_encoder.")),
    "ernie4_5_vl_moe": ("vision_config", ("model.vision_tower.", "vision_tower.", "model.vision_model.")),
    "muse_spark": ("vision_config", _LLAVA), "muse_glimmer": ("vision_config", _LLAVA),
}
# Composite models whose files transformers writes in the original checkpoint's layout (its conversion mapping for
# the model_type, reversed on saving): their tower tensors are renamed and converted (Mistral's interleaved-RoPE q/k
# permuted) by transformers' own loader with that mapping, as loading the whole model does. {model_type: the names
# at the file's root that are the tower's, where it lies there (prefix ''); () where its tensors have a prefix}
ORIGINAL_LAYOUTS: dict[str, tuple[str, ...]] = {
    "cosmos3_omni": ("blocks.", "merger.", "patch_embed.", "pos_embed.", "deepstack_merger_list."),
    "mistral_large4": (),
    "hunyuan_vl": (), "kimi_k25": (), "ovis2_5": (), "cosmos3_edge": (), "dots3_note": (), "ernie4_5_vl_moe": (),
}
# Composite models whose files name the tower's tensors as transformers' conversion mapping of the model_type
# renames them on loading (AltCLIP's `encoder.layer.N` -> `encoder.layers.N`): the tower class built alone is given
# that mapping (`_renaming`), as the whole model's loader applies it.
RENAMED_TOWERS = ("altclip",)
BY_CODE_ROUTE = "by its code"   # how the provenance names the route (`vitviz.verify` reads it)
# Position tables looked up by bucketing fractional patch coordinates (Idefics3 / SmolVLM): `pos_interp='bucket'`.
BUCKETED = ("idefics3_vision", "smolvlm_vision", "idefics2_vision")

# The route for a model vitviz does not convert: its own code, run live with its attention captured.
ROUTE = ("build it with transformers in Python and pass its vision module to vitviz.load(module) (its own code runs, "
         "attention captured where it is computed), or name a factory returning that module, wrapped to take a "
         "(1, 3, H, W) image, with --code FILE.py:FACTORY")
# Models people open that vitviz does not convert, by model_type: what their image side is.
NOT_CONVERTED = {
    "qwen2_vl": "Qwen2-VL: its vision encoder merges patches and uses 2-D rotary positions over a packed sequence",
    "qwen2_5_vl": "Qwen2.5-VL: windowed attention, 2-D rotary positions and RMSNorm in its vision encoder",
    "qwen3_vl": "Qwen3-VL: a vision encoder with 2-D rotary positions over a packed sequence of merged patches",
    "mllama": "Llama 3.2 Vision: a tiled two-stage vision encoder with gated layers",
    "pixtral": "Pixtral: 2-D rotary positions and RMSNorm in its vision encoder",
    "mistral3": "Mistral 3: a Pixtral vision encoder (2-D rotary positions, RMSNorm)",
    "florence2": "Florence-2: a DaViT (windowed) vision encoder",
    "vilt": "ViLT: one transformer over image patches and text tokens together (no separate vision tower)",
    # yolos: its own family module refuses it with what it found (its detection tokens, its position tables)
    "detr": "DETR: a convolutional backbone under an encoder-decoder transformer",
    # hierarchical vision transformers: per-stage widths and head counts (a list in config.json), reduced keys
    "segformer": "SegFormer: a hierarchical Mix Transformer (per-stage heads, spatially reduced keys)",
    "glpn": "GLPN: a SegFormer (Mix Transformer) encoder", "pvt": "PVT: a pyramid of stages with spatial-reduction "
    "attention", "pvt_v2": "PVT v2: a pyramid of stages with spatial-reduction attention",
    "mobilevit": "MobileViT: transformer blocks inside a convolutional network",
    "mobilevitv2": "MobileViT v2: separable linear attention inside a convolutional network",
    "levit": "LeViT: a convolution-attention hybrid with attention biases and shrinking stages",
    "cvt": "CvT: convolutional token embeddings and projections in every stage",
    "efficientformer": "EfficientFormer: a convolutional network with attention in its last stage",
    "nat": "NAT: neighborhood attention", "dinat": "DiNAT: dilated neighborhood attention",
    "deepseek_ocr2": "DeepSeek-OCR 2: a SAM encoder with two more convolutions (net_2, net_3) whose tokens a second, "
    "language-model-style encoder with learned queries reads (vision_config.encoder_config); vitviz does not open "
    "its SAM part alone yet",
}


@dataclass(frozen=True)
class Tower:
    """The vision tower of a composite transformers model, as its folder's config.json names it."""

    model_type: str                 # the whole model's ('llava')
    tower_type: str                 # its tower's ('clip_vision_model')
    config_key: str                 # 'vision_config' / 'backbone_config'; '' for DPT's own ViT (its own config)
    prefixes: tuple[str, ...]       # where its tensors may be in the whole model's files, tried in order
    config: dict[str, Any] = field(compare=False)   # the tower's sub-config (DPT's own ViT: the whole config)
    prefix: str = ""                # the prefix its tensors were found under (set once the file was read)
    by_code: tuple[str, str] = ("", "")   # (transformers module, class) of a tower run by its code (BY_CODE)
    roots: tuple[str, ...] = ()     # with the prefix '': the names at the file's root that are the tower's (none:
                                    # every tensor, a folder that is the tower itself)

    def describe(self) -> str:
        """'transformers model_type 'llava' (its vision tower, a 'clip_vision_model')': what the identity says."""
        what = f"its vision tower, a {self.tower_type!r}" if self.config_key else "its own ViT encoder"
        what += CHOSEN.get(self.model_type, "")
        return f"transformers model_type {self.model_type!r} ({what})"

    def wants(self, key: str) -> bool:
        """Whether `key` of the whole model's files belongs to the tower (only those are read)."""
        return any(self.under(p, key) for p in self.prefixes)

    def place(self) -> str:
        """Where its tensors were found, for messages: "under 'model.visual.'", and for a file in its original
        checkpoint's layout, how transformers' loader renames them."""
        where = f"under {self.prefix!r}" if self.prefix or not self.roots else \
            f"at the file's root: {', '.join(self.roots)}"
        if self.model_type in ORIGINAL_LAYOUTS:
            where += (f", renamed by transformers' own conversion mapping of {self.model_type!r}, as loading the "
                      "whole model does")
        return where

    def under(self, prefix: str, key: str) -> bool:
        """Whether `key` is one of the tower's tensors under `prefix` (one of `prefixes`)."""
        return key.startswith(prefix) and (bool(prefix) or not self.roots or key.startswith(self.roots))


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def sub_config(config: Any, key: str) -> Any:
    """The sub-config `key` names in a parsed config.json (a dict) or a transformers config object: '' the config
    itself, 'a.b' config['a']['b']; None where there is none."""
    for part in key.split(".") if key else ():
        config = config.get(part) if isinstance(config, dict) else getattr(config, part, None)
    return config


def identify(config: Any, where: str) -> Tower | None:
    """The vision tower a transformers config.json names, None for a config that is not a composite model.

    Args:
        config: the parsed config.json (any JSON: only string fields and objects are read).
        where: the file, for messages.

    Raises:
        CompositeModelError: a model vitviz does not convert, named with what it is and the route that works.
    """
    if not isinstance(config, dict):
        return None
    model_type = _text(config.get("model_type"))
    by_code = _by_code(config, model_type, where)
    if by_code is not None:
        return by_code
    if model_type in NOT_CONVERTED:
        raise CompositeModelError(f"{where}: transformers model_type {model_type!r} ({NOT_CONVERTED[model_type]}); "
                                  f"vitviz does not convert it to its reference ViT. To see its attention, {ROUTE}")
    if model_type not in TOWERS:
        return None
    key, prefixes = TOWERS[model_type]
    sub = sub_config(config, key) if key else None
    if model_type == "dpt" and sub is None:   # DPT's own ViT (`dpt.`), described by DPT's own config
        if config.get("is_hybrid"):
            raise CompositeModelError(f"{where}: transformers model_type 'dpt' with is_hybrid: a ViT on a BiT "
                                      f"convolutional stem, which vitviz does not convert. To see its attention, {ROUTE}")
        return Tower(model_type, "dpt", "", ("dpt.",), config)
    if not isinstance(sub, dict):
        raise CompositeModelError(f"{where}: transformers model_type {model_type!r} without a {key} object; "
                                  f"expected the config of its vision tower there. To see its attention, {ROUTE}")
    tower_type = _text(sub.get("model_type"))
    if tower_type not in READABLE:
        raise CompositeModelError(
            f"{where}: transformers model_type {model_type!r} whose vision tower is a {tower_type or 'unnamed'!r} "
            f"model ({key}.model_type); vitviz reads the towers of such models when they are "
            f"{', '.join(sorted(READABLE))}. To see its attention, {ROUTE}")
    return Tower(model_type, tower_type, key, prefixes, sub)


def _by_code(config: dict[str, Any], model_type: str, where: str) -> Tower | None:
    """The tower of a model whose vision tower runs by its own transformers code (`BY_CODE`), None for any other.

    Raises:
        CompositeModelError: transformers, which that route runs, is not installed.
    """
    key, prefixes = BY_CODE_MODELS.get(model_type) or TOWERS.get(model_type) or ("-", ())
    sub = sub_config(config, key)
    tower_type = _text(sub.get("model_type")) if isinstance(sub, dict) else ""
    if not prefixes or tower_type not in BY_CODE:
        return None
    try:
        metadata.version("transformers")
    except metadata.PackageNotFoundError:
        raise CompositeModelError(
            f"{where}: transformers model_type {model_type!r}, whose vision tower ({tower_type!r}: "
            f"{BY_CODE[tower_type][1]}) vitviz runs by transformers' own code, and transformers is not installed; "
            "pip install transformers") from None
    return Tower(model_type, tower_type, key, prefixes, sub, by_code=BY_CODE[tower_type],
                 roots=ORIGINAL_LAYOUTS.get(model_type, ()))


def refuse_windowed(config: Any, where: str) -> None:
    """Refuse a transformers config whose encoder splits the image into windows in some blocks (RF-DETR's DINOv2:
    `num_windows` > 1, `window_block_indexes`): its tensors are a plain ViT's, so it would be read as one, and those
    blocks' windowed attention shown as global attention -- not the model's.

    Raises:
        CompositeModelError: naming the model type, the windowed blocks and the route that works.
    """
    if not isinstance(config, dict):
        return
    windows, blocks = config.get("num_windows"), config.get("window_block_indexes")
    if isinstance(windows, int) and not isinstance(windows, bool) and windows > 1 and blocks:
        raise CompositeModelError(
            f"{where}: transformers model_type {_text(config.get('model_type')) or 'unnamed'!r} splits the image "
            f"into {windows} windows in blocks {blocks} (num_windows, window_block_indexes), attention that "
            f"vitviz's reference ViT does not compute: it would show global attention instead. To see its "
            f"attention, {ROUTE}")


def listed_tower(config: Any) -> tuple[str, str] | None:
    """(family, 'its clip_vision_model tower') of a composite model's config.json, for a model listing; None for
    any other config, or one `identify` refuses. Never raises."""
    try:
        tower = identify(config, "config.json")
    except CompositeModelError:
        return None
    if tower is None:
        return None
    if tower.by_code[1]:
        return "live", f"its {tower.tower_type} tower, run {BY_CODE_ROUTE} (transformers' {tower.by_code[1]})"
    return READABLE.get(tower.tower_type, "hf-dpt"), (f"its {tower.tower_type} tower" if tower.config_key
                                                       else "its own ViT")


def tower_module(module: Any) -> tuple[Any, str] | None:
    """A composite transformers model object's vision tower (the submodule its config names) and what it is
    ('model.vision_tower of the LlavaForConditionalGeneration given'); None for any other object, or a model
    `identify` refuses (its own code then runs as the caller asked)."""
    config = getattr(module, "config", None)
    if not hasattr(config, "to_dict") or not hasattr(module, "get_submodule"):
        return None
    try:
        tower = identify(config.to_dict(), f"<{type(module).__name__} object>")
    except CompositeModelError:
        return None
    for prefix in tower.prefixes if tower is not None else ():
        if not prefix and tower.roots:    # the original checkpoint's layout: no module of the model object
            continue
        try:
            sub = module.get_submodule(prefix.rstrip("."))
        except AttributeError:
            continue
        return sub, f"{prefix.rstrip('.')} of the {type(module).__name__} given, {tower.describe()}"
    return None


def tower_prefix(tower: Tower, keys: list[str], where: str) -> str:
    """The prefix the tower's tensors are under in a file holding `keys` (the one most of them carry).

    Raises:
        CompositeModelError: none of them is under any of the tower's prefixes.
    """
    counts = {p: sum(tower.under(p, k) for k in keys) for p in tower.prefixes}
    best = max(counts, key=lambda p: counts[p])
    if not counts[best]:
        stems = sorted({k.split(".")[0] for k in keys})[:8]
        raise CompositeModelError(
            f"{where}: config.json names {tower.describe()}, but no tensor of the weights is under "
            f"{' or '.join(repr(p) for p in tower.prefixes)} (top-level names: {', '.join(stems) or 'none'}); "
            "expected the whole model's weights as transformers saves them (a file in another layout, its "
            f"original checkpoint's: to see its attention, {ROUTE})")
    return best


def original_tower(config: Any, tower: Tower) -> tuple[Any, type, str]:
    """transformers' own module for the tower, for `vitviz.verify`: (its config, its class, a description). The
    tower is built from its sub-config as the composite model builds it (`AutoModel.from_config(vision_config)`,
    `load_backbone(config)`: DINOv2's backbone is the same embeddings, blocks and norm as `Dinov2Model`), without
    the language model or the depth head."""
    import transformers

    if tower.by_code[1]:    # run by its code: the class the composite model builds its tower as
        sub = sub_config(config, tower.config_key)
        sub._attn_implementation = "eager"
        module = importlib.import_module(f"transformers.models.{tower.by_code[0]}.modeling_{tower.by_code[0]}")
        cls = getattr(module, tower.by_code[1])
        whose = f", the vision tower of {type(config).__name__} ({tower.config_key}, " if tower.config_key else \
            " (the folder's own model, "
        return sub, cls, f"transformers.{cls.__name__}{whose}eager attention)"
    if not tower.config_key:   # DPT's own ViT: DPTModel as DPTForDepthEstimation builds it (no pooler)
        class DPTEncoder(transformers.DPTModel):
            def __init__(self, config: Any) -> None:
                super().__init__(config, add_pooling_layer=False)

        config._attn_implementation = "eager"
        return config, DPTEncoder, (f"transformers.DPTModel (no pooler), the vision tower of {type(config).__name__} (its own ViT, "
                                      "eager attention)")
    sub = sub_config(config, tower.config_key)
    sub._attn_implementation = "eager"
    if tower.tower_type == "beit":
        return sub, _beit_backbone(), (f"transformers.BeitBackbone, the vision tower of {type(config).__name__} "
                                       "(backbone_config, eager attention; its last block's tokens as the output)")
    own = _TOWER_CLASSES.get(tower.tower_type)
    cls = _transformers_class(own) if own else transformers.MODEL_MAPPING[type(sub)]
    if tower.model_type in RENAMED_TOWERS:
        cls = _renaming(cls, tower.model_type)
    sub._attn_implementation = "eager"
    what = f"transformers.{cls.__name__}, the vision tower of {type(config).__name__} ({tower.config_key}, eager attention)"
    return sub, cls, what


def _transformers_class(name: str) -> type:
    """A transformers model class by name, also those not exported at its top level (Kosmos2VisionModel)."""
    import importlib

    import transformers

    if hasattr(transformers, name):
        return getattr(transformers, name)
    folder = {"Kosmos2VisionModel": "kosmos2", "Idefics2VisionTransformer": "idefics2",
              "OwlViTVisionTransformer": "owlvit", "Owlv2VisionTransformer": "owlv2",
              "JanusVisionModel": "janus"}[name]
    return getattr(importlib.import_module(f"transformers.models.{folder}.modeling_{folder}"), name)


def _renaming(cls: type, model_type: str) -> type:
    """`cls` loading its tensors renamed by transformers' conversion mapping of `model_type` (which transformers
    applies to a class defined outside it by the class's own name), its name otherwise unchanged in messages."""
    from transformers.conversion_mapping import (
        get_checkpoint_conversion_mapping, register_checkpoint_conversion_mapping,
    )

    renaming = type(f"Vitviz{cls.__name__}", (cls,), {})
    register_checkpoint_conversion_mapping(renaming.__name__, get_checkpoint_conversion_mapping(model_type),
                                           overwrite=True)
    return renaming


def _beit_backbone() -> type:
    """BeitBackbone (ZoeDepth's) answering as a model: its feature maps aside, the last block's tokens (it has no
    final norm) as `last_hidden_state`."""
    import transformers
    from transformers.modeling_outputs import BaseModelOutput

    class BeitTower(transformers.BeitBackbone):
        def forward(self, pixel_values: Any = None, **kwargs: Any) -> BaseModelOutput:
            out = super().forward(pixel_values, output_hidden_states=True, **kwargs)
            return BaseModelOutput(last_hidden_state=out.hidden_states[-1])

    return BeitTower


def load_tower(config: Any, tower: Tower, cls: type, sub: Any, tensors: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """The tower (`cls` built from `sub`, as `original_tower` names them) given the file's tower tensors (their
    prefix removed), loaded by transformers' own loader: directly (`from_tensors`), or, for a model whose files are in
    its original checkpoint's layout (`ORIGINAL_LAYOUTS`), as loading the whole model loads them: the tower placed
    where the whole model keeps it (`model.visual`, `model.vision_tower`) in a model of the whole model's own
    pre-trained class and config, which transformers gives the whole model's conversion mapping (its renamings, and
    Mistral's interleaved-RoPE q/k permuted to rotate-half), and nothing else built. (module, loading info: the
    tower's own names for missing keys, the file's for unexpected ones). Its errors are `from_tensors`'."""
    if tower.model_type not in ORIGINAL_LAYOUTS:
        return _ignoring(config, tower, *from_tensors(cls, sub, tensors))
    import torch
    import transformers
    from transformers.conversion_mapping import (
        get_checkpoint_conversion_mapping, register_checkpoint_conversion_mapping,
    )

    if get_checkpoint_conversion_mapping(tower.model_type) is None:   # mappings named by the whole model's classes
        return _ignoring(config, tower, *from_tensors(cls, sub, _renamed_as_whole(config, tower, cls, tensors)))

    whole = transformers.MODEL_MAPPING[type(config)]
    base = next(c for c in whole.__mro__ if c.__name__.endswith("PreTrainedModel"))
    path = tower.prefixes[0].rstrip(".").split(".")     # where the whole model keeps its tower

    def build(self: Any, whole_config: Any) -> None:
        base.__init__(self, whole_config)
        holder = self
        for name in path[:-1]:
            setattr(holder, name, torch.nn.Module())
            holder = getattr(holder, name)
        setattr(holder, path[-1], cls(sub_config(whole_config, tower.config_key)))
        self.post_init()

    # transformers applies a registered mapping to a class defined outside it only by the class's own name
    shell = type(f"Vitviz{base.__name__.removesuffix('PreTrainedModel')}Tower", (base,), {"__init__": build})
    register_checkpoint_conversion_mapping(shell.__name__, get_checkpoint_conversion_mapping(tower.model_type),
                                           overwrite=True)
    config._attn_implementation = "eager"
    model, info = from_tensors(shell, config, {tower.prefix + k: v for k, v in tensors.items()})
    inside = ".".join(path) + "."
    info = {**info, **{k: {n.removeprefix(inside) if isinstance(n, str) else n for n in info.get(k, ())}
                       for k in ("missing_keys", "mismatched_keys")}}
    return model.get_submodule(".".join(path)), info


def _renamed_as_whole(config: Any, tower: Tower, cls: type, tensors: dict[str, Any]) -> dict[str, Any]:
    """The tower's tensors under its own module's names, each file key renamed as transformers renames it loading
    the whole model (Dots3 Note: its classes' own conversion mappings, chained from the whole model down to its
    tower): the whole model built on the meta device (no memory) gives its transforms, its state dict's names and
    where it keeps the tower. A key that a converter (not a renaming) would take, or that lands outside the tower, is
    kept as it is (then said as not the tower's)."""
    import torch
    import transformers
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightConverter, rename_source_key

    arch = next(iter(getattr(config, "architectures", None) or []), None)
    whole_cls = getattr(transformers, arch, None) if isinstance(arch, str) else None
    whole_cls = whole_cls or transformers.MODEL_MAPPING[type(config)]
    with torch.device("meta"):
        whole = whole_cls(config)
    transforms = get_model_conversion_mapping(whole)
    converters = [t for t in transforms if isinstance(t, WeightConverter)]
    renamings = [t for t in transforms if not isinstance(t, WeightConverter)]
    names = whole.state_dict()
    inside = next(name for name, m in whole.named_modules() if isinstance(m, cls)) + "."
    out = {}
    for key, value in tensors.items():
        new, converted = rename_source_key(tower.prefix + key, renamings, converters, whole.base_model_prefix, names)
        out[new.removeprefix(inside) if converted is None and new.startswith(inside) else key] = value
    return out


def _ignoring(config: Any, tower: Tower, module: Any, info: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """(module, info) without the unexpected keys the whole model's class ignores when it loads its files
    (`_keys_to_ignore_on_load_unexpected`: PaddleOCR-VL's checkpoints keep a SigLIP head its tower has not)."""
    import re

    import transformers

    whole = transformers.MODEL_MAPPING.get(type(config), None) if tower.config_key else None
    ignored = getattr(whole, "_keys_to_ignore_on_load_unexpected", None)
    if not ignored or not info.get("unexpected_keys"):
        return module, info
    kept = {k for k in info["unexpected_keys"] if not any(re.search(p, tower.prefix + k) for p in ignored)}
    return module, {**info, "unexpected_keys": kept}


def from_tensors(cls: type, config: Any, tensors: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """`cls.from_pretrained` on tensors vitviz has read (no file opened by transformers; its own loader renames the
    keys to its modules'), with transformers' progress bar quiet for the call: (module, loading info). Its errors
    (shapes that do not fit: RuntimeError) are the caller's."""
    import transformers

    bar = transformers.utils.logging.is_progress_bar_enabled()
    transformers.utils.logging.disable_progress_bar()
    try:
        return cls.from_pretrained(None, config=config, state_dict=tensors, output_loading_info=True)
    finally:
        if bar:
            transformers.utils.logging.enable_progress_bar()
