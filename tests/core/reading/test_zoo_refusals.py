"""What the zoo sweep (scripts/trial_zoo.py) found, each fixed: a folder whose config.json names a model vitviz
does not read is refused naming it and the route; a live module whose forward will not take an image says how the
live path takes one; a probe too large for memory names image_size=N; a scalar parameter (a gate) does not crash
the live path's description."""
from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

import vitviz
from vitviz.errors import DeviceError, InconsistentCheckpointError, UnknownLayoutError, VitvizError

transformers = pytest.importorskip("transformers")
timm = pytest.importorskip("timm")


def _timm_vit() -> nn.Module:
    torch.manual_seed(0)
    return timm.create_model("vit_small_patch16_224", pretrained=False, img_size=32, patch_size=8, embed_dim=32,
                             depth=2, num_heads=4, num_classes=5).eval()


def test_folder_named_by_config_is_refused_with_its_name_and_route(tmp_path: Path) -> None:
    """Chameleon: a language model's blocks (gated MLPs) and an image tokenizer, a layout vitviz does not read. The
    refusal names the model type, its class and the routes (a live module, --code), not only the tensors it could
    not place. (This test used AltCLIP, whose CLIP tower vitviz now opens by file:
    tests/parity/test_parity_zoo_towers.py.)"""
    import importlib.util

    spec = importlib.util.spec_from_file_location("trial_zoo", Path(__file__).resolve().parents[3] / "scripts" /
                                                  "trial_zoo.py")
    zoo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(zoo)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        zoo.build_hf("chameleon", "ChameleonForConditionalGeneration").save_pretrained(tmp_path)
    with pytest.raises((UnknownLayoutError, InconsistentCheckpointError)) as err:
        vitviz.load(str(tmp_path), device="cpu")
    text = str(err.value)
    assert "'chameleon'" in text and "ChameleonForConditionalGeneration" in text
    assert "vitviz.load(module)" in text and "--code" in text


def test_refusal_names_the_model_when_only_its_folder_did(tmp_path: Path) -> None:
    """A folder named after its model type (as the sweep named them) made a refusal that quotes the path count as
    naming the model: TIPSv2's "pos_embed has 17 rows, which does not fit a square grid" said neither its model
    type nor its class. The refusal names them in its own words, whatever the folder is called."""
    folder = tmp_path / "tipsv2_vision_model"
    cfg = transformers.CONFIG_MAPPING["tipsv2_vision_model"](
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, image_size=32,
        patch_size=8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        transformers.AutoModel.from_config(cfg).save_pretrained(folder)
    with pytest.raises(VitvizError) as err:
        vitviz.load(str(folder), device="cpu")
    said = str(err.value).replace(str(folder), "")
    assert "'tipsv2_vision_model'" in said and "vitviz.load(module)" in said


def test_timm_folder_refusal_names_the_architecture(tmp_path: Path) -> None:
    """A timm hub folder whose tensors vitviz cannot read says its `architecture` and the route."""
    (tmp_path / "config.json").write_text('{"architecture": "mystery_net_tiny", "num_classes": 5}')
    from safetensors.torch import save_file

    save_file({"stem.conv.weight": torch.randn(8, 3, 3, 3), "head.fc.weight": torch.randn(5, 8)},
              str(tmp_path / "model.safetensors"))
    with pytest.raises(UnknownLayoutError) as err:
        vitviz.load(str(tmp_path), device="cpu")
    assert "'mystery_net_tiny'" in str(err.value) and "vitviz.load(module)" in str(err.value)


class _NeedsText(nn.Module):
    """A model whose forward needs more than the image (a vision-language model's)."""

    def __init__(self) -> None:
        super().__init__()
        self.vision = _timm_vit()

    def forward(self, pixel_values: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
        return self.vision(pixel_values) + input_ids.float().mean()


def test_live_forward_that_needs_more_says_the_route() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(VitvizError) as err:
            vitviz.load(_NeedsText(), live=True, device="cpu")
    text = str(err.value)
    assert "_NeedsText" in text and "input_ids" in text and "vitviz.load(module)" in text and "--code" in text


def test_probe_too_large_names_the_option() -> None:
    with pytest.raises(DeviceError) as err:
        vitviz.load(_timm_vit(), live=True, device="cpu", image_size=200_000)
    assert "image_size=N (CLI --image-size N)" in str(err.value)


class _Gated(nn.Module):
    """A hand-written ViT (no attribute states its input size: its position table's rows give the grid) with a
    learned scalar gate, as grounding models have: a 0-d parameter."""

    def __init__(self) -> None:
        super().__init__()
        from timm.models.vision_transformer import Block

        torch.manual_seed(0)
        self.patch = nn.Conv2d(3, 32, 8, 8)
        self.cls_token = nn.Parameter(torch.randn(1, 1, 32) * 0.5)
        self.pos_embed = nn.Parameter(torch.randn(1, 17, 32) * 0.5)
        self.blocks = nn.Sequential(*[Block(32, 4) for _ in range(2)])
        self.gate = nn.Parameter(torch.tensor(0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], 1) + self.pos_embed
        return self.blocks(x)[:, 0] * self.gate


def test_scalar_parameter_does_not_crash_the_live_path() -> None:
    model = _Gated()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        vm = vitviz.load(model, live=True, device="cpu")
    assert vm.run(torch.rand(1, 3, 32, 32)).attentions.shape[:2] == (2, 4)


def _rf_detr_dinov2() -> nn.Module:
    """RF-DETR's DINOv2 backbone: its blocks split the image into 4 windows (every block windowed here)."""
    cfg = transformers.RfDetrDinov2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, image_size=56,
                                          patch_size=14, num_windows=4, window_block_indexes=[0, 1],
                                          out_features=["stage2"], out_indices=[2])
    torch.manual_seed(0)
    return transformers.RfDetrDinov2Backbone(cfg).eval()


def test_windowed_dinov2_is_not_shown_as_global_attention(tmp_path: Path) -> None:
    """By file its tensors are a plain DINOv2's: it opened as one, its windowed attention shown as global
    attention; live, the windows folded into the batch were read as one image's map. Both refuse now."""
    model = _rf_detr_dinov2()
    model.save_pretrained(tmp_path)
    with pytest.raises(UnknownLayoutError) as err:
        vitviz.load(str(tmp_path), device="cpu")
    assert "'rf_detr_dinov2'" in str(err.value) and "num_windows" in str(err.value)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(VitvizError) as err:
            vitviz.load(model, device="cpu")
    assert "RfDetrDinov2Backbone" in str(err.value) and "windows per batch" in str(err.value)


def test_config_field_refusal_names_the_model_type(tmp_path: Path) -> None:
    """SLANet (a table-recognition model) states hidden_act 'hardswish', a value no ViT vitviz reads uses: the
    refusal of the field said neither the model nor a route."""
    from safetensors.torch import save_file

    from vitviz.errors import MetadataError

    folder = tmp_path / "slanet"      # a folder of the model's name (as the sweep saves it) names nothing
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "slanet", "hidden_act": "hardswish"}')
    save_file({"backbone.conv.weight": torch.randn(8, 3, 3, 3)}, str(folder / "model.safetensors"))
    with pytest.raises(MetadataError) as err:
        vitviz.load(str(folder), device="cpu")
    assert "'slanet'" in str(err.value) and "hardswish" in str(err.value) and "vitviz.load(module)" in str(err.value)


def test_timm_swinv2_object_uses_the_windows_it_was_built_with() -> None:
    """A timm SwinV2 object built with window_size=4: converted live, its windows were its architecture name's
    (12), so no block's attention was the model's; now each block equals timm's own softmax."""
    torch.manual_seed(0)
    model = timm.create_model("swinv2_base_window12_192", pretrained=False, img_size=64, embed_dim=32,
                              depths=(1, 1, 1, 1), num_heads=(1, 2, 4, 8), window_size=4, num_classes=5).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        vm = vitviz.load(model, device="cpu")
    result = vm.run(torch.rand(1, 3, 64, 64))
    for m in model.modules():
        if hasattr(m, "fused_attn"):
            m.fused_attn = False
    maps: list[torch.Tensor] = []
    hooks = [m.register_forward_hook(lambda _m, _i, o: maps.append(o.detach()))
             for n, m in model.named_modules() if n.endswith("attn.softmax")]
    with torch.no_grad():
        model(torch.from_numpy(result.input)[None])
    for h in hooks:
        h.remove()
    assert len(maps) == len(result.blocks) == 4
    for mine, ref in zip(result.blocks, maps):
        torch.testing.assert_close(torch.from_numpy(mine), ref.reshape(mine.shape), atol=1e-5, rtol=0)


def test_memory_map_failure_is_a_memory_error_not_a_layout_bug(tmp_path: Path, monkeypatch) -> None:
    """Under a memory cap, safetensors' mmap fails with a RuntimeError; it was reported as 'please report this
    file's layout as a vitviz bug'."""
    from safetensors.torch import save_file

    import vitviz.core.reading.checkpoint as checkpoint

    path = tmp_path / "model.safetensors"
    save_file({"w": torch.zeros(2)}, str(path))

    def no_memory(*_a, **_k):
        raise RuntimeError(f"unable to mmap 724461416 bytes from file <{path}>: Cannot allocate memory (12)")

    monkeypatch.setattr(checkpoint, "_read_weights_file", no_memory)
    with pytest.raises(DeviceError, match="not enough memory to map it"):
        vitviz.load(str(path), device="cpu")


@pytest.mark.parametrize("arch", ["beit_base_patch16_224", "vit_relpos_medium_patch16_rpn_224"])
def test_bare_relative_position_state_dict_reads_heads_from_its_bias(tmp_path: Path, arch: str) -> None:
    """A bare BEiT / timm relpos state dict: its relative position bias has one column (MLP output) per head, but
    the head count was guessed from the width (1) and then contradicted the bias: refused with no route."""
    torch.manual_seed(0)
    model = timm.create_model(arch, pretrained=False, img_size=64, embed_dim=64, depth=2, num_heads=4,
                              num_classes=5).eval()
    torch.save(model.state_dict(), tmp_path / "model.pth")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        vm = vitviz.load(str(tmp_path / "model.pth"), device="cpu", image_size=64)
    assert vm.spec.num_heads == 4 and vm.spec.source_of("num_heads").startswith("shape:")


def test_bare_rope_mixed_state_dict_reads_heads_from_its_frequencies(tmp_path: Path) -> None:
    """A bare timm RoPE-Mixed state dict: rope.freqs is (2, depth, heads, head_dim / 2), but the head count was
    guessed from the width (1) and then contradicted the frequencies: refused with no route. Now read from them,
    and the attention is timm's own."""
    torch.manual_seed(0)
    model = timm.create_model("vit_base_patch16_rope_mixed_ape_224", pretrained=False, img_size=64, embed_dim=64,
                              depth=2, num_heads=4, num_classes=5).eval()
    torch.save(model.state_dict(), tmp_path / "model.pth")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        vm = vitviz.load(str(tmp_path / "model.pth"), device="cpu", image_size=64)
    assert vm.spec.num_heads == 4 and vm.spec.source_of("num_heads").startswith("shape: rope.freqs")
    x = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    seen: list[torch.Tensor] = []
    for blk in model.blocks:
        blk.attn.fused_attn = False
        blk.attn.attn_drop.register_forward_pre_hook(lambda _m, a: seen.append(a[0].detach()))
    with torch.no_grad():
        model(x)
    got = vm.run(x).attentions
    assert len(got) == len(seen) == 2
    for mine, ref in zip(got, seen):
        torch.testing.assert_close(torch.as_tensor(mine), ref[0], atol=1e-5, rtol=0)


@pytest.mark.parametrize("arch, looks", [("swinv2_cr_tiny_224", "SwinV2-CR"), ("vit_small_r26_s32_224", "hybrid ViT"),
                                         ("volo_d1_224", "VOLO")])
def test_bare_state_dict_refusal_says_what_it_looks_like_and_the_route(tmp_path: Path, arch: str, looks: str) -> None:
    """A bare timm state dict vitviz does not convert was refused with the layout's complaint alone ('no transformer
    blocks (blocks.N.*) found'): nothing named what it could be or what to do. Now its keys name the family and
    the route (its own code, vitviz.load(model); VOLO: that no route shows it yet)."""
    torch.manual_seed(0)
    kw = {"embed_dim": 32, "depths": (1, 1, 1, 1), "num_heads": (1, 2, 2, 2)} if "swin" in arch else {}
    model = timm.create_model(arch, pretrained=False, num_classes=5, **kw).eval()
    torch.save(model.state_dict(), tmp_path / "model.pth")
    with warnings.catch_warnings(), pytest.raises((UnknownLayoutError, InconsistentCheckpointError)) as err:
        warnings.simplefilter("ignore")
        vitviz.load(str(tmp_path / "model.pth"), device="cpu")
    text = str(err.value)
    assert "bare state dict" in text and looks in text and "vitviz.load(model)" in text


def test_convit_is_refused_live_naming_its_gated_attention() -> None:
    """ConViT handed over live: each gated (GPSA) layer was recorded as two layers (its content softmax, gated, and
    its positional softmax), and a run then disagreed with the probe on the count ('3 attention maps; 4 expected',
    naming no route). Its weights are a gated mix of two softmaxes, which vitviz does not show as one: refused,
    naming the module kind, before any map is shown."""
    torch.manual_seed(0)
    model = timm.create_model("convit_tiny", pretrained=False, img_size=64, embed_dim=64, depth=2, num_heads=4,
                              num_classes=5).eval()
    with pytest.raises(VitvizError, match="ConVit holds GPSA modules, ConViT's gated positional self-attention"):
        vitviz.load(model, device="cpu")


def test_bare_state_dict_with_batchnorm_stem_is_refused_not_a_bug(tmp_path: Path) -> None:
    """timm's vit_base_mci_224 (a ViT behind a BatchNorm conv stem): the stem's num_batches_tracked counters are
    0-d tensors, and the structural reader indexed their last dimension: 'could not be loaded (unexpected
    IndexError) ... please report' by file and a route-less refusal live. Now its layout is refused with what it
    recognised and the route; live names grid= / image_size= for vitviz.load(model)."""
    torch.manual_seed(0)
    model = timm.create_model("vit_base_mci_224", pretrained=False, img_size=64, depth=1, num_classes=5).eval()
    torch.save(model.state_dict(), tmp_path / "model.pth")
    with warnings.catch_warnings(), pytest.raises(UnknownLayoutError, match="no role for patch_embed.backbone"):
        warnings.simplefilter("ignore")
        vitviz.load(str(tmp_path / "model.pth"), device="cpu")
    with pytest.raises(VitvizError, match=r"pass grid=\(H, W\) or image_size=N to vitviz.load\(model\)"):
        vitviz.load(model, device="cpu")
