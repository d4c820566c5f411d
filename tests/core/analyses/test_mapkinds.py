"""The one table of map kinds (`vitviz.core.analyses.mapkinds`): what each kind needs, and "can this model give it?"."""
from __future__ import annotations

import numpy as np
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


def test_the_argument_column_drives_the_parser_labels_and_query_rows() -> None:
    assert {k for k, row in KINDS.items() if row.arg == "token"} == {"rollout", "token", "key", "query"}
    assert {k for k, row in KINDS.items() if row.arg == "class"} == set(maps.GRADIENT_KINDS)
    assert {k for k, row in KINDS.items() if row.arg == "prompt"} == {"text"}
    for name, kind, token, label, row in (("key:5", "key", 5, "key5", None), ("token:3", "token", 3, "token3", 3),
                                          ("query:2", "query", 2, "query2", None), ("cls", "cls", None, "cls", 0)):
        parsed = MapKind.parse(name)
        assert (parsed.kind, parsed.token, parsed.label, parsed.query_row) == (kind, token, label, row), name
    assert MapKind.parse("rollout:4").query == 4 and MapKind.parse("rollout:4").token is None
    assert MapKind.parse("Text:A Cat").target == "A Cat" and MapKind.parse("prompt: a  cat").target == "a cat"
    for bad, why in (("key", "expected key:N"), ("key:x", "expected key:N"), ("cls:3", "expected cls"),
                     ("relevance:", "class index or label"), ("text:", "needs a prompt")):
        with pytest.raises(SelectionError, match=why):
            MapKind.parse(bad)
    with pytest.raises(SelectionError, match="needs query token"):
        MapKind("key")


def test_a_new_row_with_a_token_argument_is_parsed_checked_and_labelled(monkeypatch: pytest.MonkeyPatch) -> None:
    """A kind that takes a token is its table row: the parser, labels, the range check and `unavailable` read it."""
    from vitviz.core.analyses import mapkinds

    row = mapkinds._k("probe:N", "attention", True, True, "a test row", arg="token", reads="column")
    monkeypatch.setitem(mapkinds.KINDS, "probe", row)
    monkeypatch.setattr(maps, "ALL_KINDS", tuple(mapkinds.KINDS))
    kind = MapKind.parse("probe:7")
    assert (kind.kind, kind.token, kind.label, kind.query_row) == ("probe", 7, "probe7", None)
    assert "probe:N" in mapkinds.maps_help()
    assert "probe:99 out of range" in str(unavailable(MapKind.parse("probe:99"), spec()))
    assert unavailable(kind, spec()) is None


def test_windowed_models_are_asked_by_capability() -> None:
    from vitviz.core.protocol import WINDOWS
    from vitviz.core.analyses.mapkinds import WINDOWED_KINDS

    assert WINDOWED_KINDS == ("rollout", "key", "received", "query")
    plain = spec()
    for name in WINDOWED_KINDS:
        assert unavailable(name, plain, frozenset({WINDOWS})) is None
    for name in ("cls", "mean", "token", "entropy", "relevance", "pool"):
        assert "windowed model" in str(unavailable(name, plain, frozenset({WINDOWS}))), name
    assert unavailable(MapKind.parse("key:999"), plain, frozenset({WINDOWS})) is None   # its own grid checks it
    assert "out of range" in str(unavailable(MapKind.parse("key:999"), plain))


def test_key_map_is_the_attention_column_of_its_token_from_every_patch_query() -> None:
    from vitviz.core.analyses.maps import map_stack

    s = spec()                                          # 4x4 patches + CLS: 17 tokens, 2 layers, 4 heads
    rng = np.random.default_rng(0)
    attn = rng.random((2, 4, 17, 17)).astype(np.float32)
    attn /= attn.sum(-1, keepdims=True)
    for token in (0, 5, 16):
        stack = map_stack(attn, MapKind.parse(f"key:{token}"), s)
        for layer in range(2):
            for head in range(4):
                want = np.array([attn[layer, head, 1 + i, token] for i in range(16)]).reshape(4, 4)
                np.testing.assert_array_equal(stack.maps[layer, head], want)
        np.testing.assert_allclose(stack.select(1, "mean"), attn[1, :, 1:, token].mean(0).reshape(4, 4), rtol=1e-6)
        assert stack.title == f"attention paid to token {token}"
    with pytest.raises(ValueError, match="whole attention matrices"):     # a column needs every query's row
        map_stack(attn[:, :, :1], MapKind("key", 3), s, rows=[0])
    assert MapKind("key", 3).query_row is None
