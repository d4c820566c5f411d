"""Train the bundled demo ViT on the shapes task and write it as a timm hub folder.

    python -m vitviz.demo.train --out resources/demo
    python -m vitviz.demo.train --out /tmp/demo --save-every 400      # and a checkpoint every 400 steps

With `--save-every N` the run also writes a checkpoint every N steps (and at the last step) into `--run-dir`
(default: OUT/run), one Hugging Face Trainer-style folder per checkpoint, `checkpoint-{step}/` holding the same
model.safetensors and config.json as the final model: the layout `vitviz.core.analyses.timeline.open_run` (and `vitviz
export --timeline`, and the window's timeline) reads, ordered by the step in the names. Saving does not change the
training: the same seed gives the same final file with or without it.

The run is seeded and CPU-only, on two cores: one torch thread trains while one loader process draws the
images. The same command on the same torch version gives the same file. It writes `model.safetensors` (timm key
names), `config.json` (timm hub format: architecture, model_args, pretrained_cfg with mean/std/interpolation,
label_names) and `train_log.txt`.

Training images are drawn fresh for every step from stream `TRAIN_SEED` (no image is seen twice), so there is no
overfitting to fight. The recipe: AdamW, linear warm-up then cosine decay, label smoothing, random horizontal and
vertical flips (they keep every class's name), and a short curriculum (the first steps show no distractors and a
softer texture) that gets the ViT off its initial plateau sooner.
"""
from __future__ import annotations

import argparse
import json
import math
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, TextIO

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from vitviz.core.running.model import ReferenceViT
from vitviz.core.spec import INCEPTION_MEAN, INCEPTION_STD, ModelSpec, Preprocess
from vitviz.demo import shapes

TRAIN_SEED = 0
VAL_SEED = 1        # held-out stream for the log; the tests use yet another seed
ARCHITECTURE = "vit_demo_shapes_patch8_64"


@dataclass(frozen=True)
class TrainConfig:
    embed_dim: int = 64       # 64 wide: ~0.13 s a step on one thread: 8000 steps take ~18 min on a busy 2-core box
    depth: int = 3            # depth 4 reached the same accuracy more slowly, with a more diffuse rollout
    num_heads: int = 4
    mlp_ratio: float = 2.0
    steps: int = 8000         # 4000 steps: 97.9 % and plain rollout 2.99x the box share; 8000: 99.4 % and 3.10x
    batch: int = 64
    lr: float = 7e-4          # 1.5e-3 stayed at chance for 400 steps; 5e-4 leaves the plateau by ~250
    min_lr: float = 1e-5
    warmup: int = 200
    easy_until: float = 0.06   # curriculum: easy images (difficulty 0) until this fraction of the steps,
    full_from: float = 0.25    # then a linear ramp to the full task (difficulty 1) at this one
    weight_decay: float = 0.05
    label_smoothing: float = 0.1
    threads: int = 1    # torch threads; one more process draws the images (two cores in all)
    seed: int = 0
    val_images: int = 500


def demo_spec(cfg: TrainConfig) -> ModelSpec:
    """The reference-ViT spec of the demo model: timm layout, CLS token, learned position embedding."""
    size = shapes.IMAGE_SIZE
    grid = size // shapes.PATCH_SIZE
    pp = Preprocess(crop=(size, size), resize=size, mode="squash", interpolation="bilinear",
                    mean=INCEPTION_MEAN, std=INCEPTION_STD)
    return ModelSpec(family="timm", source=ARCHITECTURE, image_size=(size, size), patch_size=shapes.PATCH_SIZE,
                     embed_dim=cfg.embed_dim, depth=cfg.depth, num_heads=cfg.num_heads,
                     mlp_hidden=int(cfg.embed_dim * cfg.mlp_ratio), num_classes=len(shapes.CLASSES),
                     pos_grid=(grid, grid), preprocess=pp, labels=shapes.CLASSES)


def init_weights(net: ReferenceViT, seed: int) -> None:
    """timm's ViT initialisation: truncated normal (std .02) for linears and embeddings, zero biases."""
    torch.manual_seed(seed)
    for m in net.modules():
        if isinstance(m, nn.Linear):
            nn.init.trunc_normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
    w = net.patch_embed.proj.weight
    nn.init.trunc_normal_(w.view(w.shape[0], -1), std=math.sqrt(1 / w[0].numel()))  # lecun-normal, as timm
    nn.init.trunc_normal_(net.pos_embed, std=0.02)
    nn.init.normal_(net.cls_token, std=1e-6)


def difficulty_at(step: int, cfg: TrainConfig) -> float:
    """Curriculum: no distractors and soft texture until `easy_until`, the full task from `full_from` on."""
    t = step / max(1, cfg.steps)
    return float(min(1.0, max(0.0, (t - cfg.easy_until) / max(1e-9, cfg.full_from - cfg.easy_until))))


class _Stream(torch.utils.data.Dataset):
    """Batch i of the training stream: images i*batch .. (i+1)*batch-1 of `TRAIN_SEED`, as tensors."""

    def __init__(self, cfg: TrainConfig) -> None:
        self.cfg = cfg

    def __len__(self) -> int:
        return self.cfg.steps

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        b = self.cfg.batch
        images, labels, _ = shapes.make_batch(TRAIN_SEED, i * b, b, difficulty_at(i, self.cfg))
        return torch.from_numpy(images), torch.from_numpy(labels)


def to_input(images: np.ndarray | torch.Tensor) -> torch.Tensor:
    """(N, H, W, 3) uint8 -> (N, 3, H, W) float normalised with the demo's mean/std."""
    x = torch.as_tensor(images).permute(0, 3, 1, 2).float() / 255.0  # (N, H, W, C) -> (N, C, H, W)
    mean = torch.tensor(INCEPTION_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(INCEPTION_STD).view(1, 3, 1, 1)
    return (x - mean) / std


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up to `lr`, then cosine decay to `min_lr`."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    t = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.min_lr + 0.5 * (cfg.lr - cfg.min_lr) * (1 + math.cos(math.pi * t))


def param_groups(net: nn.Module, weight_decay: float) -> list[dict]:
    """No weight decay on biases, norms, tokens and the position embedding (timm's `no_weight_decay`)."""
    decay, no_decay = [], []
    for name, p in net.named_parameters():
        (no_decay if p.ndim <= 1 or name in ("pos_embed", "cls_token") else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def augment(x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Random horizontal and vertical flips, per image."""
    b = x.shape[0]
    hflip = torch.rand(b, generator=gen) < 0.5
    vflip = torch.rand(b, generator=gen) < 0.5
    x = torch.where(hflip.view(b, 1, 1, 1), x.flip(-1), x)
    return torch.where(vflip.view(b, 1, 1, 1), x.flip(-2), x)


@torch.no_grad()
def evaluate(net: ReferenceViT, seed: int, count: int) -> float:
    """Accuracy on images 0..count-1 of stream `seed`."""
    net.eval()
    images, labels, _ = shapes.make_batch(seed, 0, count)
    pred = torch.cat([net(to_input(images[i:i + 250])).argmax(-1) for i in range(0, count, 250)])
    net.train()
    return float((pred == torch.from_numpy(labels)).float().mean())


def train(cfg: TrainConfig, log: TextIO,
          on_step: Callable[[int, ReferenceViT], None] | None = None) -> ReferenceViT:
    """Train from scratch; progress lines go to `log`; `on_step(steps_done, net)` after every optimiser step (the
    net in training mode: leave its weights alone)."""
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    spec = demo_spec(cfg)
    net = ReferenceViT(spec)
    init_weights(net, cfg.seed)
    net.train()
    opt = torch.optim.AdamW(param_groups(net, cfg.weight_decay), lr=cfg.lr, betas=(0.9, 0.999))
    gen = torch.Generator().manual_seed(cfg.seed)
    loader = torch.utils.data.DataLoader(_Stream(cfg), batch_size=None, shuffle=False,
                                         num_workers=1, prefetch_factor=4)
    start, seen, run_loss = time.time(), 0, 0.0
    for step, (images, labels) in enumerate(loader):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg)
        seen += cfg.batch
        x = augment(to_input(images), gen)
        loss = F.cross_entropy(net(x), labels, label_smoothing=cfg.label_smoothing)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        opt.step()
        run_loss = loss.item() if step == 0 else 0.98 * run_loss + 0.02 * loss.item()
        if on_step is not None:
            on_step(step + 1, net)
        if (step + 1) % 100 == 0 or step + 1 == cfg.steps:
            acc = evaluate(net, VAL_SEED, cfg.val_images) if (step + 1) % 400 == 0 or step + 1 == cfg.steps else None
            acc_text = f"  val_acc {acc:.3f}" if acc is not None else ""
            log.write(f"step {step + 1:5d}/{cfg.steps}  lr {lr_at(step, cfg):.2e}  "
                      f"difficulty {difficulty_at(step, cfg):.2f}  loss {run_loss:.4f}{acc_text}"
                      f"  images {seen}  elapsed {time.time() - start:6.1f}s\n")
            log.flush()
    net.eval()
    return net


def timm_config(cfg: TrainConfig, spec: ModelSpec) -> dict:
    """config.json in timm's hub format, so `vitviz.load(folder)` and `timm.create_model` read the same facts."""
    size = spec.image_size[0]
    return {
        "architecture": ARCHITECTURE,
        "num_classes": spec.num_classes,
        "num_features": spec.embed_dim,
        "global_pool": "token",
        "label_names": list(spec.labels),
        "model_args": {"img_size": size, "patch_size": spec.patch_size, "embed_dim": spec.embed_dim,
                       "depth": spec.depth, "num_heads": spec.num_heads, "mlp_ratio": cfg.mlp_ratio,
                       "qkv_bias": True, "class_token": True, "global_pool": "token"},
        "pretrained_cfg": {"input_size": [3, size, size], "mean": list(spec.preprocess.mean),
                           "std": list(spec.preprocess.std), "interpolation": spec.preprocess.interpolation,
                           "crop_pct": 1.0, "crop_mode": "squash", "num_classes": spec.num_classes,
                           "first_conv": "patch_embed.proj", "classifier": "head"},
    }


def save(net: ReferenceViT, cfg: TrainConfig, out: Path) -> None:
    """Write model.safetensors (float32, timm keys) and config.json into `out`."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().contiguous().clone() for k, v in net.state_dict().items()}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt", "vitviz_demo": "1"})
    (out / "model.safetensors").chmod(0o644)  # safetensors writes 0600; an installed wheel must be world-readable
    config = timm_config(cfg, net.spec)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


def checkpoint_saver(cfg: TrainConfig, run_dir: Path, every: int,
                     log: TextIO | None = None) -> Callable[[int, ReferenceViT], None]:
    """`train`'s `on_step` that writes `run_dir/checkpoint-{step}/` (model.safetensors + config.json, as `save`)
    every `every` steps and at the last one."""
    if every < 1:
        raise ValueError(f"--save-every {every}: expected a positive number of steps")

    def on_step(step: int, net: ReferenceViT) -> None:
        if step % every == 0 or step == cfg.steps:
            folder = run_dir / f"checkpoint-{step}"
            save(net, cfg, folder)
            if log is not None:
                log.write(f"saved {folder}\n")
                log.flush()

    return on_step


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vitviz.demo.train", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("resources/demo"), help="output folder")
    parser.add_argument("--save-every", type=int, default=0, metavar="N",
                        help="also save a checkpoint every N steps (and at the last) into --run-dir, as "
                             "checkpoint-{step}/ folders: a run `vitviz export --timeline` reads")
    parser.add_argument("--run-dir", type=Path, default=None,
                        help="where --save-every writes its checkpoints (default: OUT/run)")
    for field, value in asdict(TrainConfig()).items():
        parser.add_argument(f"--{field.replace('_', '-')}", type=type(value), default=value,
                            help=f"TrainConfig.{field}")
    args = parser.parse_args(argv)
    cfg = TrainConfig(**{k: getattr(args, k) for k in asdict(TrainConfig())})
    if args.save_every < 0 or (args.run_dir is not None and not args.save_every):
        parser.error("--save-every takes a positive number of steps; --run-dir goes with --save-every")
    from vitviz.demo import training_log

    header = (f"vitviz demo ViT on the shapes task; torch {torch.__version__}, python "
              f"{platform.python_version()}, {platform.machine()}\nconfig {json.dumps(asdict(cfg))}\n")
    with training_log(args.out, "train_log.txt", header) as log:   # progress seen every 100 steps, and kept
        start = time.time()
        saver = (checkpoint_saver(cfg, args.run_dir or args.out / "run", args.save_every, log)
                 if args.save_every else None)
        net = train(cfg, log, saver)
        save(net, cfg, args.out)
        params = sum(p.numel() for p in net.parameters())
        log.write(f"done in {time.time() - start:.0f}s; {params:,} parameters; wrote {args.out}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
