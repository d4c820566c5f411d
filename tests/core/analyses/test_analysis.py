"""Tests for vitviz.core.analyses.analysis: hand-computed cases, fast == naive rollout, prefix and grid handling."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from vitviz.core.analyses import analysis as an
from vitviz.core.spec import AttentionResult, ModelSpec
from vitviz.errors import VitvizError


def random_attention(layers: int, heads: int, tokens: int, seed: int = 0) -> np.ndarray:
    """(L, H, T, T) float32 row-stochastic attention from a softmax of random logits."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(scale=2.0, size=(layers, heads, tokens, tokens))
    attn = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return (attn / attn.sum(axis=-1, keepdims=True)).astype(np.float32)


def make_result(attn: np.ndarray, **spec_fields: object) -> AttentionResult:
    fields = dict(family="test", source="test", image_size=(32, 48), patch_size=16, embed_dim=8,
                  depth=attn.shape[0], num_heads=attn.shape[1])
    fields.update(spec_fields)
    spec = ModelSpec(**fields)  # type: ignore[arg-type]
    return AttentionResult(attentions=attn, logits=np.zeros(0, np.float32), input=np.zeros((3, 32, 48), np.float32),
                           image=np.zeros((32, 48, 3), np.uint8), spec=spec)


# ---------------------------------------------------------------- rollout, by hand

def two_layer_example() -> np.ndarray:
    """L=2, H=1, T=3 (CLS + a 1x2 grid); layer 0 sends CLS to patch 1, layer 1 swaps CLS and patch 2."""
    a0 = [[0, 1, 0], [0, 1, 0], [0, 0, 1]]
    a1 = [[0, 0, 1], [0, 1, 0], [1, 0, 0]]
    return np.array([[a0], [a1]], dtype=np.float32)  # (2, 1, 3, 3)


def test_rollout_by_hand_two_layers() -> None:
    # A0' = [[.5,.5,0],[0,1,0],[0,0,1]], A1' = [[.5,0,.5],[0,1,0],[.5,0,.5]]
    # e0 A1' A0' = [.5,0,.5] A0' = [.25,.25,.5]; the wrong order (e0 A0' A1') would give [.25,.5,.25].
    attn = two_layer_example()
    vec = an.rollout_vector(attn, num_prefix=1)
    np.testing.assert_allclose(vec, [0.25, 0.25, 0.5], atol=1e-7)
    np.testing.assert_allclose(an.rollout(attn, num_prefix=1, grid=(1, 2)), [[0.25, 0.5]], atol=1e-7)
    np.testing.assert_allclose(an.rollout_naive(attn, num_prefix=1, grid=(1, 2)), [[0.25, 0.5]], atol=1e-7)


def test_rollout_by_hand_start_layer_and_residual() -> None:
    attn = two_layer_example()
    # Only the last layer: e0 A1' = [.5, 0, .5].
    np.testing.assert_allclose(an.rollout_vector(attn, start_layer=1, num_prefix=1), [0.5, 0, 0.5], atol=1e-7)
    # No residual: e0 A1 A0 = [0,0,1] A0 = [0,0,1].
    np.testing.assert_allclose(an.rollout_vector(attn, residual=0.0, num_prefix=1), [0, 0, 1], atol=1e-7)
    # residual 0.8: A1' row 0 = [.8,0,.2]; A0' row 0 = [.8,.2,0]; [.8,0,.2] A0' = [.64,.16,.2].
    np.testing.assert_allclose(an.rollout_vector(attn, residual=0.8, num_prefix=1), [0.64, 0.16, 0.2], atol=1e-6)


def test_rollout_max_fusion_renormalises_rows() -> None:
    # Heads' CLS rows [.5,.5,0] and [.5,0,.5]: max = [.5,.5,.5] (sums to 1.5).
    # 0.5 * max + 0.5 * e0 = [.75,.25,.25] -> renormalised [.6,.2,.2] (vit-explain #16 got this wrong).
    attn = np.zeros((1, 2, 3, 3), dtype=np.float32)
    attn[0, 0] = [[0.5, 0.5, 0], [0, 1, 0], [0, 0, 1]]
    attn[0, 1] = [[0.5, 0, 0.5], [0, 1, 0], [0, 0, 1]]
    np.testing.assert_allclose(an.rollout_vector(attn, "max", num_prefix=1), [0.6, 0.2, 0.2], atol=1e-6)
    # min = [.5,0,0]; 0.5*min + 0.5*e0 = [.75,0,0] -> [1,0,0].
    np.testing.assert_allclose(an.rollout_vector(attn, "min", num_prefix=1), [1, 0, 0], atol=1e-6)


def test_discard_by_hand_protects_cls() -> None:
    # CLS row [.1,.2,.3,.4]: the lowest entry is the CLS column, but only patch entries may go; drop 1 of 3 -> .2.
    attn = np.tile(np.eye(4, dtype=np.float32), (1, 1, 1, 1))  # (1, 1, 4, 4)
    attn[0, 0, 0] = [0.1, 0.2, 0.3, 0.4]
    vec = an.rollout_vector(attn, discard_ratio=0.34, residual=0.0, num_prefix=1)
    np.testing.assert_allclose(vec, [0.125, 0.0, 0.375, 0.5], atol=1e-7)


@pytest.mark.parametrize("num_prefix", [1, 3])
def test_discard_never_drops_prefix_columns(num_prefix: int) -> None:
    attn = random_attention(1, 4, num_prefix + 12, seed=3)
    attn[..., :num_prefix] *= 1e-4  # make the prefix columns the smallest entries of every row
    attn /= attn.sum(axis=-1, keepdims=True)
    mat = an.rollout_layer_matrix(attn[0], "mean", discard_ratio=0.9, residual=0.0, num_prefix=num_prefix)
    assert (mat[:, :num_prefix] > 0).all()
    zeros_per_row = (mat[:, num_prefix:] == 0).sum(axis=1)
    assert (zeros_per_row == math.floor(0.9 * 12)).all()  # per-row semantics: exactly k patch entries per row
    np.testing.assert_allclose(mat.sum(axis=1), 1.0, rtol=1e-6)


def test_rollout_equals_naive_on_random_data() -> None:
    attn = random_attention(4, 3, 2 + 2 * 3, seed=1)  # 2 prefix tokens, 2x3 grid
    grid = (2, 3)
    combos = itertools.product(["mean", "max", "min"], [0.0, 0.3, 0.9], [0, 2, -1], ["cls", "mean", 5],
                               [0.5, 0.0, 0.9])
    for fusion, discard, start, query, residual in combos:
        kw = dict(head_fusion=fusion, discard_ratio=discard, start_layer=start, query=query, residual=residual,
                  num_prefix=2, grid=grid)
        fast = an.rollout(attn, **kw)  # type: ignore[arg-type]
        naive = an.rollout_naive(attn, **kw)  # type: ignore[arg-type]
        assert fast.shape == grid
        np.testing.assert_allclose(fast, naive, rtol=1e-4, atol=1e-6, err_msg=str(kw))


def test_rollout_rows_are_distributions_and_match_matrix() -> None:
    attn = random_attention(6, 2, 1 + 12, seed=2)
    matrix = an.rollout_matrix(attn, "max", discard_ratio=0.5, num_prefix=1)
    np.testing.assert_allclose(matrix.sum(axis=1), 1.0, rtol=1e-5)
    vec = an.rollout_vector(attn, "max", discard_ratio=0.5, query=7, num_prefix=1)
    np.testing.assert_allclose(vec, matrix[7], rtol=1e-4, atol=1e-7)
    mean_vec = an.rollout_vector(attn, "max", discard_ratio=0.5, query="mean", num_prefix=1)
    np.testing.assert_allclose(mean_vec, matrix[1:].mean(axis=0), rtol=1e-4, atol=1e-7)


def test_rollout_without_cls_needs_explicit_query() -> None:
    attn = random_attention(2, 2, 6, seed=4)
    with pytest.raises(an.AnalysisError, match="no CLS"):
        an.rollout(attn, num_prefix=0, grid=(2, 3))
    out = an.rollout(attn, query="mean", num_prefix=0, grid=(2, 3))
    np.testing.assert_allclose(out.sum(), 1.0, rtol=1e-5)  # no prefix: all mass lands on patches


@pytest.mark.parametrize("bad", [dict(discard_ratio=1.0), dict(residual=-0.1), dict(head_fusion="median"),
                                 dict(start_layer=5), dict(query=99)])
def test_rollout_rejects_bad_arguments(bad: dict) -> None:
    with pytest.raises(ValueError):
        an.rollout(random_attention(2, 2, 7), num_prefix=1, grid=(2, 3), **bad)


# ---------------------------------------------------------------- token maps

def test_token_map_orientation_on_non_square_grid() -> None:
    attn = np.zeros((2, 2, 7, 7), dtype=np.float32)  # CLS + 2x3 grid
    attn[1, 0, 0, 1 + 1 * 3 + 2] = 1.0  # layer 1, head 0: CLS attends to patch (1, 2)
    attn[1, 1, 0, 1 + 0 * 3 + 1] = 0.5  # head 1: half on patch (0, 1), half on CLS
    attn[1, 1, 0, 0] = 0.5
    cls0 = an.cls_attention(attn, -1, 0, num_prefix=1, grid=(2, 3))
    assert cls0.shape == (2, 3) and cls0[1, 2] == 1.0 and cls0.sum() == 1.0
    np.testing.assert_allclose(an.cls_attention(attn, 1, "mean", num_prefix=1, grid=(2, 3)),
                               [[0, 0.25, 0], [0, 0, 0.5]])
    np.testing.assert_allclose(an.cls_attention(attn, 1, "max", num_prefix=1, grid=(2, 3)),
                               [[0, 0.5, 0], [0, 0, 1.0]])
    np.testing.assert_allclose(an.attention_row(attn, 1, 1, 0), [0.5, 0, 0.5, 0, 0, 0, 0])


def test_token_map_mean_query_and_column() -> None:
    attn = random_attention(3, 2, 1 + 6, seed=5)
    got = an.token_map(attn, 2, 1, "mean", num_prefix=1, grid=(2, 3))
    np.testing.assert_allclose(got, attn[2, 1, 1:, 1:].mean(axis=0).reshape(2, 3), rtol=1e-6)
    got = an.token_map(attn, 0, "max", 4, num_prefix=1, grid=(2, 3))
    np.testing.assert_allclose(got, attn[0, :, 4, 1:].max(axis=0).reshape(2, 3))
    col = an.attention_column(attn, 1, 0, 0, num_prefix=1, grid=(2, 3))  # who attends to CLS
    np.testing.assert_allclose(col, attn[1, 0, 1:, 0].reshape(2, 3))


def test_result_with_registers_and_no_cls() -> None:
    # No CLS but two registers: 'cls' must not silently mean token 0 (a register).
    attn = random_attention(2, 2, 2 + 6, seed=6)
    result = make_result(attn, cls_token=False, reg_tokens=2)
    with pytest.raises(an.AnalysisError, match="no CLS"):
        an.cls_attention(result, 0)
    with pytest.raises(an.AnalysisError):
        an.rollout(result)
    got = an.token_map(result, 0, 0, 0)  # register 0, by index, is fine
    np.testing.assert_allclose(got, attn[0, 0, 0, 2:].reshape(2, 3))
    np.testing.assert_allclose(an.rollout(result, query="mean"), an.rollout_naive(result, query="mean"), rtol=1e-5)


def test_result_with_cls_and_registers_uses_spec_grid() -> None:
    attn = random_attention(2, 2, 1 + 4 + 6, seed=7)
    result = make_result(attn, reg_tokens=4)
    np.testing.assert_allclose(an.cls_attention(result, 1, 1), attn[1, 1, 0, 5:].reshape(2, 3))


@pytest.mark.parametrize("call", [
    lambda a: an.cls_attention(a, 0, 0, num_prefix=1, grid=(3, 2 + 1)),   # 1 + 9 != 7
    lambda a: an.cls_attention(a, 0, 0, num_prefix=1),                    # raw array needs a grid
    lambda a: an.cls_attention(a, 0, 2, num_prefix=1, grid=(2, 3)),       # head out of range
    lambda a: an.cls_attention(a, 3, 0, num_prefix=1, grid=(2, 3)),       # layer out of range
    lambda a: an.cls_attention(a[0], 0, 0, num_prefix=1, grid=(2, 3)),    # not 4-D
    lambda a: an.cls_attention(a, 0, 0, num_prefix=0, grid=(1, 7)),       # no CLS
])
def test_bad_inputs_raise_clear_errors(call) -> None:
    with pytest.raises(VitvizError):
        call(random_attention(2, 2, 7))


# ---------------------------------------------------------------- distance and entropy

def test_mean_attention_distance_one_hot_2x3() -> None:
    gh, gw, p, ps = 2, 3, 1, 16
    attn = np.zeros((2, 2, 7, 7), dtype=np.float32)
    for r, c in itertools.product(range(gh), range(gw)):
        q = p + r * gw + c
        attn[0, 0, q, 0] = attn[0, 0, q, p] = 0.5      # half on CLS, half on patch (0, 0): renormalised away
        attn[0, 1, q, q] = 1.0                          # itself
        attn[1, 0, q, p + r * gw + (gw - 1 - c)] = 1.0  # mirror image in the row
        attn[1, 1, q, p + r * gw] = 0.5 if q != p else 0.0
        attn[1, 1, q, 0] = 1.0 - attn[1, 1, q, p + r * gw]
    attn[:, :, 0, 1 + 5] = 1.0  # CLS queries look far away; they must not count
    dist = an.mean_attention_distance(attn, (gh, gw), ps, num_prefix=p)
    to_origin = ps * (0 + 1 + 2 + 1 + math.sqrt(2) + math.sqrt(5)) / 6
    assert dist.shape == (2, 2)
    np.testing.assert_allclose(dist[0], [to_origin, 0.0], rtol=1e-6)
    # Mirror: |2 - 2c| patches -> 32, 0, 32 per row. Head (1, 1): query (0, 0) sends everything to CLS and is
    # left out; the other five attend to the first patch of their row: 16, 32 | 0, 16, 32.
    np.testing.assert_allclose(dist[1], [ps * 4 * 2 / 6, ps * (1 + 2 + 0 + 1 + 2) / 5], rtol=1e-6)


def test_mean_attention_distance_from_result_spec() -> None:
    attn = random_attention(2, 3, 1 + 6, seed=8)
    result = make_result(attn)
    np.testing.assert_allclose(an.mean_attention_distance(result),
                               an.mean_attention_distance(attn, (2, 3), 16, num_prefix=1))
    assert (an.mean_attention_distance(result) > 0).all()


def test_entropy_uniform_and_one_hot() -> None:
    t = 7
    attn = np.full((2, 3, t, t), 1.0 / t, dtype=np.float32)
    np.testing.assert_allclose(an.attention_entropy(attn), np.full((2, 3), math.log(t)), rtol=1e-6)
    attn[1, 2, 1:] = np.eye(t, dtype=np.float32)[1:]  # patch rows one-hot in layer 1, head 2
    ent_all = an.attention_entropy(attn)
    np.testing.assert_allclose(ent_all[1, 2], math.log(t) / t, rtol=1e-6)  # only the CLS row is uniform
    np.testing.assert_allclose(an.attention_entropy(attn, num_prefix=1)[1, 2], 0.0, atol=1e-7)


# ---------------------------------------------------------------- position embeddings

def test_pos_embed_similarity_identical_and_orthogonal() -> None:
    pe = np.zeros((1 + 6, 8))
    pe[1:, :6] = np.eye(6)           # every position orthogonal...
    pe[1 + 5] = 3.0 * pe[1 + 0]      # ...except (1, 2), a scaled copy of (0, 0)
    pe[0] = np.eye(8)[2]             # CLS equals position index 2 = (0, 2)
    sim = an.pos_embed_similarity(pe, (2, 3), num_prefix_in_pos=1)
    assert sim.shape == (2, 3, 2, 3)
    assert sim[0, 0, 1, 2] == pytest.approx(1.0) and sim[1, 2, 0, 0] == pytest.approx(1.0)
    assert sim[0, 1, 1, 0] == pytest.approx(0.0) and sim[1, 1, 1, 1] == pytest.approx(1.0)
    cls = an.prefix_pos_similarity(pe[None], (2, 3), 1)
    np.testing.assert_allclose(cls, [[0, 0, 1], [0, 0, 0]], atol=1e-12)


def test_pos_embed_similarity_errors() -> None:
    pe = np.random.default_rng(0).normal(size=(6, 4))
    np.testing.assert_allclose(np.diagonal(an.pos_embed_similarity(pe, (2, 3)).reshape(6, 6)), 1.0)
    with pytest.raises(an.AnalysisError, match="no prefix rows"):
        an.prefix_pos_similarity(pe, (2, 3), 0)
    with pytest.raises(an.AnalysisError, match="resample"):
        an.pos_embed_similarity(pe, (3, 3))


def test_discard_ties_drop_exactly_k_leftmost_first() -> None:
    """Equal values at the cut (common in float16 captures): exactly k go, the leftmost first, whichever way the
    engine gets there (one call, or a window engine with its sorted keys cached)."""
    from vitviz.core.analyses.rollout import RolloutEngine, RolloutParams

    attn = np.zeros((1, 1, 5, 5), dtype=np.float32)
    attn[0, 0] = [[0.2, 0.2, 0.2, 0.2, 0.2]] * 5                # CLS + 4 patches, every patch key tied
    attn[0, 0, 1] = [0.4, 0.1, 0.3, 0.1, 0.1]                    # three patch keys tied at the cut
    mat = an.rollout_layer_matrix(attn[0], discard_ratio=0.5, residual=0.0, num_prefix=1)   # k = 2 per row
    np.testing.assert_allclose(mat[0], [1 / 3, 0, 0, 1 / 3, 1 / 3], rtol=1e-6)   # the two leftmost go
    np.testing.assert_allclose(mat[1], [0.5, 0, 0.375, 0, 0.125], rtol=1e-6)
    assert ((mat[:, 1:] == 0).sum(axis=1) == 2).all()
    half = random_attention(3, 2, 1 + 12, seed=9).astype(np.float16)   # float16: many exact ties
    engine = RolloutEngine(half, 1, True)
    for discard in (0.5, 0.9, 0.5):                              # cached sorted keys reused across settings
        params = RolloutParams("max", discard)
        np.testing.assert_array_equal(engine.vector(params), an.rollout_vector(half, "max", discard, num_prefix=1))


def test_a_query_follows_its_place_in_the_image_across_layouts() -> None:
    """The window's query-following rule, without a window (`vitviz.core.analyses.tokens.follow_query`)."""
    from vitviz.core.analyses.tokens import TokenLayout, follow_query

    old, new = TokenLayout(("cls",), (4, 4)), TokenLayout(("cls", "reg0"), (8, 8))
    assert follow_query(old, new, 0) == (0, "")                               # CLS by name
    token, note = follow_query(old, new, 1 + 1 * 4 + 2)                       # patch (1, 2) of 4x4 ...
    assert token == 2 + 3 * 8 + 5 and "patch (3, 5)" in note                  # ... is patch (3, 5) of 8x8
    token, note = follow_query(TokenLayout(("cls", "reg0"), (2, 2)), TokenLayout(("cls",), (2, 2)), 1)
    assert token is None and "does not exist" in note                         # a register the new model lacks
    assert follow_query(None, new, 70) == (None, "") and follow_query(None, new, 5) == (5, "")
    assert follow_query(old, old, 7) == (7, "") and follow_query(old, new, None) == (None, "")
