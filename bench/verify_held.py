"""Benchmark: how much attention `verify` holds at once, per route (issue 36), in layers of (H, T, T) float32 maps.

Run from the repository root: `python bench/verify_held.py [--tokens 1600] [--depth 8] [--routes timm,...]`.

Each route runs in a fresh process: a tiny random-weight model (embed dim 32, `--depth` layers, 4 heads) saved as
its library saves it and loaded with `vitviz.load`; one verify at its native (small) size first (imports, caches),
then the process's peak RSS reset (`/proc/self/clear_refs`, 5) and `verify(model, sizes=[S])` at a size S of about
`--tokens` tokens. Printed per route: the peak RSS over the RSS just before that verify, in MiB and in layers of
H * T * T * 4 bytes (the weights are a few hundred KiB: the rest is attention and the activations beside it), and
what `_sizes` counts for that route (`verify._held_layers`; a windowed model's sizes are not counted). Routes:
- timm: vitviz's reference ViT and timm's own (both hand each layer over as computed);
- transformers: the same against transformers' ViT (its attention modules' outputs read as they return);
- pixtral: a Pixtral vision tower vitviz runs by its transformers code, against transformers' own tower;
- qwen2_5_vl: a Qwen2.5-VL tower (packed patches; windowed and full-attention blocks), likewise;
- sam: a transformers SAM image encoder (windowed; a global block every other), block by block;
- no-stream: the timm case with vitviz's `forward_streamed` hidden: vitviz's whole stack from `forward_captured`.
"""
from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

HEADS, DIM = 4, 32


def _save(route: str, folder: Path, depth: int) -> tuple[Path, int, int]:
    """The route's model saved under `folder`: (its folder, patch size, prefix tokens)."""
    import torch

    torch.manual_seed(0)
    warnings.simplefilter("ignore")
    if route in ("timm", "no-stream"):
        import timm

        args = dict(img_size=64, patch_size=8, embed_dim=DIM, depth=depth, num_heads=HEADS)
        net = timm.create_model("vit_small_patch16_224", pretrained=False, num_classes=3, **args)
        timm.models._hub.save_for_hf(net, str(folder), model_args=args, safe_serialization=True)
        return folder, 8, 1
    import transformers as t

    if route == "transformers":
        net = t.ViTForImageClassification(t.ViTConfig(hidden_size=DIM, num_hidden_layers=depth, num_labels=3,
                                                      num_attention_heads=HEADS, intermediate_size=64,
                                                      image_size=64, patch_size=8))
        prefix, patch = 1, 8
    elif route == "pixtral":
        net = t.PixtralVisionModel(t.PixtralVisionConfig(hidden_size=DIM, intermediate_size=64, head_dim=8,
                                                         num_hidden_layers=depth, num_attention_heads=HEADS,
                                                         image_size=64, patch_size=8))
        prefix, patch = 0, 8
    elif route == "qwen2_5_vl":
        text = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                    num_key_value_heads=1, vocab_size=100,
                    rope_parameters={"rope_type": "default", "mrope_section": [2, 2, 4]})
        vision = dict(patch_size=4, spatial_merge_size=2, temporal_patch_size=2, num_heads=HEADS, depth=depth,
                      hidden_size=DIM, intermediate_size=64, window_size=32, fullatt_block_indexes=[1, depth - 1],
                      out_hidden_size=32)
        net = t.Qwen2_5_VLForConditionalGeneration(t.Qwen2_5_VLConfig(text_config=text, vision_config=vision))
        prefix, patch = 0, 4
    elif route == "sam":
        net = t.SamVisionModel(t.SamVisionConfig(hidden_size=DIM, num_hidden_layers=depth, num_attention_heads=HEADS,
                                                 image_size=64, patch_size=8, window_size=4, output_channels=16,
                                                 global_attn_indexes=list(range(1, depth, 2)), mlp_dim=64))
        prefix, patch = 0, 8
    else:
        raise SystemExit(f"unknown route {route!r}")
    net.eval().save_pretrained(folder)
    return folder, patch, prefix


def _one(route: str, tokens: int, depth: int) -> dict:
    """One route, in this process (see the module's docstring)."""
    import torch  # noqa: F401

    import vitviz
    from vitviz.core.analyses import verify as v

    with tempfile.TemporaryDirectory() as tmp:
        folder, patch, prefix = _save(route, Path(tmp) / route, depth)
        side = round(math.sqrt(tokens - prefix)) * patch
        if route == "sam":   # SAM's transformers original takes its native size only: built at the probe size
            import transformers as t

            cfg = t.SamVisionConfig.from_pretrained(folder)
            cfg.image_size = side
            net = t.SamVisionModel(cfg)
            net.eval().save_pretrained(folder)
        extra = {"image_size": (side, side)} if route == "qwen2_5_vl" else {}
        model = vitviz.load(folder, device="cpu", **extra)
        if route == "no-stream":
            model.forward_streamed = None   # vitviz's whole stack, from forward_captured
        first = v.verify(model, sizes=[model.spec.image_size[0] if route == "sam" else 4 * patch])
        assert first.verified, first.summary()
        t_ = (side // patch) ** 2 + prefix
        layer = HEADS * t_ * t_ * 4
        Path("/proc/self/clear_refs").write_text("5")
        before = _status("VmRSS")
        check = v.verify(model, sizes=[side])
        peak = _status("VmHWM")
        assert check.verified, check.summary()
        counted = "-" if route == "sam" else v._held_layers(model.spec, not v._streams(model))   # (no _sizes)
        return {"route": route, "tokens": t_, "layer_mib": layer / 2**20, "held_mib": (peak - before) / 2**20,
                "held_layers": (peak - before) / layer, "counted_layers": counted}


def _status(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise SystemExit(f"no {key} in /proc/self/status")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=1600)
    ap.add_argument("--depth", type=int, default=8)
    ap.add_argument("--routes", default="timm,transformers,pixtral,qwen2_5_vl,sam,no-stream")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(_one(args.one, args.tokens, args.depth)))
        return
    print(f"{'route':<14}{'T':>6}{'layer MiB':>11}{'held MiB':>10}{'held layers':>13}{'_sizes counts':>15}")
    for route in args.routes.split(","):
        done = subprocess.run([sys.executable, __file__, "--one", route, "--tokens", str(args.tokens), "--depth",
                               str(args.depth)], capture_output=True, text=True, check=False)
        if done.returncode:
            print(f"{route:<14} failed: {done.stderr.strip().splitlines()[-1:]}")
            continue
        r = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"{r['route']:<14}{r['tokens']:>6}{r['layer_mib']:>11.1f}{r['held_mib']:>10.1f}{r['held_layers']:>13.1f}"
              f"{r['counted_layers']:>15}")


if __name__ == "__main__":
    main()
