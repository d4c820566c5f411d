"""Model objects with stages (issue 31): what the live path and the object route do with hierarchical vision
transformers handed over as objects.

- Donut-Swin (stages of different head counts) opens per stage as a windowed model, exact against transformers;
- SegFormer / GLPN / PVTv2 are probed with the channel count their config states (they were probed with 16, the
  input of the spatial reduction inside their attention taken for a patch embedding), and the attention of the
  stages not shown is said;
- Florence-2's DaViT (spatial windows beside attention over channels, per-stage heads): its window blocks shown per
  stage, exact, its channel blocks said and not shown (not spatial);
- a model whose attention is all inside windows (other than Hiera, tests/parity/test_parity_hiera.py, and DaViT) is
  refused naming the class, what was seen and that no route shows it yet -- never shown as something else.
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import vitviz
from parity_refs import perturb
from vitviz.core.running.live import LiveModel, LiveWarning, NoAttentionError
from vitviz.core.protocol import WINDOWS, capabilities_of

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.filterwarnings("ignore::vitviz.core.spec.GuessWarning")
STAGED = dict(num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[16, 32], num_attention_heads=[1, 2],
              patch_sizes=[7, 3], strides=[4, 2], mlp_ratios=[2, 2])


def said(build) -> tuple[object, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = build()
    return model, [str(w.message) for w in caught if issubclass(w.category, LiveWarning)]


def test_donut_swin_object_opens_per_stage_exactly() -> None:
    from transformers.models.donut.modeling_donut_swin import DonutSwinAttention

    config = transformers.DonutSwinConfig(image_size=64, patch_size=4, embed_dim=16, depths=[2, 2], num_heads=[2, 4],
                                          window_size=4, attn_implementation="eager")
    net = perturb(transformers.DonutSwinModel(config))
    vm = vitviz.load(net, device="cpu")
    assert WINDOWS in capabilities_of(vm) and tuple(vm.spec.heads) == (2, 4)
    x = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    maps: list[torch.Tensor] = []
    hooks = [m.register_forward_hook(lambda _m, _i, o: maps.append(o[1].detach()))
             for m in net.modules() if isinstance(m, DonutSwinAttention)]
    try:
        with torch.no_grad():
            net(pixel_values=x, output_attentions=True)
    finally:
        for h in hooks:
            h.remove()
    r = vm.run(x)
    assert len(r.blocks) == len(maps) == 4
    for i, (mine, ref) in enumerate(zip(r.blocks, maps)):
        np.testing.assert_allclose(mine, ref.numpy().reshape(mine.shape), atol=1e-5, err_msg=f"block {i}")


@pytest.mark.parametrize("kind", ["Segformer", "GLPN", "PvtV2"])
def test_hierarchical_objects_are_probed_with_their_stated_channels_and_the_rest_is_said(kind: str) -> None:
    extra = {"decoder_hidden_size": 16} if kind != "PvtV2" else {}
    config = getattr(transformers, f"{kind}Config")(**STAGED, **extra, image_size=64, attn_implementation="eager")
    net = getattr(transformers, f"{kind}Model")(config).eval()
    vm, words = said(lambda: vitviz.load(net, device="cpu", image_size=64))
    assert isinstance(vm, LiveModel) and vm.spec.in_chans == 3
    assert vm.spec.source_of("in_chans").startswith("attribute: config.num_channels")
    assert len(vm.layers) == 1 and vm.spec.grid == (8, 8)     # the last stage: 8 x 8 tokens, global
    assert any("other attention call(s) are not" in w and "(1, 1, 256, 64)" in w for w in words), words
    # what is shown is the last stage's own attention
    x = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = net(pixel_values=x, output_attentions=True).attentions[-1]
    mine = vm.run(x).attentions[0]
    np.testing.assert_allclose(mine, np.asarray(ref).reshape(mine.shape), atol=1e-5)


def test_florence2_davit_spatial_blocks_are_shown_per_stage_exactly(monkeypatch) -> None:
    """Its window attention per stage (own heads; 3 x 3 windows padded on a 16 x 16 grid), exact against the weights
    transformers' own eager attention computes; its channel attention is said and not shown (not spatial)."""
    from transformers.models.florence2 import modeling_florence2 as florence

    config = transformers.Florence2VisionConfig(depths=[1, 1], embed_dim=[16, 32], num_heads=[1, 2],
                                                num_groups=[1, 2], window_size=3, patch_size=[7, 3],
                                                patch_stride=[4, 2], patch_padding=[3, 1],
                                                patch_prenorm=[False, True], projection_dim=32,
                                                attn_implementation="eager")
    net = perturb(transformers.Florence2VisionBackbone(config))
    vm, words = said(lambda: vitviz.load(net, device="cpu", image_size=64))
    assert vm.spec.describe_blocks() == ["stage 0 block 0: windowed (3×3)", "stage 1 block 0: windowed (3×3)"]
    assert vm.spec.heads == (1, 2) and [g for g in vm.spec.stage_grids()] == [(16, 16), (8, 8)]
    assert [name for name, _, _ in vm.skipped] == ["blocks.0.0.channel_block.channel_attn",
                                                   "blocks.1.0.channel_block.channel_attn"]
    assert any("attend over channels, not over the image" in w for w in words), words
    seen: list[tuple[object, torch.Tensor]] = []
    own = florence.eager_attention_forward

    def recorded(module, *args, **kwargs):
        out, weights = own(module, *args, **kwargs)
        seen.append((module, weights.detach()))
        return out, weights

    monkeypatch.setattr(florence, "eager_attention_forward", recorded)
    x = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        out = net(x)
    monkeypatch.setattr(florence, "eager_attention_forward", own)
    refs = [w for m, w in seen if isinstance(m, florence.Florence2VisionWindowAttention)]
    r = vm.run(x)
    assert [b.shape for b in r.blocks] == [(36, 1, 9, 9), (9, 2, 9, 9)]
    for i, (mine, ref) in enumerate(zip(r.blocks, refs, strict=True)):
        np.testing.assert_allclose(mine, ref.numpy(), atol=1e-5, err_msg=f"block {i}")
    np.testing.assert_allclose(r.features, out.last_hidden_state[0].mean(dim=(-2, -1)).numpy(), atol=1e-5)


class OnlyWindows(torch.nn.Module):
    """Attention only inside 2 x 2 windows of a 4 x 4 grid of 8 px patches, as (B, H, windows, n, n) scores."""

    def __init__(self) -> None:
        super().__init__()
        self.patch_embed = torch.nn.Conv2d(3, 16, 8, 8)
        self.qkv = torch.nn.Linear(16, 48)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = self.patch_embed(x).flatten(2).transpose(1, 2)                        # (B, 16, 16)
        q, k, v = self.qkv(t).reshape(x.shape[0], 4, 4, 3, 2, 8).permute(3, 0, 4, 2, 1, 5)   # (B, H, 4, 4, 8)
        a = (q @ k.transpose(-1, -2)).softmax(dim=-1)
        return (a @ v).mean(dim=(1, 2, 3))


def test_a_model_with_attention_only_inside_windows_is_refused_naming_them() -> None:
    with pytest.raises(NoAttentionError) as e:
        vitviz.load(OnlyWindows().eval(), device="cpu", live=True)
    msg = str(e.value)
    assert "<OnlyWindows object>" in msg and "inside windows" in msg and "(1, 2, 4, 4, 4)" in msg
    assert "Next:" in msg and "no route yet" in msg


def test_a_channels_property_that_fails_states_nothing() -> None:
    """The zoo sweep after the merge: rf_detr_dinov2, lw_detr_vit and pixio crashed the live path with an IndexError
    raised by a transformers backbone's `channels` property, read while looking for the input channels."""
    from torch import nn

    from vitviz.core.running.live.describe import _stated_channels

    class Backbone(nn.Module):
        num_channels = 3

        @property
        def in_chans(self) -> int:        # read first; raises as transformers' backbone `channels` did
            return [][0]

    assert _stated_channels(Backbone()) == (3, "attribute: num_channels")


def test_volo_is_refused_live_not_shown_wrong() -> None:
    """The zoo sweep after the merge: VOLO's live maps matched none of its layers' own softmax (outlook attention):
    refused, naming the module kind, instead of shown."""
    pytest.importorskip("timm")

    import vitviz

    from timm.models.volo import VOLO

    model = VOLO(layers=(1, 1, 1, 1), img_size=64, embed_dims=(32, 64, 64, 64), num_heads=(1, 2, 2, 2),
                 num_classes=5, stem_hidden_dim=16)
    with pytest.raises(vitviz.VitvizError, match="OutlookAttention .* shows nothing rather than a wrong map"):
        vitviz.load(model.eval())
