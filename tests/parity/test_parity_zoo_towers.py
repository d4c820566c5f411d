"""Composite transformers models the zoo sweep (scripts/trial_zoo.py) found refused by file although their vision
tower is one vitviz reads: Aya Vision, Cohere 2 Vision and ShieldGemma 2 (SigLIP under model.vision_tower.), LLaVA-
NeXT-Video (CLIP), Video-LLaVA (CLIP under model.image_tower.), Aria (an Idefics3 tower), Granite 4 Vision (CLIP),
ColPali and ColModernVBERT (a PaliGemma / ModernVBERT's SigLIP under `vlm_config.vision_config`), PI0 / PI0.5 (a
PaliGemma's SigLIP, saved under paligemma_with_expert.paligemma.model.vision_tower.), T5Gemma 2 (SigLIP in its
encoder), Idefics2 (Idefics3's SigLIP before it: bucketed positions, also at a size not its own) and LFM2-VL
(SigLIP 2, NaFlex), InstructBLIP-Video (InstructBLIP's ViT), GOT-OCR 2.0 (a SAM-style windowed encoder), AltCLIP
and OWL-ViT / OWLv2 (CLIP towers: blocks saved as `encoder.layer.N`, `pre_layernorm`), VisionEncoderDecoder (a ViT
encoder with its pooler), Depth Pro (its image encoder, a DINOv2: the one of its three towers that sees the whole
image), Janus (a SigLIP whose attention output is `projection_layer`). Each
is built tiny with random weights (the sweep's own tiny config), saved with `save_pretrained` and opened by file
as its tower, and handed over whole; every layer's per-head attention equals the tower's own (eager
`output_attentions`) inside the whole model, at 1e-5."""
from __future__ import annotations

import importlib.util
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import vitviz

transformers = pytest.importorskip("transformers")
ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("trial_zoo", ROOT / "scripts" / "trial_zoo.py")
zoo = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(zoo)

# model_type: (the class the sweep builds, where the tower is in the whole model)
CASES = {
    "aya_vision": ("AyaVisionForConditionalGeneration", lambda m: m.model.vision_tower),
    "cohere2_vision": ("Cohere2VisionForConditionalGeneration", lambda m: m.model.vision_tower),
    "shieldgemma2": ("Gemma3ForConditionalGeneration", lambda m: m.model.vision_tower),
    "llava_next_video": ("LlavaNextVideoForConditionalGeneration", lambda m: m.model.vision_tower),
    "video_llava": ("VideoLlavaForConditionalGeneration", lambda m: m.model.image_tower),
    "aria": ("AriaForConditionalGeneration", lambda m: m.model.vision_tower),
    "granite4_vision": ("Granite4VisionForConditionalGeneration", lambda m: m.model.vision_tower),
    "colpali": ("ColPaliForRetrieval", lambda m: m.vlm.vision_tower),
    "colmodernvbert": ("ColModernVBertForRetrieval", lambda m: m.vlm.vision_model),
    "pi0": ("PI0ForConditionalGeneration", lambda m: m.model.vlm.vision_tower),
    "pi05": ("PI05ForConditionalGeneration", lambda m: m.model.vlm.vision_tower),
    "t5gemma2": ("T5Gemma2ForConditionalGeneration", lambda m: m.model.encoder.vision_tower),
    "idefics2": ("Idefics2ForConditionalGeneration", lambda m: m.model.vision_model),
    "instructblipvideo": ("InstructBlipVideoForConditionalGeneration", lambda m: m.vision_model),
    "altclip": ("AltCLIPModel", lambda m: m.vision_model),
    "owlvit": ("OwlViTForObjectDetection", lambda m: m.owlvit.vision_model),
    "owlv2": ("Owlv2ForObjectDetection", lambda m: m.owlv2.vision_model),
    "vision-encoder-decoder": ("VisionEncoderDecoderModel", lambda m: m.encoder),
    "depth_pro": ("DepthProForDepthEstimation", lambda m: m.depth_pro.encoder.image_encoder.model),
    "janus": ("JanusForConditionalGeneration", lambda m: m.model.vision_model),
}
# handed over whole (vitviz.load(model)): the tower its config names is found and shown
LIVE = ("granite4_vision", "colpali", "colmodernvbert", "pi0", "pi05", "t5gemma2", "idefics2", "instructblipvideo",
        "altclip", "owlvit", "owlv2", "vision-encoder-decoder", "depth_pro", "janus")


@pytest.mark.parametrize("model_type,route", [*((t, "file") for t in CASES), *((t, "live") for t in LIVE)])
def test_tower_by_file(tmp_path: Path, model_type: str, route: str) -> None:
    cls, tower_of = CASES[model_type]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = zoo.build_hf(model_type, cls)
        model.save_pretrained(tmp_path)
        vm = vitviz.load(str(tmp_path) if route == "file" else model, device="cpu")
    assert model_type in vm.spec.source_of("identity" if route == "file" else "path")
    tower = tower_of(model)
    tower.set_attn_implementation("eager")
    size = vm.spec.image_size
    x = torch.randn(1, 3, *size, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        theirs = tower(pixel_values=x, output_attentions=True).attentions
    ours = vm.run(x).attentions
    assert len(ours) == len(theirs) == tower.config.num_hidden_layers
    for i, (mine, ref) in enumerate(zip(ours, theirs)):
        np.testing.assert_allclose(mine, ref[0].numpy(), atol=1e-5, err_msg=f"layer {i}")


@pytest.mark.parametrize("route", ["file", "live"])
def test_siglip2_tower_of_lfm2_vl(tmp_path: Path, route: str) -> None:
    """LFM2-VL's SigLIP 2 (NaFlex) tower: by file and handed over whole, equal to the tower's own attention on the
    patches transformers' SigLIP 2 processor cuts (`convert_image_to_patches`, every patch attended)."""
    from transformers.models.siglip2.image_processing_siglip2 import convert_image_to_patches

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = zoo.build_hf("lfm2_vl", "Lfm2VlForConditionalGeneration")
        model.save_pretrained(tmp_path)
        vm = vitviz.load(str(tmp_path) if route == "file" else model, device="cpu")
    assert vm.spec.family == "hf-siglip2" and "lfm2_vl" in vm.spec.source_of("identity" if route == "file" else "path")
    tower = model.model.vision_tower
    tower.set_attn_implementation("eager")
    size, p = vm.spec.image_size, tower.config.patch_size
    x = torch.randn(1, 3, *size, generator=torch.Generator().manual_seed(5))
    result = vm.run(x)
    patches = convert_image_to_patches(torch.from_numpy(result.input), p)[None]    # (the input vitviz ran on)
    with torch.no_grad():
        theirs = tower(pixel_values=patches, pixel_attention_mask=torch.ones(1, patches.shape[1], dtype=torch.int32),
                       spatial_shapes=torch.tensor([[size[0] // p, size[1] // p]]), output_attentions=True).attentions
    ours = result.attentions
    assert len(ours) == len(theirs) == tower.config.num_hidden_layers
    for i, (mine, ref) in enumerate(zip(ours, theirs)):
        np.testing.assert_allclose(mine, ref[0].numpy(), atol=1e-5, err_msg=f"layer {i}")


def test_idefics2_tower_at_another_size(tmp_path: Path) -> None:
    """Idefics2's tower looks its position rows up by bucketed patch coordinates: at a size that is not its own, by
    file, every layer equals the tower's own attention there; and `vitviz.verify` finds it equal."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = zoo.build_hf("idefics2", "Idefics2ForConditionalGeneration")
        model.save_pretrained(tmp_path)
        tower = model.model.vision_model
        p = tower.config.patch_size
        native = tower.config.image_size // p
        size = (p * (native + 1), p * (native + 3))
        vm = vitviz.load(str(tmp_path), device="cpu", image_size=size)
    assert vm.spec.pos_interp == "bucket"
    tower.set_attn_implementation("eager")
    x = torch.randn(1, 3, *size, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        theirs = tower(pixel_values=x, output_attentions=True).attentions
    ours = vm.run(x).attentions
    for i, (mine, ref) in enumerate(zip(ours, theirs, strict=True)):
        np.testing.assert_allclose(mine, ref[0].numpy(), atol=1e-5, err_msg=f"layer {i}")
    check = vitviz.verify(vm)
    assert check.verified, check.summary()


@pytest.mark.parametrize("model_type", ["altclip", "owlvit", "owlv2", "vision-encoder-decoder", "depth_pro", "janus"])
def test_clip_like_towers_verified(tmp_path: Path, model_type: str) -> None:
    """AltCLIP's and OWL-ViT / OWLv2's CLIP towers, a VisionEncoderDecoder's ViT, Depth Pro's image encoder
    by file:
    `vitviz.verify` builds transformers' own vision model from the folder's sub-config (the file's tensors loaded by
    its own loader) and finds it equal."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        zoo.build_hf(model_type, CASES[model_type][0]).save_pretrained(tmp_path)
        check = vitviz.verify(vitviz.load(str(tmp_path), device="cpu"))
    assert check.verified, check.summary()


def test_vision_encoder_decoder_says_its_pooler_is_not_shown(tmp_path: Path) -> None:
    """A VisionEncoderDecoder's ViT keeps its pooler (dense + tanh over the CLS token): vitviz shows the normed CLS
    token of last_hidden_state as the features and says so, not calling it the tower's output."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = zoo.build_hf("vision-encoder-decoder", "VisionEncoderDecoderModel")
        model.save_pretrained(tmp_path)
        vm = vitviz.load(str(tmp_path), device="cpu")
    assert model.encoder.pooler is not None
    assert vm.spec.pooling == "token" and "pooler" in vm.spec.source_of("pooling")
    x = torch.randn(1, 3, *vm.spec.image_size, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        cls = model.encoder(pixel_values=x).last_hidden_state[0, 0].numpy()
    np.testing.assert_allclose(np.asarray(vm.run(x).features).reshape(-1), cls, atol=1e-5)


def test_depth_pro_names_the_tower_shown(tmp_path: Path) -> None:
    """Depth Pro has three DINOv2 towers: the identity says its image encoder is shown and the others are not."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        zoo.build_hf("depth_pro", "DepthProForDepthEstimation").save_pretrained(tmp_path)
        said = vitviz.load(str(tmp_path), device="cpu").spec.source_of("identity")
    assert "image encoder" in said and "patch encoder" in said and "not shown" in said, said


def test_janus_says_what_its_features_are(tmp_path: Path) -> None:
    """Janus's SigLIP tower (no head): vitviz's features are the mean of its normed tokens, equal to the tower's own
    last_hidden_state averaged, and said not to be JanusVisionModel's pooler_output (the first token normed twice)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = zoo.build_hf("janus", "JanusForConditionalGeneration")
        model.save_pretrained(tmp_path)
        vm = vitviz.load(str(tmp_path), device="cpu")
    assert vm.spec.pooling == "avg" and "pooler_output" in vm.spec.source_of("pooling")
    x = torch.randn(1, 3, *vm.spec.image_size, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        mean = model.model.vision_model(pixel_values=x).last_hidden_state[0].mean(dim=0).numpy()
    np.testing.assert_allclose(np.asarray(vm.run(x).features).reshape(-1), mean, atol=1e-5)


def test_deepseek_ocr2_refused_naming_why(tmp_path: Path) -> None:
    """DeepSeek-OCR 2's folder is refused by name: its SAM encoder and the second encoder after it, and the route."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        zoo.build_hf("deepseek_ocr2", "DeepseekOcr2ForConditionalGeneration").save_pretrained(tmp_path)
    said = r"DeepSeek-OCR 2: a SAM encoder.*vitviz.load\(module\)"
    with pytest.raises(vitviz.errors.CompositeModelError, match=said):
        vitviz.load(str(tmp_path), device="cpu")


def test_instructblipvideo_verified(tmp_path: Path) -> None:
    """InstructBLIP-Video's tower by file: `vitviz.verify` builds transformers' own InstructBlipVideoVisionModel from
    the folder's vision_config and finds it equal."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        zoo.build_hf("instructblipvideo", "InstructBlipVideoForConditionalGeneration").save_pretrained(tmp_path)
        check = vitviz.verify(vitviz.load(str(tmp_path), device="cpu"))
    assert check.verified and "InstructBlipVideoVisionModel" in check.original, check.summary()


def _got_ocr2() -> torch.nn.Module:
    """GOT-OCR 2.0 tiny: its SAM ViT-B-style encoder (4 blocks, 3 x 3 windows, blocks 1 and 3 global, 8 px patches,
    64 px native, a 16-channel neck) beside a one-layer Qwen2 text model."""
    vision = dict(hidden_size=32, num_hidden_layers=4, num_attention_heads=2, image_size=64, patch_size=8,
                  window_size=3, global_attn_indexes=[1, 3], output_channels=16, mlp_dim=128)
    text = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                num_key_value_heads=1, vocab_size=100)
    torch.manual_seed(0)
    config = transformers.GotOcr2Config(vision_config=vision, text_config=text, image_token_index=99)
    model = transformers.GotOcr2ForConditionalGeneration(config).eval()
    with torch.no_grad():      # weights far from their initialisation: attention that is not near-uniform
        for i, p in enumerate(model.model.vision_tower.parameters()):
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(i)) * 0.1)
    return model


@pytest.mark.parametrize("route", ["file", "live"])
def test_sam_tower_of_got_ocr2(tmp_path: Path, route: str) -> None:
    """GOT-OCR 2.0's SAM-style encoder opens as the windowed reference model (windows and global blocks from its
    tables), by file and handed over whole: every block's per-window attention and the neck's output equal the
    tower's own (eager) at its native size (`vitviz.verify` does not build windowed originals yet)."""
    from transformers.models.got_ocr2.modeling_got_ocr2 import GotOcr2VisionAttention

    model = _got_ocr2()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.save_pretrained(tmp_path)
        vm = vitviz.load(str(tmp_path) if route == "file" else model, device="cpu")
    s = vm.spec
    assert s.family == "hf-sam" and s.windows == ((3, 3), (0, 0), (3, 3), (0, 0)) and s.heads == (2,)
    assert "got_ocr2" in s.source_of("identity" if route == "file" else "path")
    tower = model.model.vision_tower
    tower.set_attn_implementation("eager")
    maps: list[torch.Tensor] = []
    hooks = [m.register_forward_hook(lambda _m, _i, o: maps.append(o[1].detach()))
             for m in tower.modules() if isinstance(m, GotOcr2VisionAttention)]
    x = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    try:
        with torch.no_grad():
            feats = tower(pixel_values=x).last_hidden_state
    finally:
        for h in hooks:
            h.remove()
    result = vm.run(x)
    np.testing.assert_allclose(result.feature_map, feats[0].numpy(), atol=1e-4)
    assert len(result.blocks) == len(maps) == 4
    for i, (mine, ref) in enumerate(zip(result.blocks, maps)):
        np.testing.assert_allclose(mine, ref.numpy().reshape(mine.shape), atol=1e-5, err_msg=f"block {i}")
