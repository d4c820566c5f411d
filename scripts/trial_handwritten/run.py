"""Trial: eleven hand-written ViTs published on GitHub (ten repositories), opened with vitviz as their authors would.

Each model in models/<name>.py is the repository's own code (header: repo, path, commit) plus a `make_model()`
factory with tiny sizes. For each one this script
  1. seeds, builds it, perturbs the weights (std 0.1, so that attention is not near-uniform and differences show),
     and saves `torch.save(model.state_dict(), "<name>.pth")` into a temp folder, as the author would;
  2. computes the TRUE per-layer, per-head attention with hooks written here from the code (independent of vitviz);
  3. by file: `vitviz.load(path)` -> compares its attention / output with the truth, `vitviz.verify(model)`, and
     `vitviz.core.analyses.verify.verify(model, code="models/<name>.py:make_model")` (what `vitviz verify FILE --code` does);
  4. by code: `vitviz.load(path, code="models/<name>.py:make_model")` (the live path) and `vitviz.load(module)`:
     layers x heads found vs true, max difference;
  5. the CLI: `vitviz info FILE`, `vitviz verify FILE`, `vitviz verify FILE --code models/<name>.py:make_model`
     (python -m vitviz from the repository root, VITVIZ_ANSWERS / VITVIZ_CACHE in the temp folder).

    cd /work/main && python scripts/trial_handwritten/run.py            # table + summary (about 2-3 min)
    python scripts/trial_handwritten/run.py -v                          # also the messages in full
    python scripts/trial_handwritten/run.py d2l labml                   # only these models
    python scripts/trial_handwritten/run.py --no-cli                    # skip the subprocess CLI calls

Verdicts (attention within 1e-5, output within 1e-4 of the truth):
    exact     every layer and head, and the output
    att-ok    attention exact, the output differs (e.g. a Softmax head, a two-layer head read otherwise)
    differs   attention differs; `said` appended when vitviz flagged an assumption / warning that covers it
    refused   a vitviz error (its message is shown)
    crash     any other exception
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import math
import os
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))

import vitviz  # noqa: E402
from vitviz.core.analyses.verify import verify as core_verify  # noqa: E402
from vitviz.errors import VitvizError  # noqa: E402

ATOL_ATT, ATOL_OUT = 1e-5, 1e-4


# ------------------------------------------------------------------------------------------ ground truth
class Recorder:
    """Forward hooks on the attention modules; `fn(module, args, kwargs, output)` -> (B, H, T, T) probabilities."""

    def __init__(self, net: nn.Module, cls: type | tuple[type, ...], fn: Callable[..., torch.Tensor]) -> None:
        self.maps: list[torch.Tensor] = []
        self.handles = [m.register_forward_hook(self._hook(fn), with_kwargs=True)
                        for m in net.modules() if isinstance(m, cls)]

    def _hook(self, fn: Callable[..., torch.Tensor]) -> Callable[..., None]:
        def hook(module: nn.Module, args: tuple, kwargs: dict, out: Any) -> None:
            with torch.no_grad():
                self.maps.append(fn(module, args, kwargs, out).detach().float())
        return hook

    def close(self) -> None:
        for h in self.handles:
            h.remove()


def heads(x: torch.Tensor, h: int) -> torch.Tensor:
    """(B, T, h*d) -> (B, h, T, d)"""
    b, t, _ = x.shape
    return x.reshape(b, t, h, -1).transpose(1, 2)


def softmax_qk(q: torch.Tensor, k: torch.Tensor, scale: float) -> torch.Tensor:
    return (q @ k.transpose(-2, -1) * scale).softmax(-1)


def mha_probs(m: nn.MultiheadAttention, x: torch.Tensor) -> torch.Tensor:
    """nn.MultiheadAttention's per-head probabilities from its in_proj, written out. x: (B, T, D)."""
    d = m.embed_dim
    w, b = m.in_proj_weight, m.in_proj_bias
    q = F.linear(x, w[:d], b[:d] if b is not None else None)
    k = F.linear(x, w[d:2 * d], b[d:2 * d] if b is not None else None)
    q, k = heads(q, m.num_heads), heads(k, m.num_heads)
    return softmax_qk(q, k, (d // m.num_heads) ** -0.5)


def truth_pulfer(mod: Any) -> tuple:
    def fn(m, args, kw, out):
        seqs = args[0]
        per = []
        for h in range(m.n_heads):
            s = seqs[..., h * m.d_head:(h + 1) * m.d_head]
            per.append(softmax_qk(m.q_mappings[h](s), m.k_mappings[h](s), m.d_head ** -0.5))
        return torch.stack(per, 1)
    return mod.MyMSA, fn


def truth_tintn(mod: Any) -> tuple:
    def fn(m, args, kw, out):
        x = args[0]
        return torch.stack([softmax_qk(hd.query(x), hd.key(x), hd.attention_head_size ** -0.5) for hd in m.heads], 1)
    return mod.MultiHeadAttention, fn


def truth_omihub(mod: Any) -> tuple:
    def fn(m, args, kw, out):
        x = args[0]
        return softmax_qk(heads(m.q(x), m.head), heads(m.k(x), m.head), 1.0)   # no scaling in the repo
    return mod.MultiHeadSelfAttention, fn


def truth_schh(mod: Any) -> tuple:
    def fn(m, args, kw, out):
        x = args[0]
        h = m.n_attention_heads
        return softmax_qk(heads(m.queries(x), h), heads(m.keys(x), h), m.head_embed_dim ** -0.5)
    return mod.SelfAttention, fn


def truth_torch_mha(batch_first: bool) -> Callable[[Any], tuple]:
    def make(mod: Any) -> tuple:
        def fn(m, args, kw, out):
            q = kw.get("query", args[0] if args else None)
            return mha_probs(m, q if batch_first else q.transpose(0, 1))
        return nn.MultiheadAttention, fn
    return make


def truth_jeonsworld(mod: Any) -> tuple:
    def fn(m, args, kw, out):
        x = args[0]
        h = m.num_attention_heads
        return softmax_qk(heads(m.query(x), h), heads(m.key(x), h), m.attention_head_size ** -0.5)
    return mod.Attention, fn


def truth_explainingai(mod: Any) -> tuple:
    def fn(m, args, kw, out):
        q, k, _ = m.qkv_proj(args[0]).split(m.att_dim, dim=-1)
        return softmax_qk(heads(q, m.n_heads), heads(k, m.n_heads), m.head_dim ** -0.5)
    return mod.Attention, fn


def truth_d2l(mod: Any) -> tuple:
    def fn(m, args, kw, out):
        w = m.attention.attention_weights          # (B*H, T, T), d2l keeps it on the module
        return w.reshape(-1, m.num_heads, *w.shape[-2:])
    return mod.MultiHeadAttention, fn


def truth_zuppichini(mod: Any) -> tuple:
    from einops import rearrange

    def fn(m, args, kw, out):
        qkv = rearrange(m.qkv(args[0]), "b n (h d qkv) -> (qkv) b h n d", h=m.num_heads, qkv=3)
        return softmax_qk(qkv[0], qkv[1], 1.0)   # the softmax; the code then divides it by sqrt(emb_size)
    return mod.MultiHeadAttention, fn


def truth_labml(mod: Any) -> tuple:
    def fn(m, args, kw, out):
        return m.attn.permute(2, 3, 0, 1)          # (i, j, b, h) -> (b, h, i, j)
    return mod.MultiHeadAttention, fn


@dataclass
class Case:
    name: str
    style: str
    truth: Callable[[Any], tuple]
    chans: int = 3
    size: int = 32
    known: dict[str, Any] = field(default_factory=dict)   # what the author knows of the code: the right overrides


CASES = [
    Case("pulfer_mnist", "per-head ModuleLists on slices, patchify loop, sin-cos buffer (non-persistent), Softmax head",
         truth_pulfer, chans=1, known={"image_size": 32}),
    Case("tintn_hf_style", "one AttentionHead module per head (query/key/value), tanh-GELU, no final norm, tuple out",
         truth_tintn, known={"act": "gelu_tanh"}),
    Case("omihub_cifar", "separate q/k/v + einsum, NO 1/sqrt(d), unfold patches (p1 p2 c), GELU-GELU MLP",
         truth_omihub, known={"heads": 8, "attn_scale": 1.0}),
    Case("schh_scratch", "queries/keys/values, pos on patches only, final norm, Linear-Tanh-Linear head, MNIST",
         truth_schh, chans=1, known={"heads": 4, "head_act": "tanh"}),
    Case("schh_torch_encoder", "nn.TransformerEncoder(norm_first, activation=nn.GELU(), norm=LN), pos on patches only",
         truth_torch_mha(batch_first=True), known={"heads": 4, "block_norm": "pre", "act": "gelu", "head_act": "tanh"}),
    Case("jeonsworld_vit", "JAX port: query/key/value/out, eps 1e-6, encoder_norm, (logits, attn) tuple",
         truth_jeonsworld, known={"heads": 4, "eps": 1e-6}),
    Case("explainingai_einops", "einops, fused qkv no bias + split, head_dim*heads = 2x emb, (D,) cls token",
         truth_explainingai, known={"heads": 4}),
    Case("d2l_vit", "d2l book: Lazy modules, W_q/k/v/o no bias, heads folded into batch (bmm)", truth_d2l,
         known={"heads": 4}),
    Case("uvadlc_tutorial15", "UvA tutorial 15: nn.MultiheadAttention seq-first, img_to_patch (c p1 p2) Linear",
         truth_torch_mha(batch_first=False), known={"heads": 4, "patch_order": "cp1p2"}),
    Case("zuppichini_einops", "einops nn.Sequential ViT: qkv '(h d qkv)', softmax/sqrt(D) after softmax, mean pool",
         truth_zuppichini, known={"heads": 4, "pooling": "avg_all", "attn_scale": 1.0}),
    Case("labml_annotated", "labml.ai: seq-first, einsum 'ijbh', softmax(dim=1), 5000-row pos table, ReLU",
         truth_labml, known={"heads": 4, "act": "relu", "head_act": "relu"}),
]


# ------------------------------------------------------------------------------------------ helpers
def import_models(name: str) -> Any:
    path = HERE / "models" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"trial_models_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(path.parent))
    return mod


def main_out(out: Any) -> torch.Tensor:
    return out[0] if isinstance(out, (tuple, list)) else out


def build(case: Case, mod: Any, folder: Path) -> tuple[nn.Module, Path, torch.Tensor]:
    torch.manual_seed(0)
    net = mod.make_model()
    x = torch.randn(1, case.chans, case.size, case.size, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        net.eval()
        net(torch.zeros(1, case.chans, case.size, case.size))   # materialises Lazy modules (d2l), as training does
        g = torch.Generator().manual_seed(2)
        for p in net.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.1)
    path = folder / f"{case.name}.pth"
    torch.save(net.state_dict(), path)
    return net.eval(), path, x


def truth_of(case: Case, mod: Any, net: nn.Module, x: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
    cls, fn = case.truth(mod)
    rec = Recorder(net, cls, fn)
    try:
        with torch.no_grad():
            out = main_out(net(x)).float()
    finally:
        rec.close()
    return rec.maps, out


@dataclass
class Try:
    verdict: str = "-"
    found: str = ""            # "L x H"
    max_att: float | None = None
    max_out: float | None = None
    said: list[str] = field(default_factory=list)
    message: str = ""
    extra: str = ""

    def cell(self) -> str:
        bits = [self.verdict]
        if self.found:
            bits.append(self.found)
        if self.max_att is not None and self.verdict not in ("exact",):
            bits.append(f"att {fmt(self.max_att)}")
        if self.max_out is not None and self.verdict not in ("exact",):
            bits.append(f"out {fmt(self.max_out)}")
        return " ".join(bits)


def fmt(v: float | None) -> str:
    if v is None:
        return "-"
    if not math.isfinite(v):
        return str(v)
    return "0" if v == 0 else f"{v:.1g}"


def compare(model: Any, x: torch.Tensor, maps: list[torch.Tensor], out: torch.Tensor, said: list[str]) -> Try:
    """Run the vitviz model on the same input tensor and compare with the truth."""
    t = Try(said=said)
    res = model.run(x)
    att = np.asarray(res.attentions, dtype=np.float64)     # (L, H, T, T)
    true = np.stack([m[0].numpy() for m in maps]).astype(np.float64) if maps else np.zeros((0,))
    t.found = f"{att.shape[0]}x{att.shape[1]}/{true.shape[0]}x{true.shape[1] if true.ndim > 1 else 0}"
    if att.shape != true.shape:
        t.verdict = "differs"
        t.extra = f"shape {att.shape} vs true {true.shape}"
        t.max_att = math.inf
    else:
        t.max_att = float(np.abs(att - true).max())
    logits = np.asarray(res.logits, dtype=np.float64).reshape(-1)
    o = out[0].numpy().astype(np.float64).reshape(-1)
    t.max_out = float(np.abs(logits - o).max()) if logits.shape == o.shape else math.inf
    if t.max_out > ATOL_OUT and logits.shape == o.shape and o.min() >= 0 and abs(o.sum() - 1) < 1e-4:
        p = np.exp(logits - logits.max())      # the model ends in a Softmax (pulfer): compare probabilities
        t.max_out = float(np.abs(p / p.sum() - o).max())
    if t.verdict == "-":
        if t.max_att <= ATOL_ATT:
            t.verdict = "exact" if t.max_out <= ATOL_OUT else "att-ok"
        else:
            t.verdict = "differs"
    if t.verdict != "exact" and said:
        t.verdict += "(said)"
    return t


def said_of(model: Any, caught: list[warnings.WarningMessage]) -> list[str]:
    out = [f"{w.category.__name__}: {w.message}" for w in caught]
    spec = getattr(model, "spec", None)
    if spec is not None:
        out += [f"assumed {name}: {why}" for name, why in getattr(spec, "assumptions", ())]
    return out


def attempt(fn: Callable[[], Any]) -> tuple[Any, list[warnings.WarningMessage], str]:
    """(result or None, warnings, error message)"""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                return fn(), list(caught), ""
        except VitvizError as e:
            return None, list(caught), f"{type(e).__name__}: {e}"
        except Exception as e:  # noqa: BLE001
            where = traceback.extract_tb(e.__traceback__)[-2:]
            at = " <- ".join(f"{Path(f.filename).name}:{f.lineno}" for f in reversed(where))
            return None, list(caught), " ".join(f"CRASH {type(e).__name__}: {e} (at {at})".split())


def refused(msg: str) -> Try:
    return Try(verdict="crash" if msg.startswith("CRASH") else "refused", message=msg)


# ------------------------------------------------------------------------------------------ one model
@dataclass
class Row:
    case: Case
    file: Try = field(default_factory=Try)
    verify_plain: str = ""
    verify_code: str = ""
    hinted: dict[str, Any] = field(default_factory=dict)   # the overrides verify --code suggested, followed
    hinted_verify: str = ""
    hinted_file: Try = field(default_factory=Try)
    known_verify: str = ""
    known_file: Try = field(default_factory=Try)
    code: Try = field(default_factory=Try)
    module: Try = field(default_factory=Try)
    cli: dict[str, tuple[int, str]] = field(default_factory=dict)
    seconds: float = 0.0


def run_case(case: Case, folder: Path) -> Row:
    t0 = time.perf_counter()
    row = Row(case)
    mod = import_models(case.name)
    net, path, x = build(case, mod, folder)
    maps, out = truth_of(case, mod, net, x)
    code = f"{HERE / 'models' / case.name}.py:make_model"

    # a. by file
    model, caught, err = attempt(lambda: vitviz.load(str(path)))
    if model is None:
        row.file = refused(err)
    else:
        said = said_of(model, caught)
        cmp_, c2, err2 = attempt(lambda: compare(model, x, maps, out, said))
        row.file = cmp_ if cmp_ is not None else refused(err2)
        v, _, verr = attempt(lambda: vitviz.verify(model))
        row.verify_plain = v.summary() if v is not None else verr
        v2, _, verr2 = attempt(lambda: core_verify(model, code=code))
        row.verify_code = v2.summary() if v2 is not None else verr2
        # the author follows the hint ("could be num_heads (4 heads)" -> --heads 4), up to three times
        overrides: dict[str, Any] = {}
        while v2 is not None and v2.verdict == "differs" and v2.suggested and len(overrides) < 6:
            new = {k: v for k, v in v2.suggested if overrides.get(k) != v}
            if not new:
                break
            overrides.update(new)
            m2, caught2, e2 = attempt(lambda: vitviz.load(str(path), **overrides))
            if m2 is None:
                row.hinted_verify = e2
                break
            v2, _, verr2 = attempt(lambda: core_verify(m2, code=code))
            row.hinted_verify = v2.summary() if v2 is not None else verr2
            c3, _, e3 = attempt(lambda: compare(m2, x, maps, out, said_of(m2, caught2)))
            row.hinted_file = c3 if c3 is not None else refused(e3)
        row.hinted = overrides
    # what the author knows of the code, given as overrides (the file route at its best)
    if case.known:
        mk, caught_k, ek = attempt(lambda: vitviz.load(str(path), **case.known))
        if mk is None:
            row.known_file = refused(ek)
        else:
            ck, _, ek2 = attempt(lambda: compare(mk, x, maps, out, said_of(mk, caught_k)))
            row.known_file = ck if ck is not None else refused(ek2)
            vk, _, ek3 = attempt(lambda: core_verify(mk, code=code))
            row.known_verify = vk.summary() if vk is not None else ek3

    # b. by code (the live path, what --code does) and the module object
    live, caught, err = attempt(lambda: vitviz.load(str(path), code=code))
    if live is None:
        row.code = refused(err)
    else:
        said = [f"{w.category.__name__}: {w.message}" for w in caught]
        said += [f"skipped {s}" for s in getattr(live, "skipped", [])]
        c, _, err2 = attempt(lambda: compare(live, x, maps, out, said))
        row.code = c if c is not None else refused(err2)
        row.code.extra = (row.code.extra + " " + ", ".join(f"{n}:{m}" for n, m in getattr(live, "layers", [])[:2])).strip()
    obj, caught, err = attempt(lambda: vitviz.load(net))
    if obj is None:
        row.module = refused(err)
    else:
        said = said_of(obj, caught) if obj.spec.family != "live" else [f"{w.category.__name__}: {w.message}" for w in caught]
        c, _, err2 = attempt(lambda: compare(obj, x, maps, out, said))
        row.module = c if c is not None else refused(err2)
        row.module.extra = ("live" if obj.spec.family == "live" else f"converted ({obj.spec.family})")
    row.seconds = time.perf_counter() - t0
    return row


# ------------------------------------------------------------------------------------------ CLI
def cli(args: list[str], env: dict[str, str]) -> tuple[int, str]:
    try:
        p = subprocess.run([sys.executable, "-m", "vitviz", *args], cwd=ROOT, env=env, capture_output=True,
                           text=True, timeout=120)
        text = (p.stdout + p.stderr).strip()
        return p.returncode, text
    except subprocess.TimeoutExpired:
        return -1, "timeout after 120 s"


def flags(overrides: dict[str, Any]) -> list[str]:
    out = []
    for k, v in overrides.items():
        out += [f"--{k.replace('_', '-')}", str(v)]
    return out


def last_lines(text: str, n: int = 3) -> str:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return " | ".join(lines[-n:])


# ------------------------------------------------------------------------------------------ main
def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("only", nargs="*")
    ap.add_argument("-v", "--verbose", action="store_true")
    ap.add_argument("--no-cli", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(1)
    cases = [c for c in CASES if not a.only or any(o in c.name for o in a.only)]
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="vitviz_trial_hw_") as tmp:
        folder = Path(tmp)
        env = dict(os.environ, VITVIZ_ANSWERS=str(folder / "answers.json"), VITVIZ_CACHE=str(folder / "cache"),
                   PYTHONPATH=str(ROOT), QT_QPA_PLATFORM="offscreen", OMP_NUM_THREADS="1")
        os.environ["VITVIZ_ANSWERS"], os.environ["VITVIZ_CACHE"] = env["VITVIZ_ANSWERS"], env["VITVIZ_CACHE"]
        rows = []
        for c in cases:
            try:
                rows.append(run_case(c, folder))
            except Exception:  # noqa: BLE001 - the harness itself
                print(f"{c.name}: harness error\n{traceback.format_exc()}")
        if not a.no_cli:
            jobs = []
            for r in rows:
                f = str(folder / f"{r.case.name}.pth")
                code = f"scripts/trial_handwritten/models/{r.case.name}.py:make_model"
                jobs += [(r, "info", ["info", f]), (r, "verify", ["verify", f]),
                         (r, "verify --code", ["verify", f, "--code", code])]
                if r.hinted:
                    jobs.append((r, "verify --code +hints", ["verify", f, "--code", code, *flags(r.hinted)]))
            def one_model(r: Row) -> None:      # a model's commands in order (info would see verify's cache)
                for rr, key, argv in jobs:
                    if rr is r:
                        r.cli[key] = cli(argv, env)
            with ThreadPoolExecutor(2) as pool:
                list(pool.map(one_model, rows))
    report(rows, a.verbose, time.perf_counter() - t0)
    return 0


def report(rows: list[Row], verbose: bool, seconds: float) -> None:
    print("\n| model | style | by file: load → vs truth (L×H found/true) | verify | verify --code | by --code (live) | "
          "vitviz.load(module) | after the hint: overrides → verify --code; vs truth | "
          "the right overrides → vs truth; verify --code | CLI rc info/verify/--code/+hints |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        file_cell = r.file.cell() if r.file.verdict not in ("refused", "crash") else f"{r.file.verdict}"
        rcs = "/".join(str(r.cli[k][0]) if k in r.cli else "-"
                       for k in ("info", "verify", "verify --code", "verify --code +hints"))
        known = (f"{' '.join(flags(r.case.known))} → {r.known_file.cell() if not r.known_file.message else r.known_file.verdict}; "
                 f"{r.known_verify or '-'}")
        hint = (f"{' '.join(flags(r.hinted))} → {r.hinted_verify}; {r.hinted_file.cell()}" if r.hinted else "-")
        print(f"| {r.case.name} | {r.case.style} | {file_cell} | {r.verify_plain or '-'} | {r.verify_code or '-'} | "
              f"{r.code.cell()} | {r.module.cell()} {r.module.extra} | {hint} | {known} | {rcs} |")
    print()
    for r in rows:
        print(f"### {r.case.name}  ({r.seconds:.1f} s)")
        if r.file.message:
            print(f"  by file refused: {short(r.file.message, verbose)}")
        for s in r.file.said[: (50 if verbose else 4)]:
            print(f"  by file said: {short(s, verbose)}")
        if r.file.extra:
            print(f"  by file: {r.file.extra}")
        if r.known_file.message:
            print(f"  with the right overrides refused: {short(r.known_file.message, verbose)}")
        if r.code.message:
            print(f"  --code refused: {short(r.code.message, verbose)}")
        if r.code.extra:
            print(f"  --code: {r.code.extra}")
        for s in r.code.said[: (50 if verbose else 3)]:
            print(f"  --code said: {short(s, verbose)}")
        if r.module.message:
            print(f"  load(module) refused: {short(r.module.message, verbose)}")
        for k, (rc, text) in r.cli.items():
            print(f"  $ vitviz {k} -> rc {rc}: {text if verbose else short(last_lines(text), False)}")
    n = len(rows)
    file_exact = [r for r in rows if r.file.verdict == "exact"]
    code_exact = [r for r in rows if r.code.verdict == "exact"]
    some = [r for r in rows if "exact" in (r.file.verdict, r.code.verdict, r.module.verdict)]
    verified_file = [r for r in rows if r.verify_plain.startswith(("Verified", "Matches"))]
    verified_code = [r for r in rows if r.verify_code.startswith(("Verified", "Matches"))]
    verified_hint = [r for r in rows if r.verify_code.startswith(("Verified", "Matches"))
                     or r.hinted_verify.startswith(("Verified", "Matches"))]
    known_exact = [r for r in rows if r.known_file.verdict == "exact"]
    known_ver = [r for r in rows if r.known_verify.startswith(("Verified", "Matches"))]
    cli_ok = [r for r in rows if r.cli.get("verify --code", (1,))[0] == 0]
    silent = [r for r in rows for t in (r.file, r.code, r.module) if t.verdict == "differs"]
    print(f"\nSUMMARY ({n} models, {seconds:.0f} s)")
    print(f"  open exactly by some route: {len(some)}/{n}")
    print(f"  by file exact: {len(file_exact)}/{n}   loaded at all: {sum(r.file.verdict not in ('refused', 'crash', '-') for r in rows)}/{n}")
    print(f"  by --code (live) exact: {len(code_exact)}/{n}")
    print(f"  vitviz.load(module) exact: {sum(r.module.verdict == 'exact' for r in rows)}/{n}")
    print(f"  verify (no code) verified: {len(verified_file)}/{n}")
    print(f"  verify --code verified: {len(verified_code)}/{n}   CLI `verify FILE --code` exit 0: {len(cli_ok)}/{n}")
    print(f"  verified after following verify's own hints (--heads ...): {len(verified_hint)}/{n}   "
          f"CLI exit 0 with the hints: {sum(r.cli.get('verify --code +hints', (1,))[0] == 0 for r in rows)}")
    print(f"  by file with the right overrides (what the author knows): exact {len(known_exact)}/{n}, "
          f"verify --code verified {len(known_ver)}/{n}")
    print(f"  SILENT differences (differs, nothing said): {sorted({r.case.name for r in silent})}")


def short(s: str, verbose: bool, n: int = 400) -> str:
    s = " ".join(str(s).split())
    return s if verbose or len(s) <= n else s[:n] + " …"


if __name__ == "__main__":
    sys.exit(main())
