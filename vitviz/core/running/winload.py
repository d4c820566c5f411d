"""Loading a windowed model: a converted Swin / SAM checkpoint -> `WindowedSpec` (every field with its source)
-> the reference `WindowedNet`, every tensor loaded exactly (each key and shape asserted).

`vitviz.core.running.load` hands a file here once its family (`vitviz.core.reading.families.swin` / `sam`) is known. What the
tensors show is derived from them (stages, widths, heads, Swin v1's windows from its bias tables, SAM's from its
decomposed tables); what each implementation's code decides is its family's (named when a config or file name
names the model, assumed otherwise); a value nothing gives is a said guess, with the override that fixes it.
"""
from __future__ import annotations

import math
import os
import re
from dataclasses import replace
from typing import Any

import torch

from vitviz.core.reading import hyperparams
from vitviz.core.reading.checkpoint import RawCheckpoint
from vitviz.core.reading.families import Converted, windowed_layout
from vitviz.core.reading.families import sam as sam_family
from vitviz.core.reading.metadata import metadata_sources
from vitviz.core.running.runtime import check_model_memory, resolve_device
from vitviz.core.options import WINDOWED, only_for, overrides_for
from vitviz.core.reading.validate import check_exact_tensors, check_route, check_weights
from vitviz.core.running.windowed import WindowedModel, WindowedNet
from vitviz.core.winspec import WindowedSpec, audit
from vitviz.errors import InconsistentCheckpointError, OverrideError

# overrides only windowed models take, and those of the reference route that mean something here (`OPTIONS`)
WINDOW_OVERRIDES = only_for(WINDOWED)
APPLIES = tuple(n for n in overrides_for(WINDOWED) if n not in WINDOW_OVERRIDES)


def is_windowed(conv: Converted) -> bool:
    """Whether `conv` is a windowed family's (its module declares `WINDOWED`): it loads as the windowed model."""
    return windowed_layout(conv.family) is not None


class _Prov(hyperparams._Prov):  # noqa: SLF001 - one provenance collector for both kinds of spec
    def hint(self, name: str, hints: dict[str, Any], default: Any, source: str) -> Any:
        if name in hints:
            return self.set(name, hints[name][0], hints[name][1])
        return self.set(name, default, source)


def _check_overrides(overrides: dict[str, Any], where: str) -> None:
    check_route(overrides, WINDOWED, where, "a windowed model (Swin, SAM, ViTDet)")


def _window_list(value: Any, stages: int, what: str) -> list[tuple[int, int]]:
    """A window setting (N, (h, w), or one N / (h, w) per stage) as one (h, w) per stage."""
    def pair(v: Any) -> tuple[int, int]:
        if isinstance(v, (list, tuple)) and len(v) == 2 and all(isinstance(x, int) for x in v):
            return (int(v[0]), int(v[1]))
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return (v, v)
        raise OverrideError(f"{what} {value!r}: expected a positive window size, (h, w), or one per stage")
    if isinstance(value, (list, tuple)) and len(value) == stages and stages != 2:
        return [pair(v) for v in value]
    if isinstance(value, (list, tuple)) and len(value) == stages and stages == 2 and \
            all(isinstance(v, (list, tuple)) for v in value):
        return [pair(v) for v in value]
    return [pair(value)] * stages


def infer_windowed_spec(conv: Converted, raw: RawCheckpoint, overrides: dict[str, Any],
                        warn: bool = True) -> WindowedSpec:
    """The full spec of a converted Swin / SAM checkpoint; InconsistentCheckpointError when shapes contradict."""
    where = str(raw.path)
    _check_overrides(overrides, where)
    sd, hints, prov = conv.tensors, dict(conv.hints), _Prov()
    w = sd.get("patch_embed.proj.weight")
    if w is None or w.ndim != 4 or w.shape[-1] != w.shape[-2]:
        raise InconsistentCheckpointError(f"{where}: no square patch embedding (patch_embed.proj.weight); expected "
                                          "a complete Swin / SAM image encoder")
    patch, in_chans = int(w.shape[-1]), int(w.shape[1])
    prov.set("patch_size", patch, "shape: patch_embed.proj.weight")
    prov.set("in_chans", in_chans, "shape: patch_embed.proj.weight")
    fields: dict[str, Any] = {"patch_size": patch, "in_chans": in_chans}
    if windowed_layout(conv.family) == "sam":
        fields.update(_sam_fields(sd, hints, overrides, prov, where))
    else:
        fields.update(_swin_fields(sd, hints, overrides, prov, where, patch))
    if overrides.get("eps") is not None:
        fields["eps"] = float(prov.set("eps", overrides["eps"], "override"))
    else:
        fields["eps"] = float(prov.hint("eps", hints, 1e-5, "default: nn.LayerNorm eps 1e-5"))
    act = overrides.get("act")
    fields["mlp_kind"] = prov.set("mlp_kind", act, "override") if act else \
        prov.hint("mlp_kind", hints, "gelu", "default: exact GELU")
    fields["qkv_bias"] = prov.set("qkv_bias", any(k.endswith("attn.qkv.bias") for k in sd),
                                  "shape: blocks' attn.qkv.bias " + ("present" if any(
                                      k.endswith("attn.qkv.bias") for k in sd) else "absent"))
    fields["num_classes"] = prov.set("num_classes", int(sd["head.fc.weight"].shape[0]) if "head.fc.weight" in sd
                                     else 0, "shape: head.fc.weight" + ("" if "head.fc.weight" in sd else " absent"))
    fields["pooling"] = prov.set("pooling", "avg", f"family: {conv.family}'s head averages the last tokens")
    for name, default in (("order", "pad_roll"), ("shift_rule", "built"), ("mask_value", -100.0)):
        fields[name] = prov.hint(name, hints, default, f"default: {name}")
    if "pos_interp" in overrides and overrides["pos_interp"] is not None:
        fields["pos_interp"] = prov.set("pos_interp", overrides["pos_interp"], "override")
    else:
        fields["pos_interp"] = prov.hint("pos_interp", hints, "timm", "default: timm recipe (bicubic, antialiased)")
    size = _image_size(overrides, hints, fields, prov)
    if min(size) < fields["patch_size"]:     # torch's convolution would fail at the first image
        raise (OverrideError if "image_size" in overrides and overrides["image_size"] is not None else
               InconsistentCheckpointError)(
            f"{where}: image size {size[0]}x{size[1]} ({prov.items.get('image_size', 'its source')}) is smaller "
            f"than one {fields['patch_size']} px patch; expected at least {fields['patch_size']} px a side")
    fields["image_size"] = size
    sam = fields["arch"] == "sam"
    if overrides.get("window") is not None:
        windows = _window_list(overrides["window"], fields["_stages"], "window")
        fields["_override_window"] = windows[0][0] if sam else windows
    if overrides.get("global_blocks") is not None:
        if not sam:
            raise OverrideError(f"{where}: global_blocks= applies to SAM / ViTDet encoders; a Swin has none")
        fields["_override_globals"] = tuple(int(i) for i in overrides["global_blocks"])
    fields["family"] = overrides.get("family") or conv.family
    fields["source"] = where
    fields.update(_finish_windows(fields, hints, prov, where))
    sources = metadata_sources(raw.meta, raw.sidecars)
    fields["preprocess"] = hyperparams._preprocess(conv, raw, overrides, size, in_chans, sources, prov)  # noqa: SLF001
    labels = hints.get("labels")
    if overrides.get("labels") is None and labels and len(labels[0]) == fields["num_classes"]:
        fields["labels"] = prov.set("labels", tuple(map(str, labels[0])), labels[1])
    else:
        fields["labels"] = hyperparams._labels(  # noqa: SLF001
            conv, raw, overrides, fields["num_classes"], sources, prov)
    if "model_args" in hints:
        prov.set("model_args", hints["model_args"][0], hints["model_args"][1])
    if raw.nest_others:       # a training checkpoint with other, different weights beside those taken
        prov.set("nest_key", raw.nest_key, hyperparams.nest_key_source(raw))
    identity = hints.get("identity")
    prov.set("identity", fields["family"], identity[1] if identity else (
        f"derived: the key layout of a {conv.family} file; nothing names the model, so its family's settings are "
        "assumptions"))
    spec = WindowedSpec(**fields, provenance=tuple(sorted(prov.items.items())))
    try:
        spec.geometry()
    except ValueError as e:
        raise InconsistentCheckpointError(f"{where}: {e}") from None
    if os.environ.get("VITVIZ_AUDIT") and (problems := audit(spec)):
        raise AssertionError(f"{where}: provenance audit ({spec.family}): " + "; ".join(problems))
    if warn:
        hyperparams.warn_guesses(spec, WindowedSpec.describe_guess)
    return spec


def _image_size(overrides: dict[str, Any], hints: dict[str, Any], fields: dict[str, Any],
                prov: _Prov) -> tuple[int, int]:
    if overrides.get("image_size") is not None:
        v = overrides["image_size"]
        return prov.set("image_size", (int(v), int(v)) if isinstance(v, int) else (int(v[0]), int(v[1])), "override")
    if "image_size" in hints:
        v = hints["image_size"][0]
        return prov.set("image_size", (int(v[0]), int(v[1])), hints["image_size"][1])
    if fields.get("pos_embed"):
        g = fields["pos_grid"]
        return prov.set("image_size", (g[0] * fields["patch_size"], g[1] * fields["patch_size"]),
                        "shape: pos_embed (its grid x the patch size)")
    return prov.set("image_size", (224, 224), "guess: 224 px, nothing states the native size (pass image_size=N)")


# -------------------------------------------------------------------------------------------------------- Swin

def _swin_fields(sd: dict[str, torch.Tensor], hints: dict[str, Any], overrides: dict[str, Any], prov: _Prov,
                 where: str, patch: int) -> dict[str, Any]:
    stages = sorted({int(m.group(1)) for k in sd if (m := re.match(r"^layers\.(\d+)\.blocks\.\d+\.", k))})
    if stages != list(range(len(stages))) or not stages:
        raise InconsistentCheckpointError(f"{where}: Swin stages {stages}; expected layers.0.blocks ... in order")
    depths, dims, heads, hidden = [], [], [], []
    for s in stages:
        blocks = sorted({int(m.group(1)) for k in sd if (m := re.match(rf"^layers\.{s}\.blocks\.(\d+)\.", k))})
        depths.append(len(blocks))
        dims.append(int(sd[f"layers.{s}.blocks.0.norm1.weight"].shape[0]))
        hidden.append(int(sd[f"layers.{s}.blocks.0.mlp.fc1.weight"].shape[0]))
        table = sd.get(f"layers.{s}.blocks.0.attn.relative_position_bias_table")
        scale = sd.get(f"layers.{s}.blocks.0.attn.logit_scale")
        heads.append(int(table.shape[1]) if table is not None else int(scale.shape[0]))
    v2 = "layers.0.blocks.0.attn.logit_scale" in sd
    if overrides.get("heads") is not None and int(overrides["heads"]) not in heads:
        raise OverrideError(f"{where}: heads={overrides['heads']}: a Swin's heads are read off its bias tables "
                            f"({', '.join(map(str, heads))} per stage); there is nothing to override")
    out: dict[str, Any] = {
        "arch": prov.set("arch", "swinv2" if v2 else "swin", "shape: layers.0.blocks.0.attn." + (
            "logit_scale (Swin v2's cosine attention)" if v2 else "relative_position_bias_table (Swin v1)")),
        "depths": prov.set("depths", tuple(depths), "shape: layers.S.blocks.B per stage"),
        "dims": prov.set("dims", tuple(dims), "shape: layers.S.blocks.0.norm1.weight"),
        "heads": prov.set("heads", tuple(heads), "shape: layers.S.blocks.0.attn." +
                          ("logit_scale (heads, 1, 1)" if v2 else "relative_position_bias_table (offsets, heads)")),
        "mlp_hidden": prov.set("mlp_hidden", tuple(hidden), "shape: layers.S.blocks.0.mlp.fc1.weight"),
        "attn_kind": prov.set("attn_kind", "cosine" if v2 else "dot", "shape: attn.logit_scale " + (
            "present: scaled cosine attention (tau clamped at log 100)" if v2 else
            "absent: softmax((q * head_dim ** -0.5) @ k^T + bias)")),
        "rel_pos": prov.set("rel_pos", "cpb" if v2 else "table", "shape: attn." + (
            "cpb_mlp (16 * sigmoid of an MLP over log-spaced offsets)" if v2 else "relative_position_bias_table")),
        "patch_norm": prov.set("patch_norm", "patch_embed.norm.weight" in sd, "shape: patch_embed.norm.weight " +
                               ("present" if "patch_embed.norm.weight" in sd else "absent")),
        "final_norm": prov.set("final_norm", "norm.weight" in sd, "shape: norm.weight " +
                               ("present" if "norm.weight" in sd else "absent")),
        "block_norm": prov.set("block_norm", "res_post" if v2 else "pre", (
            "family: Swin v2 blocks are residual post-norm, x + norm(f(x))" if v2 else
            "family: Swin v1 blocks are pre-norm, x + f(norm(x))")),
        "pos_embed": "absolute_pos_embed" in sd,
    }
    prov.set("pos_embed", out["pos_embed"],
             "shape: absolute_pos_embed " + ("present" if out["pos_embed"] else "absent"))
    if out["pos_embed"]:
        n = int(sd["absolute_pos_embed"].shape[1])
        side = math.isqrt(n)
        if side * side != n:
            raise InconsistentCheckpointError(f"{where}: absolute position table of {n} rows is not a square grid")
        out["pos_grid"] = prov.set("pos_grid", (side, side), "shape: absolute_pos_embed (a square grid)")
    if len(stages) > 1:
        norm = sd.get("layers.1.downsample.norm.weight")
        if norm is None:
            raise InconsistentCheckpointError(f"{where}: no patch merging in front of stage 1 "
                                              "(layers.1.downsample.norm.weight)")
        before = int(norm.shape[0]) == 4 * dims[0]
        out["merge_norm"] = prov.set("merge_norm", "before" if before else "after",
                                     f"shape: layers.1.downsample.norm.weight ({norm.shape[0]},): norm over "
                                     + ("4C before the reduction (v1)" if before else "2C after the reduction (v2)"))
    prov.hint("eps_embed", hints, 1e-5, "default: nn.LayerNorm eps 1e-5")
    out["eps_embed"] = float(hints.get("eps_embed", (1e-5,))[0]) if overrides.get("eps") is None else \
        float(prov.set("eps_embed", overrides["eps"], "override"))
    # each block's window as its tensors show it (v1 tables; stored index / coordinate buffers)
    shown: list[tuple[tuple[int, int] | None, str]] = []
    for s, depth in enumerate(depths):
        for b in range(depth):
            buf = hints.get(f"window:{s}.{b}")
            table = sd.get(f"layers.{s}.blocks.{b}.attn.relative_position_bias_table")
            if buf is not None:
                shown.append(buf)
            elif table is not None:
                side = math.isqrt(int(table.shape[0]))
                if side * side == table.shape[0] and side % 2 == 1:
                    shown.append((((side + 1) // 2,) * 2, "shape: relative_position_bias_table ((2W-1)^2, heads)"))
                else:
                    shown.append((None, ""))
            else:
                shown.append((None, ""))
    out["_shown"] = shown
    out["_stages"] = len(stages)
    return out


# --------------------------------------------------------------------------------------------------------- SAM

def _sam_fields(sd: dict[str, torch.Tensor], hints: dict[str, Any], overrides: dict[str, Any], prov: _Prov,
                where: str) -> dict[str, Any]:
    blocks = sorted({int(m.group(1)) for k in sd if (m := re.match(r"^blocks\.(\d+)\.", k))})
    if not blocks or blocks != list(range(len(blocks))):
        raise InconsistentCheckpointError(f"{where}: SAM blocks {blocks}; expected blocks.0 ... in order")
    dim = int(sd["blocks.0.norm1.weight"].shape[0])
    rel = "blocks.0.attn.rel_pos_h" in sd
    out: dict[str, Any] = {
        "arch": prov.set("arch", "sam", "shape: blocks.N.attn.rel_pos_h / neck (a SAM / ViTDet image encoder)"),
        "depths": prov.set("depths", (len(blocks),), "shape: blocks.N"),
        "dims": prov.set("dims", (dim,), "shape: blocks.0.norm1.weight"),
        "mlp_hidden": prov.set("mlp_hidden", (int(sd["blocks.0.mlp.fc1.weight"].shape[0]),),
                               "shape: blocks.0.mlp.fc1.weight"),
        "attn_kind": prov.set("attn_kind", "dot", "family: SAM attention, softmax((q * head_dim ** -0.5) @ k^T + "
                              "bias)"),
        "rel_pos": prov.set("rel_pos", "decomposed" if rel else "", "shape: blocks.0.attn.rel_pos_h " +
                            ("present: decomposed relative positions from q" if rel else "absent")),
        "block_norm": prov.set("block_norm", "pre", "family: SAM / ViTDet blocks are pre-norm"),
        "patch_norm": False, "final_norm": False, "pos_embed": "pos_embed" in sd,
    }
    prov.set("pos_embed", out["pos_embed"], "shape: pos_embed " + ("present" if out["pos_embed"] else "absent"))
    if out["pos_embed"]:
        pe = sd["pos_embed"]
        if pe.ndim != 4:
            raise InconsistentCheckpointError(f"{where}: pos_embed {tuple(pe.shape)}; expected SAM's (1, gh, gw, D)")
        out["pos_grid"] = prov.set("pos_grid", (int(pe.shape[1]), int(pe.shape[2])), "shape: pos_embed (1, gh, gw, D)")
    if rel:
        hd = int(sd["blocks.0.attn.rel_pos_h"].shape[1])
        heads = prov.set("heads", dim // hd, "shape: blocks.0.attn.rel_pos_h (2W-1, head_dim)")
        if overrides.get("heads") is not None and int(overrides["heads"]) != heads:
            raise OverrideError(f"{where}: heads={overrides['heads']}, but the relative position tables are "
                                f"{hd} wide: {heads} heads of {hd}")
    elif overrides.get("heads") is not None:
        heads = prov.set("heads", int(overrides["heads"]), "override")
    elif "num_heads" in hints:
        heads = prov.set("heads", hints["num_heads"][0], hints["num_heads"][1])
    else:
        heads = prov.set("heads", max(1, dim // 64), f"guess: {dim} wide in heads of 64 (pass heads=N)")
    out["heads"] = (heads,)
    neck = "conv" if "neck.0.weight" in sd else "norm" if "neck.weight" in sd else ""
    out["neck"] = prov.set("neck", neck, "shape: " + {"conv": "neck.0 (1x1 conv) .. neck.3", "norm": "neck.weight "
                           "(one LayerNorm2d)", "": "no neck"}[neck])
    if neck == "conv":
        out["neck_dim"] = prov.set("neck_dim", int(sd["neck.0.weight"].shape[0]), "shape: neck.0.weight")
    out["eps_neck"] = float(prov.hint("eps_neck", hints, 1e-6, "default: LayerNorm2d eps 1e-6")) if neck else 1e-6
    residual = tuple(sorted({int(m.group(1)) for k in sd if (m := re.match(r"^blocks\.(\d+)\.residual\.", k))}))
    out["residual_blocks"] = prov.set("residual_blocks", residual, "shape: blocks.N.residual.conv1..norm3 " + (
        "(ViTDet's bottleneck: 1x1, 3x3, 1x1 convolutions, LayerNorm2d eps 1e-6, the blocks' activation)"
        if residual else "absent"))
    out["_sam_rel"] = [(tuple(int(sd[f"blocks.{b}.attn.rel_pos_{a}"].shape[0]) for a in "hw")
                        if rel else None) for b in blocks]
    out["_stages"] = 1
    return out


# ---------------------------------------------------------------------------------------- windows and shifts

def _finish_windows(fields: dict[str, Any], hints: dict[str, Any], prov: _Prov, where: str) -> dict[str, Any]:
    """Every block's window and shift as built at the native size, with their sources; pops the helpers."""
    stages = fields.pop("_stages")
    size, patch = fields["image_size"], fields["patch_size"]
    grids = [(size[0] // patch, size[1] // patch)]
    if fields["arch"] != "sam":
        for _ in range(1, stages):
            grids.append(((grids[-1][0] + 1) // 2, (grids[-1][1] + 1) // 2))
    if fields["arch"] == "sam":
        return _sam_windows(fields, hints, prov, where, grids[0])
    shown = fields.pop("_shown")
    depths = fields["depths"]
    clamp, clamp_src = hints.get("clamp", ("none", "default: windows are not shrunk"))
    config = None
    if hints.get("window") is not None:
        config = (_window_list(hints["window"][0], stages, "window"), hints["window"][1])
    override = fields.pop("_override_window", None)
    windows: list[tuple[int, int]] = []
    shifts: list[tuple[int, int]] = []
    kinds: set[str] = set()
    b = 0
    for s, depth in enumerate(depths):
        r = grids[s]
        for i in range(depth):
            win, src = shown[b]
            if win is not None:
                if override is not None and override[s] != win:
                    raise OverrideError(f"{where}: window={override[s]} for stage {s}, but its tables are for "
                                        f"{win[0]}x{win[1]} windows")
                target = win
                kinds.add(src)
            elif override is not None:
                target = override[s]
                kinds.add("override")
            elif config is not None:
                target = config[0][s]
                kinds.add(config[1])
            else:
                target = (8, 8) if fields["arch"] == "swinv2" else (7, 7)
                kinds.add(f"guess: {target[0]}x{target[0]} windows, Swin {'v2' if fields['arch'] == 'swinv2' else 'v1'}"
                          "'s usual size (no tensor of this layout holds it; pass window=N)")
            if win is None and clamp == "per_side":
                window = tuple(r[d] if r[d] <= target[d] else target[d] for d in range(2))
            elif win is None and clamp == "square":
                side = min(r[0], target[0])
                window = (side, side)
            else:
                window = target
            half = (target[0] // 2, target[1] // 2)
            if i % 2 == 0:
                shift = (0, 0)
            elif clamp == "per_side":
                shift = tuple(0 if r[d] <= window[d] else half[d] for d in range(2))
            elif clamp == "square":
                shift = (0, 0) if r[0] <= window[0] else (half[0], half[0])
            else:
                shift = half
            windows.append(tuple(window))
            shifts.append(tuple(shift))
            b += 1
    prov.set("windows", tuple(windows), _join(kinds, clamp_src if clamp != "none" else ""))
    shift_src = hints.get("shift", ("family: Swin shifts every second block by window // 2",))[1]
    prov.set("shifts", tuple(shifts), shift_src + (f"; {clamp_src.split(': ', 1)[-1]}" if clamp != "none" else ""))
    out: dict[str, Any] = {"windows": tuple(windows), "shifts": tuple(shifts)}
    if fields["arch"] == "swinv2":
        pw, pw_src = hints.get("pretrained_windows", ((0, 0), "default: the window itself"))
        if isinstance(pw, tuple) and pw[:1] == ("from",):   # named 'window12to16_192to256': pretrained stages' windows
            per = []
            g = pw[2] // patch
            for s in range(stages):
                per.append((min(pw[1], g),) * 2)
                g = (g + 1) // 2
        elif isinstance(pw, (list, tuple)) and len(pw) == stages and all(isinstance(v, int) for v in pw):
            per = [(int(v), int(v)) for v in pw]
        else:
            per = [(0, 0)] * stages
        out["pretrained_windows"] = prov.set("pretrained_windows", tuple(per), pw_src)
    else:
        out["pretrained_windows"] = tuple((0, 0) for _ in range(stages))
    return out


def _join(kinds: set[str], extra: str) -> str:
    """One source for values read from several places: the weakest first (a guess, then a family default, then
    config, then shapes), so the entry's kind is the weakest of them."""
    rank = {"guess": 0, "assumed": 0, "default": 1, "family": 1, "named": 2, "metadata": 3, "override": 3, "shape": 4}
    parts = sorted(kinds, key=lambda k: rank.get(k.split(":")[0].strip(), 0))
    text = "; ".join(parts)
    return text + (f"; {extra.split(': ', 1)[-1]}" if extra else "")


def _sam_windows(fields: dict[str, Any], hints: dict[str, Any], prov: _Prov, where: str,
                 grid: tuple[int, int]) -> dict[str, Any]:
    rel = fields.pop("_sam_rel")
    depth = fields["depths"][0]
    override_w = fields.pop("_override_window", None)
    override_g = fields.pop("_override_globals", None)
    cfg_w = hints.get("window")
    cfg_g = hints.get("global_blocks")
    # the grid a global block's tables span: the stored position grid (SAM's tables and table are both built at
    # its native size), or the native grid where the family builds them at image_size (ViTDet: its position
    # table is the pretrain grid's)
    pos = grid if hints.get("global_grid", ("",))[0] == "native" else fields.get("pos_grid") or grid
    windows: list[tuple[int, int]] = []
    sources: set[str] = set()
    for b in range(depth):
        lengths = rel[b]
        if lengths is not None:
            side = ((lengths[0] + 1) // 2, (lengths[1] + 1) // 2)
            if side == tuple(pos) and (cfg_w is None or cfg_w[0] != side[0]) and override_w is None:
                windows.append((0, 0))   # the table spans the native grid: a global block
                sources.add("shape: blocks.N.attn.rel_pos_h (2W-1, head_dim); a table spanning the native grid is a "
                            "global block's")
                continue
            if side == tuple(pos):   # as wide as the grid: the config (or override) says whether it is global
                is_global = b in (override_g or (cfg_g[0] if cfg_g else ()))
                windows.append((0, 0) if is_global else side)
                sources.add(("override" if override_g else cfg_g[1]) if (override_g or cfg_g) else
                            "guess: a window as large as the grid; taken as windowed (pass global_blocks=...)")
                continue
            windows.append(side)
            sources.add("shape: blocks.N.attn.rel_pos_h (2W-1, head_dim)")
            continue
        globals_ = override_g if override_g is not None else (cfg_g[0] if cfg_g else None)
        window = override_w if override_w is not None else (cfg_w[0] if cfg_w else None)
        if globals_ is None or window is None:
            named = fields["dims"][0] in sam_family.GLOBAL_BLOCKS and "identity" in hints
            globals_ = globals_ if globals_ is not None else sam_family.GLOBAL_BLOCKS.get(fields["dims"][0], ())
            window = window if window is not None else 14
            sources.add(("named: " if named else "guess: ") + f"SAM's window 14 and global blocks {list(globals_)} "
                        "(no tensor holds them; pass window=N and global_blocks=[...])")
        else:
            sources.add("override" if override_w is not None else cfg_w[1])
            sources.add("override" if override_g is not None else cfg_g[1])
        windows.append((0, 0) if b in globals_ else (int(window), int(window)))
    prov.set("windows", tuple(windows), _join(sources, ""))
    prov.set("shifts", tuple((0, 0) for _ in windows), "family: SAM / ViTDet never shift their windows")
    return {"windows": tuple(windows), "shifts": tuple((0, 0) for _ in windows), "pretrained_windows": ((0, 0),)}


# ------------------------------------------------------------------------------------------------------ building

def build(spec: WindowedSpec, device: torch.device) -> WindowedNet:
    try:
        with device:
            return WindowedNet(spec)
    except (ValueError, TypeError) as e:
        raise InconsistentCheckpointError(f"{spec.source}: no reference windowed model fits ({e})") from e


def load_windowed(conv: Converted, raw: RawCheckpoint, overrides: dict[str, Any], warn: bool = True) -> WindowedModel:
    """A converted Swin / SAM checkpoint as a `WindowedModel` on `overrides['device']`."""
    device = resolve_device(overrides.get("device"))
    spec = infer_windowed_spec(conv, raw, overrides, warn)
    check_weights(conv.tensors, spec.source)
    shadow = build(spec, torch.device("meta"))
    check_exact_tensors(shadow.state_dict(), conv.tensors, spec.source, "vitviz's windowed model")
    check_model_memory(sum(t.numel() * 4 for t in shadow.state_dict().values()), device, spec.source)
    net = build(spec, torch.device("cpu"))
    net.load_state_dict(conv.tensors, strict=True)
    net.eval()
    spec = replace(spec, num_params=sum(p.numel() for p in net.parameters()))
    net.spec = spec
    return WindowedModel(net, spec, torch.device("cpu"), conv.dropped).to(str(device))
