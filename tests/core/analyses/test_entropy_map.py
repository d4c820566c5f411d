"""The attention-entropy map: the proof that a new map kind is one row of the table of map kinds and its compute.

It was added as `KINDS['entropy']` (`vitviz/core/analyses/mapkinds.py`) and one branch of `map_stack` (`vitviz/core/analyses/maps.py`);
everything else -- the parser, `vitviz export --maps entropy` and its help, the window's `--map entropy`, the map
selector's entry and tooltip, the layer and head selectors, the window's export -- follows from the table."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vitviz.core.analyses.mapkinds import KINDS, maps_help, unavailable
from vitviz.core.analyses.maps import MAP_KINDS, MapKind, ResultMaps

HEADS = 2


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    path = tmp_path_factory.mktemp("entropy") / "photo.png"
    Image.fromarray(np.random.default_rng(3).integers(0, 256, (40, 48, 3), dtype=np.uint8)).save(path)
    return [path]


@pytest.fixture(scope="module")
def result(tiny_ckpt: Path, images: list[Path]):  # noqa: ANN201
    import vitviz

    return vitviz.load(tiny_ckpt, heads=HEADS, device="cpu").run(images[0])


def test_entropy_is_each_patch_querys_row_entropy(result) -> None:  # noqa: ANN001
    kind = MapKind.parse("entropy")
    assert kind == MapKind("entropy") and kind.label == "entropy" and kind.per_layer and kind.per_head
    stack = ResultMaps(result).stack(kind)
    attn = result.attentions.astype(np.float64)                      # (L, H, T, T)
    p, (gh, gw) = result.num_prefix, result.grid
    L, H, T = attn.shape[0], attn.shape[1], attn.shape[-1]
    for layer in range(L):
        for head in range(H):
            rows = attn[layer, head, p:, :]                              # the patch queries' rows
            expected = -(rows * np.log(np.where(rows > 0, rows, 1.0))).sum(-1).reshape(gh, gw)
            np.testing.assert_allclose(stack.select(layer, head), expected, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(stack.select(layer, "mean"), stack.maps[layer, :H].mean(0), rtol=1e-6)
    assert 0 <= stack.maps.min() and stack.maps.max() <= np.log(T) + 1e-5
    # a uniform row has the most entropy, log(T); a one-hot row none
    uniform = np.full((1, 1, T, T), 1.0 / T, np.float32)
    onehot = np.tile(np.eye(T, dtype=np.float32)[None, None], (1, 1, 1, 1))
    from vitviz.core.analyses.maps import query_entropy

    np.testing.assert_allclose(query_entropy(uniform, p), np.log(T), rtol=1e-5)
    np.testing.assert_allclose(query_entropy(onehot, p), 0.0, atol=1e-6)


def test_the_table_makes_it_a_kind_everywhere(result) -> None:  # noqa: ANN001
    """Nothing but the table's row names it: the kind lists, the parser, the help and the availability check."""
    assert "entropy" in MAP_KINDS and KINDS["entropy"].source == "attention"
    assert "entropy (" in maps_help()
    assert unavailable(MapKind("entropy"), result.spec) is None
    assert MapKind("entropy").query_row is None                        # it needs whole attention matrices


def test_export_writes_it_as_the_window_draws_it(tiny_ckpt: Path, images: list[Path], tmp_path: Path,
                                                 result) -> None:  # noqa: ANN001
    from vitviz.cli import main
    from vitviz.gui.exporting import render_view
    from vitviz.gui.state import ViewState

    out = tmp_path / "out"
    assert main(["export", "--model", str(tiny_ckpt), "--heads", str(HEADS), str(images[0]), "--out", str(out),
                 "--maps", "entropy", "--layers", "all", "--which-heads", "0,mean", "--quiet"]) == 0
    stem = images[0].stem
    names = sorted(p.name for p in out.glob("*.png"))
    assert names == sorted(f"{stem}_entropy_L{layer}_H{head}.png" for layer in range(result.spec.depth)
                           for head in ("0", "mean"))
    maps = ResultMaps(result)
    for layer in range(result.spec.depth):
        gui = render_view(maps, ViewState(source="entropy", layer=layer, head=0), heatmap_only=False,
                          colorbar=False).astype(int)
        cli = np.asarray(Image.open(out / f"{stem}_entropy_L{layer}_H0.png").convert("RGB")).astype(int)
        assert gui.shape == cli.shape and np.abs(gui - cli).max() <= 1


def test_the_window_takes_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """`--map entropy` parses to the view state that shows it, and the map selector offers it with its tooltip."""
    monkeypatch.setenv("QT_QPA_PLATFORM", "offscreen")
    from vitviz.gui.panels.controls import SOURCE_LABELS, SOURCE_TIPS
    from vitviz.gui.state import MAP_CHOICES, map_kind, parse_map_arg, ViewState

    fields = parse_map_arg("entropy")
    assert fields == {"source": "entropy"} and map_kind(ViewState(**fields)) == MapKind("entropy")
    assert "entropy" in MAP_CHOICES and SOURCE_LABELS["entropy"] == KINDS["entropy"].label
    assert "--map entropy" in SOURCE_TIPS["entropy"]
