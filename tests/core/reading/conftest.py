"""Fixtures of the reading tests: the small checkpoints of every cheap parity format (`formats`, for the hostile
mutations of tests/core/reading/test_checkpoint.py and test_validate.py)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from _hostile import HUB_CONFIG
from _tiny import tiny_state_dict
from safetensors.torch import save_file


@pytest.fixture(scope="module")
def formats(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, dict[str, Any]]]:
    """One small checkpoint per cheap parity format: name -> (path, load() overrides it needs)."""
    root = tmp_path_factory.mktemp("formats")
    sd = tiny_state_dict()
    torch.save(sd, root / "timm.pth")
    torch.save(sd, root / "legacy.pth", _use_new_zipfile_serialization=False)
    save_file(sd, str(root / "timm.safetensors"))
    from torchvision.models import VisionTransformer

    tv = VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64,
                           num_classes=5)
    torch.save(tv.state_dict(), root / "torchvision_vit.pth")
    from transformers import ViTConfig, ViTForImageClassification

    hf = ViTForImageClassification(ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                             intermediate_size=64, image_size=32, patch_size=8, num_labels=3))
    hf.save_pretrained(root / "hf")
    (root / "hf" / "preprocessor_config.json").write_text(json.dumps({
        "do_normalize": True, "do_resize": True, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
        "resample": 2, "size": {"height": 32, "width": 32}}))
    hub = root / "hub"
    hub.mkdir()
    save_file(sd, str(hub / "model.safetensors"))
    (hub / "config.json").write_text(json.dumps(HUB_CONFIG))
    return {"timm.pth": (root / "timm.pth", {"heads": 2}), "legacy.pth": (root / "legacy.pth", {"heads": 2}),
            "timm.safetensors": (root / "timm.safetensors", {"heads": 2}),
            "torchvision": (root / "torchvision_vit.pth", {"heads": 2}), "hf": (root / "hf", {}),
            "hub": (hub, {})}
