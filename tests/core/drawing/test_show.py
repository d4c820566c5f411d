"""`vitviz.show` and the notebook view of a result: the picture `vitviz export` writes for the same choices."""
from __future__ import annotations

import io
import sys
import types
from pathlib import Path

import numpy as np
import pytest
from _tiny import write_tiny_checkpoint
from PIL import Image

import vitviz
from vitviz.cli import main

HEADS = 2


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, object]:
    folder = tmp_path_factory.mktemp("show")
    ckpt = write_tiny_checkpoint(folder / "tiny.pth")
    image = folder / "photo.png"
    Image.fromarray(np.random.default_rng(1).integers(0, 256, (40, 52, 3), dtype=np.uint8)).save(image)
    return ckpt, image, vitviz.load(ckpt, heads=HEADS, device="cpu").run(image)


@pytest.mark.parametrize("map_name, layer, head, cli", [
    ("cls", -1, "mean", ["--maps", "cls", "--layers", "last", "--which-heads", "mean"]),
    ("rollout", -1, "mean", ["--maps", "rollout", "--layers", "last", "--which-heads", "mean"]),
    ("token:3", 0, 1, ["--maps", "token:3", "--layers", "0", "--which-heads", "1"]),
    ("entropy", 1, 0, ["--maps", "entropy", "--layers", "1", "--which-heads", "0"]),
    ("key:5", 1, "max", ["--maps", "key:5", "--layers", "1", "--which-heads", "max"]),    # a table row, nothing else
])
def test_show_is_the_exported_png(setup, tmp_path: Path, map_name: str, layer: object, head: object,
                                  cli: list[str]) -> None:
    ckpt, image, result = setup
    picture = vitviz.show(result, map_name, layer, head)
    assert isinstance(picture, Image.Image)
    out = tmp_path / "out"
    assert main(["export", "--model", str(ckpt), "--heads", str(HEADS), str(image), "--out", str(out), "--colorbar",
                 "--device", "cpu", "--quiet", *cli]) == 0
    pngs = sorted(out.glob("*.png"))
    assert len(pngs) == 1
    np.testing.assert_array_equal(np.asarray(picture), np.asarray(Image.open(pngs[0]).convert("RGB")))


def test_show_options_and_errors(setup) -> None:
    _ckpt, _image, result = setup
    bare = vitviz.show(result, style="heatmap", colorbar=False, original=False)
    assert bare.size == (result.image.shape[1], result.image.shape[0])
    with pytest.raises(vitviz.VitvizError, match="expected one of cls"):
        vitviz.show(result, "nonsense")


def test_show_draws_a_pass_the_result_holds_as_export_does(setup, tmp_path: Path) -> None:
    """The notebook API uses the one per-image holder: a `ResultMaps` with the class relevance added shows it, as
    `vitviz export --maps relevance:3` writes it; a bare result says the map needs its pass."""
    from vitviz.core.analyses.maps import ResultMaps
    from vitviz.core.analyses.relevance import class_relevance

    ckpt, image, result = setup
    with pytest.raises(vitviz.VitvizError, match="needs a pass of its own"):
        vitviz.show(result, "relevance:3")
    model = vitviz.load(ckpt, heads=HEADS, device="cpu")
    maps = ResultMaps(result)
    maps.add_relevance(class_relevance(model, str(image), 3), 3)
    picture = vitviz.show(maps, "relevance:3")
    out = tmp_path / "out"
    assert main(["export", "--model", str(ckpt), "--heads", str(HEADS), str(image), "--out", str(out), "--colorbar",
                 "--device", "cpu", "--quiet", "--maps", "relevance:3"]) == 0
    (png,) = sorted(out.glob("*.png"))
    np.testing.assert_array_equal(np.asarray(picture), np.asarray(Image.open(png).convert("RGB")))


def test_notebook_display_is_registered_by_name(setup, monkeypatch: pytest.MonkeyPatch) -> None:
    """In IPython the result's PNG formatter is registered without importing anything; it renders `show`."""
    registered = {}

    class Formatter:
        def for_type_by_name(self, module: str, name: str, func: object) -> None:
            registered[(module, name)] = func

    shell = types.SimpleNamespace(display_formatter=types.SimpleNamespace(formatters={"image/png": Formatter()}))
    monkeypatch.setitem(sys.modules, "IPython", types.SimpleNamespace(get_ipython=lambda: shell))
    vitviz._register_notebook_display()
    func = registered[("vitviz.core.spec", "AttentionResult")]
    assert type(setup[2]).__module__ == "vitviz.core.spec" and type(setup[2]).__name__ == "AttentionResult"
    png = func(setup[2])
    np.testing.assert_array_equal(np.asarray(Image.open(io.BytesIO(png)).convert("RGB")),
                                  np.asarray(vitviz.show(setup[2])))


def test_a_result_in_a_notebook_is_its_picture_with_its_summary(setup) -> None:
    """`_repr_html_`: the picture `_repr_png_` gives, inline, over the result's one-line repr (escaped)."""
    import base64
    import html
    import re

    result = setup[2]
    page = result._repr_html_()
    (data,) = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    assert base64.b64decode(data) == result._repr_png_()
    assert f"<figcaption><code>{html.escape(repr(result))}</code></figcaption>" in page


def test_show_refuses_a_key_token_out_of_range_as_export_does(setup, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    ckpt, image, result = setup
    with pytest.raises(vitviz.VitvizError, match=r"key:99 out of range.*expected key:0 to key:16"):
        vitviz.show(result, "key:99")
    assert main(["export", "--model", str(ckpt), "--heads", str(HEADS), str(image), "--out", str(tmp_path / "o"),
                 "--device", "cpu", "--quiet", "--maps", "key:99"]) == 2
    assert "key:99 out of range" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------- wrong arguments (issue 20)

@pytest.fixture(scope="module")
def shown(tiny_model, photo: Path) -> "vitviz.core.spec.AttentionResult":
    return tiny_model.run(photo)


BAD_SHOW = [
    (dict(layer="x"), "layer is 'x'"), (dict(head="min"), "head is 'min'"), (dict(map=5), "map is 5"),
    (dict(cmap=None), "cmap is None"), (dict(opacity=5), "opacity is 5"), (dict(opacity="0.5"), "opacity is '0.5'"),
    (dict(opacity=float("nan")), "opacity is nan"), (dict(layer=99), "layer 99 is out of range: the model has 2"),
    (dict(layer=-3), "layer -3 is out of range"), (dict(head=2.5), "head is 2.5"), (dict(head=7), "head 7 is out"),
    (dict(layer=True), "layer is True"), (dict(style="bogus"), "style is 'bogus'"), (dict(scale="mine"), "scale"),
    (dict(smooth="no"), "smooth is 'no'"), (dict(colorbar="yes"), "colorbar is 'yes'"), (dict(original=1), "original"),
    (dict(map="token:999"), "token:999 out of range: the model has 17 tokens"),
    (dict(map="rollout:999"), "rollout:999 out of range"), (dict(map="pca"), "needs a pass of its own"),
    (dict(map="relevance"), "needs a pass of its own"), (dict(map="nonsense"), "expected one of cls"),
    (dict(cmap="rainbowish"), "cmap is 'rainbowish'"), (dict(size="input"), "unknown argument size='input'"),
    (dict(bogus=1), "unknown argument bogus=1"),
]


@pytest.mark.parametrize("kwargs, needle", BAD_SHOW, ids=[str(k) for k, _ in BAD_SHOW])
def test_show_refuses_wrong_arguments_naming_them(shown, kwargs: dict[str, object], needle: str) -> None:
    with pytest.raises(vitviz.VitvizError, match="expected|unknown argument") as info:
        vitviz.show(shown, **kwargs)
    assert needle in str(info.value) and str(info.value).startswith("show: ")


def test_show_refuses_what_is_not_a_result(tiny_model) -> None:
    with pytest.raises(vitviz.VitvizError, match="result is None .*expected an AttentionResult"):
        vitviz.show(None)
    with pytest.raises(vitviz.VitvizError, match="result is a model, not a result; expected model.run"):
        vitviz.show(tiny_model)


def test_show_accepts_what_export_accepts(shown) -> None:
    import numpy as np

    for kwargs in (dict(layer="last"), dict(layer="mean"), dict(head=-1), dict(head="max"), dict(cmap="magma_r"),
                   dict(map="rollout:3"), dict(map="token:16"), dict(layer=np.int64(1)), dict(opacity=0),
                   dict(style="heatmap", scale="own", smooth=False, colorbar_label=True)):
        assert vitviz.show(shown, **kwargs).size[0] > 0
    np.testing.assert_array_equal(np.asarray(vitviz.show(shown, layer="last")), np.asarray(vitviz.show(shown)))
