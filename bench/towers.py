"""Benchmark: peak memory of opening a composite model's vision tower by file (vitviz.core.reading.towers).

Run from the repository root: `python bench/towers.py [--lm-mb 500]`.

Builds a tiny LLaVA (CLIP tower, 2 blocks) with transformers, saves it with `save_pretrained`, and adds a fake
language-model tensor of `--lm-mb` MB (`language_model.model.big.weight`): in a single `model.safetensors`, as a sharded model (tower and
language model in separate shards, with `model.safetensors.index.json`), and as a `pytorch_model.bin`. Each
measurement runs in its own process and reports its peak resident set (VmHWM) minus the resident set just before
the measured call (after importing torch, vitviz and safetensors):

- `vitviz.load(folder)`: the tower only (safetensors `safe_open`, tensor by tensor; the .bin memory-mapped);
- `safetensors.torch.load_file(...)` (or `torch.load`) of every file, each tensor then touched (summed), as a reader that checks its
  values does: what reading every tensor costs (the language model too). Untouched, load_file's tensors are
  memory-mapped and cost little until used.

The ratio line says how much of the fake language model vitviz's open touched (about 0 when none of it is read).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from common import PEAK_RSS_PRELUDE, ROOT  # noqa: I001

_MEASURE = r"""
import os, sys, warnings
warnings.simplefilter("ignore")
import torch, safetensors.torch, vitviz

""" + PEAK_RSS_PRELUDE + r"""how, path = sys.argv[1], sys.argv[2]
if how == "vitviz":
    model = vitviz.load(path, device="cpu")
else:
    tensors = {}
    for f in sorted(os.listdir(path)):
        if f.endswith(".safetensors"):
            tensors.update(safetensors.torch.load_file(os.path.join(path, f)))
        elif f.endswith(".bin"):
            tensors.update(torch.load(os.path.join(path, f), weights_only=True))
    total = sum(float(t.float().sum()) for t in tensors.values())   # touched, as a reader that checks them does
print((rss("VmHWM:") - before) / 2**20)
"""


def _folders(root: Path, lm_mb: int) -> tuple[Path, Path, Path, Path]:
    """(single-file, sharded and pytorch_model.bin folders) of a tiny LLaVA with an `lm_mb` MB fake language-model
    tensor, and the same model without it."""
    import torch
    import transformers
    from safetensors.torch import load_file, save_file

    vision = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, image_size=32,
                  patch_size=8)
    text = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=300)
    cfg = transformers.LlavaConfig(vision_config=transformers.CLIPVisionConfig(**vision),
                                   text_config=transformers.LlamaConfig(**text), image_token_index=299)
    single, sharded = root / "llava", root / "llava-sharded"
    transformers.LlavaForConditionalGeneration(cfg).save_pretrained(single)
    tensors = load_file(str(single / "model.safetensors"))
    big = torch.zeros(lm_mb * 2**20 // 4)  # (N,) float32: lm_mb MB
    tower = {k: v for k, v in tensors.items() if "vision_tower" in k}
    rest = {**{k: v for k, v in tensors.items() if k not in tower}, "language_model.model.big.weight": big}
    save_file({**tower, **rest}, str(single / "model.safetensors"), metadata={"format": "pt"})
    sharded.mkdir()
    (sharded / "config.json").write_text((single / "config.json").read_text())
    save_file(tower, str(sharded / "model-00001-of-00002.safetensors"), metadata={"format": "pt"})
    save_file(rest, str(sharded / "model-00002-of-00002.safetensors"), metadata={"format": "pt"})
    weight_map = {**{k: "model-00001-of-00002.safetensors" for k in tower},
                  **{k: "model-00002-of-00002.safetensors" for k in rest}}
    (sharded / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    alone = root / "llava-no-lm"   # the same model without the fake language model: vitviz.load's own floor
    alone.mkdir()
    (alone / "config.json").write_text((single / "config.json").read_text())
    save_file({k: v for k, v in tensors.items()}, str(alone / "model.safetensors"), metadata={"format": "pt"})
    pickled = root / "llava-bin"
    pickled.mkdir()
    (pickled / "config.json").write_text((single / "config.json").read_text())
    torch.save({**tower, **rest}, pickled / "pytorch_model.bin")
    return single, sharded, pickled, alone


def _peak_mb(how: str, folder: Path) -> float:
    out = subprocess.run([sys.executable, "-c", _MEASURE, how, str(folder)], capture_output=True, text=True,
                         cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lm-mb", type=int, default=500, help="size of the fake language-model tensor (MB)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        single, sharded, pickled, alone = _folders(Path(tmp), args.lm_mb)
        print(f"floor: vitviz.load of the same LLaVA without the fake language model: {_peak_mb('vitviz', alone):.1f} MB")
        for label, folder in (("single model.safetensors", single), ("sharded (index + 2 shards)", sharded),
                              ("pytorch_model.bin (zip, memory-mapped)", pickled)):
            ours, whole = _peak_mb("vitviz", folder), _peak_mb("load_file", folder)
            print(f"{label}: fake language model {args.lm_mb} MB; peak RSS over the baseline: "
                  f"vitviz.load {ours:.1f} MB, reading every tensor {whole:.1f} MB")
            print(f"  ratio vitviz.load / every tensor = {ours / whole:.3f}x")


if __name__ == "__main__":
    main()
