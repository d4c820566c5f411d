"""Benchmark: peak memory of opening a vision tower by its code (vitviz.core.reading.towers.BY_CODE) from a whole
vision-language model's folder.

Run from the repository root: `python bench/by_code.py [--depth 8] [--lm-mb 500]`.

Writes a Qwen2-VL folder as `save_pretrained` lays it out -- `config.json` and one `model.safetensors` holding the
vision tower under `model.visual.` in bfloat16 (Qwen2-VL's width: 1280, 16 heads, `--depth` blocks) beside a fake
language-model tensor of `--lm-mb` MB -- and measures, in its own process, the peak resident set (VmHWM) of
`vitviz.load(folder)` (the tower built by transformers from config.json, given the tower's tensors, described by
its probe forward at 224 px) minus the resident set just before it (torch, transformers and vitviz imported). The
tower's size in float32 is printed beside it: what the route must hold at least once.
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from common import report_load_peak  # noqa: I001



def _folder(root: Path, depth: int, lm_mb: int) -> Path:
    import torch
    import transformers
    from safetensors.torch import save_file
    from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VisionTransformerPretrainedModel

    text = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                num_key_value_heads=1, vocab_size=100, rope_parameters={"rope_type": "default",
                                                                         "mrope_section": [2, 2, 4]})
    cfg = transformers.Qwen2VLConfig(text_config=text, vision_config=dict(depth=depth, embed_dim=1280,
                                                                          hidden_size=1536, num_heads=16))
    folder = root / "qwen2-vl"
    folder.mkdir()
    cfg.save_pretrained(folder)
    tower = Qwen2VisionTransformerPretrainedModel(cfg.vision_config)
    tensors = {f"model.visual.{k}": v.to(torch.bfloat16).contiguous() for k, v in tower.state_dict().items()}
    tensors["model.language_model.big.weight"] = torch.zeros(lm_mb * 2**20 // 4)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depth", type=int, default=8, help="vision blocks (Qwen2-VL has 32)")
    parser.add_argument("--lm-mb", type=int, default=500, help="size of the fake language-model tensor (MB)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = _folder(Path(tmp), args.depth, args.lm_mb)
        report_load_peak(folder, f"Qwen2-VL tower, {args.depth} blocks of width 1280", args.lm_mb)


if __name__ == "__main__":
    main()
