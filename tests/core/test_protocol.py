"""What a model can do (`vitviz.core.protocol`): a windowed model states the WINDOWS capability, and the one adapter
(`windowed`, `capabilities_of_spec`) answers for a model, its spec, its result and its per-image holder alike, so no
other code asks the class or a flag."""
from __future__ import annotations

import dataclasses

import numpy as np
from _windowed import model_of, swin_spec, x_for

from vitviz.core.analyses.maps import MapKind, ResultMaps
from vitviz.core.analyses.winview import WindowedMaps, holder_of
from vitviz.core.protocol import (ATTENTION, CAPABILITIES, REFERENCE, WINDOWS, capabilities_of, capabilities_of_spec,
                                  windowed)
from vitviz.core.spec import AttentionResult, ModelSpec


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
