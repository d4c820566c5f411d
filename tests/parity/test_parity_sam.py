"""Parity for SAM / ViTDet image encoders: timm `samvit_*` (hub folder with config.json, bare state dict), the
original segment-anything layout (`image_encoder.*`, `mlp.lin1`), transformers `SamVisionModel` and the vision tower
of `SamModel` (save_pretrained).

Each original is tiny (4 blocks, 3x3 windows, blocks 1 and 3 global, 8 px patches, 64 px native, a 16-channel
neck) with random weights; the neck's output, the pooled output and every block's per-window, per-head attention
(the global blocks' over the whole grid) are compared at the native size and at sizes where the windows are padded
and the global blocks' relative position tables are resampled. transformers' encoder refuses other sizes: there the
oracle is timm's samvit with the same weights.
"""
from __future__ import annotations

import warnings
from functools import partial

import numpy as np
import pytest
import torch

import vitviz
from parity_refs import perturb
from vitviz.core.spec import GuessWarning

timm = pytest.importorskip("timm")
transformers = pytest.importorskip("transformers")

ATOL_ATTN, ATOL_OUT = 1e-5, 1e-4
SIZES = [(64, 64), (80, 72), (40, 48)]
ARGS = dict(img_size=64, patch_size=8, embed_dim=32, depth=4, num_heads=2, global_attn_indexes=[1, 3],
            window_size=3, neck_chans=16, num_classes=0)


def x_for(size: tuple[int, int]) -> torch.Tensor:
    return torch.randn(1, 3, *size, generator=torch.Generator().manual_seed(1))


def quiet_load(path, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GuessWarning)
        return vitviz.load(path, device="cpu", **kw)


def timm_sam(eps: float | None = None, arch: str = "samvit_base_patch16", **kw) -> torch.nn.Module:
    torch.manual_seed(0)
    extra = {"norm_layer": partial(torch.nn.LayerNorm, eps=eps)} if eps else {}
    model = perturb(timm.create_model(arch, pretrained=False, **{**ARGS, **kw}, **extra))
    for m in model.modules():
        if hasattr(m, "fused_attn"):
            m.fused_attn = False
    return model


def timm_reference(model: torch.nn.Module, x: torch.Tensor):
    """(neck output, pooled output, every block's softmax read where it enters attn_drop)."""
    maps: list[torch.Tensor] = []
    hooks = [m.register_forward_hook(lambda _m, _i, o: maps.append(o.detach()))
             for name, m in model.named_modules() if name.endswith("attn.attn_drop")]
    try:
        with torch.no_grad():
            feats = model.forward_features(x)
            out = model.forward_head(feats)
    finally:
        for h in hooks:
            h.remove()
    return feats, out, maps


def check(result, feats: torch.Tensor, out: torch.Tensor | None, maps: list[torch.Tensor]) -> float:
    np.testing.assert_allclose(result.feature_map, feats[0].numpy(), atol=ATOL_OUT)
    if out is not None:
        got = result.features if result.logits.size == 0 else result.logits
        np.testing.assert_allclose(got, out[0].numpy(), atol=ATOL_OUT)
    assert len(result.blocks) == len(maps)
    worst = 0.0
    for i, (mine, ref) in enumerate(zip(result.blocks, maps)):
        ref = ref.numpy().reshape(mine.shape)     # (B * windows * heads, n, n) -> (windows, heads, n, n)
        np.testing.assert_allclose(mine, ref, atol=ATOL_ATTN, err_msg=f"block {i} ({result.spec_line(i)})")
        worst = max(worst, float(np.abs(mine - ref).max()))
    return worst


def test_timm_sam_hub_folder(tmp_path) -> None:
    from timm.models import save_for_hf

    model = timm_sam()
    save_for_hf(model, str(tmp_path), safe_serialization=True, model_args=ARGS)
    vm = quiet_load(tmp_path)
    s = vm.spec
    assert (s.family, s.arch, s.heads, s.neck, s.neck_dim) == ("timm-sam", "sam", (2,), "conv", 16)
    assert s.windows == ((3, 3), (0, 0), (3, 3), (0, 0)) and s.kind_of("windows") == "derived"
    assert s.kind_of("heads") == "derived" and s.named and s.assumptions == ()
    assert s.describe_blocks()[1] == "stage 0 block 1: global (8×8)"
    for size in SIZES:
        check(vm.run(x_for(size)), *timm_reference(model, x_for(size)))


def test_timm_sam_state_dict(tmp_path) -> None:
    """A bare file: windows and global blocks from the tables' shapes, the native size from the position table;
    timm's eps and resampling are its family's conventions (assumed, flagged)."""
    model = timm_sam()
    torch.save(model.state_dict(), tmp_path / "sam.pth")
    vm = quiet_load(tmp_path / "sam.pth")
    s = vm.spec
    assert s.image_size == (64, 64) and s.kind_of("image_size") == "derived"
    assert s.windows == ((3, 3), (0, 0), (3, 3), (0, 0))
    assert {"eps", "eps_neck", "mlp_kind"} <= set(dict(s.assumptions))
    for size in SIZES:
        check(vm.run(x_for(size)), *timm_reference(model, x_for(size)))


def test_timm_sam_classifier(tmp_path) -> None:
    """samvit_base_patch16_224's shape: no absolute table, one LayerNorm2d as the neck, a classifier head."""
    args = {k: v for k, v in ARGS.items() if k != "neck_chans"}
    torch.manual_seed(0)
    model = perturb(timm.create_model("samvit_base_patch16_224", pretrained=False, **{**args, "num_classes": 5}))
    for m in model.modules():
        if hasattr(m, "fused_attn"):
            m.fused_attn = False
    torch.save(model.state_dict(), tmp_path / "sam_cls.pth")
    vm = quiet_load(tmp_path / "sam_cls.pth", image_size=64)
    assert vm.spec.neck == "norm" and not vm.spec.pos_embed and vm.spec.num_classes == 5
    for size in SIZES[:2]:
        check(vm.run(x_for(size)), *timm_reference(model, x_for(size)))


def to_segment_anything(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """timm's samvit keys back to segment-anything's (timm's checkpoint_filter_fn in reverse), with a prompt encoder
    and mask decoder beside the image encoder."""
    out = {f"image_encoder.{k.replace('mlp.fc', 'mlp.lin')}": v for k, v in sd.items()}
    out["prompt_encoder.point_embeddings.0.weight"] = torch.zeros(1, 16)
    out["mask_decoder.iou_token.weight"] = torch.zeros(1, 16)
    return out


def test_segment_anything_checkpoint(tmp_path) -> None:
    """The original layout; its ImageEncoderViT's LayerNorms use eps 1e-6 (timm's samvit 1e-5): the oracle is timm's
    samvit built with eps 1e-6."""
    model = timm_sam(eps=1e-6)
    torch.save(to_segment_anything(model.state_dict()), tmp_path / "sam_vit_b_01ec64.pth")
    vm = quiet_load(tmp_path / "sam_vit_b_01ec64.pth")
    assert vm.spec.family == "sam" and vm.spec.eps == 1e-6
    assert sorted(vm.dropped) == ["mask_decoder.iou_token.weight", "prompt_encoder.point_embeddings.0.weight"]
    for size in SIZES[:2]:
        check(vm.run(x_for(size)), *timm_reference(model, x_for(size)))


def hf_sam(kind: str) -> torch.nn.Module:
    from transformers import SamConfig, SamModel, SamVisionConfig, SamVisionModel

    vc = dict(hidden_size=32, num_hidden_layers=4, num_attention_heads=2, image_size=64, patch_size=8, window_size=3,
              global_attn_indexes=[1, 3], output_channels=16, mlp_dim=128)
    torch.manual_seed(0)
    if kind == "vision":
        return perturb(SamVisionModel(SamVisionConfig(**vc, attn_implementation="eager")))
    return perturb(SamModel(SamConfig(vision_config=vc, attn_implementation="eager")))


def hf_reference(encoder: torch.nn.Module, x: torch.Tensor):
    from transformers.models.sam.modeling_sam import SamVisionAttention

    maps: list[torch.Tensor] = []
    hooks = [m.register_forward_hook(lambda _m, _i, o: maps.append(o[1].detach()))
             for m in encoder.modules() if isinstance(m, SamVisionAttention)]
    try:
        with torch.no_grad():
            o = encoder(pixel_values=x)
    finally:
        for h in hooks:
            h.remove()
    return o.last_hidden_state, None, maps


@pytest.mark.parametrize("kind", ["vision", "sam"])
def test_hf_sam(tmp_path, kind: str) -> None:
    model = hf_sam(kind)
    model.save_pretrained(tmp_path)
    vm = quiet_load(tmp_path)
    s = vm.spec
    assert s.family == "hf-sam" and s.named and s.assumptions == () and s.eps == 1e-6
    assert s.windows == ((3, 3), (0, 0), (3, 3), (0, 0)) and s.heads == (2,)
    if kind == "sam":
        assert vm.dropped and all(not k.startswith("vision_encoder.") for k in vm.dropped)
    check(vm.run(x_for((64, 64))), *hf_reference(model.vision_encoder, x_for((64, 64))))
    # transformers refuses other sizes; vitviz resamples as timm's samvit does (an assumption it says), which is
    # exactly timm's samvit with these weights (and transformers' eps)
    with pytest.raises(ValueError, match="doesn't match"):
        hf_reference(model.vision_encoder, x_for((80, 72)))
    oracle = timm_sam(eps=1e-6)
    oracle.load_state_dict(vm.net.state_dict())
    for size in SIZES[1:]:
        spec = vm.spec_at(size)
        assert dict(spec.assumptions).get("pos_interp", "").startswith("assumed")
        check(vm.run(x_for(size)), *timm_reference(oracle, x_for(size)))
