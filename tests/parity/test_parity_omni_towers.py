"""Composite models whose vision tower vitviz runs by its own transformers code, opened by file and handed over whole:
Qwen2.5-Omni and Qwen3-Omni (the whole model: the tower under `thinker_config.vision_config`, its tensors under
`thinker.visual.`, an audio encoder and a speech side beside it; and their thinkers alone, `visual.`) and Cohere
Compass (a Qwen3-VL-style tower with deepstack mergers under `model.visual.`).

Each is built tiny with random weights (the zoo sweep's own tiny config, `scripts/trial_zoo.py`), saved with
`save_pretrained` and opened by file, and handed over as the whole model object. Only the tower's tensors are read,
and both routes show exactly the maps of the tower itself handed over alone -- whose parity with transformers' own
eager attention on its image processor's packing is proven in `test_parity_qwen_vl.py::test_relatives_live` -- and
`vitviz.verify` rebuilds the tower from the folder and finds it equal."""
from __future__ import annotations

import importlib.util
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import vitviz

transformers = pytest.importorskip("transformers")
ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("trial_zoo", ROOT / "scripts" / "trial_zoo.py")
zoo = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(zoo)

ATOL = 1e-5
# model_type: (the class the sweep builds, the tower inside it, the tower's class, its tensors' prefix in the file)
CASES = {
    "qwen2_5_omni": ("Qwen2_5OmniForConditionalGeneration", lambda m: m.thinker.model.visual,
                     "Qwen2_5OmniVisionEncoder", "thinker.visual."),
    "qwen2_5_omni_thinker": ("Qwen2_5OmniThinkerForConditionalGeneration", lambda m: m.model.visual,
                             "Qwen2_5OmniVisionEncoder", "visual."),
    "qwen3_omni_moe": ("Qwen3OmniMoeForConditionalGeneration", lambda m: m.thinker.model.visual,
                       "Qwen3OmniMoeVisionEncoder", "thinker.visual."),
    "qwen3_omni_moe_thinker": ("Qwen3OmniMoeThinkerForConditionalGeneration", lambda m: m.model.visual,
                               "Qwen3OmniMoeVisionEncoder", "visual."),
    "cohere_compass": ("CohereCompassForConditionalGeneration", lambda m: m.model.visual,
                       "CohereCompassVisionModel", "model.visual."),
}


@pytest.fixture(scope="module")
def built() -> dict[str, Any]:
    return {}


def _model(model_type: str, built: dict[str, Any]) -> Any:
    if model_type not in built:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            built[model_type] = zoo.build_hf(model_type, CASES[model_type][0])
    return built[model_type]


def _size(tower: Any) -> tuple[int, int]:
    """A non-square size of whole merge blocks: 2 x 3 of them."""
    block = tower.config.patch_size * tower.config.spatial_merge_size
    return 2 * block, 3 * block


def _load(what: Any, size: tuple[int, int]) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return vitviz.load(what, image_size=size, device="cpu")


@pytest.mark.parametrize("model_type", list(CASES))
def test_tower_by_file_and_whole_model(tmp_path: Path, built: dict[str, Any], model_type: str) -> None:
    from vitviz.core.reading.checkpoint import read_checkpoint

    model = _model(model_type, built)
    tower = CASES[model_type][1](model)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.save_pretrained(tmp_path)
    raw = read_checkpoint(str(tmp_path))
    assert raw.tower.prefix == CASES[model_type][3] and set(raw.tensors) == set(tower.state_dict())
    size = _size(tower)
    alone = _load(tower, size)
    x = torch.randn(1, 3, *size, generator=torch.Generator().manual_seed(3))
    ref, ref_out = alone.forward_captured(x)
    assert ref.shape[1] == len(tower.blocks)
    for route, vm in (("file", _load(tmp_path, size)), ("whole model", _load(model, size))):
        path = vm.spec.source_of("path")
        assert "by its code" in path and CASES[model_type][2] in path, route
        assert model_type in vm.spec.source_of("identity" if route == "file" else "path"), route
        ours, out = vm.forward_captured(x)
        np.testing.assert_allclose(ours, ref, atol=ATOL, err_msg=route)
        np.testing.assert_allclose(out, ref_out, atol=ATOL, err_msg=route)


@pytest.mark.parametrize("model_type", list(CASES))
def test_verify_gives_a_verdict(tmp_path: Path, built: dict[str, Any], model_type: str) -> None:
    model = _model(model_type, built)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.save_pretrained(tmp_path)
    check = vitviz.verify(_load(tmp_path, _size(CASES[model_type][1](model))))
    assert check.verified, check.summary()
    assert check.max_attention <= ATOL and CASES[model_type][2] in check.original


def test_a_tower_tensor_left_out_is_refused(tmp_path: Path, built: dict[str, Any]) -> None:
    """A whole model's file missing one of its tower's tensors is refused naming it (the parity above can fail)."""
    from safetensors.torch import load_file, save_file

    model = _model("qwen2_5_omni", built)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.save_pretrained(tmp_path)
    files = sorted(tmp_path.glob("*.safetensors"))
    for f in files:
        tensors = load_file(str(f))
        if "thinker.visual.blocks.0.attn.k.weight" in tensors:
            del tensors["thinker.visual.blocks.0.attn.k.weight"]
            save_file(tensors, str(f), metadata={"format": "pt"})
    with pytest.raises(vitviz.VitvizError, match="missing: blocks.0.attn.k.weight"):
        _load(tmp_path, _size(model.thinker.model.visual))
