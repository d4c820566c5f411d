"""What a model can do (`vitviz.core.protocol`): a windowed model states the WINDOWS capability, and the one adapter
(`windowed`, `capabilities_of_spec`) answers for a model, its spec, its result and its per-image holder alike, and a
spec says its own layout (`traits`), so no other code asks the class or a flag."""
from __future__ import annotations

import dataclasses

import numpy as np
from _windowed import model_of, sam_spec, swin_spec, x_for

from vitviz.core.analyses.maps import MapKind, ResultMaps
from vitviz.core.analyses.winview import WHY_NOT, WindowedMaps, holder_of, info_rows
from vitviz.core.protocol import (ATTENTION, CAPABILITIES, REFERENCE, WINDOWS, capabilities_of, capabilities_of_spec,
                                  windowed)
from vitviz.core.spec import PLAIN_TRAITS, AttentionResult, ModelSpec


def test_a_windowed_model_says_so_by_capability_and_every_part_of_it_follows() -> None:
    model = model_of(swin_spec())
    result = model.run(x_for((64, 64)))
    assert capabilities_of(model) == frozenset({WINDOWS}) and WINDOWS in CAPABILITIES
    assert capabilities_of_spec(model.spec) == frozenset({WINDOWS})
    holder = holder_of(result)
    assert isinstance(holder, WindowedMaps)
    assert all(windowed(x) for x in (model, model.spec, result, holder))
    stack, row, stride = holder.view("received", 2)         # the interface a panel asks: block 2 is stage 1's first
    assert (row, stride) == (0, 8) and stack.maps.shape[-2:] == (8, 8)        # its stage's grid and stride
    assert holder.outlines(2) is not None


def test_a_plain_spec_is_the_reference_vit_unless_it_runs_its_own_code() -> None:
    spec = ModelSpec(family="test", source="x", image_size=(32, 32), patch_size=8, embed_dim=32, depth=2, num_heads=4)
    assert capabilities_of_spec(spec) == frozenset({ATTENTION, REFERENCE})
    assert capabilities_of_spec(dataclasses.replace(spec, family="live")) == frozenset({ATTENTION})
    attn = np.full((2, 4, 17, 17), 1 / 17, np.float32)
    result = AttentionResult(attentions=attn, logits=np.zeros(3, np.float32), input=np.zeros((3, 32, 32), np.float32),
                             image=np.zeros((32, 32, 3), np.uint8), spec=spec, source="x")
    holder = holder_of(result)
    assert isinstance(holder, ResultMaps) and not windowed(holder) and not windowed(spec) and not windowed(result)
    stack, row, stride = holder.view("key:3", -1)
    assert (row, stride) == (-1, 8) and holder.outlines(-1) is None and holder.row_blocks(MapKind("key", 3), -1) is None


def _plain_result(depth: int = 3) -> AttentionResult:
    spec = ModelSpec(family="test", source="x", image_size=(32, 32), patch_size=8, embed_dim=32, depth=depth,
                     num_heads=4)
    attn = np.full((depth, 4, 17, 17), 1 / 17, np.float32)
    return AttentionResult(attentions=attn, logits=np.zeros(3, np.float32), input=np.zeros((3, 32, 32), np.float32),
                           image=np.zeros((32, 32, 3), np.uint8), spec=spec, source="x")


def test_the_docks_ask_the_holder_what_it_has_whichever_lane_made_it() -> None:
    """What the rollout, matrix, features and info docks ask (`ImageMaps.rollout_depth`, `query_count`, `why_not`,
    `info_rows`), answered by both holders: a plain ViT's from its whole token matrices, a windowed model's from
    its blocks and first-stage grid."""
    plain = holder_of(_plain_result(3))
    assert plain.rollout_depth == 3 and plain.query_count == 17           # every token, the CLS token included
    assert plain.why_not("matrix") is None and plain.why_not("features") is None and plain.info_rows() == []
    model = model_of(swin_spec())
    result = model.run(x_for((64, 64)))
    swin = holder_of(result)
    assert swin.query_count == 16 * 16                                    # first-stage patches, no prefix token
    assert swin.rollout_depth == 1 and swin.unshown(MapKind("rollout")) is not None     # across patch merging
    assert swin.why_not("matrix") == WHY_NOT["matrix"] and swin.why_not("features") == WHY_NOT["features"]
    assert swin.info_rows() == info_rows(model.spec, result.geometry) and swin.info_rows()
    sam = holder_of(model_of(sam_spec()).run(x_for((48, 56))))
    assert sam.rollout_depth == len(sam.layers("rollout", 0, "global")) == 1 and sam.query_count == 6 * 7


def test_a_spec_says_its_own_layout() -> None:
    """`spec.traits`: blocks over stages (no mean over them, 'block' on an axis, no plain-ViT settings) for a windowed
    spec; a position table asked for unless a windowed model has none; what a plain ViT's spec (and the window
    before any model) says otherwise."""
    plain = _plain_result().spec
    t = plain.traits
    assert (t.blocks, t.plain_settings, t.pos_table, t.layer_word, t.layer_mean) == (False, True, True, "layer", True)
    assert t == PLAIN_TRAITS
    swin = swin_spec().traits
    assert (swin.blocks, swin.plain_settings, swin.pos_table, swin.layer_word, swin.layer_mean) == (
        True, False, False, "block", False)
    assert sam_spec().traits.pos_table and model_of(sam_spec()).spec.traits.blocks     # SAM's absolute table
    for spec in (plain, swin_spec(), sam_spec()):    # the spec's own word agrees with the one lane adapter
        assert spec.traits.blocks == windowed(spec) == (WINDOWS in capabilities_of_spec(spec))
