"""What the window asks about a model whose file does not say everything, and the verdict line it shows.

Qt-free and torch-free (plain data in, text out): which assumed settings the "what the file does not say" dialog
asks (`asked`), whether it opens by itself (`asks_unprompted`), the choices it offers for each, and the line the
status bar and Model info show about the model's exactness (`verdict_line`: verified, not verified with its
assumptions, or differs from the original).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vitviz.core.options import OPTION, REMEMBERABLE, setting_fields
from vitviz.core.spec import ASSUMED, ModelSpec

# The assumed settings that change attention and that the dialog asks, in its order: spec field -> the override
# that fixes it (`Option.remembered`: `vitviz.load(heads=, block_norm=, act=, attn_scale=)`).
ASKED = {OPTION[name].provenance_field: name for name in REMEMBERABLE}
OVERRIDE_FIELDS = {override: name for name, override in ASKED.items()}
LABELS = {"num_heads": "Heads", "block_norm": "Norm order", "mlp_kind": "Activation", "attn_scale": "Attention scale"}
NORM_ORDERS = {"pre": "pre-norm: x + f(norm(x)) (ViT, timm, DeiT)",
               "post": "post-norm: norm(x + f(x)) (nn.TransformerEncoderLayer's default, the original Transformer)",
               "res_post": "norm after each sublayer: x + norm(f(x)) (Swin v2, timm *_rpn_*)"}
ACTIVATIONS = {"gelu": "GELU (exact)", "gelu_tanh": "GELU, tanh approximation", "quick_gelu":
               "QuickGELU: x·σ(1.702x) (OpenAI CLIP)", "relu": "ReLU", "silu": "SiLU / Swish", "tanh": "tanh"}
# verdict levels -> how the line is drawn
LEVEL_STYLES = {"verified": "color: #188038;", "unverified": "color: #b06000;", "differs":
                "color: #d93025; font-weight: bold;", "checking": "color: #1a73e8;", "none": ""}
LIVE_LINE = "Runs your model's own code (nothing converted to verify)"


LIVE_FAMILY = "live"   # the family of a model run from its own code (`vitviz.core.running.live`)


def runs_own_code(spec: ModelSpec | None) -> bool:
    """Whether `spec` is a model that runs from its own code (the live path): nothing converted to verify, and its
    attention, not its file, says its heads. The one place the window tells such a model from a converted one."""
    return spec is not None and spec.family == LIVE_FAMILY


def is_assumed(spec: ModelSpec, name: str) -> bool:
    """Whether `name` is an assumed setting that changes what `spec` computes now."""
    return spec.relevant(name) and spec.kind_of(name) == ASSUMED


def asked(spec: ModelSpec) -> list[str]:
    """The settings of `ASKED` that are assumed for this model, in order (an activation only when it is one the
    dialog offers: a SwiGLU MLP is read from its shapes)."""
    if runs_own_code(spec) or not spec.traits.plain_settings:
        # a windowed model (Swin, SAM / ViTDet): the dialog's choices are a plain ViT's (head counts of one width,
        # a norm order and scale a windowed model does not take: its reload would be refused); its warnings say
        # what to pass instead
        return []
    return [name for name in ASKED if is_assumed(spec, name)
            and (name != "mlp_kind" or spec.mlp_kind in ACTIVATIONS)]


def asks_unprompted(spec: ModelSpec, library_layout: bool) -> bool:
    """Whether the dialog opens by itself when `spec` has loaded: the head count is a guess, or the layout is a
    hand-written or tutorial one (not a library's, `library_layout` False) with any asked setting assumed. A
    library layout's assumptions are reviewed on request ("Review assumptions…")."""
    return bool(asked(spec)) and (spec.heads_guessed or not library_layout)


def scale_choices(spec: ModelSpec) -> list[tuple[float, str]]:
    """The attention scales offered, (value, text); 0 means head_dim**-0.5, as `vitviz.load(attn_scale=0)`."""
    hd = spec.head_dim
    out = [(0.0, f"head_dim^-0.5 = {hd ** -0.5:.4g} (the standard scale)")]
    if spec.embed_dim != hd:
        out.append((spec.embed_dim ** -0.5, f"dim^-0.5 = {spec.embed_dim ** -0.5:.4g} (the model width: some "
                                             "tutorials scale by it)"))
    out.append((1.0, "1 (no scaling)"))
    if spec.attn_scale and all(abs(v - spec.attn_scale) > 1e-12 for v, _t in out):
        out.append((float(spec.attn_scale), f"{spec.attn_scale:.6g}"))
    return out


def value_text(spec: ModelSpec, name: str) -> str:
    """A setting's value as the dialog and Model info say it ('pre-norm', '4', 'head_dim^-0.5 = 0.25')."""
    if name == "attn_scale":
        return (f"head_dim^-0.5 = {spec.head_dim ** -0.5:.4g}" if not spec.attn_scale
                else f"{spec.attn_scale:.6g}")
    if name == "block_norm":
        return NORM_ORDERS.get(spec.block_norm, spec.block_norm).split(":")[0]
    value: Any = getattr(spec, name, None)
    if name == "preprocess":
        pp = spec.preprocess
        return f"mean {', '.join(f'{m:g}' for m in pp.mean)}; std {', '.join(f'{s:g}' for s in pp.std)}"
    if isinstance(value, tuple):
        return "×".join(map(str, value))
    return "" if value is None else str(value)


def setting_text(spec: ModelSpec, name: str) -> str:
    """'eps = 1e-05', or the name alone for a setting without a value of its own ('token_order')."""
    value = value_text(spec, name)
    return f"{name} = {value}" if value else name


# The input settings the Model settings panel edits (`Option.setting`, none the dialog asks): override -> its label.
SETTINGS_LABELS = {name: OPTION[name].setting for name in setting_fields() if name not in REMEMBERABLE}


def reason(source: str) -> str:
    """Why a value is assumed, from its provenance ('guess: width 32 / ...' -> 'width 32 / ...'), its advice as
    the window gives it (`window_wording`)."""
    text = str(source)
    for prefix in ("guess:", "default:", "family:", "table:", "assumed:"):
        if text.startswith(prefix):
            return window_wording(text[len(prefix):].strip())
    return window_wording(text)


def window_wording(text: str) -> str:
    """A library message's advice as the window gives it: "pass act='relu'" -> 'answer Activation: relu in
    Review assumptions…', "pass image_size=N" -> 'set Model settings › Image size to N'; an override the window has
    no control for names the command line's flag ('start vitviz with --pooling avg'). The command line's
    '(CLI ...)' beside an advice is left out."""
    from vitviz.core.options import reword_advice

    def render(option: Any, value: str) -> str:
        field = OVERRIDE_FIELDS.get(option.name)
        if field is not None:
            return f"answer {LABELS[field]}: {value} in Review assumptions…"
        if option.name in SETTINGS_LABELS:
            return f"set Model settings › {SETTINGS_LABELS[option.name]} to {value}"
        return f"start vitviz with {option.cli_flag} {value}" if option.cli_flag else f"pass {option.name}={value}"

    return reword_advice(text, render)


def plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


# the start of the 'identity' provenance of a model a library names -> that library (`vitviz.core.analyses.verify` builds
# its original from the same entry)
NAMED_BY = (("named: timm architecture", "timm"), ("named: transformers model_type", "transformers"),
            ("named: open_clip model config", "open_clip"), ("named: torchvision", "torchvision"),
            ("named: model name", "timm"), ("named: the published file", "timm"))


def original_name(spec: ModelSpec | None, against: str = "auto", code: str = "") -> str:
    """How the verdict line names the original a check runs: 'timm' (the library that names the model, or the
    one chosen: 'timm:vit_small_patch16_224' -> 'timm'), 'my_vit.py:build' for the user's code; '' when the
    spec does not say (the check itself finds out)."""
    if code:
        file, _sep, factory = code.rpartition(":")
        return f"{file.replace(chr(92), '/').rsplit('/', 1)[-1]}:{factory}" if file else code
    if against and against != "auto":
        return against.split(":", 1)[0]
    identity = spec.source_of("identity") if spec is not None and hasattr(spec, "source_of") else ""
    return next((library for prefix, library in NAMED_BY if str(identity).startswith(prefix)), "")


def checking_text(name: str, progress: str = "", waiting: bool = False) -> str:
    """'Checking against timm…', 'Checking against timm: comparing at 224x224 (1/2)…' (`progress`: the check's
    own words), 'Checking against the original… after the images' (`waiting`: the images run first)."""
    head = f"Checking against {name or 'the original'}"
    if waiting:
        return f"{head}… after the images"
    progress = progress.strip().rstrip(".…")
    if not progress:
        return f"{head}…"
    return f"{head}: {progress[:1].lower()}{progress[1:]}…"


def progress_text(fraction: float, text: str) -> str:
    """What the verdict line adds for a check's progress report: its text ('Comparing at 224x224 (1/2)…'), else
    the percentage done."""
    text = str(text or "").strip()
    if text:
        return text
    return f"{int(round(100 * fraction))} % done" if 0 <= fraction < 1 else ""


@dataclass(frozen=True)
class VerdictLine:
    """What the status bar and Model info say about a model's exactness: `text` (short), `tooltip` (the
    assumptions listed), `level` ('verified', 'unverified', 'differs', 'checking': the check that will say is on
    its way, or 'none': nothing to say yet)."""

    text: str
    tooltip: str
    level: str


def verdict_line(spec: ModelSpec | None, verification: Any = None, failure: str = "",
                 checking: bool = False, original: str | None = None, progress: str = "",
                 waiting: bool = False) -> VerdictLine:
    """The verdict line of `spec`: the worker's `Verification` (`vitviz.core.analyses.verify`) when it has answered, else
    "Not verified — N assumptions" from `spec.assumptions` alone (`failure`: why the check could not be made).

    `checking`: the check is on its way (`waiting`: queued behind the images). With `original` (the name of what
    it compares with, '' when only the check knows) the line says "Checking against timm…" with `progress` (the
    check's own words) instead of "Not verified", which the check may be about to contradict; with None the line
    stays "Not verified — N assumptions" and only its tooltip says that the check runs.

    A model run by its own code (nothing converted) says `LIVE_LINE`, unless a check against its library's own
    record of its attention (`original`: 'timm', 'transformers') is on its way or has said verified / differs."""
    if spec is None:
        return VerdictLine("", "", "none")
    listed = "\n".join(f"• {setting_text(spec, name)}: {reason(source)}" for name, source in spec.assumptions)
    tip_list = f"Assumed (the file does not say):\n{listed}" if listed else "Nothing that changes the computation " \
                                                                            "is assumed."
    n = len(spec.assumptions)
    verdict = getattr(verification, "verdict", None)
    summary = _summary(verification)
    if runs_own_code(spec) and verdict not in ("verified", "differs") and not (checking and original and not failure):
        # nothing converted; where its library's own record of the attention can be compared (`original`: timm,
        # transformers) the check's verdict or progress is said as for a converted model, else this line
        why = (f"The check against its library's own record could not run: {failure}\n" if failure
               else f"{summary}\n" if summary else "")
        return VerdictLine(LIVE_LINE, "The model's module runs as written; its attention is captured where its code "
                                      "computes it.\n" + why + tip_list, "none")
    if verdict == "verified":
        return VerdictLine(summary or "Verified against the original", f"{summary}\n{tip_list}", "verified")
    if verdict == "differs":
        layer = getattr(verification, "first_differing_layer", None)
        text = "Differs from the original" + (f" — from layer {layer}" if layer is not None else "")
        causes = causes_text(verification)
        return VerdictLine(text, f"{summary}\nThe maps vitviz shows are not the original model's."
                                 + (f"\n{causes}" if causes else "") + f"\n{tip_list}", "differs")
    if verdict is None and checking and original is not None and not failure:
        text = checking_text(original, progress, waiting)
        return VerdictLine(text, f"{text}\nThe maps are shown meanwhile; this line says whether they are the "
                                 f"original model's once the check has answered.\n{tip_list}", "checking")
    head = f"Not verified — {plural(n, 'assumption')}" if n else "Not verified"
    if verdict == "unverified":
        return VerdictLine(head, f"{summary}\n{tip_list}" if summary else tip_list, "unverified")
    why = (f"The check against the original could not run: {failure}\n" if failure
           else "Checking against the original…\n" if checking else "")
    return VerdictLine(head, why + tip_list, "unverified")


def causes(verification: Any) -> tuple[tuple[str, str], ...]:
    """(setting, what would fix it) for each setting that could explain a 'differs' (the lead's
    `Verification.causes`: ('num_heads', '4 heads')); () when the check names none."""
    return tuple((str(name), str(fix)) for name, fix in (getattr(verification, "causes", None) or ()))


def suggested(verification: Any) -> dict[str, Any]:
    """The load overrides that could make the model agree with its original ({'heads': 4}); {} when none."""
    return dict(getattr(verification, "suggested", None) or {})


def causes_text(verification: Any) -> str:
    """'Settings that could explain it: num_heads (the original has 4 heads)'; '' when the check names none."""
    found = causes(verification)
    if not found:
        return ""
    return "Settings that could explain it: " + "; ".join(f"{name} (the original has {what})" for name, what in found)


def suggestion_text(name: str, value: Any) -> str:
    """One suggested override as a button says it: ('heads', 4) -> '4 heads', ('block_norm', 'post') ->
    'post-norm blocks'."""
    if name == "heads":
        return f"{value} heads"
    if name == "block_norm":
        return f"{NORM_ORDERS.get(str(value), str(value)).split(':')[0]} blocks"
    if name == "act":
        return ACTIVATIONS.get(str(value), str(value))
    if name == "attn_scale":
        return "attention scale head_dim^-0.5" if not value else f"attention scale {float(value):.4g}"
    return f"{name}={value}"


def fix_label(verification: Any) -> str:
    """The differs box's button: 'Use 4 heads' when the check suggests overrides, else ''."""
    return ("Use " + ", ".join(suggestion_text(k, v) for k, v in suggested(verification).items())
            if suggested(verification) else "")


def _summary(verification: Any) -> str:
    if verification is None:
        return ""
    summary = getattr(verification, "summary", None)
    text = summary() if callable(summary) else summary
    return str(text or "")
