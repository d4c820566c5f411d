"""A file nothing names gets a verdict: the library architectures whose parameters fit it exactly are found by
their shapes (`vitviz.core.reading.identify`), the file is loaded into each kind of them and compared (`vitviz.core.analyses.verify`).

Each case saves a real registered architecture the way users do (`torch.save(model.state_dict(), ...)`), with
random weights: nothing in the file names it. The negative cases show what is not claimed: a setting two fitting
architectures state differently stays an assumption naming the other; a wrong head count differs and names the
cause; `--against` is honoured or refused, never ignored.
"""
from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import vitviz
from vitviz.core.reading import identify
from vitviz.core.files import CACHE_ENV
from vitviz.core.spec import VERIFIED
from vitviz.core.analyses.verify import apply_verification, verify

timm = pytest.importorskip("timm")

pytestmark = pytest.mark.filterwarnings("ignore::vitviz.core.spec.GuessWarning")


def _save(folder: Path, arch: str, **kwargs) -> Path:
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        net = timm.create_model(arch, pretrained=False, **kwargs)
    path = folder / f"{arch}-mine.pth"   # a name of one's own: nothing names the architecture
    torch.save(net.state_dict(), path)
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("identify")


@pytest.fixture(scope="module")
def tiny_file(files: Path) -> Path:
    return _save(files, "deit_tiny_patch16_224")


def test_candidates_are_the_architectures_with_the_files_names_and_shapes(tiny_file: Path) -> None:
    sd = torch.load(tiny_file, weights_only=True)
    found = identify.candidates(sd)
    assert {"timm:deit_tiny_patch16_224", "timm:vit_tiny_patch16_224"} <= set(identify.names(found))
    assert all(c.library == "timm" and c.kwargs["num_classes"] == 1000 for c in found)
    # a training wrapper's prefix and another class count still fit (built with the file's own head)
    wrapped = {f"module.{k}": v for k, v in sd.items()}
    wrapped["module.head.weight"], wrapped["module.head.bias"] = torch.zeros(10, 192), torch.zeros(10)
    again = identify.candidates(wrapped)
    assert identify.names(again) == identify.names(found) and again[0].prefix == "module."
    assert again[0].kwargs["num_classes"] == 10
    # one more block: no registered architecture has it
    deeper = {**sd, **{k.replace("blocks.11.", "blocks.12."): v for k, v in sd.items() if k.startswith("blocks.11.")}}
    assert identify.candidates(deeper) == []
    assert identify.candidates(sd, "torchvision") == []     # a timm layout is no torchvision architecture
    with pytest.raises(vitviz.VitvizError, match="has no architecture"):
        identify.candidates(sd, "timm:no_such_vit")


def test_signatures_are_cached_per_library_version(tiny_file: Path, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(identify, "bundled", lambda library, version: tmp_path / "none.json")   # nothing shipped
    sd = torch.load(tiny_file, weights_only=True)
    first = identify.names(identify.candidates(sd, "timm:vit_tiny_patch16_224"))
    store = tmp_path / f"shapes-timm-{identify._version('timm')}.json"
    assert first == ["timm:vit_tiny_patch16_224"] and set(json.loads(store.read_text())) == {"vit_tiny_patch16_224"}
    store.write_text("{not json")   # a damaged cache is rebuilt
    assert identify.names(identify.candidates(sd, "timm:vit_tiny_patch16_224")) == first
    assert set(json.loads(store.read_text())) == {"vit_tiny_patch16_224"}


def test_the_shipped_signatures_are_what_the_installed_library_builds(tmp_path: Path) -> None:
    """resources/identify holds the signatures of one timm / torchvision release: when that release is installed,
    a sample of them (the ViTs of every size tests use) is built again here and must agree."""
    for library, sample in (("timm", ("vit_tiny_patch16_224", "vit_base_patch16_clip_quickgelu_224",
                                      "deit_small_distilled_patch16_224")), ("torchvision", ("vit_b_16", "vit_h_14")),
                            ("open_clip", ("ViT-B-32", "ViT-B-32-quickgelu"))):
        shipped = identify.bundled(library, identify._version(library))
        if not shipped.exists():
            continue
        data = json.loads(shipped.read_text())
        # every registered architecture, no other (the tests' own registrations are undone after each)
        assert set(data) == set(identify._registered(library))
        for arch in sample:
            net = identify.Candidate(library, arch).build("meta")
            assert data[arch] == identify.signature(library, {k: tuple(v.shape) for k, v in net.state_dict().items()})


def test_a_bare_timm_state_dict_is_verified_and_its_assumptions_become_verified(tiny_file: Path) -> None:
    model = vitviz.load(tiny_file)
    before = dict(model.spec.assumptions)
    assert {"num_heads", "mlp_kind", "eps", "pooling", "block_norm"} <= set(before)
    check = verify(model)
    assert check.verdict == "verified" and check.library == "timm"
    assert check.summary().startswith("Matches timm ") and "shapes exact" in check.summary()
    assert set(check.matches) == set(check.fitting) >= {"timm:deit_tiny_patch16_224", "timm:vit_tiny_patch16_224"}
    assert check.sizes == ((224, 224), (256, 256)) and check.max_attention < 1e-5
    # every assumed setting the probe reaches is confirmed; the preprocessing is not (the probe is normalised)
    assert set(check.confirmed) == set(before) - {"preprocess"}
    apply_verification(model, check)
    assert [name for name, _ in model.spec.assumptions] == ["preprocess"]
    assert model.spec.kind_of("num_heads") == VERIFIED and model.spec.kind_of("eps") == VERIFIED
    assert model.spec.source_of("num_heads").startswith("verified: timm ")
    assert "was table:" in model.spec.source_of("num_heads")   # what it was before stays readable
    assert model.spec.to_dict()["provenance"]["num_heads"].startswith("verified: ")
    json.dumps(check.to_dict())
    assert check.to_dict()["fitting"] and check.to_dict()["confirmed"]


def test_a_wrong_head_count_differs_and_names_the_cause(tiny_file: Path) -> None:
    check = verify(vitviz.load(tiny_file, heads=6), sizes=(224,))
    assert check.verdict == "differs" and check.first_differing_layer == 0
    assert ("num_heads", "3 heads") in check.causes and dict(check.suggested)["heads"] == 3
    assert "could be num_heads (3 heads)" in check.summary() and check.confirmed == ()


def test_against_is_honoured_or_refused_never_ignored(tiny_file: Path) -> None:
    model = vitviz.load(tiny_file)
    one = verify(model, against="timm:vit_tiny_patch16_224", sizes=(224,))
    assert one.verdict == "verified" and one.fitting == ("timm:vit_tiny_patch16_224",)
    wrong = verify(model, against="timm:vit_small_patch16_224", sizes=(224,))
    assert wrong.verdict == "differs" and "do not fit" in wrong.reason and "shapes differ" in wrong.reason
    other = verify(model, against="torchvision")
    assert other.verdict == "unverified" and "timm's layout, not torchvision's" in other.reason
    hf = verify(model, against="transformers")
    assert hf.verdict == "unverified" and "against='transformers'" in hf.reason
    with pytest.raises(vitviz.VitvizError, match="expected one of"):
        verify(model, against="keras:vit")


@pytest.fixture
def twin() -> Iterator[str]:
    """A registered timm architecture with exactly vit_tiny_patch16_224's shapes and QuickGELU: two originals no
    tensor tells apart (as vit_base_patch16_clip_224 and its _quickgelu_ twin are; bench/verify.py runs those).
    Unregistered afterwards: timm's registry is the process's, and no other test may see the twin."""
    from timm.models import _registry, register_model
    from timm.models.vision_transformer import _create_vision_transformer

    name = "vit_tiny_patch16_quickgelu_twin_224"

    def vit_tiny_patch16_quickgelu_twin_224(pretrained: bool = False, **kwargs):  # noqa: ANN003, ANN202
        args = dict(patch_size=16, embed_dim=192, depth=12, num_heads=3, act_layer="quick_gelu")
        return _create_vision_transformer("vit_tiny_patch16_224", pretrained=pretrained, **dict(args, **kwargs))
    vit_tiny_patch16_quickgelu_twin_224.__module__ = "timm.models.vision_transformer"   # listed with its kin
    register_model(vit_tiny_patch16_quickgelu_twin_224)
    try:
        yield name
    finally:
        _registry._clear_model_entries(name)
        _registry._model_entrypoints.pop(name, None)


def test_a_setting_no_candidate_tells_apart_stays_assumed_naming_the_alternatives(tiny_file: Path,
                                                                                   twin: str) -> None:
    model = vitviz.load(tiny_file)
    check = verify(model, sizes=(224,))
    assert f"timm:{twin}" in check.fitting and f"timm:{twin}" not in check.matches
    assert check.verdict == "verified"   # what is shown is exactly what the GELU architectures compute...
    assert dict(check.open)["mlp_kind"] == f"quick_gelu as timm:{twin}"   # ...but the file may be the other one
    assert "still assumed: mlp_kind" in check.summary()
    assert any(name == f"timm:{twin}" and "quick_gelu" in how for name, how in check.alternatives)
    assert "mlp_kind" not in check.confirmed and "num_heads" in check.confirmed
    apply_verification(model, check)
    assert "mlp_kind" in dict(model.spec.assumptions)
    # answered as the twin: it matches the twin, and the GELU ones are the alternatives
    quick = verify(vitviz.load(tiny_file, act="quick_gelu"), sizes=(224,))
    assert quick.verdict == "verified" and quick.matches == (f"timm:{twin}",)


def test_a_bare_torchvision_state_dict_is_verified(files: Path) -> None:
    import torchvision

    torch.manual_seed(0)
    path = files / "my_vit_b.pth"
    torch.save(torchvision.models.vit_b_16(num_classes=10).state_dict(), path)
    model = vitviz.load(path)
    check = verify(model, sizes=(224,))
    assert check.verdict == "verified" and check.fitting == ("torchvision:vit_b_16",)
    assert check.summary().startswith("Matches torchvision vit_b_16 (shapes exact")
    assert {"num_heads", "eps", "mlp_kind"} <= set(check.confirmed)


def test_cli_verify_a_bare_file(tiny_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from vitviz.cli import main

    assert main(["verify", str(tiny_file)]) == 0
    out = capsys.readouterr().out
    assert "fitting " in out and "timm:deit_tiny_patch16_224" in out and "verified (" in out
    assert out.splitlines()[-1].startswith("Matches timm ")
    assert main(["verify", str(tiny_file), "--json", "--against", "timm:vit_tiny_patch16_224"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["verdict"] == "verified" and data["fitting"] == ["timm:vit_tiny_patch16_224"]
    assert main(["verify", str(tiny_file), "--heads", "6"]) == 1
    assert "--heads 3" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["verify", str(tiny_file), "--against", "keras:x"])


def test_export_verifies_once_per_model_and_info_agrees(tiny_file: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """The first export checks the model and remembers the verdict (per file content, settings and versions); a
    second export of the same model takes it without running any original; `vitviz info` shows it, and the
    manifest's spec, info and the verdict agree on which settings are verified."""
    import numpy as np
    from PIL import Image

    import vitviz.core.analyses.verify as verify_module
    from vitviz.cli import main

    image = tmp_path / "img.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (40, 40, 3), dtype=np.uint8)).save(image)
    args = ["export", "--model", str(tiny_file), str(image), "--maps", "cls", "--layers", "11", "--quiet",
            "--device", "cpu"]
    assert main([*args, "--out", str(tmp_path / "one")]) == 0
    first = json.loads((tmp_path / "one" / "manifest.json").read_text())["model"]
    assert first["verification"]["verdict"] == "verified" and first["verification"]["remembered"] is False
    assert first["spec"]["provenance_kinds"]["num_heads"] == "verified"
    assert "num_heads" not in first["spec"]["assumptions"]

    def no_check(*_a, **_k):
        raise AssertionError("the original was run again")
    monkeypatch.setattr(verify_module, "verify", no_check)
    assert main([*args, "--out", str(tmp_path / "two")]) == 0
    second = json.loads((tmp_path / "two" / "manifest.json").read_text())["model"]
    assert second["verification"]["remembered"] is True
    assert second["verification"]["summary"] == first["verification"]["summary"]
    assert second["spec"]["provenance"] == first["spec"]["provenance"]
    # another setting is another model: checked again (here: refused, since verify is patched out)
    with pytest.raises(AssertionError, match="run again"):
        main([*args, "--heads", "6", "--out", str(tmp_path / "three")])
    capsys.readouterr()
    assert main(["info", str(tiny_file)]) == 0
    out = capsys.readouterr().out
    assert "verdict        Matches timm " in out and "(remembered from an earlier check)" in out
    assert "verified (verified: timm" in out
    assert main(["info", str(tiny_file), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["verification"]["summary"] == first["verification"]["summary"]
    assert data["provenance"]["num_heads"] == first["spec"]["provenance"]["num_heads"]


def test_a_library_that_is_not_importable_is_said_for_a_file_nothing_names(tiny_file: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    model = vitviz.load(tiny_file)
    monkeypatch.setitem(sys.modules, "timm", None)   # `import timm` raises ImportError
    check = verify(model)
    assert check.verdict == "unverified" and "pip install timm" in check.reason and check.library == "timm"


def test_a_dinov2_repository_file_without_a_name_is_verified(files: Path) -> None:
    """A DINOv2 backbone saved from facebookresearch/dinov2's own code (it keeps `mask_token`) under a name of
    one's own: its hub architectures are the candidates (built as its hub builds them, at the file's size), and the
    one that fits is compared at two sizes, its own position-table resampling included. The input size stays
    assumed: the original takes any size, so the probe says nothing about the one to use."""
    vits = pytest.importorskip("dinov2.models.vision_transformer")
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        net = vits.vit_small(patch_size=14, img_size=56, init_values=1.0, ffn_layer="mlp", block_chunks=0)
    path = files / "my_backbone.pth"
    torch.save(net.state_dict(), path)
    model = vitviz.load(path)
    assumed = {name for name, _ in model.spec.assumptions}
    check = verify(model)
    assert check.verdict == "verified" and check.fitting == ("dinov2:dinov2_vits14",)
    assert check.summary().startswith("Matches dinov2 dinov2_vits14 (shapes exact")
    assert len(check.sizes) == 2 and "num_heads" in check.confirmed
    assert set(check.confirmed) == assumed - {"preprocess", "image_size"}
    assert verify(model, against="dinov2:dinov2_vitb14", sizes=(56,)).verdict == "differs"


def test_a_bare_open_clip_file_matches_and_keeps_quick_gelu_open(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A whole CLIP saved by open_clip under a name of one's own: its image tower's names and shapes are compared
    with every model config's tower; a GELU config and its QuickGELU twin both fit, so what vitviz shows matches
    one of them and the activation stays an assumption naming the other -- until it is answered."""
    open_clip = pytest.importorskip("open_clip")
    vision = {"image_size": 32, "layers": 2, "width": 128, "patch_size": 8, "head_width": 64}   # 2 heads, as guessed
    text = {"context_length": 8, "vocab_size": 64, "width": 32, "heads": 2, "layers": 1}
    for name, quick in (("vitviz-tiny", False), ("vitviz-tiny-quickgelu", True)):
        cfg = {"embed_dim": 32, "vision_cfg": vision, "text_cfg": text, **({"quick_gelu": True} if quick else {})}
        (tmp_path / f"{name}.json").write_text(json.dumps(cfg))
    # open_clip's registry is the process's: this test's configs go into copies, put back afterwards
    monkeypatch.setattr(open_clip.factory, "_MODEL_CONFIGS", dict(open_clip.factory._MODEL_CONFIGS))
    monkeypatch.setattr(open_clip.factory, "_MODEL_CONFIG_PATHS", list(open_clip.factory._MODEL_CONFIG_PATHS))
    open_clip.add_model_config(tmp_path)
    torch.manual_seed(0)
    path = tmp_path / "my_clip.pt"
    torch.save(open_clip.create_model("vitviz-tiny", pretrained=None).state_dict(), path)
    model = vitviz.load(path)
    check = verify(model)
    assert {"open_clip:vitviz-tiny", "open_clip:vitviz-tiny-quickgelu"} <= set(check.fitting)
    assert check.verdict == "verified" and check.summary().startswith("Matches open_clip ")
    shown = model.spec.mlp_kind
    other = "gelu" if shown == "quick_gelu" else "quick_gelu"
    assert dict(check.open)["mlp_kind"].startswith(other) and "mlp_kind" not in check.confirmed
    answered = verify(vitviz.load(path, act="gelu"), sizes=(32,))
    assert "open_clip:vitviz-tiny" in answered.matches and "open_clip:vitviz-tiny-quickgelu" not in answered.matches


def test_a_bare_transformers_state_dict_is_verified(files: Path) -> None:
    """`torch.save(ViTForImageClassification(ViTConfig(num_labels=10)).state_dict())` -- no config.json: the
    classes vitviz reads are built with their model type's default configuration (the file's class count and
    size) on the meta device; the one that fits is transformers' own original, eager attention."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    path = files / "my_hf_vit.pth"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.save(transformers.ViTForImageClassification(transformers.ViTConfig(num_labels=10)).state_dict(), path)
    model = vitviz.load(path)
    check = verify(model, sizes=(224,))
    assert check.verdict == "verified" and check.fitting == ("transformers:ViTForImageClassification",)
    assert check.summary().startswith("Matches transformers ViTForImageClassification (shapes exact")
    assert {"num_heads", "eps"} <= set(check.confirmed)


def test_the_command_line_takes_what_verify_takes() -> None:
    """`vitviz verify --against` is parsed without torch, from its own copy of the names: kept equal here (a bare
    transformers file's `--against transformers:ViTModel` was refused by the parser while verify took it)."""
    from vitviz.cli import verify as cli_verify
    from vitviz.core.analyses import verify as core_verify
    assert cli_verify.AGAINST == core_verify.AGAINST and cli_verify.BY_ARCH == core_verify._BY_ARCH
    assert set(core_verify._BY_ARCH) == set(identify.LIBRARIES)
    assert cli_verify._against("transformers:ViTModel") == "transformers:ViTModel"
