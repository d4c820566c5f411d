"""One table of map kinds: for each kind what it is made from, what it needs and what it can be selected by (no Qt,
no torch).

`MapKind` (`vitviz.core.analyses.maps`) reads its `source`, `per_layer`, `per_head` and argument from here;
`unavailable(kind, spec, can)` is the one answer to "can this model give this map?" that export
(`vitviz.batch.plan.check_maps`), the window (`vitviz.gui.state.parse_map_arg` / the controls), Compare and
`vitviz.show` ask; `WINDOW_UNSHOWN` says which kinds the window's `--map` cannot show yet and why; a windowed model
gives only `WINDOWED_KINDS` (the rows with `windows`). The one parser of map names is `MapKind.parse` (`--maps` and
`--map` both use it): it reads each row's `arg`, so a kind that takes a token (`key:N`) is one row here.

Arguments (`KindInfo.arg`, `ARGS`):
    'none'       a bare name ('cls', 'mean', 'entropy');
    'token'      a token index ('token:N', 'key:N', 'query:N'; optional in 'rollout[:N]'): `MapKind.token`, for
                 rollout `MapKind.rollout.query`; the window's query token (a click on a patch) picks it;
    'class'      a class to explain, optional ('relevance[:CLASS]'): `MapKind.target`, an index or a label;
    'prompt'     a text prompt ('text:PROMPT', its case kept): `MapKind.target`.

What a kind reads of the attention (`KindInfo.reads`): 'row' (one query's row: export captures only those rows),
'column' (one key's column over every query) or 'matrix' (whole matrices).

Needs (`KindInfo.needs`):
    'cls'        a CLS token (the 'cls' map);
    'gradients'  a backward pass (the gradient maps, LeGrad of a prompt);
    'map_head'   a MAP pooling head (SigLIP, PE);
    'text_tower' an image embedding to compare with a text embedding (CLIP / SigLIP projection);
    'features'   the blocks' output tokens (a pass of its own);
    'windowed'   a windowed model (Swin, SAM / ViTDet) and no other;
    'reference'  vitviz's reference ViT with its hooks (attention gradients, block outputs, the MAP head run); a
                 model run from its own code (family 'live') has only its captured attention.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from vitviz.core.options import ONE_VECTOR_POOLINGS   # the poolings LeGrad applies the head to

if TYPE_CHECKING:
    from vitviz.core.spec import ModelSpec


class KindLike(Protocol):
    """What this table reads of a `vitviz.core.analyses.maps.MapKind` (not imported: maps reads this table); one
    class only is called `MapKind`."""

    kind: str
    token: int | None
    rollout: Any
    target: int | str | None

    @property
    def label(self) -> str: ...


@dataclass(frozen=True)
class KindInfo:
    """What one map kind is.

    Attributes:
        syntax: how it is written in `--maps` / `--map` ('token:N', 'relevance[:CLASS]').
        source: what it is made from: 'attention', 'pool', 'gradients', 'text', 'features' or 'windows'.
        per_layer: a map per layer (False: one map of the whole model, files named `Lall`).
        per_head: a map per head (or per pooling head); False: the heads are fused or there are none.
        title: what the map is, for labels.
        needs: see the module's docstring.
        label: its name in the window's map selector ('' when the window picks it another way).
        help: what it shows, one phrase (the `--maps` / `--map` help, the selector's tooltip).
        arg: the argument it takes after ':' (`ARGS`, see the module's docstring); optional when `syntax` writes
            it in brackets.
        reads: what it reads of the attention: 'row', 'column' or 'matrix'.
        windows: a windowed model (Swin, SAM / ViTDet) gives it too, inside its windows (`WINDOWED_KINDS`).
    """

    syntax: str
    source: str
    per_layer: bool
    per_head: bool
    title: str
    needs: frozenset[str] = frozenset()
    label: str = ""
    help: str = ""
    arg: str = "none"
    reads: str = "matrix"
    windows: bool = False

    @property
    def name(self) -> str:
        """How the kind is written before its argument ('token' of 'token:N'; 'rollout' of 'rollout:pool')."""
        return self.syntax.split("[")[0].split(":")[0]

    @property
    def optional(self) -> bool:
        """Whether its argument may be left out ('rollout[:N]', 'relevance[:CLASS]')."""
        return "[" in self.syntax


ARGS = ("none", "token", "class", "prompt")
READS = ("row", "column", "matrix")


def _k(syntax: str, source: str, per_layer: bool, per_head: bool, title: str, *needs: str, label: str = "",
       help: str = "", arg: str = "none", reads: str = "matrix", windows: bool = False) -> KindInfo:
    assert arg in ARGS and reads in READS, (syntax, arg, reads)
    return KindInfo(syntax, source, per_layer, per_head, title, frozenset(needs), label, help or title, arg, reads,
                    windows)


KINDS: dict[str, KindInfo] = {   # keyed by `MapKind.kind`; a new kind is one row here and its compute in maps.py
    "cls": _k("cls", "attention", True, True, "CLS attention", "cls", label="CLS attention",
              help="the CLS token's attention over the patches", reads="row"),
    "mean": _k("mean", "attention", True, True, "attention received (mean over queries)",
               label="Mean attention received", help="the attention each patch receives, averaged over the patch "
                                                     "queries"),
    "max": _k("max", "attention", True, True, "attention received (max over queries)",
              label="Max attention received", help="the attention each patch receives, maximised over the patch "
                                                   "queries"),
    "rollout": _k("rollout[:N]", "attention", True, False, "attention rollout", label="Attention rollout",
                  help="attention rollout through the layers (heads fused); rollout:N from token N", arg="token",
                  windows=True),
    "token": _k("token:N", "attention", True, True, "attention row of a token",
                label="Attention of query token", help="the attention row of token N (token 0 is CLS when the "
                                                       "model has one)", arg="token", reads="row"),
    "entropy": _k("entropy", "attention", True, True, "attention entropy per patch (nats)",
                  label="Attention entropy per patch",
                  help="the entropy (nats) of each patch's attention row: low where the patch attends to a few "
                       "tokens, up to log(tokens) where it attends evenly"),
    "key": _k("key:N", "attention", True, True, "attention paid to a token",
              label="Attention paid to a key token",
              help="the attention every patch pays to token N (column N of the attention; key:0 is what each patch "
                   "gives CLS when the model has one; a windowed model: patch N, from the queries of its window)",
              arg="token", reads="column", windows=True),
    "relevance": _k("relevance[:CLASS]", "gradients", False, False, "class relevance (Chefer)",
                    "gradients", "reference", label="Class relevance",
                    help="Chefer's class relevance of CLASS (an index or label; default the top class), one map of "
                         "the whole model; a forward and backward pass per image and class", arg="class"),
    "gradrollout": _k("gradrollout[:CLASS]", "gradients", False, False, "gradient rollout", "gradients",
                      "reference", help="vit-explain's gradient rollout of CLASS", arg="class"),
    "attngrad": _k("attngrad[:CLASS]", "gradients", True, True, "attention × gradient", "gradients",
                   "reference", help="attention x gradient of CLASS per layer and head (signed)", arg="class"),
    "pca": _k("pca", "features", True, False, "PCA of the tokens", "features", "reference",
              help="feature PCA colours of the output tokens"),
    "norms": _k("norms", "features", True, False, "token norms", "features", "reference",
                help="each patch's output-token norm"),
    "pool": _k("pool", "pool", False, True, "pooling attention (MAP head)", "map_head", "reference",
               label="Pooling attention (MAP head)",
               help="a MAP pooling head's attention over the patches, per pooling head (SigLIP, PE: their 'CLS "
                    "attention'), one map of the whole model"),
    "poolrollout": _k("rollout:pool", "pool", True, False, "rollout of the pooling query", "map_head", "reference",
                      help="the rollout of a MAP head's query"),
    "text": _k("text:PROMPT", "text", False, False, "LeGrad of a text prompt", "gradients",
               "text_tower", "reference",
               help="LeGrad of the image-text similarity of PROMPT (CLIP / SigLIP files with their text tower "
                    "and tokenizer), e.g. 'text:a photo of a cat'", arg="prompt"),
    "received": _k("received", "windows", True, True, "attention received in windows", "windowed",
                   label="Attention received (windows)",
                   help="a windowed model's (Swin, SAM / ViTDet) attention each patch receives, stitched from its "
                        "windows", windows=True),
    "query": _k("query:N", "windows", True, True, "attention of a patch in windows", "windowed",
                label="Attention of a patch in its window",
                help="a windowed model's patch N's attention inside its window", arg="token", reads="row",
                windows=True),
}


def bare_names() -> tuple[str, ...]:
    """The kinds written as their bare name, no argument ('cls', 'mean', 'entropy', 'pca', 'pool', ...)."""
    return tuple(k for k, i in KINDS.items() if i.syntax == k)


def of_source(*sources: str) -> tuple[str, ...]:
    """The kinds made from these sources, in the table's order."""
    return tuple(k for k, i in KINDS.items() if i.source in sources)


def maps_help() -> str:
    """The `--maps` help: every kind of the table with what it shows."""
    return "comma list of " + "; ".join(f"{i.syntax} ({i.help})" for i in KINDS.values())


# the kinds the window's --map cannot show yet, and why (the window shows these elsewhere or not at all)
WINDOW_UNSHOWN: dict[str, str] = {
    "pca": "the window shows PCA of the tokens in its Features dock, not as --map; export it with "
           "`vitviz export --maps pca`",
    "norms": "the window shows token norms in its Features dock, not as --map; export them with "
             "`vitviz export --maps norms`",
}

# the kinds a windowed model (Swin, SAM / ViTDet) gives: its own, and those the table says it gives inside its
# windows (rollout within one grid: SAM / ViTDet's global blocks; not across Swin's patch merging, which
# `vitviz.core.analyses.winview.WindowedMaps.unshown` says)
WINDOWED_KINDS = tuple(k for k, i in KINDS.items() if i.windows)


def of_arg(*args: str) -> tuple[str, ...]:
    """The kinds that take one of these arguments (`ARGS`), in the table's order."""
    return tuple(k for k, i in KINDS.items() if i.arg in args)


def info(kind: "KindLike | str") -> KindInfo:
    """The table's row of a kind (a `MapKind` or its `kind` word)."""
    return KINDS[kind if isinstance(kind, str) else kind.kind]


def unavailable(kind: "KindLike | str", spec: "ModelSpec", can: "frozenset[str] | None" = None) -> str | None:
    """Why this model cannot give `kind` (None: it can, as far as its spec and capabilities say): the one question
    export, the window, Compare and `vitviz.show` ask.

    `kind`: a `MapKind` (its argument is checked too: a token in range, a rollout's start layer) or a `MapKind.kind`
    word (what the model can give whatever is selected: the window's map selector; a model without a CLS token is
    not refused the word 'cls' there, the window shows it as the patch mean). `can`: the loaded model's
    capabilities (`vitviz.core.protocol`: 'windows', 'reference', 'map_head', ...); None: read from the spec (a
    windowed spec, or the reference ViT unless its family is 'live'). A class label is looked up later
    (`vitviz.batch.plan.check_classes`)."""
    from vitviz.core.protocol import REFERENCE, WINDOWS, capabilities_of_spec

    can = capabilities_of_spec(spec) if can is None else can
    word = kind if isinstance(kind, str) else kind.kind
    row = KINDS[word]
    needs, label = row.needs, row.syntax if isinstance(kind, str) else kind.label
    if WINDOWS in can:
        if not row.windows:
            return (f"the {row.syntax} map is a plain ViT's (attention over all tokens, a CLS token, the reference "
                    "ViT's passes); this windowed model (Swin, SAM / ViTDet) attends inside windows: its maps are "
                    f"{', '.join(KINDS[k].syntax for k in WINDOWED_KINDS)}")
        return None      # the token's range is the first stage's grid: `WindowedMaps` checks it at the run's size
    if "windowed" in needs:
        return (f"the {label} map is a windowed model's (Swin, SAM / ViTDet: attention inside windows); this model "
                "attends over all its tokens: use --maps mean (the attention each patch receives) or token:N")
    if "cls" in needs and not isinstance(kind, str) and not (spec.cls_token and spec.num_prefix > 0):
        hint = "pool (its MAP head's attention) or mean" if spec.pooling == "map" else "mean"
        return f"this model has no CLS token, so the 'cls' map is undefined; use --maps {hint}"
    if "map_head" in needs and spec.pooling != "map":
        return (f"the {label} map needs a MAP pooling head (SigLIP, Perception Encoder); this model pools with "
                f"{spec.pooling!r}")
    if "reference" in needs and REFERENCE not in can:
        return (f"the {label} map needs vitviz's reference ViT; this model runs from its own code, whose "
                "attention gradients and block outputs are not exposed")
    if isinstance(kind, str):
        return None
    token = kind.token if kind.token is not None else kind.rollout.query if row.arg == "token" else None
    if token is not None and not 0 <= int(token) < spec.num_tokens:
        return (f"{row.name}:{token} out of range: the model has {spec.num_tokens} tokens ({spec.num_prefix} "
                f"prefix + {spec.grid[0]}x{spec.grid[1]} patches)")
    if "text_tower" in needs and not spec.embed_out:
        return (f"the {label} map compares the image embedding with a text embedding; this model's output is not a "
                "CLIP / SigLIP image embedding (no projection head)")
    if "text_tower" in needs and spec.pooling not in ONE_VECTOR_POOLINGS:
        return (f"the {label} map is LeGrad, which applies the head to one mean-pooled token; this model pools "
                f"with {spec.pooling!r} (LeGrad needs {', '.join(ONE_VECTOR_POOLINGS)})")
    if kind.kind == "rollout" and kind.rollout.start >= spec.depth:
        return (f"rollout start layer {kind.rollout.start} out of range: the model has {spec.depth} layers "
                f"(0-{spec.depth - 1})")
    return None
