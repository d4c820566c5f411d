"""transformers EoMT: refused by name, saying why (segmentation queries join the last blocks), instead of the
structural reader's "several convolutions could be the patch embedding"."""
from __future__ import annotations

import pytest

import vitviz
from vitviz.errors import UnknownLayoutError

transformers = pytest.importorskip("transformers")


def test_eomt_dinov3_is_refused_by_name(tmp_path) -> None:
    from transformers import EomtDinov3Config, EomtDinov3ForUniversalSegmentation

    EomtDinov3ForUniversalSegmentation(EomtDinov3Config(
        hidden_size=64, num_hidden_layers=4, num_attention_heads=4, intermediate_size=128, image_size=32,
        patch_size=8, num_blocks=1, num_queries=5, num_register_tokens=4, num_upscale_blocks=1)).save_pretrained(tmp_path)
    with pytest.raises(UnknownLayoutError) as e:
        vitviz.load(tmp_path, device="cpu")
    msg = str(e.value)
    assert "EoMT" in msg and "5 learned query tokens" in msg and "could not be placed" not in msg
