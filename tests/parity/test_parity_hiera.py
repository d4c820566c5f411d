"""Hiera run by its own code (issue 31): its attention inside mask units and over its last stages, captured where
transformers and timm compute it, shown per stage on windows of the stage's grid -- exact against transformers'
own eager attention (`output_attentions`), each token placed by transformers' own unroll and pooling; the blocks
that pool their queries are listed as not shown, and the mask-unit blocks are windowed (not global)."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import vitviz
from parity_refs import perturb
from vitviz.core.running.live import LiveWarning
from vitviz.core.running.live.stages import StagedModel

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.filterwarnings("ignore::vitviz.core.spec.GuessWarning")
ATOL = 1e-5


def hf_hiera() -> torch.nn.Module:
    config = transformers.HieraConfig(embed_dim=16, image_size=[64, 64], patch_size=[7, 7], patch_stride=[4, 4],
                                      patch_padding=[3, 3], depths=[1, 2, 2, 1], num_heads=[1, 2, 2, 4],
                                      embed_dim_multiplier=2.0, num_query_pool=2, query_stride=[2, 2],
                                      masked_unit_size=[8, 8], masked_unit_attention=[True, True, False, False],
                                      attn_implementation="eager")
    torch.manual_seed(0)
    return perturb(transformers.HieraModel(config))


def reference_cells(net: torch.nn.Module) -> torch.Tensor:
    """(N, 2) the (row, col) of each stage-0 token in the order the model keeps them: transformers' own `unroll`
    applied to the cells' coordinates."""
    from transformers.models.hiera.modeling_hiera import unroll

    rows, cols = torch.meshgrid(torch.arange(16.0), torch.arange(16.0), indexing="ij")
    coords = torch.stack([rows.flatten(), cols.flatten()], dim=-1)[None]                   # (1, 256, 2)
    return unroll(coords, image_shape=[64, 64], patch_stride=[4, 4], schedule=net.unroll_schedule)[0]


def test_hf_hiera_is_shown_per_stage_exactly() -> None:
    net = hf_hiera()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        vm = vitviz.load(net, device="cpu")
    assert isinstance(vm, StagedModel)
    assert any("pool their queries" in str(w.message) for w in caught if issubclass(w.category, LiveWarning))
    # two query poolings (num_query_pool=2): Hiera's fourth stage stays on the third's 4 x 4 grid
    assert vm.spec.describe_blocks() == ["stage 0 block 0: windowed (8×8)", "stage 1 block 0: windowed (4×4)",
                                         "stage 2 block 0: global (4×4)", "stage 2 block 1: global (4×4)"]
    assert [name for name, _, _ in vm.skipped] == ["encoder.stages.1.layers.0.attn", "encoder.stages.2.layers.0.attn"]
    x = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    from transformers.models.hiera.modeling_hiera import HieraMaskUnitAttention

    maps: list[torch.Tensor] = []     # every layer's own weights (output_attentions keeps one per stage)
    hooks = [m.register_forward_hook(lambda _m, _i, o: maps.append(o[1].detach()))
             for m in net.modules() if isinstance(m, HieraMaskUnitAttention)]
    try:
        with torch.no_grad():
            out = net(pixel_values=x, output_attentions=True)
    finally:
        for h in hooks:
            h.remove()
    r = vm.run(x)
    np.testing.assert_allclose(r.features, out.pooler_output[0].numpy(), atol=1e-4)
    cells, grid, shown = reference_cells(net), 16, 0
    for blk, ref in zip([b for s in net.encoder.stages for b in s.layers], maps, strict=True):
        if blk.query_stride > 1:      # transformers' own pooling of the tokens (a max over each 2 x 2 group)
            cells = cells.view(blk.query_stride, -1, 2).amax(dim=0) // 2
            grid //= 2
            continue
        ref = ref[0].numpy()                                                        # (H, W, n, n)
        w, n = ref.shape[1], ref.shape[2]
        geo, mine = r.geometry[shown], r.blocks[shown]
        index = (cells[:, 0] * grid + cells[:, 1]).long().numpy()                  # the grid cell of token t
        slot = geo.slot_of[index]                                                   # (N, 2): vitviz's place of it
        for t_window in range(w):
            tokens = np.arange(n) * w + t_window                                    # place i of window t_window
            win = slot[tokens, 0]
            assert (win == win[0]).all()
            at = slot[tokens, 1]
            np.testing.assert_allclose(mine[win[0]][:, at[:, None], at[None, :]], ref[:, t_window], atol=ATOL,
                                       err_msg=f"block {geo.block} window {t_window}")
        shown += 1
    assert shown == len(r.blocks) == 4


def test_timm_hiera_is_shown_per_stage() -> None:
    timm = pytest.importorskip("timm")
    net = perturb(timm.create_model("hiera_tiny_224", pretrained=False, img_size=64, embed_dim=16, num_heads=1,
                                    stages=(1, 2, 2, 1), num_classes=5))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LiveWarning)
        vm = vitviz.load(net, device="cpu")
    assert isinstance(vm, StagedModel) and vm.spec.heads == (1, 2, 4) and vm.spec.image_size == (64, 64)
    assert vm.hook_points() == list(net.blocks)     # the window's Stop hooks (a windowed net's all_blocks it lacks)
    assert sum(vm.parameter_counts().values()) == sum(p.numel() for p in net.parameters())
    x = torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(2))
    r = vm.run(x)
    with torch.no_grad():
        np.testing.assert_allclose(r.logits, net(x)[0].numpy(), atol=1e-4)
    for block in r.blocks:      # every query's attention over its window sums to 1
        np.testing.assert_allclose(block.sum(-1), 1.0, atol=1e-5)
    assert [g.describe() for g in r.geometry] == ["windowed (8×8)", "windowed (4×4)", "global (4×4)"]
    with pytest.raises(vitviz.VitvizError, match="runs at 64x64 only"):
        vm.run(torch.randn(1, 3, 96, 96))


@pytest.mark.parametrize("route", ["live", "hub folder"])
def test_timm_hiera_verify_compares_what_is_shown_with_timms_own_record(tmp_path, route: str) -> None:
    """verify of a timm Hiera run by its code: each shown block's windows against timm's own softmax of the same
    model (fused attention off), each token placed by the model's own `unroll` -- verified; tokens placed in raster
    order instead (no unroll) differ."""
    timm = pytest.importorskip("timm")
    from timm.models import save_for_hf

    from vitviz.core.running.live import stages

    args = dict(img_size=64, embed_dim=16, num_heads=1, stages=(1, 2, 2, 1), num_classes=5)
    net = perturb(timm.create_model("hiera_tiny_224", pretrained=False, **args))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LiveWarning)
        if route == "live":
            vm = vitviz.load(net, device="cpu")
        else:
            save_for_hf(net, str(tmp_path), model_args=args, safe_serialization=True)
            vm = vitviz.load(tmp_path, device="cpu")
    check = vitviz.verify(vm)
    assert check.verdict == "verified" and check.library == "timm", check.reason
    assert [len(blocks) for blocks in check.per_layer] == [3] and check.max_attention <= 1e-6
    assert check.max_output <= 1e-5 and check.sizes == ((64, 64),)
    vm._placers[0] = stages._unrolled(np.arange(256))      # stage 0's tokens taken as raster order
    wrong = vitviz.verify(vm)
    assert wrong.verdict == "differs" and wrong.first_differing_layer == 0 and wrong.max_attention > 1e-3


def test_hf_hiera_verify_compares_what_is_shown_with_its_own_record() -> None:
    """verify of transformers' HieraModel handed over: each shown block against the softmax its own attention modules
    compute (a copy of its modules sharing its weights), each token placed by transformers' own `unroll` --
    verified against transformers; stage 0's tokens taken in raster order instead differ."""
    from vitviz.core.running.live import stages

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LiveWarning)
        vm = vitviz.load(hf_hiera(), device="cpu")
    check = vitviz.verify(vm)
    assert check.verdict == "verified" and check.library == "transformers", check.reason
    assert [len(blocks) for blocks in check.per_layer] == [4] and check.max_attention <= 1e-6
    assert check.max_output <= 1e-5 and "HieraModel" in check.original
    vm._placers[0] = stages._unrolled(np.arange(256))
    wrong = vitviz.verify(vm)
    assert wrong.verdict == "differs" and wrong.first_differing_layer == 0 and wrong.max_attention > 1e-3
