"""Every setting that changes the computation says where it came from, and every assumption is flagged.

The field walk itself runs on every spec any test builds (conftest sets VITVIZ_AUDIT, so `infer_spec` calls
`audit_provenance` on each); these tests show that the walk covers every field, that it fails when a field is made
silent, and that what it calls an assumption reaches `vitviz info`, the warnings and the export manifest.
"""
from __future__ import annotations

import dataclasses
import json
import warnings
from pathlib import Path

import pytest

from _tiny import HEADS, write_tiny_checkpoint


def _load(path: Path, **kw):  # noqa: ANN202
    import vitviz

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return vitviz.load(path, **kw)


def test_every_spec_field_is_classified() -> None:
    """A new ModelSpec field must be put in COMPUTE_FIELDS (it needs a provenance) or OTHER_FIELDS."""
    from vitviz.core.spec import COMPUTE_FIELDS, OTHER_FIELDS, ModelSpec

    names = {f.name for f in dataclasses.fields(ModelSpec)}
    assert names == set(COMPUTE_FIELDS) | set(OTHER_FIELDS), names ^ (set(COMPUTE_FIELDS) | set(OTHER_FIELDS))
    assert not set(COMPUTE_FIELDS) & set(OTHER_FIELDS)


@pytest.mark.parametrize("source, named, kind", [
    ("metadata: config.json", False, "read"), ("shape: pos_embed length", False, "derived"),
    ("named: timm architecture 'x'", False, "named"), ("override", False, "given"),
    ("guess: width 32 / head_dim 32", True, "assumed"), ("assumed: a tutorial's activation", True, "assumed"),
    ("default: exact GELU", False, "assumed"), ("default: exact GELU", True, "named"),
    ("family: torchvision", False, "assumed"), ("family: torchvision", True, "named"),
    ("table: embed_dim 768", False, "assumed"), ("something nobody described", False, "assumed"),
])
def test_provenance_kinds(source: str, named: bool, kind: str) -> None:
    from vitviz.core.spec import provenance_kind

    assert provenance_kind(source, named) == kind


def test_bare_state_dict_flags_every_convention(tiny_ckpt: Path) -> None:
    """A bare timm-layout state dict names nothing: norm order, activation, eps and the attention scale are
    conventions of the layout, so each is an assumption (and the head count, given, is not)."""
    spec = _load(tiny_ckpt, heads=HEADS).spec
    assert not spec.named
    assumed = {name for name, _ in spec.assumptions}
    assert {"block_norm", "mlp_kind", "eps", "attn_scale"} <= assumed
    assert "num_heads" not in assumed and spec.kind_of("num_heads") == "given"
    assert spec.kind_of("qkv_bias") == "derived" and spec.kind_of("embed_dim") == "derived"
    from vitviz.core.spec import audit_provenance

    assert audit_provenance(spec) == []


def test_passing_a_value_makes_it_given(tiny_ckpt: Path) -> None:
    spec = _load(tiny_ckpt, heads=HEADS, act="relu", block_norm="pre", eps=1e-6, attn_scale=0.25).spec
    assumed = {name for name, _ in spec.assumptions}
    assert not {"block_norm", "mlp_kind", "eps", "attn_scale", "num_heads"} & assumed
    assert spec.mlp_kind == "relu" and spec.kind_of("mlp_kind") == "given"


def test_the_audit_fails_when_a_field_is_made_silent(tiny_ckpt: Path) -> None:
    """Dropping a field's entry, giving it a source of no known kind, or flagging less than is assumed are each
    reported: the walk can fail."""
    from vitviz.core.spec import audit_provenance

    spec = _load(tiny_ckpt, heads=HEADS).spec
    silent = dataclasses.replace(spec, provenance=tuple((k, v) for k, v in spec.provenance if k != "eps"))
    assert any(p.startswith("eps: no provenance") for p in audit_provenance(silent))
    vague = dataclasses.replace(spec, provenance=tuple((k, "the usual value" if k == "block_norm" else v)
                                                       for k, v in spec.provenance))
    assert any(p.startswith("block_norm: source") for p in audit_provenance(vague))
    # a spec whose flag list misses an assumption: the audit notices it
    class Quiet(type(spec)):  # type: ignore[misc]
        @property
        def guesses(self):  # noqa: ANN202
            return ()

    quiet = Quiet(**{f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)})
    assert any("not flagged" in p for p in audit_provenance(quiet))


def test_a_named_model_makes_the_family_defaults_facts(tmp_path: Path) -> None:
    """A timm hub folder's config.json names the architecture: timm's own defaults are that model's facts."""
    import timm
    from safetensors.torch import save_file

    net = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, depth=2,
                            num_classes=5)
    folder = tmp_path / "hub"
    folder.mkdir()
    save_file({k: v.contiguous() for k, v in net.state_dict().items()}, folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps({
        "architecture": "vit_tiny_patch16_224", "num_classes": 5,
        "model_args": {"img_size": 32, "patch_size": 8, "depth": 2},
        "pretrained_cfg": {"input_size": [3, 32, 32], "mean": [0.5] * 3, "std": [0.5] * 3, "crop_pct": 0.9,
                           "interpolation": "bicubic"}}))
    spec = _load(folder).spec
    assert spec.named and "timm architecture" in spec.source_of("identity")
    assert spec.assumptions == ()
    assert spec.kind_of("eps") == "named" and spec.kind_of("block_norm") == "named"


def test_labels_are_a_quiet_note_not_a_warning(tmp_path: Path) -> None:
    """A 1000-class head's ImageNet names are not an attention setting: a note, no GuessWarning."""
    from vitviz.core.spec import GuessWarning

    path = write_tiny_checkpoint(tmp_path / "k.pth", num_classes=1000)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        import vitviz

        spec = vitviz.load(path, heads=HEADS, act="gelu", block_norm="pre", eps=1e-6, attn_scale=0.25,
                           mean=(0.5,), std=(0.5,), resize=32, crop_mode="squash", pooling="token").spec
    assert "labels" in dict(spec.notes)
    assert not [w for w in seen if issubclass(w.category, GuessWarning)], [str(w.message) for w in seen]


def test_info_warnings_and_manifest_flag_the_same_assumptions(tiny_ckpt: Path, photo: Path, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    from vitviz.cli import main
    from vitviz.core.spec import GuessWarning

    spec = _load(tiny_ckpt, heads=HEADS).spec
    assumed = [name for name, _ in spec.assumptions]
    assert main(["info", str(tiny_ckpt), "--heads", str(HEADS)]) == 0
    printed = capsys.readouterr().out
    flagged = [line.split()[2] for line in printed.splitlines() if line.strip().startswith("!! GUESSED")]
    assert sorted(flagged) == sorted(assumed)
    with pytest.warns(GuessWarning) as seen:
        import vitviz

        vitviz.load(tiny_ckpt, heads=HEADS)
    warned = {str(w.message).split(": ", 1)[1].split(" ")[0] for w in seen if issubclass(w.category, GuessWarning)}
    assert warned == set(assumed)
    out = tmp_path / "out"
    assert main(["export", "--model", str(tiny_ckpt), "--heads", str(HEADS), str(photo), "--out", str(out),
                 "--quiet"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())["model"]["spec"]
    assert sorted(manifest["assumptions"]) == sorted(assumed)
    assert manifest["provenance_kinds"]["block_norm"] == "assumed"


def test_off_grid_resampling_recipe_is_flagged_only_away_from_the_grid(tiny_ckpt: Path) -> None:
    """The position-table resampling recipe matters only at another input size: then an assumed one is said."""
    native = _load(tiny_ckpt, heads=HEADS).spec
    assert "pos_interp" not in dict(native.assumptions)
    other = _load(tiny_ckpt, heads=HEADS, image_size=48).spec
    assert "pos_interp" in dict(other.assumptions)
    assert "pos_interp" not in dict(_load(tiny_ckpt, heads=HEADS, image_size=48, pos_interp="deit").spec.assumptions)


def test_cli_choices_match_the_library() -> None:
    import argparse

    from vitviz.cli.options import add_override_arguments
    from vitviz.core.running.model import ACTIVATIONS as LIB_ACTIVATIONS
    from vitviz.core.posembed import RECIPES

    parser = argparse.ArgumentParser()
    add_override_arguments(parser)
    choices = {a.dest: tuple(a.choices) for a in parser._actions if a.choices}
    assert choices["act"] == choices["head_act"] == LIB_ACTIVATIONS and choices["pos_interp"] == RECIPES


def test_eps_final_is_used_for_the_final_norms(tiny_ckpt: Path) -> None:
    """Blocks at 1e-6 and the final norm at another eps (Chefer's ViT): eps_final reaches the final norm only."""
    import torch

    model = _load(tiny_ckpt, heads=HEADS, eps=1e-6, eps_final=0.5)
    assert model.net.norm.eps == 0.5 and model.net.blocks[0].norm1.eps == 1e-6
    assert model.spec.kind_of("eps_final") == "given"
    plain = _load(tiny_ckpt, heads=HEADS, eps=1e-6)
    x = torch.randn(1, 3, 32, 32)
    a, b = model.run(x), plain.run(x)
    assert (a.attentions == b.attentions).all() and abs(a.logits - b.logits).max() > 1e-4


def test_model_objects_state_their_settings() -> None:
    """A timm or torchvision object says its eps, activation, scale and norm order itself: nothing is assumed,
    and a ReLU timm model converts with ReLU (exactly)."""
    import timm
    import torch
    import torchvision

    net = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=5, img_size=32, patch_size=8,
                            depth=2, act_layer="relu").eval()
    model = _load(net)
    assert model.spec.family != "live" and model.spec.mlp_kind == "relu"
    assert model.spec.assumptions == ()
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        ref = net(x)[0].numpy()
    assert abs(model.run(x).logits - ref).max() < 1e-4
    tv = torchvision.models.vision_transformer.VisionTransformer(
        image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64, num_classes=5).eval()
    model = _load(tv)
    assert model.spec.family == "torchvision" and not any(k != "preprocess" for k, _ in model.spec.assumptions)


def test_imagenet_names_need_no_torchvision(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A 1000-class model opens with its ImageNet names from vitviz's own list, even with torchvision broken."""
    import sys

    from torchvision.models._meta import _IMAGENET_CATEGORIES

    path = write_tiny_checkpoint(tmp_path / "k.pth", num_classes=1000)
    monkeypatch.setitem(sys.modules, "torchvision.models._meta", None)  # any import of it now fails
    spec = _load(path, heads=HEADS).spec
    assert spec.labels == tuple(_IMAGENET_CATEGORIES)


def test_a_broken_package_is_named_not_the_file(tiny_ckpt: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import vitviz.core.reading.hyperparams as hp
    from vitviz.errors import CheckpointError, VitvizError

    def broken(*a, **k):  # noqa: ANN002, ANN003, ANN202
        raise ImportError("operator torchvision::nms does not exist", name="torchvision.ops")

    monkeypatch.setattr(hp, "infer_spec", broken)
    monkeypatch.setattr("vitviz.core.running.load.infer_spec", broken)
    with pytest.raises(VitvizError) as err:
        _load(tiny_ckpt, heads=HEADS)
    assert "'torchvision'" in str(err.value) and "report this file" not in str(err.value)
    assert not isinstance(err.value, CheckpointError)


def test_a_published_file_under_its_hub_name_is_named(tmp_path: Path) -> None:
    """'NAME-HASH.pth' whose sha256 starts with HASH is the published release itself (torch.hub's own check):
    named, so its family's settings are facts; the same name with a hash that does not match names nothing."""
    import hashlib
    import shutil

    plain = write_tiny_checkpoint(tmp_path / "plain.pth")
    digest = hashlib.sha256(plain.read_bytes()).hexdigest()
    published = tmp_path / f"deit_tiny_patch8_32-{digest[:8]}.pth"
    shutil.copy(plain, published)
    spec = _load(published, heads=HEADS).spec
    assert spec.named and "published file 'deit_tiny_patch8_32'" in spec.source_of("identity")
    assert not {"block_norm", "mlp_kind", "eps", "attn_scale"} & {k for k, _ in spec.assumptions}
    fake = tmp_path / f"deit_tiny_patch8_32-{'0' * 8 if not digest.startswith('0' * 8) else '1' * 8}.pth"
    shutil.copy(plain, fake)
    spec = _load(fake, heads=HEADS).spec
    assert not spec.named and "block_norm" in dict(spec.assumptions)


def test_stated_statistics_leave_the_resize_recipe_an_assumption(tmp_path: Path) -> None:
    """mean/std from the training args (or the caller) do not say how the image is resized and cropped: that stays
    a flagged assumption of its own until a config states it or resize and crop_mode are given."""
    import torch

    from _tiny import tiny_state_dict

    torch.save({"model": tiny_state_dict(), "args": {"mean": [0.5, 0.5, 0.5], "std": [0.25, 0.25, 0.25]}},
               tmp_path / "run.pth")
    spec = _load(tmp_path / "run.pth", heads=HEADS).spec
    assert spec.kind_of("preprocess") == "read" and spec.preprocess.std == (0.25,) * 3
    assert "resize_recipe" in dict(spec.assumptions)
    given = _load(tmp_path / "run.pth", heads=HEADS, resize=32, crop_mode="squash").spec
    assert "resize_recipe" not in dict(given.assumptions) and given.kind_of("resize_recipe") == "given"


def test_cli_warnings_are_one_clean_line_with_the_flags(tiny_ckpt: Path, photo: Path, tmp_path: Path,
                                                         capfd: pytest.CaptureFixture[str]) -> None:
    """On the command line vitviz's warnings are `vitviz: warning: ...`, one line each, naming the flag (--heads N),
    never a Python argument (heads=N) or a source line of vitviz's code."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", "import sys; from vitviz.cli import main; sys.exit(main())", "export", "--model", str(tiny_ckpt), str(photo),
                           "--out", str(tmp_path / "o"), "--quiet", "--no-verify"],
                          capture_output=True, text=True, timeout=120, env={**__import__("os").environ,
                                                                            "VITVIZ_AUDIT": ""})
    assert proc.returncode == 0, proc.stderr
    lines = [t for t in proc.stderr.splitlines() if t.strip()]
    assert lines and all(t.startswith("vitviz: warning: ") for t in lines), lines
    assert any("pass --heads N" in t for t in lines) and not any("heads=N" in t for t in lines)
    assert not any("infer_spec(" in t or ".py:" in t for t in lines)


def test_a_remembered_override_says_so_and_is_given(tiny_ckpt: Path) -> None:
    """Answers remembered for a file (`vitviz.load(_remembered=)`, as the command line and the window pass them)
    are given, never assumed, and their provenance says they are remembered -- not a plain override -- in
    `spec.to_dict()` (the export manifest); an override typed now stays 'override'."""
    spec = _load(tiny_ckpt, heads=4, block_norm="post", act="relu", _remembered={"heads", "block_norm"}).spec
    data = spec.to_dict()
    assert data["provenance"]["num_heads"].startswith("remembered: you answered 4 in the window for this file")
    assert "forget: vitviz info FILE --forget" in data["provenance"]["num_heads"]
    assert data["provenance"]["block_norm"].startswith("remembered: you answered post")
    assert data["provenance"]["mlp_kind"] == "override"
    assert data["provenance_kinds"]["num_heads"] == data["provenance_kinds"]["block_norm"] == "given"
    assert not {"num_heads", "block_norm", "mlp_kind"} & set(data["assumptions"])
    scale = _load(tiny_ckpt, heads=HEADS, attn_scale=0.0, _remembered=("attn_scale",)).spec
    assert scale.source_of("attn_scale").startswith("remembered: you answered 0 (head_dim^-0.5)")
    from vitviz.core.spec import audit_provenance

    assert audit_provenance(spec) == [] and audit_provenance(scale) == []


def test_remembered_names_only_what_was_given_and_only_rememberable_overrides(tiny_ckpt: Path) -> None:
    from vitviz.errors import VitvizError

    spec = _load(tiny_ckpt, heads=HEADS, _remembered=frozenset({"heads", "act"})).spec   # act not given: nothing
    assert spec.source_of("num_heads").startswith("remembered") and spec.kind_of("mlp_kind") == "assumed"
    with pytest.raises(VitvizError, match="expected overrides among heads, block_norm, act, attn_scale"):
        _load(tiny_ckpt, heads=HEADS, eps=1e-6, _remembered={"eps"})
    with pytest.raises(VitvizError, match="expected a collection of override names"):
        _load(tiny_ckpt, heads=HEADS, _remembered="heads")
