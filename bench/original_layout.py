"""Benchmark: peak memory of opening a vision tower whose whole model's files are in its original checkpoint's
layout (vitviz.core.reading.towers.ORIGINAL_LAYOUTS), renamed by transformers' own conversion mapping.

Run from the repository root: `python bench/original_layout.py [--depth 8] [--lm-mb 1024]`.

Writes a Mistral Large 4 folder as `save_pretrained` lays it out -- `config.json` and one `model.safetensors` holding
its Pixtral tower under `vision_encoder.` in Mistral's own names (wq / wk saved for interleaved RoPE; width 1024, 16
heads, `--depth` blocks, float32) beside a tiny language model and a fake language-model tensor of `--lm-mb` MB --
and measures, in its own process, the peak resident set (VmHWM) of `vitviz.load(folder)` (the tower's tensors read
alone, renamed and permuted by transformers' loader as the whole model's, described by its probe forward at 224 px)
minus the resident set just before it (torch, transformers and vitviz imported).
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from common import report_load_peak  # noqa: I001



def _folder(root: Path, depth: int, lm_mb: int) -> Path:
    import warnings

    import torch
    import transformers
    from safetensors.torch import load_file, save_file

    vision = transformers.PixtralVisionConfig(hidden_size=1024, intermediate_size=4096, num_hidden_layers=depth,
                                              num_attention_heads=16, image_size=224, patch_size=16, head_dim=64)
    text = dict(hidden_size=32, intermediate_size=64, moe_intermediate_size=32, num_hidden_layers=1,
                num_attention_heads=2, num_key_value_heads=2, vocab_size=100, kv_lora_rank=16, qk_rope_head_dim=8,
                qk_nope_head_dim=8, qk_head_dim=16, v_head_dim=8, head_dim=8, index_n_heads=2, index_head_dim=16,
                index_topk=8, n_routed_experts=2, num_experts_per_tok=1, n_shared_experts=1, first_k_dense_replace=1)
    folder = root / "mistral-large-4"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = transformers.MistralLarge4Config(vision_config=vision.to_dict(), text_config=text, image_token_index=99)
        transformers.MistralLarge4ForConditionalGeneration(cfg).save_pretrained(folder)
    tensors = load_file(str(folder / "model.safetensors"))
    tensors["layers.99.fake.weight"] = torch.zeros(lm_mb * 2**20 // 4)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depth", type=int, default=8, help="vision blocks")
    parser.add_argument("--lm-mb", type=int, default=1024, help="size of the fake language-model tensor (MB)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = _folder(Path(tmp), args.depth, args.lm_mb)
        report_load_peak(folder, f"Mistral Large 4's Pixtral tower, {args.depth} blocks of width 1024", args.lm_mb)


if __name__ == "__main__":
    main()
