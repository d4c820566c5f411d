"""The geometry and maps of windowed attention (vitviz.core.winspec / winmaps), on hand-built reference models:
every window token's grid cell is where the model took it from (both pad/roll orders, with shifts and padding),
a query's window map holds its whole row, the stitched received map of a global block is the plain ViT's mean map,
and rollout is refused across Swin's patch merging with the reason."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from _windowed import swin_spec, sam_spec, model_of, x_for
from vitviz.core.analyses import analysis, winmaps
from vitviz.core.analyses.maps import SelectionError
from vitviz.core.running.windowed import WindowedNet
from vitviz.core.winspec import WindowedSpec










@pytest.mark.parametrize("order, rule", [("pad_roll", "fits"), ("roll_pad", "built")])
@pytest.mark.parametrize("size", [(64, 64), (80, 68), (44, 52)])
def test_positions_are_where_the_model_cuts(order: str, rule: str, size: tuple[int, int]) -> None:
    """Feed each block a grid of cell numbers and read what its attention receives as window tokens."""
    spec = swin_spec(order, rule)
    net = WindowedNet(spec)
    geo = spec.geometry(size)
    for g in geo:
        assert sorted(p for p in g.positions.ravel() if p >= 0) == list(range(g.grid[0] * g.grid[1]))
        assert (g.positions < 0).sum() == g.padded[0] * g.padded[1] - g.grid[0] * g.grid[1]
        block = net.all_blocks()[g.block]
        seen = []
        block.attn.forward = lambda x, _g, _m: (seen.append(x[..., 0].clone()), torch.zeros_like(x))[1]
        cells = torch.arange(1, g.grid[0] * g.grid[1] + 1, dtype=torch.float32).reshape(1, *g.grid, 1)
        block.windows(cells.expand(1, *g.grid, spec.dims[g.stage]).contiguous(), g)
        np.testing.assert_array_equal(seen[0].numpy().astype(int) - 1, g.positions, err_msg=g.describe())


def test_shift_mask_regions_match_the_wrap() -> None:
    """In a shifted window rolled across the edge, the cells from the two sides are different regions."""
    g = swin_spec().geometry()[1]
    labels = winmaps.region_labels(g)
    last = winmaps.window_labels(g) == g.num_windows - 1      # the corner window, rolled across both edges
    assert len(set(labels[last].ravel())) == 4
    assert len(set(winmaps.region_labels(swin_spec().geometry()[0]).ravel())) == g.num_windows


@pytest.mark.parametrize("size", [(64, 64), (80, 68)])
def test_query_map_holds_the_whole_row(size: tuple[int, int]) -> None:
    result = model_of(swin_spec()).run(x_for(size))
    for b, g in enumerate(result.geometry):
        for cell in [(0, 0), (g.grid[0] - 1, g.grid[1] - 1), (g.grid[0] // 2, 1)]:
            m = winmaps.query_map(result.blocks[b], g, cell)
            total = m.reshape(m.shape[0], -1).sum(axis=1) + winmaps.padding_share(result.blocks[b], g, cell)
            np.testing.assert_allclose(total, 1.0, atol=1e-5)
            inside = winmaps.window_labels(g) == winmaps.window_labels(g)[cell]
            assert not m[:, ~inside].any()     # nothing outside the query's window
    with pytest.raises(SelectionError, match="outside"):
        winmaps.query_map(result.blocks[0], result.geometry[0], (99, 0))


def test_received_of_a_global_block_is_the_plain_mean_map() -> None:
    result = model_of(sam_spec()).run(x_for((48, 56)))
    g = result.geometry[1]
    assert g.is_global and g.describe() == "global (6×7)"
    dense = result.blocks[1][0][None]                       # (1, H, N, N): one window, the whole grid
    plain = analysis.attention_received(dense, 0, "mean")[0].reshape(-1, *g.grid)
    np.testing.assert_allclose(winmaps.received_map(result.blocks[1], g), plain, atol=1e-6)
    windowed = winmaps.received_map(result.blocks[0], result.geometry[0])
    assert windowed.shape == (2, 6, 7) and np.isfinite(windowed).all()


def test_stacks_by_stage_and_dense_rows() -> None:
    result = model_of(swin_spec()).run(x_for((64, 64)))
    stack = winmaps.received_stack(result, 1)
    assert stack.maps.shape == (2, 2 + 2, 8, 8)            # stage 1: 2 blocks, 2 heads + mean + max, 8x8 grid
    q = winmaps.query_stack(result, 1, (5, 9))              # first-stage cell (5, 9) -> stage-1 cell (2, 4)
    np.testing.assert_allclose(q.maps[1, :2], winmaps.query_map(result.blocks[3], result.geometry[3], (2, 4)))
    g = result.geometry[3]
    dense = winmaps.dense_block(result.blocks[3], g, "mean")
    np.testing.assert_allclose(dense[2 * 8 + 4], winmaps.query_map(result.blocks[3], g, (2, 4)).mean(0).ravel(),
                               atol=1e-6)
    with pytest.raises(SelectionError, match="stage 2 out of range"):
        winmaps.received_stack(result, 2)


def test_rollout_within_a_stage_not_across_merging() -> None:
    swin = model_of(swin_spec()).run(x_for((64, 64)))
    assert "patch merging" in winmaps.rollout_unavailable(swin.spec)
    assert winmaps.rollout_unavailable(swin.spec, stage=0) is None
    assert winmaps.rollout_stack(swin, 0).maps.shape == (2, 3, 16, 16)
    sam = model_of(sam_spec()).run(x_for((48, 56)))
    assert winmaps.rollout_unavailable(sam.spec) is None
    rolled = winmaps.rollout_stack(sam, 0, cell0=(2, 3))
    assert rolled.maps.shape == (3, 3, 6, 7)
    np.testing.assert_allclose(rolled.maps[:, 0].reshape(3, -1).sum(axis=1), 1.0, atol=1e-5)


def test_windowed_spec_fields_are_classified_and_audited() -> None:
    """Every field of WindowedSpec is a setting that changes the computation or one that does not (the list the
    audit walks is whole), and the audit finds a setting without a source and an identity nobody stated."""
    import dataclasses

    from vitviz.core.winspec import COMPUTE_FIELDS, OTHER_FIELDS, audit

    assert {f.name for f in dataclasses.fields(WindowedSpec)} == set(COMPUTE_FIELDS) | set(OTHER_FIELDS)
    problems = audit(swin_spec())
    assert any(p.startswith("windows: no provenance") for p in problems)
    assert any(p.startswith("identity") for p in problems)
    sourced = dataclasses.replace(swin_spec(), provenance=tuple(
        (name, "shape: test") for name in COMPUTE_FIELDS) + (("identity", "named: test"), ("order", "family: test")))
    assert audit(sourced) == [] and sourced.assumptions == ()   # a named model's family settings are its facts
    unnamed = dataclasses.replace(sourced, provenance=tuple(p for p in sourced.provenance if p[0] != "identity")
                                  + (("identity", "derived: the key layout"),))
    assert [n for n, _ in unnamed.assumptions] == ["order"] and audit(unnamed) == []
