"""Text prompts as relevance targets: `vitviz.core.analyses.text.text_embedding` equals the library's own normalised text
features (open_clip's whole CLIP file, a transformers CLIPModel folder with a tokenizer built here from a tiny
vocabulary -- no network), `prompt_relevance` equals LeGrad / Chefer with that embedding, `vitviz export --maps
text:...` writes the named map, and files without a text tower or tokenizer say so."""
from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import vitviz
from _hostile import variant
from parity_refs import perturb
from vitviz.cli import main
from vitviz.core.analyses.relevance import class_relevance, legrad
from vitviz.core.spec import GuessWarning
from vitviz.core.analyses.text import TextTowerError, prompt_label, prompt_relevance, text_embedding

open_clip = pytest.importorskip("open_clip")
transformers = pytest.importorskip("transformers")

PROMPTS = ["a photo of a cat", "a dog"]
CFG = {"embed_dim": 16, "quick_gelu": True,
       "vision_cfg": dict(layers=2, width=64, head_width=16, patch_size=8, image_size=32, mlp_ratio=2.0),
       "text_cfg": dict(context_length=16, vocab_size=49408, width=32, heads=2, layers=1)}


def quiet_load(path: Path) -> "vitviz.core.running.model.VitModel":
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=GuessWarning)
        warnings.filterwarnings("ignore", message=".*ignored the text tower")
        return vitviz.load(path, device="cpu")


@pytest.fixture(scope="module")
def oc_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    """open_clip's whole CLIP (text tower too) with its open_clip_config.json beside it."""
    torch.manual_seed(0)
    model = perturb(open_clip.CLIP(**CFG).eval())
    folder = tmp_path_factory.mktemp("oc")
    torch.save(model.state_dict(), folder / "open_clip_pytorch_model.bin")
    (folder / "open_clip_config.json").write_text(json.dumps({"model_cfg": CFG}))
    return folder / "open_clip_pytorch_model.bin", model


def tiny_clip_tokenizer(folder: Path) -> "transformers.CLIPTokenizer":
    """A CLIPTokenizer over the 256 byte symbols (alone and word-final) and a few merges."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    symbols = [chr(b) for b in keep] + [chr(256 + i) for i in range(256 - len(keep))]  # GPT-2's byte symbols
    vocab = symbols + [s + "</w>" for s in symbols]
    merges = [("a", "t</w>"), ("c", "at</w>"), ("o", "g</w>"), ("d", "og</w>")]
    vocab += ["".join(m) for m in merges] + ["<|startoftext|>", "<|endoftext|>"]
    return transformers.CLIPTokenizer(vocab={t: i for i, t in enumerate(vocab)},
                                      merges=merges)


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module, object]:
    from transformers import CLIPConfig, CLIPModel

    folder = tmp_path_factory.mktemp("hf")
    tok = tiny_clip_tokenizer(folder)
    v = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, image_size=32,
             patch_size=8)
    t = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
             vocab_size=len(tok), bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
             pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    model = perturb(CLIPModel(CLIPConfig(vision_config=v, text_config=t, projection_dim=16,
                                         attn_implementation="eager")))
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder, model, tok


def test_open_clip_file_text_embedding(oc_file) -> None:
    path, model = oc_file
    got = text_embedding(quiet_load(path), PROMPTS)
    with torch.no_grad():
        ref = model.encode_text(open_clip.SimpleTokenizer(context_length=16)(PROMPTS), normalize=True)
    assert got.shape == (2, 16) and got.dtype == np.float32
    np.testing.assert_allclose(got, ref.numpy(), atol=1e-5)
    np.testing.assert_allclose(text_embedding(path, PROMPTS), got, atol=0)  # the path works as well


def test_openai_layout_without_config(oc_file, tmp_path: Path) -> None:
    """An OpenAI-layout file alone: the architecture from the shapes (heads = width / 64, as open_clip infers)."""
    cfg = {**CFG, "vision_cfg": {**CFG["vision_cfg"], "width": 128, "head_width": 64},
           "text_cfg": {**CFG["text_cfg"], "width": 64, "heads": 1}}
    cfg["vision_cfg"].pop("mlp_ratio")
    torch.manual_seed(1)
    model = perturb(open_clip.CLIP(**cfg).eval())
    torch.save(model.state_dict(), tmp_path / "ViT-tiny.pt")
    with torch.no_grad():
        ref = model.encode_text(open_clip.SimpleTokenizer(context_length=16)(PROMPTS), normalize=True)
    np.testing.assert_allclose(text_embedding(tmp_path / "ViT-tiny.pt", PROMPTS), ref.numpy(), atol=1e-5)


def test_hf_folder_text_embedding(hf_folder) -> None:
    folder, model, tok = hf_folder
    got = text_embedding(quiet_load(folder), PROMPTS)
    with torch.no_grad():
        out = model.get_text_features(**tok(PROMPTS, padding=True, return_tensors="pt"))
        ref = out if isinstance(out, torch.Tensor) else out.pooler_output
        ref = ref / ref.norm(dim=-1, keepdim=True)
    np.testing.assert_allclose(got, ref.numpy(), atol=1e-5)


@pytest.mark.parametrize("which", ["oc", "hf"])
def test_prompt_relevance_is_legrad_and_chefer_of_the_embedding(oc_file, hf_folder, photo: Path, which: str) -> None:
    vm = quiet_load(oc_file[0] if which == "oc" else hf_folder[0])
    emb = text_embedding(vm, ["a photo of a cat"])[0]
    got = prompt_relevance(vm, photo, "a photo of a cat")
    ref = legrad(vm, photo, emb)
    np.testing.assert_allclose(got.map, ref.map, atol=1e-6)
    np.testing.assert_allclose(got.scores, ref.scores, atol=1e-6)
    rel = prompt_relevance(vm, photo, "a photo of a cat", method="chefer")
    np.testing.assert_allclose(rel.chefer, class_relevance(vm, photo, emb).chefer, atol=1e-6)


def test_vision_only_files_say_there_is_no_text_tower(oc_file, tmp_path: Path) -> None:
    path, model = oc_file
    torch.save({k: v for k, v in model.state_dict().items() if k.startswith("visual.")}, tmp_path / "vis.pth")
    (tmp_path / "vis.json").write_text(json.dumps({"model_cfg": CFG}))
    with pytest.raises(TextTowerError, match="no text tower"):
        text_embedding(tmp_path / "vis.pth", PROMPTS)
    from transformers import CLIPVisionConfig, CLIPVisionModel

    hf = tmp_path / "hfvis"
    CLIPVisionModel(CLIPVisionConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                     num_attention_heads=4, image_size=32, patch_size=8)).save_pretrained(hf)
    with pytest.raises(TextTowerError, match="without a text tower"):
        text_embedding(quiet_load(hf), PROMPTS)


def test_hf_folder_without_tokenizer(hf_folder, tmp_path: Path) -> None:
    hf_folder[1].save_pretrained(tmp_path)
    with pytest.raises(TextTowerError, match="no tokenizer files"):
        text_embedding(tmp_path, PROMPTS)


def test_small_vocab_without_tokenizer(tmp_path: Path) -> None:
    cfg = {**CFG, "text_cfg": {**CFG["text_cfg"], "vocab_size": 64}}
    torch.save(open_clip.CLIP(**cfg).state_dict(), tmp_path / "m.bin")
    (tmp_path / "open_clip_config.json").write_text(json.dumps({"model_cfg": cfg}))
    with pytest.raises(TextTowerError, match="vocabulary of 64"):
        text_embedding(tmp_path / "m.bin", PROMPTS)


def _sha8(prompt: str) -> str:
    import hashlib

    return hashlib.sha256(prompt.encode()).hexdigest()[:8]


def test_prompt_label() -> None:
    assert prompt_label("a photo of a Cat!") == f"text-a_photo_of_a_cat-{_sha8('a photo of a Cat!')}"
    assert prompt_label("???") == f"text-prompt-{_sha8('???')}"
    assert prompt_label("a  photo of a Cat! ") == prompt_label("a photo of a Cat!")   # what MapKind.parse keeps


# ----------------------------------------------------------------------------------------------------- export
def test_parse_text_map_keeps_the_prompt() -> None:
    from vitviz.batch.plan import output_name, parse_maps

    maps = parse_maps("cls, Text:A Photo of a Cat ,prompt:a dog")
    assert [m.kind for m in maps] == ["cls", "text", "text"]
    label = f"text-a_photo_of_a_cat-{_sha8('A Photo of a Cat')}"
    assert maps[1].target == "A Photo of a Cat" and maps[1].label == label
    assert output_name("img", maps[1], "all", "mean") == f"img_{label}_Lall.png"
    from vitviz.core.analyses.maps import SelectionError

    with pytest.raises(SelectionError, match="needs a prompt"):
        parse_maps("text:")


@pytest.mark.parametrize("which", ["oc", "hf"])
def test_export_text_map(oc_file, hf_folder, photo: Path, tmp_path: Path, which: str) -> None:
    from PIL import Image

    from vitviz.cli import main
    from vitviz.core.analyses.relevance import legrad

    ckpt = oc_file[0] if which == "oc" else hf_folder[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rc = main(["export", "--model", str(ckpt), str(photo), "--out", str(tmp_path), "--maps",
                   "text:a photo of a cat", "--npz", "--quiet"])
    assert rc == 0
    label = prompt_label("a photo of a cat")
    png = tmp_path / f"photo_{label}_Lall.png"
    assert png.is_file() and Image.open(png).size[0] > 0
    vm = quiet_load(ckpt)
    data = np.load(tmp_path / "photo.npz")
    ref = legrad(vm, photo, text_embedding(vm, ["a photo of a cat"])[0])
    np.testing.assert_allclose(data[label.replace("-", "_")], ref.map, atol=1e-5)


def test_export_text_map_without_text_tower(tiny_ckpt: Path, oc_file, photo: Path, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    from vitviz.cli import main

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["export", "--model", str(tiny_ckpt), "--heads", "4", str(photo), "--out", str(tmp_path / "a"),
                     "--maps", "text:a cat", "--quiet"]) == 2
    assert "not a CLIP / SigLIP image embedding" in capsys.readouterr().err
    vis = tmp_path / "vis"
    vis.mkdir()
    torch.save({k: v for k, v in oc_file[1].state_dict().items() if k.startswith("visual.")}, vis / "v.pth")
    (vis / "open_clip_config.json").write_text(json.dumps({"model_cfg": CFG}))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["export", "--model", str(vis / "v.pth"), str(photo), "--out", str(tmp_path / "b"),
                     "--maps", "text:a cat", "--quiet"]) == 2
    assert "no text tower" in capsys.readouterr().err


# ----------------------------------------------------------------- near-identical prompts, text tower memory (issue 20)

NEAR_PROMPTS = ["一只猫", "一只狗", "a cat", "A CAT!", "a cat?", "???", "!!!", "a" * 60 + " one", "a" * 60 + " two",
                "a photo of a cat", "a photo of a cat.", "A photo of a cat"]


def test_near_identical_prompts_each_get_a_file_of_their_own(family_folders: dict[str, Path], photo: Path,
                                                            tmp_path: Path) -> None:
    import warnings

    import numpy as np

    from vitviz.core.analyses.text import prompt_label

    labels = [prompt_label(p) for p in NEAR_PROMPTS]
    assert len(set(labels)) == len(NEAR_PROMPTS)
    assert labels == [prompt_label(p) for p in NEAR_PROMPTS]          # stable
    out = tmp_path / "out"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(["export", "--model", str(family_folders["open_clip"] / "open_clip_pytorch_model.bin"),
                         str(photo), "--out", str(out), "--maps", ",".join(f"text:{p}" for p in NEAR_PROMPTS),
                         "--npz", "--quiet", "--no-verify"]) == 0
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert pngs == sorted(f"photo_{label}_Lall.png" for label in labels)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["parameters"]["prompts"] == dict(zip(labels, NEAR_PROMPTS))
    assert sorted(manifest["images"][0]["outputs"]) == sorted(pngs + ["photo.npz"])
    keys = set(np.load(out / "photo.npz").files)
    assert all(label.replace("-", "_") in keys for label in labels)


def test_two_maps_under_one_name_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from vitviz.batch.plan import check_unique_names, combos, parse_maps
    from vitviz.core.analyses import text
    from vitviz.core.analyses.maps import SelectionError

    maps = parse_maps("text:a cat,text:A CAT!")
    check_unique_names(combos(maps, ["all"], ["mean"]))
    monkeypatch.setattr(text, "prompt_label", lambda _p: "text-a_cat")   # as names were made before
    with pytest.raises(SelectionError, match="maps text:'a cat' and text:'A CAT!' would both be written as "
                                             "text-a_cat_Lall.png"):
        check_unique_names(combos(maps, ["all"], ["mean"]))


def test_text_tower_memory_is_checked_before_it_is_built(family_folders: dict[str, Path], tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from vitviz.core.running import runtime
    from vitviz.core.analyses.text import text_embedding
    from vitviz.errors import DeviceError

    folder = variant(family_folders["open_clip"], tmp_path / "big", "open_clip_config.json",
                      "model_cfg.text_cfg", "context_length", 8192)
    monkeypatch.setattr(runtime, "available_memory", lambda: 100 << 20)
    with pytest.raises(DeviceError, match=r"context_length 8,192\) needs .* causal mask, but only 100.0 MiB"):
        text_embedding(folder / "open_clip_pytorch_model.bin", ["a cat"])
