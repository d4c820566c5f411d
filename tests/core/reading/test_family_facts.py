"""What each family knows beside its converter (PREPROCESS, NAME_HINTS, ...) and the one list of every choice
(`vitviz.core.options`): every family declares its facts, the readers give what the old central tables gave, and
no module keeps a copy of a list that `options` or `formats` owns."""
from __future__ import annotations

import argparse
import ast
import importlib
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from vitviz.core.reading import families

from vitviz.core import options
from vitviz.core.spec import IMAGENET_MEAN, IMAGENET_STD, INCEPTION_MEAN, INCEPTION_STD

PACKAGE = Path(__file__).resolve().parents[3] / "vitviz"
OPENAI_MEAN = (0.48145466, 0.4578275, 0.40821073)   # OpenAI CLIP's statistics, written out here on purpose
OPENAI_STD = (0.26862954, 0.26130258, 0.27577711)


# ------------------------------------------------------------------------------------------------ family facts

@pytest.mark.parametrize("module", families.FAMILIES, ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_every_family_declares_its_facts(module: ModuleType) -> None:
    assert isinstance(module.HELP, str) and module.HELP.strip()
    assert isinstance(families.fact(module, "REGISTERED_SIZES"), bool)
    for name, recipe in families.fact(module, "PREPROCESS").items():
        assert isinstance(recipe, families.Recipe), name
        assert 0 < recipe.crop_pct <= 1 and recipe.mode in options.CROP_MODES
        assert recipe.interpolation in options.INTERPOLATIONS and len(recipe.mean) == len(recipe.std)
    for pattern, family, priority in families.fact(module, "NAME_HINTS"):
        assert isinstance(pattern, str) and isinstance(family, str) and isinstance(priority, int)
    for model_type, family in families.fact(module, "HF_MODEL_TYPES").items():
        assert family.startswith("hf-"), model_type


def test_a_family_without_its_facts_is_refused() -> None:
    fake = ModuleType("vitviz.core.reading.families.newfamily")
    fake.NAMES, fake.detect, fake.convert = ("newfamily",), lambda *a: None, lambda *a: None
    with pytest.raises(AssertionError, match="newfamily does not declare DETECT_ORDER, HELP"):
        families.check_family_module(fake)
    fake.HELP, fake.DETECT_ORDER = "a new layout", 500
    families.check_family_module(fake)
    # what it does not state is the cautious default: no eval recipe, not the registered sizes, no name hints
    assert [families.fact(fake, name) for name in ("PREPROCESS", "REGISTERED_SIZES", "NAME_HINTS")] == [{}, False, ()]
    fake.REGISTERED_SIZES = True
    assert families.fact(fake, "REGISTERED_SIZES") is True


@pytest.mark.parametrize("name, family", [
    ("cait_s24_224.pth", "cait"), ("pe_core_b16.pt", "pe"), ("facebook/PE-Core-B16-224", "pe"),
    ("vit_pe_core_base_patch16_224.fb", "pe"),
    ("dinov3_vitl16_pretrain_lvd1689m-8aa4cbdd.pth", "dinov3"), ("dinov2_vitb14_pretrain.pth", "dinov2"),
    ("vit_base_patch16_siglip_224.webli", "siglip"), ("eva02_base_patch14_224.mim_in22k", "eva"),
    ("eva_giant_patch14_clip_224", "eva"), ("vit_base_patch16_rope_reg1_gap_256", "eva"),
    ("ViT-B-16-openai-clip.bin", "clip"), ("beit_base_patch16_224.pth", "beit"),
    ("deit3_small_patch16_224.pth", "deit3"), ("deit_3_base_224.pth", "deit3"), ("deit_tiny_patch16_224.pth", "deit"),
    ("dino_deitsmall16_pretrain.pth", "deit"),   # as before: deit is tried before dino
    ("dino_vitbase16_pretrain.pth", "dino"), ("mae_pretrain_vit_base.pth", "mae"),
    ("vit_base_patch16_224.augreg_in21k.bin", "timm"), ("google/vit-base-patch16-224", "timm"),
    ("resnet50.pth", None), ("weights.pth", None), ("mae.pth", None), ("sam_vit_b_01ec64.pth", "timm"),
])
def test_family_from_a_name(name: str, family: str | None) -> None:
    from vitviz.catalog.scan import guess_family_from_name

    assert families.family_from_name(name) == family
    assert guess_family_from_name(name) == family


def test_recipes_are_the_old_table() -> None:
    """A few rows of the table hyperparams kept before (crop_pct, interpolation, mean, std, mode), by hand."""
    r = families.recipe
    assert r("clip") == (1.0, "bicubic", OPENAI_MEAN, OPENAI_STD, "center") == r("hf-clip") == r("timm-clip")
    assert r("eva02") == (0.9, "bicubic", OPENAI_MEAN, OPENAI_STD, "center")
    assert r("timm") == (0.9, "bicubic", INCEPTION_MEAN, INCEPTION_STD, "center")
    assert r("deit") == (0.875, "bicubic", IMAGENET_MEAN, IMAGENET_STD, "center")
    assert r("torchvision") == (0.875, "bilinear", IMAGENET_MEAN, IMAGENET_STD, "center")
    assert r("hf-vit") == r("hf") == (1.0, "bilinear", INCEPTION_MEAN, INCEPTION_STD, "squash")
    assert r("hf-siglip2") == (1.0, "bilinear", INCEPTION_MEAN, INCEPTION_STD, "squash")
    assert r("hf-dinov3") == (1.0, "bilinear", IMAGENET_MEAN, IMAGENET_STD, "squash")
    assert r("timm_rope") == (0.95, "bicubic", IMAGENET_MEAN, IMAGENET_STD, "center")
    assert r("seed") == (1.0, "bilinear", (0.0,), (1.0,), "squash")
    assert r("timm-swin") == r("timm") and r("hf-sam") == r("hf")   # a sub-family takes its prefix's recipe
    for layout in ("structural", "vit_pytorch", "torch_encoder", "swin", "sam"):
        assert r(layout) is None, layout
    assert r("hf-blip") == (1.0, "bicubic", OPENAI_MEAN, OPENAI_STD, "squash")   # BlipImageProcessor
    # every row of the old table, none lost; mmpretrain, hf-vitpose, hf-ijepa, timm_relpos, hf-aimv2, hf-blip,
    # hf-internvit since
    assert len(families.PREPROCESS) == 28 + 7


def test_registered_sizes_hf_types_and_eval_sizes() -> None:
    for family in ("timm", "deit3", "dinov2", "hf-vit", "clip", "eva02", "pe", "beit", "jax-siglip", "torchvision"):
        assert families.follows_registered_sizes(family), family
    for family in ("structural", "vit_pytorch", "torch_encoder", "seed", "swin", "sam"):
        assert not families.follows_registered_sizes(family), family
    assert set(families.REGISTERED_FAMILIES) >= {"timm", "deit", "deit3", "dino", "dinov2", "mae", "torchvision", "hf",
                                                 "clip", "eva", "eva02", "dinov3", "pe", "rope_vit", "beit", "jax"}
    assert families.hf_family("dinov2_with_registers") == "hf-dinov2"
    assert families.hf_family("clip_vision_model") == "hf-clip"
    assert families.hf_family("data2vec-vision") == "hf-data2vec-vision"
    assert families.hf_family("siglip2_vision_model") == "hf-siglip2"
    assert families.hf_family("dinov3_vit") == "hf-dinov3"
    assert families.hf_family("bert") is None
    assert families.eval_size("dinov2")[0] == families.eval_size("hf-dinov2")[0] == 224
    assert families.eval_size("timm") is None


def test_cli_family_help_names_every_family_without_torch() -> None:
    code = ("import sys, argparse; from vitviz.cli.options import add_override_arguments\n"
            "p = argparse.ArgumentParser(); add_override_arguments(p); p.parse_args(['--interpolation', 'hamming'])\n"
            "assert 'torch' not in sys.modules, 'building the parser imported torch'\n"
            "print(p.format_help())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=PACKAGE.parent).stdout
    text = " ".join(out.split())
    for name in ("timm", "dinov2", "eva02", "structural", "vit_pytorch", "hf-siglip2", "jax-siglip"):
        assert name in text.replace("- ", "-"), name


# ------------------------------------------------------------------------------------------------- the options

def _parser() -> argparse.ArgumentParser:
    from vitviz.cli.options import add_override_arguments

    parser = argparse.ArgumentParser()
    add_override_arguments(parser)
    return parser


def test_cli_choices_are_the_options_lists() -> None:
    choices = {a.dest: tuple(a.choices) for a in _parser()._actions if a.choices}
    assert choices == {"crop_mode": options.CROP_MODES, "interpolation": options.INTERPOLATIONS,
                       "act": options.ACTIVATIONS, "block_norm": options.BLOCK_NORMS,
                       "pooling": options.CLI_POOLINGS, "patch_order": options.PATCH_ORDERS,
                       "pos_interp": options.POS_RECIPES, "head_act": options.ACTIVATIONS,
                       "rope": options.ROPE_PRESET_NAMES, "pos_kind": options.POS_KINDS}
    args = _parser().parse_args(["--interpolation", "hamming", "--rope", "rope_mixed"])
    assert (args.interpolation, args.rope) == ("hamming", "rope_mixed")


def test_library_lists_are_the_options_lists() -> None:
    from vitviz.core.running import images, model
    from vitviz.core import posembed
    from vitviz.core.analyses import relevance
    from vitviz.core.reading import validate
    assert model.ACTIVATIONS is options.ACTIVATIONS and model.BLOCK_NORMS is options.BLOCK_NORMS
    assert posembed.RECIPES is options.POS_RECIPES and posembed.ROPE_KINDS is options.ROPE_KINDS
    for preset, settings in options.ROPE_PRESETS.items():   # each preset is a kind the RoPE code computes
        assert settings["rope"] in options.ROPE_KINDS + ("",), preset
    assert validate.INTERPOLATIONS is options.INTERPOLATIONS and set(images.PIL_FILTERS) == set(options.INTERPOLATIONS)
    assert relevance.ONE_VECTOR_POOLINGS is options.ONE_VECTOR_POOLINGS
    for act in options.ACTIVATIONS:   # every name offered builds an activation
        model.make_act(act)
    out = validate.check_overrides({"interpolation": "hamming", "crop_mode": "squash_crop", "rope": "pe"},
                                   families.FAMILY_NAMES)
    assert out["interpolation"] == "hamming"
    with pytest.raises(validate.OverrideError, match="expected one of nearest, bilinear, bicubic, lanczos, box, "
                                                     "hamming"):
        validate.check_overrides({"interpolation": "area"}, families.FAMILY_NAMES)


def test_options_imports_only_the_stdlib() -> None:
    tree = ast.parse((PACKAGE / "core" / "options.py").read_text(encoding="utf-8"))
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert imported <= set(sys.stdlib_module_names), imported - set(sys.stdlib_module_names)   # no vitviz, no torch


def test_weight_file_orders() -> None:
    from vitviz.catalog import hub
    from vitviz.core import formats
    scan = importlib.import_module("vitviz.catalog.scan")     # `catalog.scan` is also its function
    assert formats.FOLDER_WEIGHT_NAMES == (
        "model.safetensors", "pytorch_model.bin", "pytorch_model.pth", "model.pth", "open_clip_model.safetensors",
        "open_clip_pytorch_model.bin", "model.safetensors.index.json")
    assert hub.HUB_WEIGHT_NAMES == ("model.safetensors", "model.safetensors.index.json", "open_clip_model.safetensors",
                                "pytorch_model.bin", "open_clip_pytorch_model.bin")
    assert scan.FOLDER_WEIGHT_NAMES is formats.FOLDER_WEIGHT_NAMES


def test_one_name_per_thing() -> None:
    """The second names a list once had beside its owner's (`options`, `formats`, the families' registry) are gone:
    every user reads the owner's name."""
    from vitviz import catalog
    from vitviz.catalog import hub
    from vitviz.core.analyses import mapkinds, relevance
    from vitviz.core.reading import hyperparams, validate
    from vitviz.core.running import images
    scan = importlib.import_module("vitviz.catalog.scan")
    gone = [(validate, "INTERPOLATION_NAMES"), (options, "LEGRAD_POOLINGS"),
            (mapkinds, "LEGRAD_POOLINGS"), (relevance, "LEGRAD_POOLINGS"), (hyperparams, "TABLE_FAMILIES"),
            (scan, "HF_WEIGHT_NAMES"), (catalog, "HF_WEIGHT_NAMES"), (hub, "WEIGHT_FILES")]
    assert [f"{module.__name__}.{name}" for module, name in gone if hasattr(module, name)] == []
    assert images.INTERPOLATIONS is options.INTERPOLATIONS and set(images.PIL_FILTERS) == set(options.INTERPOLATIONS)


def _literal_lists(path: Path) -> list[tuple[int, set[str]]]:
    """(line, the strings) of every tuple, list or set literal of strings in a source file (a dict of labels keyed
    by the names is the window's wording: `test_labels_name_the_options` holds its keys to the lists)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else []
        strings = {i.value for i in items if isinstance(i, ast.Constant) and isinstance(i.value, str)}
        if strings:
            out.append((node.lineno, strings))
    return out


@pytest.mark.parametrize("owner, names, at_least", [
    ("core/options.py", set(options.CROP_MODES), 3),   # all three: a mode dispatch may name two
    ("core/options.py", set(options.INTERPOLATIONS), 3),
    ("core/options.py", {"dinov2_reg", "bilinear_aa"}, 2),   # the recipes no family is named after
    ("core/options.py", {"rope_vit", "rope_mixed", "timm_rope"}, 3),
    ("core/options.py", {"pre", "post", "res_post"}, 3),
    ("core/formats.py", {"pytorch_model.bin", "open_clip_model.safetensors", "model.safetensors.index.json",
                         "open_clip_pytorch_model.bin", "pytorch_model.pth", "model.pth"}, 2),
])
def test_no_other_module_keeps_its_own_list(owner: str, names: set[str], at_least: int) -> None:
    copies = [f"{path.relative_to(PACKAGE)}:{line}" for path in sorted(PACKAGE.rglob("*.py"))
              if path != PACKAGE / owner for line, strings in _literal_lists(path) if len(strings & names) >= at_least]
    assert not copies, f"a copy of a list vitviz/{owner} owns: {copies}"


def test_labels_name_the_options() -> None:
    """The window's words for each choice cover exactly the options' names (a new choice cannot go unoffered)."""
    pytest.importorskip("PySide6")
    from vitviz.gui import assumptions
    from vitviz.gui.panels import model_settings

    assert tuple(options.CROP_MODE_LABELS) == options.CROP_MODES
    assert tuple(assumptions.ACTIVATIONS) == options.ACTIVATIONS
    assert tuple(assumptions.NORM_ORDERS) == tuple(model_settings.NORM_TEXTS) == options.BLOCK_NORMS


def test_every_cli_override_is_a_load_keyword(monkeypatch: pytest.MonkeyPatch) -> None:
    from vitviz.cli.options import override_names, overrides_from
    from vitviz.core.reading.hyperparams import OVERRIDES
    from vitviz.core.running.live import LIVE_OVERRIDES
    from vitviz.core.running.winload import WINDOW_OVERRIDES

    monkeypatch.setenv("VITVIZ_VERBOSE", "")   # --verbose sets it: restored after the test
    names = override_names()
    assert set(names) <= set(OVERRIDES + WINDOW_OVERRIDES + LIVE_OVERRIDES), set(names) - set(OVERRIDES)
    assert {"heads", "interpolation", "rope", "eps_final", "window", "code", "in_chans"} <= set(names)
    args = _parser().parse_args(["--heads", "3", "--interpolation", "hamming", "--window", "8", "--verbose"])
    assert overrides_from(args) == {"heads": 3, "interpolation": "hamming", "window": 8}


def test_the_windowed_families_are_the_ones_declaring_a_windowed_layout() -> None:
    """A windowed family is its module alone: `WINDOWED` names the windowed model's layout it converts to, and the
    loader routes by it (no list of windowed families elsewhere)."""
    from vitviz.core.reading.families import FAMILIES, windowed_layout
    from vitviz.core.reading.families import sam, swin, vitdet

    assert {n: windowed_layout(n) for n in swin.NAMES + sam.NAMES + vitdet.NAMES} == {
        **{n: "swin" for n in swin.NAMES}, **{n: "sam" for n in sam.NAMES + vitdet.NAMES}}
    plain = [n for m in FAMILIES if not hasattr(m, "WINDOWED") for n in m.NAMES]
    assert plain and all(windowed_layout(n) is None for n in plain)
    assert {m.WINDOWED for m in FAMILIES if hasattr(m, "WINDOWED")} == {"swin", "sam"}
