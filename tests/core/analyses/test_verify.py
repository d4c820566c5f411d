"""`vitviz verify`: the converted model compared with the original implementation, per family, at two sizes.

Every case builds the original with random (perturbed) weights, saves it the way its users save it, loads the file
with vitviz and verifies: the original is built again by its library (or by the user's code) with the file's
weights, and every layer's attention and the output are compared on a probe input. The negative cases show the
comparison fails when it should: a ReLU model read as GELU, a wrong eps, a resampling recipe that only shows at the
other size, a file that is not the model its name says; and that nothing is called verified when nothing names the
model. Bad devices and sizes are refused naming them, and a timm whose import raises is 'not verified', said.
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import vitviz
from _hostile import DEMO, REPO
from parity_refs import perturb
from vitviz.core.spec import GuessWarning
from vitviz.core.analyses.verify import ATOL_ATTENTION, Verification, verify
from vitviz.errors import VitvizError

timm = pytest.importorskip("timm")
transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.filterwarnings("ignore::vitviz.core.spec.GuessWarning",
                                        "ignore:.*text tower:UserWarning")
TINY = dict(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4)
NATIVE, OTHER = (32, 32), (48, 48)   # the other size: 2 more 8 px patches per side

CODE = '''
import sys
import types

import torch
from torch import nn

CALLS = sys.modules.setdefault("_verify_test_calls", types.ModuleType("_verify_test_calls"))


class EncoderViT(nn.Module):
    """A ViT written with nn.TransformerEncoder, as tutorials write it (post-norm, ReLU)."""

    def __init__(self, dim=32, heads=4):
        super().__init__()
        self.patch = nn.Conv2d(3, dim, 8, 8)
        self.cls = nn.Parameter(torch.randn(1, 1, dim))
        self.pos = nn.Parameter(torch.randn(1, 17, dim) * 0.5)
        layer = nn.TransformerEncoderLayer(dim, heads, 2 * dim, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(dim, 10)

    def forward(self, x):
        CALLS.n = getattr(CALLS, "n", 0) + 1
        x = self.patch(x).flatten(2).transpose(1, 2)  # (B, D, 4, 4) -> (B, 16, D)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        return self.head(self.encoder(x)[:, 0])


def encoder():
    return EncoderViT()


def vit_pytorch():
    from vit_pytorch import ViT
    return ViT(image_size=32, patch_size=8, num_classes=4, dim=32, depth=2, heads=2, mlp_dim=64, dim_head=16)


def torchvision_vit():
    from torchvision.models.vision_transformer import VisionTransformer
    return VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=4, hidden_dim=64, mlp_dim=128,
                             num_classes=5)


def timm_relu():
    from timm.models.vision_transformer import VisionTransformer
    return VisionTransformer(num_classes=5, mlp_ratio=2.0, act_layer=nn.ReLU, img_size=32, patch_size=8,
                             embed_dim=64, depth=2, num_heads=4)


def timm_gelu():
    from timm.models.vision_transformer import VisionTransformer
    return VisionTransformer(num_classes=5, mlp_ratio=2.0, img_size=32, patch_size=8, embed_dim=64, depth=2,
                             num_heads=4)
'''


def _user_module(code: Path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("_verify_test_models", code)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("verify")
    (folder / "models.py").write_text(CODE)
    return folder


def _timm_folder(root: Path, arch: str) -> Path:
    folder = root / arch
    if not folder.is_dir():
        torch.manual_seed(0)
        model = perturb(timm.create_model(arch, pretrained=False, num_classes=5, **TINY))
        timm.models._hub.save_for_hf(model, str(folder), model_args=TINY, safe_serialization=True)
    return folder


def _hf_folder(root: Path, kind: str) -> Path:
    from transformers import (CLIPConfig, CLIPModel, Dinov2Config, Dinov2Model, ViTConfig,
                              ViTForImageClassification)

    folder = root / f"hf_{kind}"
    if not folder.is_dir():
        torch.manual_seed(0)
        c = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, image_size=32, patch_size=8)
        if kind == "vit":
            model = ViTForImageClassification(ViTConfig(intermediate_size=128, num_labels=5, **c))
        elif kind == "dinov2":
            model = Dinov2Model(Dinov2Config(mlp_ratio=2, **c))
        else:  # a whole CLIP: its vision tower and the image-embedding projection
            text = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                        vocab_size=64, bos_token_id=0, eos_token_id=1)
            model = CLIPModel(CLIPConfig(vision_config={**c, "intermediate_size": 128}, text_config=text,
                                         projection_dim=16))
        perturb(model).save_pretrained(folder)
    return folder


def _open_clip_file(root: Path) -> Path:
    open_clip = pytest.importorskip("open_clip")
    folder = root / "open_clip"
    if not folder.is_dir():
        folder.mkdir()
        vision = dict(layers=2, width=64, head_width=16, patch_size=8, image_size=32, mlp_ratio=2.0,
                      ls_init_value=0.5)
        text = dict(context_length=8, vocab_size=64, width=32, heads=2, layers=1)
        torch.manual_seed(0)
        model = perturb(open_clip.CLIP(embed_dim=16, quick_gelu=True, vision_cfg=vision, text_cfg=text).eval())
        torch.save(model.state_dict(), folder / "open_clip_pytorch_model.bin")  # the whole CLIP, text tower too
        (folder / "open_clip_config.json").write_text(json.dumps({
            "model_cfg": {"embed_dim": 16, "quick_gelu": True, "vision_cfg": vision, "text_cfg": text},
            "preprocess_cfg": {"mean": [0.1, 0.2, 0.3], "std": [0.3, 0.3, 0.3]}}))
    return folder / "open_clip_pytorch_model.bin"


def _code_weights(root: Path, factory: str) -> Path:
    path = root / f"{factory}.pth"
    if not path.is_file():
        torch.manual_seed(0)
        torch.save(perturb(getattr(_user_module(root / "models.py"), factory)()).state_dict(), path)
    return path


def _load(path: Path, **kw):
    return vitviz.load(path, device="cpu", **kw)


def assert_verified(check: Verification, sizes: tuple[tuple[int, int], ...], depth: int = 2) -> None:
    assert check.verdict == "verified", check.summary() + " " + check.reason
    assert check.sizes == sizes and check.first_differing_layer is None
    assert len(check.per_layer) == len(sizes) and all(len(layers) == depth for layers in check.per_layer)
    assert all(d <= ATOL_ATTENTION for layers in check.per_layer for _, d in layers)
    assert check.max_output is not None and check.max_output <= 1e-4
    assert check.summary().startswith(f"Verified against {check.against} (max ")


# ----------------------------------------------------------------------------------------------- libraries
LIBRARY_CASES = {
    "timm vit": ("timm", lambda root: _timm_folder(root, "vit_small_patch16_224")),
    "timm deit distilled": ("timm", lambda root: _timm_folder(root, "deit_tiny_distilled_patch16_224")),
    "timm dinov2 registers": ("timm", lambda root: _timm_folder(root, "vit_small_patch14_reg4_dinov2")),
    "transformers vit": ("transformers", lambda root: _hf_folder(root, "vit")),
    "transformers dinov2": ("transformers", lambda root: _hf_folder(root, "dinov2")),
    "transformers clip": ("transformers", lambda root: _hf_folder(root, "clip")),
}


@pytest.mark.parametrize("case", list(LIBRARY_CASES))
def test_named_models_are_verified_against_their_library_at_two_sizes(root: Path, case: str) -> None:
    library, make = LIBRARY_CASES[case]
    model = _load(make(root))
    assert model.spec.named
    check = verify(model)
    assert_verified(check, (NATIVE, OTHER))
    assert check.library == library and check.version == importlib_version(library)
    assert check.against == f"{library} {check.version}" and not check.skipped
    if case == "timm deit distilled":
        assert model.spec.prefix_names == ("cls", "dist")
    if case == "timm dinov2 registers":
        assert model.spec.reg_tokens == 4
    json.dumps(check.to_dict())  # the manifest's entry is plain JSON


def importlib_version(library: str) -> str:
    return __import__(library).__version__


def test_a_published_file_named_by_its_hub_name_is_verified(tmp_path: Path) -> None:
    """DeiT's releases are `{'model': ...}` files named NAME-HASH.pth: the name is a timm model (ViT-Ti/16: the real
    size, since the name fixes it), built with the file's head and table sizes."""
    import hashlib

    torch.manual_seed(0)
    model = perturb(timm.create_model("deit_tiny_patch16_224", pretrained=False, num_classes=7))
    raw = tmp_path / "raw.pth"
    torch.save({"model": model.state_dict()}, raw)
    path = raw.rename(tmp_path / f"deit_tiny_patch16_224-{hashlib.sha256(raw.read_bytes()).hexdigest()[:8]}.pth")
    loaded = _load(path)
    assert loaded.spec.source_of("identity").startswith("named: the published file 'deit_tiny_patch16_224'")
    check = verify(loaded)
    assert_verified(check, ((224, 224), (256, 256)), depth=12)
    assert check.original.startswith("timm.create_model('deit_tiny_patch16_224', num_classes=7")


def test_open_clip_vision_tower_is_verified_at_two_sizes(root: Path) -> None:
    model = _load(_open_clip_file(root))
    assert model.spec.named and "open_clip model config" in model.spec.source_of("identity")  # its config names it
    check = verify(model)
    assert_verified(check, (NATIVE, OTHER))   # at 48 px a tower of that size, its table resized by open_clip
    assert check.library == "open_clip" and check.original.endswith(".visual")


# ------------------------------------------------------------------------------------------------- --code
CODE_CASES = {"torchvision": ("torchvision_vit", 4), "vit-pytorch": ("vit_pytorch", 2),
              "nn.TransformerEncoder": ("encoder", 4)}


@pytest.mark.parametrize("case", list(CODE_CASES))
def test_code_originals_are_verified(root: Path, case: str) -> None:
    """The user's module (their factory, the file's weights) against vitviz's conversion of the same file; these
    originals have a fixed position table, so the other size is skipped, and said why."""
    factory, heads = CODE_CASES[case]
    weights = _code_weights(root, factory)
    model = _load(weights, heads=heads)   # a bare state dict: nothing names it, the heads are given
    assert not model.spec.named
    check = verify(model, code=f"{root / 'models.py'}:{factory}")
    assert_verified(check, (NATIVE,))
    assert check.library == "code" and check.against == f"models.py:{factory}"
    assert [size for size, _ in check.skipped] == [OTHER]
    assert "48x48" in check.skipped[0][1]


def test_a_live_model_given_its_code_is_checked_through_its_files_conversion(root: Path) -> None:
    weights = _code_weights(root, "vit_pytorch")
    live = vitviz.load(weights, code=f"{root / 'models.py'}:vit_pytorch", device="cpu")
    assert verify(live).verdict == "unverified" and "live model" in verify(live).reason
    # its file's conversion needs the head count, which a bare vit-pytorch file does not hold: guessed 1 of 32
    check = verify(live, code=f"{root / 'models.py'}:vit_pytorch")
    assert check.verdict == "differs" and check.first_differing_layer == 0


def test_one_forward_of_the_original_per_size(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    weights = _code_weights(root, "encoder")
    model = _load(weights, heads=4)
    calls = sys.modules.setdefault("_verify_test_calls", type(sys)("_verify_test_calls"))
    calls.n = 0
    verify(model, code=f"{root / 'models.py'}:encoder", sizes=[NATIVE])
    assert calls.n == 1
    from timm.models.vision_transformer import VisionTransformer

    forward, seen = VisionTransformer.forward, []
    monkeypatch.setattr(VisionTransformer, "forward", lambda self, x: seen.append(x.shape) or forward(self, x))
    verify(_load(_timm_folder(root, "vit_small_patch16_224")))
    assert [tuple(s[-2:]) for s in seen] == [NATIVE, OTHER]


# ---------------------------------------------------------------------------------------------- negatives
def test_relu_model_read_as_gelu_differs_from_layer_1(root: Path) -> None:
    """The file alone says nothing about the activation, so vitviz assumes GELU; the user's code builds ReLU.
    Layer 0's attention sees only the patch embedding and the first norm, so it agrees; from layer 1 on it
    cannot."""
    weights = _code_weights(root, "timm_relu")
    model = _load(weights, heads=4)
    assert model.spec.mlp_kind == "gelu" and "mlp_kind" in dict(model.spec.assumptions)
    check = verify(model, code=f"{root / 'models.py'}:timm_relu")
    assert check.verdict == "differs" and check.first_differing_layer == 1
    (layer0, d0), (layer1, d1) = check.per_layer[0]
    assert d0 <= ATOL_ATTENTION < d1 and check.max_output > 1e-4
    # the cause is named: the user's module states its activation (nn.ReLU in its MLPs), vitviz assumed GELU
    assert check.summary() == (f"Differs from the original from layer 1 (max {_fmt(check.max_attention)}); could be "
                               "mlp_kind (relu)")
    assert check.causes == (("mlp_kind", "relu"),) and dict(check.suggested) == {"act": "relu"}
    assert "mlp_kind" in check.assumptions and check.confirmed == ()
    # the same file and the same code, read with the activation the code uses: verified, and every assumption the
    # probe reaches is confirmed by the user's own code (the image preprocessing is not: the probe is normalised)
    fixed = verify(_load(weights, heads=4, act="relu"), code=f"{root / 'models.py'}:timm_relu")
    assert fixed.verdict == "verified" and fixed.causes == ()
    assert set(fixed.confirmed) == set(fixed.assumptions) - {"preprocess"} and "eps" in fixed.confirmed
    # and a GELU model of the same weights is what vitviz assumed
    assert verify(model, code=f"{root / 'models.py'}:timm_gelu").verdict == "verified"


def _fmt(value: float) -> str:
    from vitviz.core.analyses.verify import format_difference

    return format_difference(value)


def test_bare_state_dict_is_unverified_with_its_assumptions(root: Path) -> None:
    weights = _code_weights(root, "timm_gelu")
    model = _load(weights, heads=4)
    check = verify(model)
    names = tuple(name for name, _ in model.spec.assumptions)
    assert check.verdict == "unverified" and check.assumptions == names and "mlp_kind" in names
    # its layout is timm's, but no registered timm architecture has its shapes (vitviz.core.reading.identify): said, with
    # the route that can check it
    assert check.reason.startswith(f"nothing names the model: {len(names)} assumptions; no timm architecture")
    assert "code=FILE.py:FACTORY" in check.reason and check.fitting == ()
    assert check.summary() == f"Not verified — {len(names)} assumptions ({', '.join(names)})"
    assert check.library == "timm" and check.sizes == () and check.max_attention is None
    for against in ("timm", "transformers"):  # naming a library does not make vitviz's guesses a proof
        assert verify(model, against=against).verdict == "unverified"
    assert "not transformers's" in verify(model, against="transformers").reason   # timm's layout, said


def test_a_wrong_setting_of_a_named_model_differs(root: Path) -> None:
    folder = _timm_folder(root, "vit_small_patch16_224")
    check = verify(_load(folder, eps=1e-2))   # timm's eps is 1e-6: the first norm already differs
    assert check.verdict == "differs" and check.first_differing_layer == 0


def test_a_resampling_recipe_differs_only_at_the_other_size(root: Path) -> None:
    check = verify(_load(_hf_folder(root, "dinov2"), pos_interp="timm"))   # HF DINOv2 resamples its own way
    assert check.verdict == "differs" and check.sizes == (NATIVE, OTHER)
    native, other = check.per_layer
    assert all(d <= ATOL_ATTENTION for _, d in native) and check.output_per_size[0] <= 1e-4
    assert max(d for _, d in other) > ATOL_ATTENTION


def test_a_file_that_is_not_the_model_its_name_says_differs(tmp_path: Path) -> None:
    """A torchvision file name names vit_b_16; a smaller model saved under it does not fit vit_b_16 (checked on the
    meta device: no ViT-B is built)."""
    from torchvision.models import VisionTransformer

    torch.manual_seed(0)
    net = VisionTransformer(image_size=224, patch_size=16, num_layers=1, num_heads=12, hidden_dim=48, mlp_dim=64)
    torch.save(net.state_dict(), tmp_path / "vit_b_16-c867db91.pth")
    model = _load(tmp_path / "vit_b_16-c867db91.pth")
    assert model.spec.source_of("identity").startswith("named: torchvision vit_b_16")
    check = verify(model)
    assert check.verdict == "differs" and "do not fit" in check.reason and check.library == "torchvision"
    assert check.summary().startswith("Differs from the original: ")


def test_a_library_that_is_not_importable_is_said(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = _load(_timm_folder(root, "vit_small_patch16_224"))
    monkeypatch.setitem(sys.modules, "timm", None)   # `import timm` raises ImportError
    check = verify(model)
    assert check.verdict == "unverified" and "pip install timm" in check.reason
    assert check.summary().startswith("Not verified — timm is not importable")


def test_against_another_library_is_unverified(root: Path) -> None:
    check = verify(_load(_timm_folder(root, "vit_small_patch16_224")), against="transformers")
    assert check.verdict == "unverified" and "named by timm" in check.reason
    with pytest.raises(vitviz.VitvizError, match="against="):
        verify(_load(_timm_folder(root, "vit_small_patch16_224")), against="keras")


# ---------------------------------------------------------------------------------------------------- CLI
def test_cli_exit_codes_and_report(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from vitviz.cli import main

    folder = _timm_folder(root, "vit_small_patch16_224")
    assert main(["verify", str(folder)]) == 0
    text = capsys.readouterr().out
    lines = text.splitlines()
    assert "timm.create_model('vit_small_patch16_224')" in text and "32x32" in text and "48x48" in text
    assert lines[-1].startswith("Verified against timm") and "assumptions none" in text
    assert [line.split()[0] for line in lines if line.strip().split()[0] in ("0", "1", "output")] == \
        ["0", "1", "output"]
    code = root / "models.py"
    relu = _code_weights(root, "timm_relu")
    # the activation said on the command line is the user's word (the code's ReLU is read only where nothing is
    # given): GELU against a ReLU original differs from layer 1, and says what could explain it
    assert main(["verify", str(relu), "--heads", "4", "--act", "gelu", "--code", f"{code}:timm_relu"]) == 1
    text = capsys.readouterr().out
    assert text.splitlines()[-1].startswith("Differs from the original from layer 1") and "*" in text
    assert "mlp_kind" in text and "skipped    48x48" in text and "try --act relu" in text
    assert main(["verify", str(relu), "--heads", "4"]) == 1
    assert capsys.readouterr().out.splitlines()[-1].startswith("Not verified — ")
    assert main(["verify", str(folder), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["verdict"] == "verified" and data["sizes"] == [[32, 32], [48, 48]]
    assert [len(entry["layers"]) for entry in data["per_layer"]] == [2, 2]
    assert main(["verify", str(relu), "--code", f"{code}:nope"]) == 2
    assert "defines no 'nope'" in capsys.readouterr().err


def test_export_manifest_has_the_verification(root: Path, tmp_path: Path) -> None:
    from PIL import Image

    from vitviz.cli import main

    image = tmp_path / "img.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (40, 40, 3), dtype=np.uint8)).save(image)
    folder = _timm_folder(root, "vit_small_patch16_224")
    for extra, verdict in (([], "verified"), (["--no-verify"], None)):
        out = tmp_path / f"out{len(extra)}"
        assert main(["export", "--model", str(folder), str(image), "--out", str(out), "--quiet",
                     "--device", "cpu", *extra]) == 0
        entry = json.loads((out / "manifest.json").read_text())["model"]["verification"]
        assert (entry and entry["verdict"]) == verdict
    assert entry is None
    out = tmp_path / "bare"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GuessWarning)
        assert main(["export", "--model", str(_code_weights(root, "timm_gelu")), "--heads", "4", str(image),
                     "--out", str(out), "--quiet", "--device", "cpu"]) == 0
    entry = json.loads((out / "manifest.json").read_text())["model"]["verification"]
    assert entry["verdict"] == "unverified" and "mlp_kind" in entry["assumptions"]


def test_the_library_entry_point(root: Path) -> None:
    """`vitviz.verify(model)` is the library's way in (the same Verification as core.verify)."""
    model = _load(_timm_folder(root, "vit_tiny_patch16_224"))
    check = vitviz.verify(model)
    assert check.verdict == "verified" and check.summary().startswith("Verified against timm")


def test_a_timm_folder_of_an_unregistered_architecture_is_built_from_its_model_args() -> None:
    """The bundled demo's config.json names `vit_demo_shapes_patch8_64`, which timm does not register: its
    `model_args` build timm's VisionTransformer, the original it is checked against (not a traceback)."""
    import warnings

    import vitviz
    from vitviz.resources_path import resource

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = vitviz.load(resource("demo"), device="cpu")
    check = vitviz.verify(model)
    assert check.verdict == "verified", check.summary()
    assert "VisionTransformer(" in check.original and "not a registered timm name" in check.original


def test_cli_verify_code_reads_what_the_file_leaves_assumed_from_the_code(root: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """`vitviz verify FILE --code models.py:timm_relu` with no option: the file alone guesses 1 head and GELU; the
    code is the original, so its attention's head count and its modules' ReLU are read from it (said, with the
    flags), and the conversion with them is verified -- not a first verdict of 'differs' that sends the user back."""
    from vitviz.cli import main

    weights = _code_weights(root, "timm_relu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GuessWarning)
        alone = _load(weights)
    assert alone.spec.num_heads != 4 and alone.spec.mlp_kind == "gelu"
    capsys.readouterr()
    assert main(["verify", str(weights), "--code", f"{root / 'models.py'}:timm_relu"]) == 0
    out, err = capsys.readouterr()
    assert "read from your code" in err and "--heads 4" in err and "--act relu" in err
    assert out.splitlines()[-1].startswith("Verified against models.py:timm_relu")
    assert "num_heads" not in out.split("assumptions")[-1]
    # what the user gives wins over what the code says: a wrong head count given is compared as given
    assert main(["verify", str(weights), "--code", f"{root / 'models.py'}:timm_relu", "--heads", "2"]) == 1
    out, err = capsys.readouterr()
    assert "could be" in out.splitlines()[-1] and "num_heads (4 heads)" in out.splitlines()[-1]


def test_a_two_layer_heads_activation_is_read_from_the_code(tmp_path: Path) -> None:
    """A hand-written head `Classifier(fc1, Tanh, fc2)`: the file alone guesses GELU between its Linears, the model
    object says Tanh (read from its children, `vitviz.load(module)` and `verify --code` alike)."""
    from torch import nn

    from vitviz.core.reading.objects import module_settings

    class Classifier(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1, self.activation, self.fc2 = nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc2(self.activation(self.fc1(x[:, 0])))

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.classifier = Classifier()

    said = module_settings(Net())
    assert said["head_act"][0] == "tanh" and "classifier: Linear, Tanh, Linear" in said["head_act"][1]
    seq = nn.Module()
    seq.mlp_head = nn.Sequential(nn.LayerNorm(8), nn.Linear(8, 8), nn.ReLU(), nn.Dropout(0.1), nn.Linear(8, 3))
    assert module_settings(seq)["head_act"][0] == "relu"
    seq.mlp_head = nn.Sequential(nn.LayerNorm(8), nn.Linear(8, 3))   # one Linear: no head activation to read
    assert "head_act" not in module_settings(seq)


# ---------------------------------------------------------------------------------------- verify's arguments (issue 34)

@pytest.mark.parametrize("options, match", [
    (dict(device="bogus"), "unknown device 'bogus'"), (dict(device="cuda:9"), "cuda:9"),
    (dict(sizes="x"), "sizes='x'"), (dict(sizes=5), "sizes=5"), (dict(sizes=[2.5]), "size 2.5"),
    (dict(sizes=[True]), "size True"), (dict(sizes=[(64,)]), r"size \(64,\)"),
    (dict(sizes=[100000]), r"needs .*expected a smaller size"), (dict(sizes=[]), "at least one")])
def test_verify_refuses_bad_devices_and_sizes(options: dict, match: str, demo) -> None:
    with pytest.raises(VitvizError, match=match):
        vitviz.verify(demo, **options)


def test_verify_with_a_timm_whose_import_raises_says_so(tmp_path: Path, tiny_ckpt: Path) -> None:
    """A broken install (a torchvision that does not match torch makes `import timm` raise RuntimeError): the
    verdict is 'not verified', naming the error, for a named model and for a file nothing names."""
    import subprocess
    import sys

    (tmp_path / "timm").mkdir()
    (tmp_path / "timm" / "__init__.py").write_text('raise RuntimeError("operator torchvision::nms does not exist")\n')
    script = ("import sys, warnings, vitviz; warnings.simplefilter('ignore'); from _tiny import HEADS\n"
              "for path, kw in ((sys.argv[1], {}), (sys.argv[2], {'heads': HEADS})):\n"
              "    print(vitviz.verify(vitviz.load(path, **kw)).summary())\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO / "tests"), str(REPO)])}
    done = subprocess.run([sys.executable, "-c", script, str(DEMO), str(tiny_ckpt)], capture_output=True,
                          text=True, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 2 and all(line.startswith("Not verified") for line in lines), done.stdout
    assert "operator torchvision::nms does not exist" in lines[0]


def test_a_timm_hub_folder_run_by_timms_code_gets_a_verdict_not_a_crash(tmp_path: Path) -> None:
    """A timm hub folder of an architecture vitviz does not convert (CaiT) runs by timm's own code; verify took it
    for a transformers tower run by its code and crashed (AttributeError in towers.original_tower). It now compares
    what vitviz shows with timm's own record of a fresh build from the folder (tests/parity/test_parity_cait.py)."""
    import warnings

    timm = pytest.importorskip("timm")
    from timm.models import save_for_hf

    args = dict(img_size=32, patch_size=8, embed_dim=48, depth=2, num_heads=4, num_classes=5)
    torch.manual_seed(0)
    net = timm.create_model("cait_xxs24_224", pretrained=False, **args).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        save_for_hf(net, str(tmp_path), safe_serialization=True, model_args=args)
        model = vitviz.load(str(tmp_path))
        check = vitviz.verify(model)
    assert check.verdict == "verified" and check.library == "timm", check.reason
    assert "cait_xxs24_224" in check.original and "attn_drop" in check.original


def test_a_timm_model_mixing_its_softmax_before_applying_it_is_verified_on_the_applied_weights(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """EfficientFormerV2's attention mixes its softmax over heads (talking_head2, a convolution) before `attn @ v`;
    vitviz shows the weights applied to the values (said), and verify records the same from timm's module (the left
    operand of the product after the softmax): verified. Recording the softmax itself instead differs."""
    import warnings

    timm = pytest.importorskip("timm")
    from vitviz.core.analyses import verify as verify_module

    torch.manual_seed(0)
    net = timm.create_model("efficientformerv2_s0", pretrained=False, num_classes=5, depths=(1, 1, 1, 2),
                            embed_dims=(8, 16, 24, 32), img_size=64).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = vitviz.load(net, device="cpu", image_size=64)
    check = vitviz.verify(model)
    assert check.verdict == "verified" and check.library == "timm", check.reason
    assert [len(layers) for layers in check.per_layer] == [3]
    monkeypatch.setattr(verify_module, "_PRODUCTS", ())      # no product followed: each softmax as it is
    wrong = vitviz.verify(model)
    assert wrong.verdict == "differs" and wrong.first_differing_layer == 0
