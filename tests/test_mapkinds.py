"""The one table of map kinds (`vitviz.core.analyses.mapkinds`): what each kind needs, and "can this model give it?"."""
from __future__ import annotations

import pytest

from vitviz.batch.plan import check_maps, parse_maps
from vitviz.core.analyses import maps
from vitviz.core.analyses.mapkinds import KINDS, WINDOW_UNSHOWN, info, unavailable
from vitviz.core.analyses.maps import MapKind, SelectionError
from vitviz.core.spec import ModelSpec


def spec(**fields: object) -> ModelSpec:
    base: dict[str, object] = dict(family="test", source="x", image_size=(32, 32), patch_size=8, embed_dim=32,
                                   depth=2, num_heads=4)
    base.update(fields)
    return ModelSpec(**base)  # type: ignore[arg-type]


def test_every_kind_has_one_row_and_maps_reads_it() -> None:
    assert set(KINDS) == set(maps.ALL_KINDS)
    assert set(WINDOW_UNSHOWN) <= set(KINDS)
    for name in ("cls", "mean", "max", "rollout", "rollout:3", "token:2", "pool", "rollout:pool", "relevance",
                 "gradrollout:tabby", "attngrad:3", "pca", "norms", "text:a cat", "received", "query:4"):
        kind = MapKind.parse(name)
        row = info(kind)
        assert (kind.source, kind.per_layer, kind.per_head) == (row.source, row.per_layer, row.per_head), name
    # the whole-model kinds (files named Lall) are the ones without layers
    assert {k for k, row in KINDS.items() if not row.per_layer} == set(maps.WHOLE_MODEL_KINDS)
    assert KINDS["text"].needs >= {"gradients", "text_tower"} and KINDS["text"].arg == "prompt"
    assert {k for k, row in KINDS.items() if "gradients" in row.needs} == set(maps.GRADIENT_KINDS) | {"text"}
    assert {k for k, row in KINDS.items() if "map_head" in row.needs} == set(maps.POOL_KINDS)


def test_unavailable_answers_what_export_refuses() -> None:
    plain = spec()
    assert unavailable(MapKind.parse("mean"), plain) is None
    assert unavailable(MapKind.parse("cls"), plain) is None
    assert "no CLS token" in str(unavailable(MapKind.parse("cls"), spec(cls_token=False, pooling="avg")))
    assert "MAP pooling head" in str(unavailable(MapKind.parse("pool"), plain))
    assert "out of range" in str(unavailable(MapKind.parse("rollout:99"), plain))
    assert "text embedding" in str(unavailable(MapKind.parse("text:a cat"), plain))
    assert "windowed" in str(unavailable(MapKind.parse("received"), plain))
    for name in ("pool", "rollout:99", "text:a cat", "query:1"):   # export refuses with the same words
        why = unavailable(MapKind.parse(name), plain)
        with pytest.raises(SelectionError) as raised:
            check_maps(parse_maps(name), plain)
        assert str(raised.value) == why


def test_unavailable_of_a_word_is_what_the_model_cannot_give_whatever_is_selected() -> None:
    plain, pooled, live = spec(), spec(pooling="map", cls_token=False), spec(family="live")
    assert unavailable("mean", plain) is None and unavailable("cls", spec(cls_token=False, pooling="avg")) is None
    assert "MAP pooling head" in str(unavailable("pool", plain)) and unavailable("pool", pooled) is None
    assert unavailable("poolrollout", pooled) is None and unavailable("poolrollout", plain) is not None
    for kind in ("relevance", "gradrollout", "attngrad", "text", "pca", "norms"):
        assert unavailable(kind, plain) is None
        assert "reference ViT" in str(unavailable(kind, live)), kind
        assert "reference ViT" in str(unavailable(kind, plain, frozenset({"attention"}))), kind
    for kind in ("cls", "mean", "max", "rollout", "token"):   # a model run from its own code gives its attention
        assert unavailable(kind, live) is None
    assert "windowed" in str(unavailable("received", plain))


def test_export_refuses_the_reference_only_kinds_of_a_model_run_from_its_own_code() -> None:
    from vitviz.cli.export import _check_passes
    from vitviz.errors import VitvizError

    class Own:
        net = object()   # not vitviz's reference ViT

    _check_passes(Own(), parse_maps("cls,mean,max,rollout,token:1"))
    for name in ("relevance", "gradrollout:2", "attngrad", "pool", "rollout:pool", "pca", "norms", "text:a cat"):
        with pytest.raises(VitvizError, match="need vitviz's reference ViT"):
            _check_passes(Own(), parse_maps(name))
