"""The view model of windowed results (vitviz.core.analyses.winview), on tiny reference models with random weights: the
stitched received map against a hand computation from each window's attention (windows found here from the
roll, not from the library's geometry), a shifted block's query map against the model's own softmax rows, the
window outlines of small grids (count and place, the shift mask's regions on them), the overview against the
plain-ViT statistics on a global block and closed forms, the Model-info rows, rollout (refused across patch
merging, SAM's global blocks only), and the holder's arrays against `vitviz export --npz`."""
from __future__ import annotations

import itertools
import math
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from _windowed import swin_spec, sam_spec, model_of, x_for
from parity_refs import perturb
from vitviz.core.analyses import analysis, winmaps, winview
from vitviz.core.analyses.maps import MapKind, SelectionError
from vitviz.core.winspec import BlockGeometry
from vitviz.core.analyses.winview import RolloutUndefined, WindowedMaps










@pytest.fixture(scope="module")
def swin_run():
    model = model_of(swin_spec())
    return model, model.run(x_for((64, 64)))


def windows_by_roll(grid: int, window: int, shift: int) -> dict[tuple[int, int], tuple[int, int]]:
    """(row, col) -> (window, token) of a square grid whole in windows, rolled by -shift as the models do:
    rolled cell (i, j) holds cell ((i + shift) % grid, (j + shift) % grid)."""
    out = {}
    per = grid // window
    for i, j in itertools.product(range(grid), repeat=2):
        cell = ((i + shift) % grid, (j + shift) % grid)
        out[cell] = ((i // window) * per + j // window, (i % window) * window + j % window)
    return out


# ------------------------------------------------------------------------------------------ the two maps

def test_received_is_stitched_from_the_windows(swin_run) -> None:
    """Per key cell: the mean over its window's queries of their attention to it, windows found from the roll."""
    _, result = swin_run
    maps = WindowedMaps(result)
    for stage, grid in ((0, 16), (1, 8)):
        stack = maps.stack("received", stage)
        assert stack.maps.shape == (2, result.spec.heads[stage] + 2, grid, grid)
        for index, block in enumerate(winmaps.stage_blocks(result, stage)):
            attn = result.blocks[block]
            shift = 2 if index == 1 else 0
            assert result.geometry[block].shift == (shift, shift)
            slots = windows_by_roll(grid, 4, shift)
            want = np.zeros((attn.shape[1], grid, grid))
            for (r, c), (w, t) in slots.items():
                want[:, r, c] = attn[w, :, :, t].mean(axis=-1)     # every query of the window (no padding)
            heads = attn.shape[1]
            np.testing.assert_allclose(stack.maps[index, :heads], want, rtol=1e-5, atol=1e-7)
            np.testing.assert_allclose(stack.maps[index, heads], want.mean(0), rtol=1e-5, atol=1e-7)
            np.testing.assert_allclose(stack.maps[index, heads + 1], want.max(0), rtol=1e-5, atol=1e-7)
    assert maps.layers("received", 1) == [2, 3] and maps.stride(1) == 8


def test_query_of_a_shifted_block_is_its_windows_row(swin_run) -> None:
    """Corner patch (0, 0) in the shifted block 1: its window wraps over all four corners of the image; the map
    is the model's own softmax row, each key at its cell, read from the probe here."""
    model, result = swin_run
    kept: list[torch.Tensor] = []
    probe = model.net.all_blocks()[1].attn.probe
    handle = probe.register_forward_hook(lambda _m, _i, out: kept.append(out.detach().clone()))
    try:
        with torch.no_grad():
            model.net(x_for((64, 64)))
    finally:
        handle.remove()
    own = kept[0].numpy()                                        # (windows, heads, n, n)
    slots = windows_by_roll(16, 4, 2)
    w, t = slots[(0, 0)]
    stack = WindowedMaps(result).stack("query:0", 0)
    got = stack.maps[1, 0]                                      # block 1 of stage 0, head 0
    want = np.zeros((16, 16), np.float32)
    for (r, c), (w2, t2) in slots.items():
        if w2 == w:
            want[r, c] = own[w, 0, t, t2]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-8)
    window_cells = {cell for cell, (w2, _) in slots.items() if w2 == w}
    assert window_cells == {(r, c) for r in (14, 15, 0, 1) for c in (14, 15, 0, 1)}   # wrapped over the corners
    assert math.isclose(float(got.sum()), 1.0, rel_tol=1e-5)
    # the shift mask: the query attends (almost) only to its own region, the 2 x 2 corner it is in
    assert got[:2, :2].sum() > 0.999 and got[14:, 14:].sum() < 1e-6
    # its window's outline is the four 2 x 2 corner pieces, four sides each
    outline = as_set(WindowedMaps(result).query_outline(1, (0, 0)))
    assert len(outline) == 16 and {((0, 2), (2, 2)), ((2, 0), (2, 2)), ((14, 14), (16, 14))} <= outline


# ------------------------------------------------------------------------------------------ outlines

def geometry(grid: int, window: int, shift: int, order: str = "pad_roll") -> BlockGeometry:
    padded = -(-grid // window) * window
    return BlockGeometry(0, 0, 0, (grid, grid), (window, window), (shift, shift), (padded, padded), order, False, 4)


def as_set(segments: np.ndarray) -> set[tuple[tuple[float, float], tuple[float, float]]]:
    return {tuple(map(tuple, s.tolist())) for s in segments}


def border(n: int) -> set:
    return {((0, 0), (n, 0)), ((0, n), (n, n)), ((0, 0), (0, n)), ((n, 0), (n, n))}


def test_window_outlines_of_a_tiny_grid() -> None:
    plain = winview.window_outlines(geometry(8, 4, 0))
    assert len(plain) == 6 and as_set(plain) == border(8) | {((0, 4), (8, 4)), ((4, 0), (4, 8))}
    shifted = winview.window_outlines(geometry(8, 4, 2))        # the shift moves the cuts to 2 and 6
    assert len(shifted) == 8
    assert as_set(shifted) == border(8) | {((0, y), (8, y)) for y in (2, 6)} | {((x, 0), (x, 8)) for x in (2, 6)}
    padded = winview.window_outlines(geometry(6, 4, 0))         # a 6 x 6 grid in 8 x 8 of windows: cut at 4
    assert as_set(padded) == border(6) | {((0, 4), (6, 4)), ((4, 0), (4, 6))}
    one = winview.window_outlines(BlockGeometry(0, 0, 0, (5, 7), (5, 7), (0, 0), (5, 7), "pad_roll", True, 8))
    assert len(one) == 4                                         # a global block: the border only
    assert np.array_equal(winview.WindowOutlines(0, shifted, 4, (8, 8), "").pixels(), shifted * 4)


@pytest.mark.parametrize("grid, window, shift, order", [(8, 4, 2, "pad_roll"), (14, 7, 3, "pad_roll"),
                                                        (6, 4, 2, "pad_roll"), (5, 4, 2, "roll_pad"),
                                                        (10, 4, 2, "roll_pad")])
def test_shift_mask_regions_lie_on_the_window_outlines(grid: int, window: int, shift: int, order: str) -> None:
    """Cells of one window in different mask regions are never neighbours on the unshifted image."""
    g = geometry(grid, window, shift, order)
    assert as_set(winview.region_outlines(g)) == as_set(winview.window_outlines(g))


# ------------------------------------------------------------------------------------------ overview

def test_overview_closed_forms() -> None:
    """Uniform attention in 4 x 4 windows: entropy log 16, distance the mean over pairs of a 4 x 4 grid."""
    g = geometry(8, 4, 2)
    attn = np.full((4, 3, 16, 16), 1 / 16, np.float32)
    np.testing.assert_allclose(winview.block_entropy(attn, g), np.log(16), rtol=1e-6)
    cells = list(itertools.product(range(4), repeat=2))
    pairs = np.mean([math.dist(a, b) for a in cells for b in cells])
    # the shifted windows hold far cells of the image (the wrapped corners): distance is on the image
    assert not np.allclose(winview.block_distance(attn, g), pairs)
    np.testing.assert_allclose(winview.block_distance(attn, geometry(8, 4, 0)), pairs, rtol=1e-6)


def test_overview_of_a_global_block_is_the_plain_statistics() -> None:
    model = model_of(sam_spec())
    result = model.run(x_for((48, 56)))
    view = WindowedMaps(result).overview()
    assert view.blocks == (0, 1, 2) and view.distance.shape == (3, 2) and "global (6×7)" in view.labels[1]
    plain = result.blocks[1][0][None]                            # (1, H, T, T): one window of the whole grid
    np.testing.assert_allclose(view.distance[1], analysis.mean_attention_distance(plain, (6, 7), 1.0, 0)[0],
                               rtol=1e-5)
    np.testing.assert_allclose(view.entropy[1], analysis.attention_entropy(plain, num_prefix=0)[0], rtol=1e-5)
    assert np.all(view.entropy[[0, 2]] <= np.log(16) + 1e-6) and np.all(np.isfinite(view.distance))


# ------------------------------------------------------------------------------------------ info, rollout

def test_stage_rows() -> None:
    rows = dict(winview.info_rows(swin_spec()))
    assert rows["architecture"] == "Swin: 2 stages, 4 blocks"
    assert rows["stage 0"] == "2 blocks, 1 head, width 16, window 4×4 (shift 2), 16×16 tokens of 4 px"
    assert rows["stage 1"] == "2 blocks, 2 heads, width 32, window 4×4 (shift 2), 8×8 tokens of 8 px"
    assert rows["stage 0 block 1 (block 1)"] == "windowed (4×4, shift 2)"
    assert rows["stage 1 block 0 (block 2)"] == "windowed (4×4)"
    sam = dict(winview.info_rows(sam_spec()))
    assert sam["architecture"] == "SAM / ViTDet image encoder: 1 stage, 3 blocks (1 global)"
    assert sam["stage 0"] == "3 blocks, 2 heads, width 16, window 4×4, 1 global, 6×7 tokens of 8 px"
    assert sam["stage 0 block 1 (block 1)"] == "global (6×7)"
    # at a run's own size the rows say what ran: a 4 x 4 grid of stage 1 is one window, no shift (torchvision)
    small = dict(winview.info_rows(swin_spec(), swin_spec().geometry((32, 32))))
    assert small["stage 1"] == "2 blocks, 2 heads, width 32, window 4×4, 4×4 tokens of 8 px"


def test_rollout_refused_across_merging_and_within_global_blocks(swin_run) -> None:
    _, result = swin_run
    maps = WindowedMaps(result)
    with pytest.raises(RolloutUndefined, match="patch merging"):
        maps.stack("rollout")
    assert "patch merging" in maps.rollout_reason()
    assert maps.stack("rollout", 1).maps.shape == (2, 3, 8, 8) and maps.rollout_reason(1) is None
    with pytest.raises(RolloutUndefined, match="no global blocks"):
        maps.rollout(0, blocks="global")
    sam = WindowedMaps(model_of(sam_spec()).run(x_for((48, 56))))
    assert sam.rollout_reason() is None and sam.layers("rollout", blocks="global") == [1]
    only = sam.rollout(blocks="global")
    a = sam.result.blocks[1][0].mean(axis=0)                     # (T, T) heads fused by the mean
    layer = 0.5 * np.eye(42) + 0.5 * a
    layer /= layer.sum(axis=1, keepdims=True)
    want = np.full(42, 1 / 42) @ layer                           # the mean of the patch queries, one layer
    np.testing.assert_allclose(only.maps[0, 0].ravel(), want, rtol=1e-5)
    assert sam.stack("rollout").maps.shape == (3, 3, 6, 7)       # all blocks, windowed ones block-diagonal


def test_holder_kinds_and_memory(swin_run) -> None:
    _, result = swin_run
    maps = WindowedMaps(result)
    before = maps.nbytes
    assert before == result.nbytes
    maps.precompute()
    assert maps.nbytes > before
    with pytest.raises(SelectionError, match="not a windowed model's view"):
        maps.stack(MapKind("cls"))
    with pytest.raises(SelectionError, match="stage 2 out of range"):
        maps.stack("received", 2)
    assert maps.received(0, "max").maps.shape == maps.stack("received", 0).maps.shape


def test_holder_arrays_are_the_exports_npz(tmp_path: Path) -> None:
    """`vitviz export --npz` writes exactly `WindowedMaps.arrays()` of the same image."""
    timm = pytest.importorskip("timm")
    from PIL import Image
    from timm.models import save_for_hf

    import vitviz
    from vitviz.cli import main

    kw = dict(img_size=64, embed_dim=16, depths=(2, 2), num_heads=(1, 2), window_size=4, num_classes=5)
    torch.manual_seed(0)
    net = perturb(timm.create_model("swin_tiny_patch4_window7_224", pretrained=False, **kw))
    folder, images = tmp_path / "swin", tmp_path / "images"
    images.mkdir()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        save_for_hf(net, str(folder), safe_serialization=True, model_args=kw)
    image = images / "a.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (70, 90, 3), dtype=np.uint8)).save(image)
    out = tmp_path / "maps"
    assert main(["export", "--model", str(folder), str(images), "--out", str(out), "--maps", "received",
                 "--layers", "last", "--npz", "--quiet"]) == 0
    held = WindowedMaps(vitviz.load(folder, device="cpu").run(image)).arrays()
    with np.load(out / "a.npz") as npz:
        assert sorted(npz.files) == sorted(held)
        for name in held:
            if name == "source":
                assert Path(str(npz[name])).name == Path(str(held[name])).name == "a.png"
                continue
            assert npz[name].dtype == held[name].dtype and np.array_equal(npz[name], held[name]), name


@pytest.mark.parametrize("chunk", [1500, 600, 300, 20, 5])   # windows, one window, heads, rows
def test_overview_in_pieces_is_the_same(chunk: int, monkeypatch: pytest.MonkeyPatch, swin_run) -> None:
    """The overview made a few windows, heads or query rows at a time (SAM's global blocks) is the whole one."""
    _, result = swin_run
    whole = WindowedMaps(result).overview(1)
    monkeypatch.setattr(winview, "CHUNK", chunk)
    pieces = WindowedMaps(result).overview(1)
    np.testing.assert_allclose(pieces.distance, whole.distance, rtol=1e-6)
    np.testing.assert_allclose(pieces.entropy, whole.entropy, rtol=1e-6)


def test_key_is_the_column_of_its_patch_in_each_window(swin_run) -> None:
    """key:N of a windowed model: the attention patch N receives from each query of its window (the column of
    the window's attention), at each query's cell; the view answers it as any kind, with its stage's stride."""
    _model, result = swin_run
    maps = WindowedMaps(result)
    token = 3 * 16 + 5                                           # first-stage cell (3, 5)
    for block in range(len(result.geometry)):
        g = result.geometry[block]
        stack, row, stride = maps.view(f"key:{token}", block)
        assert (row, stride) == (g.index, g.stride) and stack.maps.shape[-2:] == g.grid
        cell = winmaps.stage_cell(result.spec, g.stage, (3, 5))
        w, t = g.slot_of[cell[0] * g.grid[1] + cell[1]]
        want = np.zeros((stack.num_heads, g.grid[0] * g.grid[1]), np.float32)
        for q, pos in enumerate(g.positions[w]):
            if pos >= 0:
                want[:, pos] = result.blocks[block][w, :, q, t]
        np.testing.assert_array_equal(stack.maps[row, :-2], want.reshape(-1, *g.grid))
    query = maps.view(f"query:{token}", 0)[0].maps[0, 0]
    key = maps.view(f"key:{token}", 0)[0].maps[0, 0]
    assert not np.array_equal(query, key)                            # a row and a column of one window
    assert maps.unshown(MapKind.parse("key:1")) is None and maps.picks(MapKind.parse("key:1"))[0] == (0, 0)
    with pytest.raises(SelectionError, match="out of range"):
        maps.view("key:999", 0)
