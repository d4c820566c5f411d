"""The "by its code" route (`vitviz.core.reading.towers.BY_CODE`): a transformers folder whose vision tower vitviz's
reference ViT cannot represent (Qwen2-VL's packed patches and 2-D rotary positions) is built from its config.json as
the whole model builds it, given only the tower's tensors, and run live; what it runs is said, only the tower's
shards are opened, tensors that do not fit and a missing transformers are refused naming the model, and options
the route does not take are refused. (Parity with transformers: tests/parity/test_parity_qwen_vl.py.)"""
from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

import vitviz
from vitviz.core.reading.checkpoint import read_checkpoint
from vitviz.errors import CompositeModelError, OverrideError

transformers = pytest.importorskip("transformers")

TEXT = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
            vocab_size=100, rope_parameters={"rope_type": "default", "mrope_section": [2, 2, 4]})
VISION = dict(depth=2, embed_dim=32, hidden_size=32, num_heads=4, patch_size=4, spatial_merge_size=2,
              temporal_patch_size=2)


@pytest.fixture(scope="module")
def qwen2_vl() -> Any:
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = transformers.Qwen2VLConfig(text_config=TEXT, vision_config=VISION)
        return transformers.Qwen2VLForConditionalGeneration(cfg).eval()


def _saved(model: Any, folder: Path, **save: Any) -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.save_pretrained(folder, **save)
    return folder


def _load(folder: Any, **overrides: Any) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return vitviz.load(folder, **{"image_size": 32, **overrides})


def test_says_it_runs_transformers_code(tmp_path: Path, qwen2_vl: Any) -> None:
    vm = _load(_saved(qwen2_vl, tmp_path))
    path = vm.spec.source_of("path")
    assert "by its code: transformers.Qwen2VisionTransformerPretrainedModel, the vision tower of Qwen2VLConfig" in path
    assert f"transformers {transformers.__version__}'s code runs, vitviz converts nothing" in path
    assert "live, by its code (transformers)" in repr(vm) or "live, by its code (transformers)" in str(vm)
    assert vm.spec.source == str(tmp_path)


def test_only_the_tower_shards_are_read(tmp_path: Path, qwen2_vl: Any) -> None:
    """Sharded: the shards holding only the language model are never opened (replaced by garbage here)."""
    folder = _saved(qwen2_vl, tmp_path, max_shard_size="20KB")
    index = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    tower = {f for k, f in index.items() if k.startswith(("visual.", "model.visual."))}
    other = sorted(set(index.values()) - tower)
    assert other, "expected shards without any tower tensor"
    for name in other:
        (folder / name).write_bytes(b"not a safetensors file")
    raw = read_checkpoint(folder)
    assert raw.tower is not None and raw.tower.by_code[1] == "Qwen2VisionTransformerPretrainedModel"
    assert raw.tensors and all(k.startswith(("patch_embed.", "blocks.", "merger.")) for k in raw.tensors)
    vm = _load(folder)
    maps, _ = vm.forward_captured(torch.randn(1, 3, 32, 32))
    assert maps.shape == (1, 2, 4, 64, 64)


def test_tensors_that_do_not_fit_are_refused(tmp_path: Path, qwen2_vl: Any) -> None:
    from safetensors.torch import load_file, save_file

    folder = _saved(qwen2_vl, tmp_path)
    tensors = load_file(str(folder / "model.safetensors"))
    key = next(k for k in tensors if k.endswith("blocks.1.attn.qkv.weight"))
    tensors[key] = torch.zeros(96, 16)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(CompositeModelError, match=r"tower tensors do not fit transformers\.Qwen2Vision.*qkv"):
        _load(folder)


def test_missing_transformers_named(tmp_path: Path, qwen2_vl: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without transformers the route cannot run: the refusal names the model type and how to install it."""
    from vitviz.core.reading import towers

    folder = _saved(qwen2_vl, tmp_path)

    def missing(name: str) -> str:
        raise towers.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(towers.metadata, "version", missing)
    with pytest.raises(CompositeModelError) as e:
        _load(folder)
    assert "'qwen2_vl'" in str(e.value) and "pip install transformers" in str(e.value)


def test_options_of_the_reference_route_refused(tmp_path: Path, qwen2_vl: Any) -> None:
    with pytest.raises(OverrideError, match=r"act=.*does not apply to a vision tower run by its code"):
        _load(_saved(qwen2_vl, tmp_path), act="relu")


def test_listed_as_run_by_its_code() -> None:
    from vitviz.catalog.scan import _family_from_config

    config = {"model_type": "qwen2_5_vl", "vision_config": {"model_type": "qwen2_5_vl_vision"}}
    family, detail = _family_from_config(config)
    assert family == "live" and "run by its code" in detail and "Qwen2_5_VisionTransformerPretrainedModel" in detail


PIXTRAL = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, image_size=32,
               patch_size=4, head_dim=8)


@pytest.mark.parametrize("kind", ["pixtral", "llava"])
def test_pixtral_folders(tmp_path: Path, kind: str) -> None:
    """A Pixtral folder of its own, and a LLaVA whose tower is Pixtral (pixtral-12b), run the tower by its code;
    verify compares it with transformers' own."""
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        vision = transformers.PixtralVisionConfig(**PIXTRAL)
        if kind == "pixtral":
            model = transformers.PixtralVisionModel(vision)
        else:
            text = transformers.MistralConfig(**{**TEXT, "rope_parameters": None}, head_dim=16)
            model = transformers.LlavaForConditionalGeneration(transformers.LlavaConfig(
                vision_config=vision, text_config=text, image_token_index=99, vision_feature_layer=-1))
    vm = _load(_saved(model.eval(), tmp_path))
    path = vm.spec.source_of("path")
    assert "by its code: transformers.PixtralVisionModel" in path
    assert ("the folder's own model" if kind == "pixtral" else "the vision tower of LlavaConfig") in path
    check = vitviz.verify(vm)
    assert check.verified, check.summary()
