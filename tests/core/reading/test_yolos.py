"""transformers YOLOS (issue 31: "a position table that does not fit the grid"): refused by name, saying why
(detection tokens after the patches, covered by the table; the mid-layer tables)."""
from __future__ import annotations

import pytest

import vitviz
from vitviz.errors import UnknownLayoutError

transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("config_beside", [True, False])
def test_yolos_is_refused_by_name(tmp_path, config_beside: bool) -> None:
    from transformers import YolosConfig, YolosForObjectDetection

    YolosForObjectDetection(YolosConfig(image_size=[32, 32], patch_size=8, hidden_size=32, num_hidden_layers=2,
                                        num_attention_heads=2, intermediate_size=64,
                                        num_detection_tokens=5)).save_pretrained(tmp_path)
    if not config_beside:
        (tmp_path / "config.json").unlink()
    with pytest.raises(UnknownLayoutError) as e:
        vitviz.load(tmp_path if config_beside else tmp_path / "model.safetensors", device="cpu", heads=2)
    msg = str(e.value)
    assert "YOLOS" in msg and "5 detection tokens follow the patches" in msg and "mid-layer position table" in msg
    assert "does not fit" not in msg
