"""Reading a ViT by structure: the roles and shapes of its tensors, not a fixed list of names.

Hand-written and tutorial ViTs name their parts freely (`blocks.N.attention.in_proj_weight`,
`layers.N.attn.heads.H.query`, `encoder.N.msa.q`, `mlp.0` / `mlp.3`, `head`, ...), so this reader places each
tensor by what it is:

- blocks: the repeated modules under one `CONTAINER.N.` (a child that holds attention starts a block; a child
  without attention joins the block before it, as in `nn.Sequential(Residual(attn), Residual(ff), ...)`);
- attention: an `nn.MultiheadAttention` in-projection `(3A, D)`, a fused `(3A, D)` Linear, separate q/k/v
  Linears `(A, D)`, or one q/k/v triple per head -- head modules `heads.h.query` or per-head lists `q_mappings.h`
  -- each `(hd, D)` on the whole token (concatenated head by head) or `(hd, D/H)` on its head's slice (the
  "Vision Transformers from scratch" tutorial: a block-diagonal qkv); the head count is then derived; the output
  projection is the `(D, A)` Linear next to them, or absent;
- MLP: the `(F, D)` / `(D, F)` pair of Linears left in the block; norms: the `(D,)` weight/bias pairs, the one
  in front of the attention is norm1, the one in front of the MLP norm2;
- outside the blocks: the patch embedding (a conv `(D, C, P, P)`, or a Linear `(D, C*P*P)` over flattened
  patches, folded into the conv; a LayerNorm `(C*P*P,)` before it and `(D,)` after it), tokens `(1, 1, D)`,
  the position table `(1, n, D)`, `(n, D)` or `(1, D, gh, gw)` (none in the file: a computed table the model does not
  save, the 1-D sin-cos one by a said guess, `pos_kind=`), the final norm(s), and the head: one Linear, or
  `Linear -> act -> Linear`, with a LayerNorm in front of it read as a norm after pooling.

What the file cannot say (heads, activation, pooling without a class token, the flatten order of a Linear patch
embedding) comes from `Facts` a family module passes (vit-pytorch, nn.TransformerEncoder) or is a said guess.
A file with attention-shaped weights that cannot be placed is refused with what was recognised and what was
not -- never with "not a Vision Transformer".
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from vitviz.core.reading.families.base import Converted, Hint
from vitviz.core.reading.metadata import CHANNEL_KEYS, as_int, find_value, metadata_sources
from vitviz.errors import OverrideError, UnknownLayoutError

if TYPE_CHECKING:
    import torch
    from vitviz.core.reading.checkpoint import RawCheckpoint

NAMES = ("structural",)
DETECT_ORDER = 1000   # tried last: it reads any layout by the roles and shapes of its tensors
# What this family knows beyond its keys (read by `vitviz.core.reading.families`: see there).
HELP = "any other layout, read by tensor roles and shapes"
# REGISTERED_SIZES False (the default): a hand-written layout need not follow the registered sizes

_ROLE_WORDS = {"q": "q", "query": "q", "queries": "q", "k": "k", "key": "k", "keys": "k", "v": "v", "value": "v",
               "values": "v", "qkv": "qkv", "kv": "kv", "inproj": "qkv", "cattn": "qkv"}
_OUT_WORDS = ("out", "proj", "o", "wo", "output", "dense", "projection", "outproj", "oproj", "toout", "fcout",
              "cproj", "outputprojection", "attnout", "concat")


@dataclass
class Facts:
    """What a family knows that the tensors do not say. Each value is a hint `(value, source)` or None."""
    family: str = "structural"
    eps: Hint = (1e-5, "assumed: nn.LayerNorm's default eps 1e-5 (a hand-written layout; no tensor holds the eps)")
    mlp_kind: Hint = ("gelu", "guess: GELU, the ViT activation (pass act='relu' if the MLP uses ReLU)")
    block_norm: Hint = ("pre", "assumed: pre-norm blocks, as in ViT (the norm order is in no tensor)")
    patch_order: Hint = ("p1p2c", "guess: flattened patches in einops order 'b c (h p1) (w p2) -> b (h w) "
                         "(p1 p2 c)' (pass patch_order='cp1p2' for unfold/permute order)")
    head_act: Hint = ("gelu", "guess: GELU between the two head Linears (pass head_act=...)")
    pooling_no_cls: Hint = ("avg", "guess: no class token, so the mean of the patch tokens (pass pooling='token' "
                            "for token-0 pooling)")
    pooling_cls: Hint | None = None
    attn_scale: Hint = (0.0, "assumed: head_dim ** -0.5, the usual attention scale (a hand-written attention may "
                        "scale otherwise)")
    token_order: Hint = ("prefix_first", "assumed: the class (and other prefix) tokens come before the patches, as "
                         "in ViT; a model that appends them after the patches needs its own code")
    no_pos_table: Hint | None = ("sincos1d", "guess: no position table in the file, taken as a table the model "
                                 "computes and does not save: the 1-D sin-cos table over every token, class token "
                                 "first (the 'Vision Transformers from scratch' tutorial's get_positional_embeddings "
                                 "in a non-persistent buffer)")
    extra: dict[str, Hint] = field(default_factory=dict)  # more hints handed through (attn_scale, pos_kind, ...)


@dataclass
class Unit:
    """One module's tensors (or one bare parameter), with the position of its first key in the file."""
    kind: str                     # 'linear' | 'norm' | 'conv' | 'in_proj' | 'param'
    path: str                     # module path (for 'param': the full key)
    weight: torch.Tensor
    bias: torch.Tensor | None
    order: int
    keys: tuple[str, ...]

    @property
    def name(self) -> str:
        return self.path.rsplit(".", 1)[-1]

    @property
    def parent(self) -> str:
        return self.path.rpartition(".")[0]

    def describe(self) -> str:
        """The file's own key and shape, e.g. 'blocks.0.attn.q.weight (64, 64)'."""
        return f"{self.keys[0]} {tuple(self.weight.shape)}"

    def at(self, path: str) -> "Unit":
        """The same tensors under another (block-relative) path."""
        return Unit(self.kind, path, self.weight, self.bias, self.order, self.keys)


class Unplaced(Exception):
    """A tensor (or several) the reader recognised no role for; `step`, when given, is the one thing to do (else
    the refusal gives the usual choices: the model's own code, or overrides)."""

    def __init__(self, what: str, units: list[Unit] | None = None, step: str = "") -> None:
        super().__init__(what)
        self.what, self.units, self.step = what, units or [], step


@dataclass
class Report:
    """What was recognised, for messages."""
    parts: dict[str, str] = field(default_factory=dict)


def units_of(sd: dict[str, torch.Tensor]) -> list[Unit]:
    """Group keys into modules: Linear (2-D weight, optional bias), norm (1-D weight + bias), conv (4-D weight),
    an nn.MultiheadAttention in-projection, or a bare parameter."""
    order = {k: i for i, k in enumerate(sd)}
    modules: dict[str, dict[str, str]] = {}
    for key in sd:
        path, _, name = key.rpartition(".")
        modules.setdefault(path, {})[name] = key
    units: list[Unit] = []
    for path, names in modules.items():
        left = dict(names)
        if "in_proj_weight" in left and sd[left["in_proj_weight"]].ndim == 2:
            w, b = left.pop("in_proj_weight"), left.pop("in_proj_bias", None)
            units.append(Unit("in_proj", path, sd[w], sd[b] if b else None, order[w], (w,) + ((b,) if b else ())))
        if "weight" in left:
            w = left.pop("weight")
            b = left.pop("bias", None)
            wt, bt = sd[w], sd[b] if b else None
            if bt is not None and (bt.ndim != 1 or bt.shape[0] != wt.shape[0]):
                left["bias"], bt, b = b, None, None
            kind = {1: "norm" if bt is not None else "param", 2: "linear", 4: "conv"}.get(wt.ndim, "param")
            if kind == "param":
                units.append(Unit("param", w, wt, None, order[w], (w,)))
                if b:
                    units.append(Unit("param", b, sd[b], None, order[b], (b,)))
            else:
                units.append(Unit(kind, path, wt, bt, order[w], (w,) + ((b,) if b else ())))
        for key in left.values():
            units.append(Unit("param", key, sd[key], None, order[key], (key,)))
    return sorted(units, key=lambda u: u.order)


def _squash(name: str) -> str:
    return re.sub(r"[^a-z]", "", name.lower())


def qkv_role(name: str) -> str | None:
    """'q' / 'k' / 'v' / 'qkv' / 'kv' for a module name such as `query`, `to_q`, `k_proj`, `W_v`, `qkv`."""
    word = _squash(name)
    if word in _ROLE_WORDS:
        return _ROLE_WORDS[word]
    for pre, suf in (("to", ""), ("w", ""), ("", "proj"), ("", "linear"), ("linear", ""), ("proj", ""),
                     ("", "layer"), ("", "lin"), ("", "fc"), ("", "weight"), ("", "w"), ("", "net"), ("", "mat")):
        if word.startswith(pre) and word.endswith(suf) and len(word) > len(pre) + len(suf):
            core = word[len(pre):len(word) - len(suf) if suf else None]
            if core in _ROLE_WORDS:
                return _ROLE_WORDS[core]
    return None


_LIST_SUFFIXES = ("mappings", "mapping", "maps", "heads", "list", "linears", "layers", "projs", "projections", "s")


def list_role(name: str) -> str | None:
    """'q' / 'k' / 'v' for a ModuleList holding one Linear per head: `q_mappings`, `k_heads`, `value_projs`,
    `queries` (the per-head lists of the from-scratch tutorials)."""
    role = qkv_role(name)
    if role in ("q", "k", "v"):
        return role
    word = _squash(name)
    for suf in _LIST_SUFFIXES:
        if word.endswith(suf) and len(word) > len(suf):
            role = qkv_role(word[:-len(suf)])
            if role in ("q", "k", "v"):
                return role
    return None


# Names of a Linear that say nothing of its role: `query.linear` is the query's (labml's PrepareForMultiHeadAttention)
_WRAPPED_NAMES = frozenset({"linear", "lin", "proj", "projection", "fc", "dense", "layer", "net", "w"})


def unit_role(u: Unit) -> str | None:
    """The q/k/v role of a Linear by its own name (`query`, `to_q`), for an item of a ModuleList
    (`q_mappings.0`) by the list's name, and for a Linear with a name that says nothing inside a module named for
    the role (`query.linear`, labml's) by that module's name."""
    if u.kind != "linear":
        return None
    if u.name.isdigit():
        return list_role(u.parent.rsplit(".", 1)[-1]) if u.parent else None
    role = qkv_role(u.name)
    if role is None and _squash(u.name) in _WRAPPED_NAMES and u.parent:
        return qkv_role(u.parent.rsplit(".", 1)[-1])
    return role


def _attention_path(u: Unit) -> str:
    """The path of the attention module a q/k/v Linear belongs to: its parent, or its grandparent for an item of
    a per-head list (`q_mappings.0`) or a wrapped Linear (`query.linear`)."""
    wrapped = not u.name.isdigit() and qkv_role(u.name) is None
    return u.parent.rpartition(".")[0] if u.name.isdigit() or wrapped else u.parent


def is_attention_shaped(sd: dict[str, torch.Tensor]) -> bool:
    """Whether the file holds attention weights: an nn.MultiheadAttention in-projection, q/k/v-named Linears, or
    (3D, D) Linears inside repeated modules (NAME.N.)."""
    for unit in units_of(sd):
        if unit.kind == "in_proj" or unit_role(unit) is not None:
            return True
        if unit.kind == "linear" and _index_split(unit.path) and _attention_unit(unit):
            return True
    return False


def detect(keys: set[str], raw: RawCheckpoint) -> str | None:
    """Claims any file with attention-shaped weights that no named family claimed (it is registered last)."""
    sd, _ = _without_prefixes(raw)
    return "structural" if is_attention_shaped(sd) else None


def _without_prefixes(raw: RawCheckpoint) -> tuple[dict[str, torch.Tensor], list[str]]:
    from vitviz.core.reading.families.base import strip_prefixes

    return strip_prefixes(dict(raw.tensors))


def convert(sd: dict[str, torch.Tensor], raw: RawCheckpoint, family: str | None = None,
            overrides: dict[str, Any] | None = None) -> Converted:
    return read(sd, raw, facts_from_metadata(Facts(), raw), overrides or {})


def facts_from_metadata(facts: Facts, raw: RawCheckpoint, mean_pool: str = "avg") -> Facts:
    """`facts` with what the training args or a config beside the file state: `norm_first`, `activation`,
    `pool`, `layer_norm_eps` (`mean_pool` is what 'mean' pooling means for this family)."""
    from dataclasses import replace

    from vitviz.core.reading.metadata import ACT_KEYS, EPS_KEYS, NORM_FIRST_KEYS, POOL_KEYS

    sources = metadata_sources(raw.meta, raw.sidecars)
    acts = {"gelu": "gelu", "relu": "relu", "silu": "silu", "swish": "silu", "quick_gelu": "quick_gelu",
            "gelu_tanh": "gelu_tanh", "gelu_new": "gelu_tanh", "tanh": "tanh"}
    pools = {"cls": "token", "token": "token", "mean": mean_pool, "avg": mean_pool, "gap": mean_pool}
    changes: dict[str, Any] = {}
    found = find_value(sources, NORM_FIRST_KEYS, lambda v: v if isinstance(v, bool) else None)
    if found:
        changes["block_norm"] = ("pre" if found[0] else "post", found[1])
    found = find_value(sources, ACT_KEYS, lambda v: acts.get(str(v).lower().split(".")[-1].replace("()", "")))
    if found:
        changes["mlp_kind"] = found
    found = find_value(sources, EPS_KEYS, lambda v: float(v) if isinstance(v, float) and 0 < v < 1e-2 else None)
    if found:
        changes["eps"] = found
    found = find_value(sources, POOL_KEYS, lambda v: pools.get(str(v).lower()))
    if found:
        changes["pooling_cls"] = changes["pooling_no_cls"] = found
    return replace(facts, **changes)


# ------------------------------------------------------------------------------------------------------ reader
def read(sd: dict[str, torch.Tensor], raw: RawCheckpoint, facts: Facts, overrides: dict[str, Any]) -> Converted:
    """Place every tensor of `sd` in the canonical layout; UnknownLayoutError says what could not be placed."""
    report = Report()
    units = units_of(sd)
    out: dict[str, torch.Tensor] = {}
    hints: dict[str, Hint] = {"eps": facts.eps, "mlp_kind": facts.mlp_kind, "block_norm": facts.block_norm,
                              **facts.extra}
    dropped: list[str] = []
    try:
        container, groups, inside = _blocks(units, report)
        first = _first_qkv(groups[0])
        dim = _embed_width(groups[0], first) if first is not None else 0
        per_head: set[int] = set()
        zeros = 0
        for i, group in enumerate(groups):
            block, heads, padded = _read_block(group, dim, i)
            zeros += padded
            if i == 0:
                _describe_attention(block, heads, report)
            out.update({f"blocks.{i}.{k}": v for k, v in block.items()})
            if heads:
                per_head.add(heads)
        if len(per_head) == 1:
            n = per_head.pop()
            hints["num_heads"] = (n, f"shape: {n} per-head query/key/value modules")
            asked = overrides.get("heads")
            if asked and int(asked) != n:
                raise OverrideError(f"{raw.path}: heads={asked}, but each block holds {n} per-head query/key/value "
                                    f"modules ({report.parts.get('attention', '')}): the file has {n} heads; expected "
                                    f"heads={n} or no heads=")
        if zeros:
            hints["zero_params"] = (zeros, "derived: the zeros outside each head's block of the block-diagonal qkv "
                                           "assembled from per-head Linears on their slices (not the model's)")
        top = [u for u in units if id(u) not in inside]
        dropped += _read_top(top, dim, container, raw, facts, overrides, out, hints, report)
    except Unplaced as e:
        raise _refusal(raw, report, e, units) from None
    hints.update(_unstated(groups[0], facts, out, hints))
    return Converted(facts.family, out, hints, dropped)


def _unstated(first_block: list[Unit], facts: Facts, out: dict[str, torch.Tensor],
              hints: dict[str, Hint]) -> dict[str, Hint]:
    """What no tensor of a hand-written layout says and its code decides: the attention scale (known only for
    nn.MultiheadAttention, whose code fixes it), the token order and the final norms' eps -- each said as
    assumed, so that it is flagged wherever the model is shown."""
    from vitviz.core.spec import ASSUMED, provenance_kind

    found: dict[str, Hint] = {}
    if "attn_scale" not in hints:
        mha = any(u.kind == "in_proj" for u in first_block)
        found["attn_scale"] = (0.0, "derived: an nn.MultiheadAttention (in_proj_weight), which always scales by "
                                    "head_dim ** -0.5") if mha else facts.attn_scale
    if any(k in out for k in ("cls_token", "dist_token", "reg_token")):
        found["token_order"] = facts.token_order
    finals = [k for k in ("norm", "norm_extra", "fc_norm") if f"{k}.weight" in out]
    eps, eps_src = hints.get("eps", facts.eps)
    if finals and provenance_kind(eps_src) == ASSUMED:  # a stated layer_norm_eps is every norm's
        found["eps_final"] = (eps, f"assumed: the final LayerNorm{'s' if len(finals) > 1 else ''} "
                                   f"({', '.join(finals)}) use{'' if len(finals) > 1 else 's'} the blocks' eps "
                                   f"{eps:g} (a model may build {'them' if len(finals) > 1 else 'it'} with another, "
                                   "e.g. nn.LayerNorm's 1e-5 after 1e-6 blocks)")
    return found


def _first_qkv(group: list[Unit]) -> Unit | None:
    return next((u for u in group if _named_attention(u)), None) or \
        next((u for u in group if _attention_unit(u)), None)


def _embed_width(group: list[Unit], first: Unit) -> int:
    """The embed dim D, read off the first block's first q/k/v Linear: its input width, unless it is one of H
    per-head Linears that each act on their head's slice of the token (`q_mappings.h` (hd, hd), the from-scratch
    tutorial, or `heads.h.query` (hd, hd)): then H * hd, when the block's LayerNorms or MLP have that width."""
    width = int(first.weight.shape[1])
    if first.name.isdigit():     # q_mappings.<h>: the list's items
        items = [u for u in group if u.kind == "linear" and u.parent == first.parent and u.name.isdigit()]
    elif m := re.match(r"^(.*)\.\d+$", first.parent):   # heads.<h>.query: the same role in each head module
        items = [u for u in group if u.kind == "linear" and u.name == first.name
                 and re.fullmatch(re.escape(m.group(1)) + r"\.\d+", u.parent)]
    else:
        return width
    widths = {int(u.weight.shape[0]) for u in group if u.kind == "norm"} | \
        {int(u.weight.shape[1]) for u in group if u.kind == "linear" and unit_role(u) is None}
    sliced = width * len(items)
    return sliced if len(items) > 1 and sliced in widths and width not in widths else width


def _index_split(path: str) -> tuple[str, int, str] | None:
    """'transformer.layers.3.0.norm' -> ('transformer.layers', 3, '0.norm'): the first numeric segment."""
    parts = path.split(".")
    for i, part in enumerate(parts):
        if part.isdigit():
            return ".".join(parts[:i]), int(part), ".".join(parts[i + 1:])
    return None


def _named_attention(u: Unit) -> bool:
    """Certain attention: an nn.MultiheadAttention in-projection or a q/k/v-named Linear (or an item of a q/k/v
    per-head list)."""
    return u.kind == "in_proj" or unit_role(u) is not None


def _attention_unit(u: Unit) -> bool:
    """Possible attention: certain attention, or a (3k, k) Linear (which may also be an MLP of ratio 3)."""
    return _named_attention(u) or (u.kind == "linear" and u.weight.shape[0] == 3 * u.weight.shape[1])


def _blocks(units: list[Unit], report: Report) -> tuple[str, list[list[Unit]], set[int]]:
    """The block container and the units of each block, with paths made relative to the block.

    A child of the container that holds attention starts a block; a child without attention joins the block
    before it (vit-pytorch's first `nn.Sequential(Residual(PreNorm(attn)), Residual(PreNorm(ff)), ...)`). The
    children of a merged block keep apart by their position: '0.fn.norm', '1.fn.fn.net.0'.
    """
    by_container: dict[str, dict[int, list[Unit]]] = {}
    loose_heads: list[Unit] = []   # per-head list items (q_mappings.h) outside any stack: their index is a head's
    for u in units:
        split = _index_split(u.path)
        if split and not split[2] and unit_role(u) is not None:
            loose_heads.append(u)
        elif split:
            by_container.setdefault(split[0], {}).setdefault(split[1], []).append(u)
    def score(kids: dict[int, list[Unit]]) -> tuple[int, int]:
        units_in = [u for us in kids.values() for u in us]
        return sum(map(_named_attention, units_in)), sum(map(_attention_unit, units_in))

    scored = sorted(((score(kids), name) for name, kids in by_container.items()), reverse=True)
    if not scored or scored[0][0][1] == 0:
        top = sorted({u.parent.rpartition(".")[0] or "(top level)" for u in loose_heads})
        raise Unplaced("no repeated transformer blocks (modules under NAME.N. holding attention weights)" +
                       (f"; one attention with per-head q/k/v lists ({', '.join(top)}) outside any stack of blocks: "
                        "a single encoder block written out in the model itself" if loose_heads else ""),
                       loose_heads)
    (named, _), container = scored[0]
    others = [name for (n, _), name in scored[1:] if n] if named else []
    if others:
        extra = [u for name in others for us in by_container[name].values() for u in us]
        raise Unplaced(f"attention weights in more than one stack of blocks ({container}.N and "
                       f"{', '.join(o + '.N' for o in others)})", extra)
    starts = _named_attention if named else _attention_unit  # an MLP of ratio 3 is no attention when names say
    children: list[list[list[Unit]]] = []  # blocks -> children -> units
    for index in sorted(by_container[container]):
        members = by_container[container][index]
        if any(starts(u) for u in members):
            children.append([members])
        elif children:
            children[-1].append(members)
        elif not container:
            raise _sequential(by_container[container])
        else:
            raise Unplaced(f"{container}.{index} comes before any attention", members)
    groups: list[list[Unit]] = []
    for kids in children:
        group = []
        for pos, members in enumerate(kids):
            for u in members:
                rel = _index_split(u.path)[2] or u.name  # type: ignore[index]
                group.append(u.at(f"{pos}.{rel}" if len(kids) > 1 else rel))
        groups.append(group)
    report.parts["blocks"] = f"{len(groups)} blocks under {container}.N"
    return container, groups, {id(u) for kids in children for members in kids for u in members}


def _code_step(why: str) -> str:
    """The one step left for a layout no file reading places: the model's own code (`why` says what it gives)."""
    return (f"open it with its own code: vitviz.load(path, code='FILE.py:FACTORY') (CLI: vitviz FILE --code "
            f"FILE.py:FACTORY, or vitviz info / export with --code), or vitviz.load(model) with the module itself -- "
            f"{why}, and its attention is captured where it is computed (the model's own by construction: there is "
            "no reading of the file to verify)")


def _sequential(parts: dict[int, list[Unit]]) -> Unplaced:
    """The refusal of a file whose keys start with numbers (`0.cls_token`, `1.0.0.fn.1.qkv.weight`): the state
    dict of an `nn.Sequential` (the einops ViT of the "Implementing ViT in PyTorch" blog and its many copies),
    whose parts are numbered, not named -- it names them and gives the route that runs the model as written."""
    shown = "; ".join(f"{i}: {', '.join(k for u in us[:2] for k in u.keys[:1])}{' ...' if len(us) > 2 else ''}"
                      for i, us in sorted(parts.items())[:4])
    return Unplaced(
        "its keys start with numbers because the model is an nn.Sequential: its parts are numbered, not named "
        f"({shown}), so nothing in the file says which part is the patch embedding, the blocks or the head (part "
        f"{min(parts)} comes before any attention)",
        step=_code_step("FACTORY being the function or class that builds the nn.Sequential; its forward runs as "
                        "written"))


def _describe_attention(block: dict[str, torch.Tensor], heads: int, report: Report) -> None:
    qkv = block["attn.qkv.weight"]
    dim, width = int(qkv.shape[1]), int(qkv.shape[0]) // 3
    report.parts["attention"] = (f"width {width} over embed dim {dim}" + (f", {heads} per-head modules" if heads
                                 else "") + (", output projection" if "attn.proj.weight" in block
                                             else ", no output projection"))
    if "mlp.fc1.weight" in block:
        report.parts["mlp"] = f"hidden {block['mlp.fc1.weight'].shape[0]}"


# ------------------------------------------------------------------------------------------------------ blocks
def _read_block(units: list[Unit], dim: int, index: int) -> tuple[dict[str, torch.Tensor], int, int]:
    """One block's units -> canonical `attn.qkv`, `attn.proj`, `norm1`, `norm2`, `mlp.fc1/fc2`, `ls1/ls2`, plus
    the head count when the file has one module per head (else 0) and how many zeros the canonical qkv holds
    that the file does not (a block-diagonal qkv of per-head Linears on their slices)."""
    import torch

    out: dict[str, torch.Tensor] = {}
    used: set[int] = set()
    (w, b), attn_path, heads, qkv_units = _find_qkv(units, dim, used)
    if w.shape[1] != dim:
        raise Unplaced(f"block {index}: q/k/v take width {w.shape[1]}, the first block {dim}", qkv_units)
    out["attn.qkv.weight"] = w
    if b is not None:
        out["attn.qkv.bias"] = b
    width = int(w.shape[0]) // 3
    mlp = _find_mlp(units, dim, width, attn_path, used, index)
    fc1 = mlp[0] if mlp else None
    if mlp:
        used.update(id(u) for u in mlp)
        out["mlp.fc1.weight"], out["mlp.fc2.weight"] = mlp[0].weight, mlp[1].weight
        if any(u.bias is not None for u in mlp):  # one biased, one not: the missing bias is zero (exact)
            for name, u in zip(("fc1", "fc2"), mlp):
                out[f"mlp.{name}.bias"] = u.bias if u.bias is not None else torch.zeros(u.weight.shape[0])
    proj = _find_out_proj(units, dim, width, attn_path, used)
    if proj is not None:
        out["attn.proj.weight"] = proj.weight
        if proj.bias is not None:
            out["attn.proj.bias"] = proj.bias
        used.add(id(proj))
    elif width != dim:
        raise Unplaced(f"block {index}: attention width {width} differs from the embed dim {dim}, but no "
                       f"({dim}, {width}) output projection was found")
    attn_first = min(u.order for u in qkv_units)
    _place_norms(units, dim, used, out, attn_path, attn_first, fc1, index)
    _place_layer_scale(units, dim, used, out, index)
    left = [u for u in units if id(u) not in used]
    if left:
        raise Unplaced(f"block {index}: no role for {', '.join(u.describe() for u in left[:4])}", left)
    return out, heads, int(w.numel()) - sum(int(u.weight.numel()) for u in qkv_units if u.kind != "in_proj") \
        if heads else 0


def _under(path: str, prefix: str) -> bool:
    return prefix == "" or path == prefix or path.startswith(prefix + ".")


def _find_qkv(units: list[Unit], dim: int,
              used: set[int]) -> tuple[tuple[torch.Tensor, torch.Tensor | None], str, int, list[Unit]]:
    """((3A, D) weight, bias), the attention module's path, the number of per-head modules (0 if fused), and the
    units they came from."""
    in_proj = [u for u in units if u.kind == "in_proj"]
    if len(in_proj) > 1:
        raise Unplaced("more than one nn.MultiheadAttention in a block", in_proj)
    if in_proj:
        u = in_proj[0]
        used.add(id(u))
        return (u.weight, u.bias), u.path, 0, [u]
    linears = [u for u in units if u.kind == "linear"]
    roles = [(u, unit_role(u)) for u in linears]
    roles = [(u, r) for u, r in roles if r is not None]
    # one module per head: the attention's head modules X.<h>.query / .key / .value (or .qkv), or its q/k/v lists
    # with one Linear per head, q_mappings.<h> / k_mappings.<h> / v_mappings.<h>; keyed by the attention's path
    per_head: dict[tuple[str, str], dict[int, dict[str, Unit]]] = {}
    for u, r in roles:
        if u.name.isdigit():
            key, head = (u.parent.rpartition(".")[0], "lists"), int(u.name)
        elif m := re.match(r"^(.*)\.(\d+)$", u.parent):
            key, head = (m.group(1).rpartition(".")[0], "modules"), int(m.group(2))
        else:
            continue
        per_head.setdefault(key, {}).setdefault(head, {})[r] = u
    for (path, style), heads in per_head.items():
        shapes = {tuple(u.weight.shape) for h in heads.values() for u in h.values()}
        if len(heads) >= 2 and len(shapes) == 1 and all(set(h) in ({"q", "k", "v"}, {"qkv"}) for h in heads.values()):
            order = [heads[h] for h in sorted(heads)]
            parts = _per_head_parts(order, dim)
            members = [u for h in order for u in h.values()]
            used.update(id(u) for u in members)
            return parts, path, len(order), members
    by_parent: dict[str, dict[str, list[Unit]]] = {}
    for u, r in roles:   # (an item of a per-head list of one: the list's parent)
        by_parent.setdefault(_attention_path(u), {}).setdefault(r, []).append(u)
    for parent, found in by_parent.items():
        one = {r: us[0] for r, us in found.items() if len(us) == 1}
        if {"q", "k", "v"} <= set(one):
            trio = [one["q"], one["k"], one["v"]]
            used.update(id(u) for u in trio)
            return _cat(trio), parent, 0, trio
        if {"q", "kv"} <= set(one):  # vit-pytorch style to_q + to_kv: kv rows are [k; v]
            pair = [one["q"], one["kv"]]
            used.update(id(u) for u in pair)
            return _cat(pair), parent, 0, pair
        if "qkv" in one and one["qkv"].weight.shape[0] % 3 == 0:
            used.add(id(one["qkv"]))
            return (one["qkv"].weight, one["qkv"].bias), parent, 0, [one["qkv"]]
    # no names: a (3A, D) Linear that is not the first half of an MLP pair (F, D) / (D, F) in one module,
    # preferring one with its (D, A) output projection beside it
    def beside(u: Unit, shape: tuple[int, int]) -> bool:
        return any(o is not u and o.parent == u.parent and tuple(o.weight.shape) == shape for o in linears)

    candidates = [u for u in linears if u.weight.shape[1] == dim and u.weight.shape[0] % 3 == 0
                  and not beside(u, (dim, int(u.weight.shape[0])))]
    if len(candidates) > 1:
        candidates = [u for u in candidates if beside(u, (dim, int(u.weight.shape[0]) // 3))] or candidates
    if len(candidates) == 1:
        used.add(id(candidates[0]))
        return (candidates[0].weight, candidates[0].bias), candidates[0].parent, 0, candidates[:1]
    raise Unplaced("no query/key/value projection found in a block", linears)


def _cat(units: list[Unit]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """[q; k; v] rows (and biases; a missing bias among present ones is zero, which is exact)."""
    import torch

    w = torch.cat([u.weight for u in units], dim=0)
    if all(u.bias is None for u in units):
        return w, None
    return w, torch.cat([u.bias if u.bias is not None else torch.zeros(u.weight.shape[0]) for u in units])


def _per_head_parts(heads: list[dict[str, Unit]], dim: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-head q/k/v -> one (3*H*hd, D) in-projection with rows [q heads; k heads; v heads], head h at rows
    h*hd:(h+1)*hd of each third -- the layout the reference attention reshapes to (3, H, hd).

    Each head's Linear reads either the whole token ((hd, D): its rows are stacked) or its own slice of it
    ((hd, D/H) applied to `x[..., h*D/H:(h+1)*D/H]`, as the from-scratch tutorial's `q_mappings`: the fused weight
    is block-diagonal, zero outside each head's slice, which is exact).
    """
    import torch

    trios: list[list[Unit]] = []
    for h in heads:
        if "qkv" in h:  # a fused (3hd, D) per head: split into its thirds
            u = h["qkv"]
            ws = u.weight.chunk(3, dim=0)
            bs = u.bias.chunk(3) if u.bias is not None else (None, None, None)
            trios.append([Unit("linear", u.path, w, b, u.order, u.keys) for w, b in zip(ws, bs)])
        else:
            trios.append([h["q"], h["k"], h["v"]])
    width = int(trios[0][0].weight.shape[1])
    if width == dim:
        return _cat([t[r] for r in range(3) for t in trios])
    if width * len(trios) != dim:
        raise Unplaced(f"{len(trios)} per-head q/k/v Linears of shape {tuple(trios[0][0].weight.shape)}: their "
                       f"input width {width} is neither the embed dim {dim} (each head reads the whole token) nor "
                       f"{dim} / {len(trios)} heads (each head reads its slice)", [u for t in trios for u in t])
    parts = []
    for r in range(3):  # (H*hd, H*(D/H)) = (H*hd, D), head h's block at rows h*hd.., columns h*D/H..
        weight = torch.block_diag(*[t[r].weight for t in trios])
        parts.append(Unit("linear", trios[0][r].path, weight, _cat([t[r] for t in trios])[1], trios[0][r].order,
                          trios[0][r].keys))
    return _cat(parts)


def _find_mlp(units: list[Unit], dim: int, width: int, attn_path: str, used: set[int],
              index: int) -> tuple[Unit, Unit] | None:
    """(fc1 (F, D), fc2 (D, F)) among the Linears outside the attention module; None for a block without MLP.

    In a flat block (q/k/v, output projection and MLP side by side) a Linear named like an output projection is
    left for the attention, and among several possible pairs the later one is the MLP.
    """
    rest = [u for u in units if u.kind == "linear" and id(u) not in used
            and not (attn_path and _under(u.path, attn_path))]
    pairs = [(a, b) for a in rest for b in rest if a is not b and a.weight.shape[1] == dim
             and tuple(b.weight.shape) == (dim, a.weight.shape[0])]
    if not attn_path:
        pairs = [p for p in pairs if not any(_squash(u.name) in _OUT_WORDS for u in p)] or pairs
    pairs.sort(key=lambda p: (p[0].order > p[1].order, -p[0].order))
    if pairs:
        left = [u for u in rest if u not in pairs[0]]
        if attn_path and left:
            raise Unplaced(f"block {index}: Linears beside the MLP: {', '.join(u.describe() for u in left[:4])}",
                           left)
        return pairs[0]
    if not rest or (not attn_path and len(rest) == 1 and tuple(rest[0].weight.shape) == (dim, width)):
        return None
    raise Unplaced(f"block {index}: the MLP is not a (F, {dim}) / ({dim}, F) pair of Linears: "
                   f"{', '.join(u.describe() for u in rest[:4])}", rest)


def _find_out_proj(units: list[Unit], dim: int, width: int, attn_path: str, used: set[int]) -> Unit | None:
    cands = [u for u in units if u.kind == "linear" and id(u) not in used and _under(u.path, attn_path)
             and tuple(u.weight.shape) == (dim, width)]
    if not attn_path:
        named = [u for u in cands if _squash(u.name) in _OUT_WORDS]
        cands = named[:1] or cands[:1]
    if len(cands) > 1:
        named = [u for u in cands if _squash(u.name) in _OUT_WORDS or _squash(u.parent.rsplit(".", 1)[-1])
                 in _OUT_WORDS]
        cands = named if len(named) == 1 else cands
    if len(cands) > 1:
        raise Unplaced(f"several ({dim}, {width}) Linears could be the attention's output projection", cands)
    return cands[0] if cands else None


def _branch(path: str) -> str:
    return path.split(".", 1)[0] if "." in path else ""


def _norm_rank(name: str) -> int:
    """0 for a norm named for the attention side (norm1, ln_1, attention_norm), 1 for the MLP side, 2 unknown."""
    low = name.lower()
    m = re.search(r"(\d+)$", low)
    if m and m.group(1) in ("1", "2"):
        return int(m.group(1)) - 1
    if any(w in low for w in ("att", "msa", "sa_", "before", "self", "pre")):
        return 0
    if any(w in low for w in ("mlp", "ff", "fc", "after", "post", "mix")):
        return 1
    return 2


def _place_norms(units: list[Unit], dim: int, used: set[int], out: dict[str, torch.Tensor], attn_path: str,
                 attn_first: int, fc1: Unit | None, index: int) -> None:
    """norm1 in front of the attention, norm2 in front of the MLP (inside their branches, e.g. vit-pytorch's
    `0.norm` / `1.net.0`, or beside them, e.g. `norm1` / `norm2`, ordered by name then by position); q/k norms
    of head width inside the attention."""
    norms = [u for u in units if u.kind == "norm" and id(u) not in used]
    for u in norms:
        if attn_path and _under(u.path, attn_path) and u.weight.shape[0] != dim:
            role = qkv_role(re.sub(r"norm|ln|layernorm", "", u.name.lower()) or "x")
            if role in ("q", "k") and f"attn.{role}_norm.weight" not in out:
                out[f"attn.{role}_norm.weight"], out[f"attn.{role}_norm.bias"] = u.weight, u.bias  # type: ignore[assignment]
                used.add(id(u))
    norms = [u for u in norms if id(u) not in used and u.weight.shape[0] == dim]
    attn_branch = _branch(attn_path) or attn_path
    mlp_branch = _branch(fc1.path) if fc1 is not None else ""
    mlp_branch = "" if mlp_branch == attn_branch else mlp_branch
    first, second, loose, misplaced = [], [], [], []
    for u in norms:
        if attn_branch and _under(u.path, attn_branch):
            (first if u.order < attn_first else misplaced).append(u)
        elif mlp_branch and _under(u.path, mlp_branch):
            (second if fc1 is not None and u.order < fc1.order else misplaced).append(u)
        else:
            loose.append(u)
    if misplaced or len(first) > 1 or len(second) > 1:
        raise Unplaced(f"block {index}: a LayerNorm inside or after a sub-layer, or two stacked in front of one",
                       misplaced + first + second)
    loose.sort(key=lambda u: (_norm_rank(u.name), u.order))
    need = 2 if fc1 is not None else 1
    slots: list[Unit | None] = [first[0] if first else None, second[0] if second else None][:need]
    for i in range(need):
        if slots[i] is None and loose:
            slots[i] = loose.pop(0)
    if loose and all(s is not None for s in slots):
        found = [u for u in units if u.kind == "norm" and u.weight.shape[0] == dim]
        raise Unplaced(f"block {index}: {len(found)} LayerNorms of width {dim} ("
                       f"{', '.join(u.keys[0].rsplit('.', 1)[0] for u in found)}), e.g. one in front of the MLP and "
                       "another at its start; the reference block has one in front of the attention and one in "
                       "front of the MLP, not two stacked",
                       sorted(found, key=lambda u: u.order))
    if any(s is None for s in slots) or loose:
        raise Unplaced(f"block {index}: expected {need} LayerNorm(s) of width {dim} (in front of the attention"
                       f"{' and in front of the MLP' if need == 2 else ''}), found "
                       f"{len([u for u in units if u.kind == 'norm'])}", loose or [u for u in units if u.kind == "norm"])
    for i, u in enumerate(slots):
        assert u is not None
        out[f"norm{i + 1}.weight"], out[f"norm{i + 1}.bias"] = u.weight, u.bias  # type: ignore[assignment]
        used.add(id(u))


def _place_layer_scale(units: list[Unit], dim: int, used: set[int], out: dict[str, torch.Tensor],
                       index: int) -> None:
    scales = [u for u in units if u.kind == "param" and id(u) not in used and tuple(u.weight.shape) == (dim,)]
    if not scales:
        return
    if len(scales) != 2:
        raise Unplaced(f"block {index}: {len(scales)} per-channel scale vectors; expected none or two "
                       "(layer scale after the attention and after the MLP)", scales)
    scales.sort(key=lambda u: (_norm_rank(u.path.replace(".", "_")), u.order))
    for i, u in enumerate(scales):
        out[f"ls{i + 1}.gamma"] = u.weight
        used.add(id(u))


# ------------------------------------------------------------------------------------------------ outside blocks
def _read_top(units: list[Unit], dim: int, container: str, raw: RawCheckpoint, facts: Facts,
              overrides: dict[str, Any], out: dict[str, torch.Tensor], hints: dict[str, Hint],
              report: Report) -> list[str]:
    """Patch embedding, tokens, position table, final norms and head; returns the keys deliberately dropped."""
    used: set[int] = set()
    dropped: list[str] = []
    patch_parent = _patch_embedding(units, dim, raw, facts, overrides, out, hints, used, report)
    for u in units:
        if id(u) in used or u.kind not in ("param", "linear"):
            continue
        if u.kind == "linear" and u.bias is not None:
            continue
        low, shape = u.path.lower(), tuple(u.weight.shape)
        if u.weight.numel() == 0:  # vit-pytorch's (0, D) cls token for mean pooling: no token
            dropped.extend(u.keys)
            used.add(id(u))
        elif "mask" in low.rsplit(".", 1)[-1] and shape[-1] == dim:
            dropped.extend(u.keys)
            used.add(id(u))
        elif re.search(r"(^|[._])pos|position", low) or (u.kind == "param" and len(shape) in (3, 4) and shape[0] == 1
                                                         and "pos_embed" not in out and not _token_name(low)
                                                         and u.weight.numel() // dim > 1):
            _position_table(u, dim, out, hints, report, used)
    for u in units:
        if id(u) in used or u.kind != "param":
            continue
        kind = _token_name(u.path.lower())
        shape = tuple(u.weight.shape)
        if not shape or shape[-1] != dim or u.weight.numel() % dim:    # (a scalar: a gate, no token)
            continue
        n = u.weight.numel() // dim
        if kind is None and n == 1 and u.weight.ndim >= 2 and "cls_token" not in out:
            kind = "cls"
        if kind == "cls" and n == 1 and "cls_token" not in out:
            out["cls_token"] = u.weight.reshape(1, 1, dim)
        elif kind == "dist" and n == 1:
            out["dist_token"] = u.weight.reshape(1, 1, dim)
        elif kind == "reg":
            out["reg_token"] = u.weight.reshape(1, n, dim)
        else:
            continue
        used.add(id(u))
        report.parts.setdefault("tokens", "")
        report.parts["tokens"] = (report.parts["tokens"] + f" {kind} ({u.path})").strip()
    _final_norms_and_head(units, dim, container, patch_parent, facts, overrides, out, hints, used, report)
    left = [u for u in units if id(u) not in used]
    if left:
        raise Unplaced(f"no role for {', '.join(u.describe() for u in left[:4])}", left)
    if "pos_embed" not in out and facts.no_pos_table is not None:
        hints.setdefault("pos_kind", facts.no_pos_table)
    if "cls_token" in out:
        hints.setdefault("pooling", facts.pooling_cls or ("token", "shape: class token -> token 0"))
    else:
        hints.setdefault("pooling", facts.pooling_no_cls)
    return dropped


def _token_name(low: str) -> str | None:
    last = low.rsplit(".", 1)[-1]
    if "dist" in last:
        return "dist"
    if "reg" in last or "register" in last:
        return "reg"
    if "cls" in last or "class" in last:
        return "cls"
    return None


def _position_table(u: Unit, dim: int, out: dict[str, torch.Tensor], hints: dict[str, Hint], report: Report,
                    used: set[int]) -> None:
    w, shape = u.weight, tuple(u.weight.shape)
    if "pos_embed" in out:
        raise Unplaced("two position embeddings", [u])
    if len(shape) == 4 and shape[1] == dim:  # (1, D, gh, gw), added to the conv output
        out["pos_embed"] = w.flatten(2).transpose(1, 2)  # (1, D, gh, gw) -> (1, gh*gw, D)
        hints["pos_grid_shape"] = ((int(shape[2]), int(shape[3])), f"shape: {u.path} {shape}")
    elif len(shape) == 4 and shape[-1] == dim:  # (1, gh, gw, D)
        out["pos_embed"] = w.reshape(1, -1, dim)
        hints["pos_grid_shape"] = ((int(shape[1]), int(shape[2])), f"shape: {u.path} {shape}")
    elif shape[-1] == dim and len(shape) in (2, 3) and (len(shape) == 2 or shape[0] == 1):
        out["pos_embed"] = w.reshape(1, -1, dim)
    elif len(shape) == 3 and shape[1] == 1 and shape[2] == dim:   # (max_len, 1, D): labml's sequence-first table
        raise Unplaced(f"position embedding {u.path} {shape} is a sequence-first table of {shape[0]} rows (n, 1, "
                       f"{dim}), sized for the longest sequence the code allows and sliced to the tokens in its "
                       "forward: nothing in the file says how many rows (which grid) the model uses", [u],
                       step=_code_step("its forward slices the table as written"))
    else:
        raise Unplaced(f"position embedding {u.path} {shape} is not (1, n, {dim}), (n, {dim}) or (1, {dim}, h, w)",
                       [u])
    used.add(id(u))
    report.parts["position embedding"] = f"{u.path} {shape}"


def _patch_embedding(units: list[Unit], dim: int, raw: RawCheckpoint, facts: Facts, overrides: dict[str, Any],
                     out: dict[str, torch.Tensor], hints: dict[str, Hint], used: set[int], report: Report) -> str:
    """The conv (D, C, P, P) or Linear (D, C*P*P) patch projection and its norms; returns its parent path."""
    import torch

    two_stage = _conv_then_linear(units, dim)
    convs = [two_stage[0]] if two_stage else [u for u in units if u.kind == "conv" and u.weight.shape[0] == dim]
    if len(convs) > 1:
        raise Unplaced("several convolutions could be the patch embedding", convs)
    if convs:
        u = convs[0]
        if u.weight.shape[-1] != u.weight.shape[-2]:
            raise Unplaced(f"patch embedding {u.describe()} has a non-square kernel", [u])
        weight, bias = u.weight, u.bias
        if two_stage:  # Conv2d (D', C, P, P) then Linear (D, D'): one conv W_l @ W_c, bias W_l @ b_c + b_l (exact)
            lin = two_stage[1]
            weight = torch.einsum("od,dcpq->ocpq", lin.weight, u.weight)  # (D, D') x (D', C, P, P) -> (D, C, P, P)
            if u.bias is not None or lin.bias is not None:
                bias = (lin.weight @ u.bias if u.bias is not None else 0) + \
                    (lin.bias if lin.bias is not None else torch.zeros(dim))
            used.add(id(lin))
            hints["patch_embed"] = ("conv+linear", f"assumed: the patch embedding is a Conv2d {u.describe()} "
                                    f"followed by a Linear {lin.describe()}, folded into one convolution (exact "
                                    "when nothing, e.g. no activation, comes between them)")
        out["patch_embed.proj.weight"] = weight
        if bias is not None:
            out["patch_embed.proj.bias"] = bias
        used.add(id(u))
        report.parts["patch embedding"] = f"conv {u.describe()}" + (f" then Linear {two_stage[1].describe()}"
                                                                    if two_stage else "")
        proj = two_stage[1] if two_stage else u
        width_in, chans, patch = int(u.weight[0].numel()), int(u.weight.shape[1]), int(u.weight.shape[-1])
        order = "cp1p2"
    else:
        proj, chans, patch = _patch_linear(units, dim, raw, used)
        width_in = int(proj.weight.shape[1])
        order, src = overrides.get("patch_order") or facts.patch_order[0], \
            "override" if overrides.get("patch_order") else facts.patch_order[1]
        if order not in ("p1p2c", "cp1p2"):
            raise Unplaced(f"patch_order {order!r}; expected 'p1p2c' (einops) or 'cp1p2' (unfold)")
        if chans > 1:
            hints["patch_order"] = (order, src)
        out["patch_embed.proj.weight"] = _to_conv_order(proj.weight, chans, patch, order)  # (D, C, P, P)
        if proj.bias is not None:
            out["patch_embed.proj.bias"] = proj.bias
        used.add(id(proj))
        report.parts["patch embedding"] = f"Linear over flattened {chans}x{patch}x{patch} patches ({proj.describe()})"
    parent = proj.parent
    for u in [u for u in units if u.kind == "norm" and id(u) not in used and u.parent == parent and parent]:
        size = int(u.weight.shape[0])
        if size == width_in and (size != dim or u.order < proj.order):  # LayerNorm over the raw patch pixels
            perm = _flat_order_perm(chans, patch, order)
            out["patch_embed.norm_in.weight"], out["patch_embed.norm_in.bias"] = u.weight[perm], u.bias[perm]  # type: ignore[index]
        elif size == dim and u.order > proj.order:
            out["patch_embed.norm.weight"], out["patch_embed.norm.bias"] = u.weight, u.bias  # type: ignore[assignment]
        else:
            continue
        used.add(id(u))
    return parent


_PATCH_WORDS = ("patch", "tokeni", "stem")  # not 'embed': an embedding projection head is often named so


def _conv_then_linear(units: list[Unit], dim: int) -> tuple[Unit, Unit] | None:
    """A two-stage patch embedding: one Conv2d (D', C, P, P) followed by a Linear (D, D') in the same module (or
    one named for the patch embedding), e.g. `nn.Sequential(nn.Conv2d(...), Rearrange(...), nn.Linear(...))`;
    None when the patch embedding is a single layer. Never the head's Linear, and never across a LayerNorm."""
    convs = [u for u in units if u.kind == "conv"]
    if len(convs) != 1:
        return None
    conv = convs[0]
    width = int(conv.weight.shape[0])
    lins = [u for u in units if u.kind == "linear" and tuple(u.weight.shape) == (dim, width) and u.order > conv.order
            and ((conv.parent and u.parent == conv.parent) or any(w in u.path.lower() for w in _PATCH_WORDS))
            and not re.search(r"head|classifier|logits", u.path.lower())]
    if len(lins) > 1:
        raise Unplaced(f"several Linears could follow the patch convolution {conv.describe()}", lins)
    if not lins:
        return None
    between = [u for u in units if u.kind == "norm" and conv.order < u.order < lins[0].order]
    if between:
        raise Unplaced(f"a LayerNorm between the patch convolution {conv.describe()} and its Linear "
                       f"{lins[0].describe()} (a two-stage patch embedding vitviz cannot fold)", between)
    return conv, lins[0]


def _patch_linear(units: list[Unit], dim: int, raw: RawCheckpoint, used: set[int]) -> tuple[Unit, int, int]:
    """A Linear (D, C*P*P) over flattened patches: (unit, C, P). C is 1 or 3 unless metadata says otherwise
    (3*P*P is never a square, so the split is unique)."""
    meta = find_value(metadata_sources(raw.meta, raw.sidecars), CHANNEL_KEYS,
                      lambda v: as_int(v) if as_int(v) in (1, 2, 3, 4) else None)  # not a CNN's `channels: 64`
    channels = [meta[0]] if meta else [3, 1]
    found = []
    for u in units:
        if u.kind != "linear" or u.weight.shape[0] != dim or id(u) in used:
            continue
        k = int(u.weight.shape[1])
        named = any(w in u.path.lower() for w in ("patch", "embed", "tokeni", "stem", "proj_in", "mapper"))
        if k == dim and not named:
            continue
        for c in channels:
            p = math.isqrt(k // c) if k % c == 0 else 0
            if p and c * p * p == k:
                found.append((u, c, p, named))
                break
    named = [f for f in found if f[3]]
    found = named or found
    if len(found) != 1:
        what = "no" if not found else "several"
        raise Unplaced(f"{what} patch embedding: expected a conv ({dim}, C, P, P) or a Linear ({dim}, C*P*P)",
                       [f[0] for f in found])
    return found[0][0], found[0][1], found[0][2]


def _to_conv_order(w: torch.Tensor, c: int, p: int, order: str) -> torch.Tensor:
    """Linear weight (D, C*P*P) over patches flattened in `order` -> conv weight (D, C, P, P)."""
    d = w.shape[0]
    if order == "p1p2c":
        return w.reshape(d, p, p, c).permute(0, 3, 1, 2).contiguous()  # (D, P, P, C) -> (D, C, P, P)
    return w.reshape(d, c, p, p).contiguous()


def _flat_order_perm(c: int, p: int, order: str) -> torch.Tensor:
    """Index that reorders a per-pixel vector from `order` into the conv's (c, p1, p2) order."""
    import torch

    idx = torch.arange(c * p * p)
    if order == "p1p2c":
        return idx.reshape(p, p, c).permute(2, 0, 1).reshape(-1)  # (P, P, C) -> (C, P, P)
    return idx


def _final_norms_and_head(units: list[Unit], dim: int, container: str, patch_parent: str, facts: Facts,
                          overrides: dict[str, Any], out: dict[str, torch.Tensor], hints: dict[str, Hint],
                          used: set[int], report: Report) -> None:
    import torch

    heads = sorted((u for u in units if u.kind == "linear" and id(u) not in used), key=lambda u: u.order)
    head_parent = heads[-1].parent if heads else ""
    norms = [u for u in units if u.kind == "norm" and id(u) not in used and u.weight.shape[0] == dim]
    after = [u for u in norms if re.search(r"fc_norm|head|classifier", u.path.lower())
             or (head_parent and u.parent == head_parent and u.order < heads[0].order)]
    before = [u for u in norms if u not in after]
    stack = container.rpartition(".")[0]
    before.sort(key=lambda u: (0 if stack and _under(u.path, stack) else 1, u.order))
    if len(before) > 2 or len(after) > 1:
        raise Unplaced("more final LayerNorms than a norm, a second stacked norm and a norm after pooling",
                       before + after)
    for name, u in zip(("norm", "norm_extra"), before):
        out[f"{name}.weight"], out[f"{name}.bias"] = u.weight, u.bias  # type: ignore[assignment]
        used.add(id(u))
    if after:
        out["fc_norm.weight"], out["fc_norm.bias"] = after[0].weight, after[0].bias  # type: ignore[assignment]
        used.add(id(after[0]))
    if before or after:
        report.parts["final norms"] = ", ".join(u.path for u in before + after)
    if not heads:
        return
    chain_ok = heads[0].weight.shape[1] == dim and all(b.weight.shape[1] == a.weight.shape[0]
                                                       for a, b in zip(heads, heads[1:]))
    if len(heads) > 2 or not chain_ok:
        raise Unplaced("the head is not one Linear or Linear -> activation -> Linear from the embed dim", heads)
    last = heads[-1]
    out["head.weight"] = last.weight
    out["head.bias"] = last.bias if last.bias is not None else torch.zeros(last.weight.shape[0])  # exact
    used.add(id(last))
    if len(heads) == 2:
        out["pre_logits.fc.weight"] = heads[0].weight
        out["pre_logits.fc.bias"] = heads[0].bias if heads[0].bias is not None else torch.zeros(heads[0].weight.shape[0])
        used.add(id(heads[0]))
        act = overrides.get("head_act")
        hints["pre_logits_act"] = (act, "override") if act else facts.head_act
    report.parts["head"] = " -> ".join(u.describe() for u in heads)


# ------------------------------------------------------------------------------------------------------ refusals
def _refusal(raw: RawCheckpoint, report: Report, error: Unplaced, units: list[Unit]) -> UnknownLayoutError:
    """A refusal that names what was recognised, what could not be placed, and what to do."""
    seen = "; ".join(f"{k}: {v}" for k, v in report.parts.items()) or "attention-shaped weights (q/k/v projections)"
    tensors = ", ".join(u.describe() for u in error.units[:4]) + (" ..." if len(error.units) > 4 else "")
    return UnknownLayoutError(
        f"{raw.path}: a transformer with attention weights, but its layout could not be placed exactly. "
        f"Recognised: {seen}. Could not place: {error.what}" + (f" (tensors: {tensors})" if tensors else "")
        + (f". Next: {error.step}" if error.step else
           ". If your code computes something vitviz cannot read from the file, open the model through its own "
           "class instead: vitviz.load(model) with the nn.Module built by your code, or vitviz.load(path, "
           "code='FILE.py:FACTORY') (CLI --code FILE.py:FACTORY) (its attention is captured where it is computed); "
           "overrides such as heads=, act=, block_norm=, pooling=, attn_scale= and "
           "patch_order= fix what the file does not say"))
