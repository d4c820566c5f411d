"""Hostile inputs, round three, again (issue 34): new variants on the surfaces fixed in this round -- Ray inputs
and manifests, layer / head ranges, compare and timeline arguments, verify's arguments, the answers store, user
code's global state -- each run in a bounded child process (an alarm per case, a memory cap), classified:

- clean: a VitvizError (or argparse's usage error, exit 2) naming the problem, or a normal result;
- finding: any other exception (a traceback), a hang (the alarm), a memory blow-up (MemoryError under the cap),
  or a wrong result the case checks for.

    python scripts/hostile3/fuzz.py [--only SURFACE] [--seconds 60]

Prints a table (surface, case, outcome, detail) and exits 1 when anything is a finding. Runs on the CPU, touches
no network (URIs are file://, or schemes pyarrow refuses before any connection), writes only under a temporary
folder.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "resources" / "demo"
MEMORY_CAP = 6 << 30          # bytes of address space per child (torch itself needs about 2 GiB of it)

# Run in the child: every case is `name: code`; the code runs with `tmp` (a fresh folder), `demo` (the loaded demo
# model, made once), `png(path)`, `cli(*argv)` -> (exit code, stderr) in scope. A VitvizError is clean; `bad(...)`
# marks a wrong result.
CHILD = r'''
import contextlib, io, json, os, signal, sys, traceback, warnings
from pathlib import Path
import numpy as np
warnings.simplefilter("ignore")
import vitviz
from vitviz.errors import VitvizError
from PIL import Image

class Hang(BaseException):
    pass

class Wrong(Exception):
    pass

def bad(why):
    raise Wrong(why)

def alarm(_s, _f):
    raise Hang()

signal.signal(signal.SIGALRM, alarm)
demo = vitviz.load(sys.argv[2])

def png(path, size=64):
    path = Path(path); path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (size, size, 3), dtype=np.uint8)).save(path)
    return path

def cli(*argv):
    from vitviz.cli import main
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main([str(a) for a in argv])
        except SystemExit as e:
            code = e.code
    text = err.getvalue()
    if "Traceback" in text:
        raise Wrong("traceback on stderr: " + text.strip().splitlines()[-1][:200])
    return code, text

def factory(tmp, statement, after=False):
    """Load a --code file whose factory runs `statement` (before building the model, or `after`)."""
    c = tmp / "c.py"
    lines = ["import io, os, signal, sys, numpy, torch", f"sys.path.insert(0, {str(Path(sys.argv[2]).parents[1] / 'tests')!r})",
             "from misbehaving_code import tiny", "def make():"]
    lines += ["    m = tiny()", f"    {statement}", "    return m"] if after else [f"    {statement}", "    return tiny()"]
    c.write_text("\n".join(lines) + "\n")
    return vitviz.load(None, code=f"{c}:make", device="cpu")

cases = json.loads(sys.argv[1])
seconds = int(sys.argv[3])
for name, code in cases:
    tmp = Path(__import__("tempfile").mkdtemp(prefix="fuzz-"))
    cwd = os.getcwd()
    signal.alarm(seconds)
    try:
        exec(code, {"tmp": tmp, "demo": demo, "png": png, "cli": cli, "bad": bad, "np": np, "vitviz": vitviz,
                    "Path": Path, "os": os, "json": json, "sys": sys, "VitvizError": VitvizError,
                    "factory": factory})
        outcome, detail = "clean", "ran"
    except VitvizError as e:
        outcome, detail = "clean", f"{type(e).__name__}: {str(e)[:160]}"
    except Hang:
        outcome, detail = "HANG", f"no answer in {seconds} s"
    except MemoryError as e:
        outcome, detail = "BLOW-UP", f"MemoryError {e}"
    except Wrong as e:
        outcome, detail = "WRONG", str(e)[:200]
    except BaseException as e:
        tb = traceback.extract_tb(e.__traceback__)
        where = next((f"{Path(f.filename).name}:{f.lineno}" for f in reversed(tb) if "vitviz" in f.filename), "")
        outcome, detail = "EXCEPTION", f"{type(e).__name__}: {str(e)[:150]} ({where})"
    finally:
        signal.alarm(0)
        os.chdir(cwd)
    print("@@" + json.dumps([name, outcome, detail]), flush=True)
'''

SURFACES: dict[str, list[tuple[str, str]]] = {
    "ray-inputs": [
        ("list naming itself", "l = tmp/'l.txt'; l.write_text(f'{l}\\n'); from vitviz.batch.ray_engine import "
                               "collect_sources as c; s = c([str(l)], tmp/'o', None); "
                               "len(s) == 1 or bad(f'{len(s)} sources')"),
        ("list with NUL in a line", "l = tmp/'l.txt'; l.write_bytes(b'a\\x00b.png\\nc.png\\n'); "
                                    "from vitviz.batch.ray_engine import collect_sources as c; c([str(l)], tmp/'o', None)"),
        ("list of one 20 MB line", "l = tmp/'l.txt'; l.write_text('x'*20_000_000 + '.png\\n'); "
                                   "from vitviz.batch.ray_engine import collect_sources as c; c([str(l)], tmp/'o', None)"),
        ("list not UTF-8", "l = tmp/'l.txt'; l.write_bytes(b'\\xff\\xfe\\x00a.png\\n'); "
                           "from vitviz.batch.ray_engine import collect_sources as c; c([str(l)], tmp/'o', None)"),
        ("list that is a folder", "(tmp/'l.txt').mkdir(); png(tmp/'l.txt'/'a.png'); "
                                  "from vitviz.batch.ray_engine import collect_sources as c; c([str(tmp/'l.txt')], tmp/'o', None)"),
        ("list that is a link loop", "os.symlink(tmp/'l.txt', tmp/'l.txt'); "
                                     "from vitviz.batch.ray_engine import collect_sources as c; c([str(tmp/'l.txt')], tmp/'o', None)"),
        ("listed FIFO image fails as its image", "os.mkfifo(tmp/'f.png'); l = tmp/'l.txt'; l.write_text('f.png\\n'); "
         "from vitviz.batch.ray_engine import collect_sources as c, read_row, Destination; "
         "from vitviz.batch.plan import Plan, parse_maps; from vitviz.core.drawing.render import RenderOptions; "
         "s = c([str(l)], tmp/'o', None)[0]; "
         "r = read_row({'source': str(s.path), 'read': s.read, 'sub': '.', 'stem': 'f', 'index': 0, 'remote': False}, "
         "demo.spec, Plan(parse_maps('cls'), [0], ['mean'], RenderOptions()), Destination(tmp/'o')); "
         "r['status'] == 'failed' or bad(r['status'])"),
        ("file: without slashes", "from vitviz.batch.ray_engine import collect_sources as c; c(['file:a.png'], tmp/'o', None)"),
        ("file:// empty path", "from vitviz.batch.ray_engine import collect_sources as c; c(['file://'], tmp/'o', None)"),
        ("file URI with a query", "png(tmp/'a.png'); from vitviz.batch.ray_engine import collect_sources as c; "
                                  "c([(tmp/'a.png').as_uri() + '?x=1'], tmp/'o', None)"),
        ("file URI of /dev/null", "from vitviz.batch.ray_engine import fetch; fetch('file:///dev/null')"),
        ("file URI glob into /dev", "from vitviz.batch.ray_engine import collect_sources as c; "
                                    "c(['file:///dev/zer*.png'], tmp/'o', None)"),
        ("file URI of a link loop", "os.symlink(tmp/'x.png', tmp/'x.png'); from vitviz.batch.ray_engine import fetch; "
                                    "fetch((tmp/'x.png').as_uri())"),
        ("file URI with NUL", "from vitviz.batch.ray_engine import fetch; fetch('file:///tmp/a\\x00.png')"),
        ("s3 URI with no host", "from vitviz.batch.ray_engine import collect_sources as c; c(['s3:///a.png/'], tmp/'o', None)"),
        ("unknown scheme list", "from vitviz.batch.ray_engine import collect_sources as c; c(['gopher://h/list.txt'], tmp/'o', None)"),
    ],
    "ray-manifest": [
        ("manifest a folder", "(tmp/'manifest.json').mkdir(); from vitviz.batch.ray_engine import Destination; "
                              "Destination(tmp).read_json('manifest.json')"),
        ("manifest a link loop", "os.symlink(tmp/'manifest.json', tmp/'manifest.json'); "
                                 "from vitviz.batch.ray_engine import Destination; Destination(tmp).read_json('manifest.json')"),
        ("manifest 2 GiB sparse", "f = open(tmp/'manifest.json', 'wb'); f.truncate(2 << 30); f.close(); "
                                  "from vitviz.batch.ray_engine import Destination; Destination(tmp).read_json('manifest.json')"),
        ("manifest a JSON list", "(tmp/'manifest.json').write_text('[1, 2]'); from vitviz.batch.ray_engine import Destination; "
                                 "Destination(tmp).read_json('manifest.json')"),
        ("manifest images entries hostile", "(tmp/'manifest.json').write_text(json.dumps({'images': [1, None, "
         "{'path': [], 'status': 'done', 'sha256': {}}, {'status': 'done'}]})); "
         "from vitviz.batch.ray_engine import Destination; Destination(tmp).read_json('manifest.json')"),
        ("manifest as FIFO via URI", "os.mkfifo(tmp/'manifest.json'); from vitviz.batch.ray_engine import Destination; "
                                     "Destination(tmp.as_uri()).read_json('manifest.json')"),
    ],
    "ranges": [
        ("layers 0-4095 on a 3-layer model", "c, e = cli('export', '--model', demo.spec.source, png(tmp/'a.png'), "
                                             "'--out', tmp/'o', '--layers', '0-1023'); c == 2 or bad(c)"),
        ("layers leading zeros", "c, e = cli('export', '--model', demo.spec.source, png(tmp/'a.png'), '--out', tmp/'o', "
                                 "'--layers', '0'*5000 + '1', '--quiet', '--no-verify'); c in (0, 2) or bad(c)"),
        ("layers 100k items", "c, e = cli('export', '--model', demo.spec.source, png(tmp/'a.png'), '--out', tmp/'o', "
                              "'--layers', ','.join(['0-1000'] * 100000)); c == 2 or bad(c)"),
        ("heads -0", "c, e = cli('export', '--model', demo.spec.source, png(tmp/'a.png'), '--out', tmp/'o', "
                     "'--which-heads', '-0', '--quiet', '--no-verify'); c in (0, 2) or bad(c)"),
        ("heads 1-", "c, e = cli('export', '--model', demo.spec.source, png(tmp/'a.png'), '--out', tmp/'o', "
                     "'--which-heads', '1-'); c == 2 or bad(c)"),
        ("layers unicode digits", "c, e = cli('export', '--model', demo.spec.source, png(tmp/'a.png'), '--out', tmp/'o', "
                                  "'--layers', '\u0661-\u0662', '--quiet', '--no-verify'); c in (0, 2) or bad(c)"),
        ("layers -99999999999999", "c, e = cli('export', '--model', demo.spec.source, png(tmp/'a.png'), '--out', tmp/'o', "
                                   "'--layers', '-99999999999999'); c == 2 or bad(c)"),
    ],
    "compare": [
        ("no images", "vitviz.compare(demo, demo, [])"),
        ("a generator of images", "vitviz.compare(demo, demo, (png(tmp/f'{i}.png') for i in range(2)))"),
        ("kind token:3", "vitviz.compare(demo, demo, [png(tmp/'a.png')], kind='token:3')"),
        ("kind nonsense", "vitviz.compare(demo, demo, [png(tmp/'a.png')], kind='nonsense')"),
        ("kind pool", "vitviz.compare(demo, demo, [png(tmp/'a.png')], kind='pool')"),
        ("heads MATCH", "vitviz.compare(demo, demo, [png(tmp/'a.png')], heads='MATCH')"),
        ("heads a list", "vitviz.compare(demo, demo, [png(tmp/'a.png')], heads=['match'])"),
        ("cka a string", "vitviz.compare(demo, demo, [png(tmp/'a.png')], cka='no')"),
        ("images with a FIFO", "os.mkfifo(tmp/'f.png'); vitviz.compare(demo, demo, [tmp/'f.png'])"),
        ("export --compare a FIFO", "os.mkfifo(tmp/'b.pth'); c, e = cli('export', '--model', demo.spec.source, "
                                    "'--compare', tmp/'b.pth', png(tmp/'a.png'), '--out', tmp/'o'); c == 2 or bad(c)"),
        ("export --compare /dev/zero", "c, e = cli('export', '--model', demo.spec.source, '--compare', '/dev/zero', "
                                       "png(tmp/'a.png'), '--out', tmp/'o'); c == 2 or bad(c)"),
        ("export --compare ' '", "c, e = cli('export', '--model', demo.spec.source, '--compare', ' ', "
                                 "png(tmp/'a.png'), '--out', tmp/'o'); c == 2 or bad(c)"),
    ],
    "timeline": [
        ("run folder is a file", "(tmp/'run').write_text('x'); from vitviz.core.analyses.timeline import open_run; "
                                 "open_run(tmp/'run')"),
        ("run holds a FIFO step-1.pth", "(tmp/'run').mkdir(); os.mkfifo(tmp/'run'/'step-1.pth'); "
         "from vitviz.core.analyses.timeline import open_run; open_run(tmp/'run').model(0)"),
        ("run holds /dev/zero as step-1.pth", "(tmp/'run').mkdir(); os.symlink('/dev/zero', tmp/'run'/'step-1.pth'); "
         "from vitviz.core.analyses.timeline import open_run; open_run(tmp/'run').model(0)"),
        ("run holds a link loop", "(tmp/'run').mkdir(); os.symlink(tmp/'run'/'step-1.pth', tmp/'run'/'step-1.pth'); "
         "from vitviz.core.analyses.timeline import open_run; open_run(tmp/'run')"),
        ("run holds an empty step-1.pth", "(tmp/'run').mkdir(); (tmp/'run'/'step-1.pth').write_bytes(b''); "
         "from vitviz.core.analyses.timeline import open_run; open_run(tmp/'run').model(0)"),
        ("export --timeline /dev/null", "c, e = cli('export', '--timeline', '/dev/null', png(tmp/'a.png'), '--out', "
                                        "tmp/'o'); c == 2 or bad(c)"),
        ("timeline of bytes path", "from vitviz.core.analyses.timeline import open_run; open_run(b'/tmp')"),
    ],
    "verify": [
        ("sizes huge pair", "vitviz.verify(demo, sizes=[(64, 2**62)])"),
        ("sizes negative", "vitviz.verify(demo, sizes=[-64])"),
        ("sizes numpy array", "vitviz.verify(demo, sizes=np.array([64]))"),
        ("sizes numpy int", "vitviz.verify(demo, sizes=[np.int64(64)])"),
        ("sizes a set", "vitviz.verify(demo, sizes={64})"),
        ("device meta", "import torch; vitviz.verify(demo, device=torch.device('meta'))"),
        ("device cuda:-1", "vitviz.verify(demo, device='cuda:-1')"),
        ("device 0", "vitviz.verify(demo, device=0)"),
        ("device empty", "vitviz.verify(demo, device='')"),
        ("against None", "vitviz.verify(demo, against=None)"),
        ("against a number", "vitviz.verify(demo, against=3)"),
        ("model None", "vitviz.verify(None)"),
        ("code a FIFO", "os.mkfifo(tmp/'c.py'); vitviz.verify(demo, code=f'{tmp}/c.py:make')"),
    ],
    "answers": [
        ("store over 1 MiB", "s = tmp/'a.json'; s.write_text(json.dumps({'x': 'y' * (2 << 20)})); "
                             "os.environ['VITVIZ_ANSWERS'] = str(s); from vitviz.catalog import answers; answers.read_all()"),
        ("store a link loop", "s = tmp/'a.json'; os.symlink(s, s); os.environ['VITVIZ_ANSWERS'] = str(s); "
                              "from vitviz.catalog import answers; answers.read_all() == {} or bad('answers')"),
        ("store a list", "s = tmp/'a.json'; s.write_text('[1]'); os.environ['VITVIZ_ANSWERS'] = str(s); "
                         "from vitviz.catalog import answers; answers.read_all() == {} or bad('answers')"),
        ("store NaN heads", "s = tmp/'a.json'; s.write_text('{\"/m\": {\"heads\": NaN, \"attn_scale\": NaN}}'); "
                            "os.environ['VITVIZ_ANSWERS'] = str(s); from vitviz.catalog import answers; "
                            "answers.answers_for('/m') == {} or bad(answers.answers_for('/m'))"),
        ("store string heads", "s = tmp/'a.json'; s.write_text('{\"/m\": {\"heads\": \"4\"}}'); "
                               "os.environ['VITVIZ_ANSWERS'] = str(s); from vitviz.catalog import answers; "
                               "answers.answers_for('/m') == {} or bad(answers.answers_for('/m'))"),
        ("store not UTF-8", "s = tmp/'a.json'; s.write_bytes(b'{\"\\xff\": 1}'); os.environ['VITVIZ_ANSWERS'] = str(s); "
                            "from vitviz.catalog import answers; answers.read_all()"),
        ("store in a folder that is a file", "(tmp/'d').write_text('x'); os.environ['VITVIZ_ANSWERS'] = str(tmp/'d'/'a.json'); "
                                             "from vitviz.catalog import answers; answers.remember('/m', {'heads': 4})"),
        ("remember heads numpy int", "os.environ['VITVIZ_ANSWERS'] = str(tmp/'a.json'); from vitviz.catalog import answers; "
                                     "answers.remember('/m', {'heads': np.int64(4)})"),
        ("remember unknown name", "os.environ['VITVIZ_ANSWERS'] = str(tmp/'a.json'); from vitviz.catalog import answers; "
                                  "answers.remember('/m', {'eps': 1e-6}); answers.answers_for('/m') == {} or bad('kept')"),
        ("info with a store of huge heads", "s = tmp/'a.json'; s.write_text(json.dumps({str(Path(demo.spec.source).absolute()): "
                                            "{'heads': 10**30}})); os.environ['VITVIZ_ANSWERS'] = str(s); "
                                            "c, e = cli('info', demo.spec.source); c == 0 or bad((c, e[-300:]))"),
    ],
    "user-code": [
        ("code changes the working folder", "here = os.getcwd(); factory(tmp, 'os.chdir(\"/\")'); "
         "os.getcwd() == here or bad('working folder left at ' + os.getcwd())"),
        ("code lowers the recursion limit", "before = sys.getrecursionlimit(); factory(tmp, 'sys.setrecursionlimit(80)'); "
         "sys.getrecursionlimit() == before or bad('recursion limit left at %d' % sys.getrecursionlimit())"),
        ("code makes numpy raise on errors", "before = np.geterr(); factory(tmp, 'numpy.seterr(all=\"raise\")'); "
         "np.geterr() == before or bad('numpy error state left at %s' % np.geterr())"),
        ("code sets a float16 default", "import torch; factory(tmp, 'torch.set_default_dtype(torch.float16)', "
         "after=True); torch.get_default_dtype() == torch.float32 or bad(torch.get_default_dtype())"),
        ("code ignores Ctrl-C", "import signal; before = signal.getsignal(signal.SIGINT); "
         "factory(tmp, 'signal.signal(signal.SIGINT, signal.SIG_IGN)'); "
         "signal.getsignal(signal.SIGINT) == before or bad('SIGINT handler left replaced')"),
        ("code replaces sys.stdout", "before = sys.stdout; factory(tmp, 'sys.stdout = io.StringIO()'); "
         "sys.stdout is before or bad('sys.stdout left replaced')"),
        ("code replaces sys.stderr", "before = sys.stderr; factory(tmp, 'sys.stderr = io.StringIO()'); "
         "sys.stderr is before or bad('sys.stderr left replaced')"),
        ("code sets an environment variable", "factory(tmp, 'os.environ[\"VITVIZ_ANSWERS\"] = \"/dev/zero\"'); "
         "os.environ.get('VITVIZ_ANSWERS') != '/dev/zero' or bad('VITVIZ_ANSWERS left set by the code')"),
    ],
}

# Round two (after the fixes above): new variants on the same surfaces and on the Ray engine's streamed lists.
S = "from vitviz.batch.ray_engine import SourceStream as S; "
SURFACES.update({
    "ray-stream": [
        ("list of only comments and blanks", S + "l = tmp/'l.txt'; l.write_text('# x\\n\\n   \\n#y\\n'); S([str(l)], tmp/'o', None)"),
        ("list with CRLF endings", S + "png(tmp/'a.png'); l = tmp/'l.txt'; l.write_bytes(b'a.png\\r\\n'); "
         "got = [s.read for s, _ in S([str(l)], tmp/'o', None)]; got == [str(tmp/'a.png')] or bad(got)"),
        ("30,000 duplicate lines", S + "l = tmp/'l.txt'; l.write_text('a.png\\n' * 30000); "
         "n = len(list(S([str(l)], tmp/'o', None))); n == 1 or bad(f'{n} sources')"),
        ("clashing stems stay unique", S + "import random; r = random.Random(0); l = tmp/'l.txt'; "
         "l.write_text(''.join(f'{r.choice(\"ab\")}/{r.choice([\"x\", \"x_png\", \"x_2\", \"x.y\"])}.{r.choice([\"png\", \"jpg\"])}\\n' "
         "for _ in range(3000))); pairs = [(s.sub.as_posix(), stem) for s, stem in S([str(l)], tmp/'o', None)]; "
         "len(set(pairs)) == len(pairs) or bad('two images share a stem')"),
        ("line that is a nested list", S + "(tmp/'other.txt').write_text('a.png\\n'); l = tmp/'l.txt'; "
         "l.write_text('other.txt\\n'); got = [s.read for s, _ in S([str(l)], tmp/'o', None)]; "
         "got == [str(tmp/'other.txt')] or bad(got)"),
        ("list lines under the output folder", S + "png(tmp/'o'/'a.png'); png(tmp/'b.png'); l = tmp/'l.txt'; "
         "l.write_text(f'{tmp}/o/a.png\\nb.png\\n'); got = [s.read for s, _ in S([str(l)], tmp/'o', None)]; "
         "got == [str(tmp/'b.png')] or bad(got)"),
        ("file URI with a fragment", S + "png(tmp/'a.png'); l = tmp/'l.txt'; l.write_text((tmp/'a.png').as_uri() + '#f\\n'); "
         "list(S([str(l)], tmp/'o', None))"),
        ("line with surrogate escapes", S + "l = tmp/'l.txt'; l.write_bytes('a\\udcff.png\\n'.encode('utf-8', 'surrogatepass')); "
         "list(S([str(l)], tmp/'o', None))"),
        ("list given twice", S + "png(tmp/'a.png'); l = tmp/'l.txt'; l.write_text('a.png\\n'); "
         "n = len(list(S([str(l), str(l)], tmp/'o', None))); n == 1 or bad(f'{n} sources')"),
        ("stream iterated twice", S + "png(tmp/'a.png'); l = tmp/'l.txt'; l.write_text('a.png\\n'); s = S([str(l)], tmp/'o', None); "
         "first = list(s); again = list(s); (len(first), len(again)) == (1, 0) or bad((len(first), len(again)))"),
        ("manifest written from the spill", "from vitviz.batch.ray_engine import dump_json; import io; b = io.BytesIO(); "
         "dump_json({'a': 1, 'images': iter([{'p': '\\u2028\\x00'}]), 'z': [1]}, b); "
         "json.loads(b.getvalue()) == {'a': 1, 'images': [{'p': '\\u2028\\x00'}], 'z': [1]} or bad(b.getvalue()[:200])"),
    ],
    "compare-2": [
        ("kind max", "vitviz.compare(demo, demo, [png(tmp/'a.png')], kind='max')"),
        ("kind rollout", "vitviz.compare(demo, demo, [png(tmp/'a.png')], kind='rollout')"),
        ("images as arrays", "vitviz.compare(demo, demo, [np.zeros((40, 40, 3), np.uint8)])"),
        ("a 1x1 image", "vitviz.compare(demo, demo, [png(tmp/'a.png', size=1)])"),
        ("a 16-bit grey image", "from PIL import Image; Image.fromarray(np.full((40, 40), 60000, np.uint16)).save(tmp/'g.png'); "
         "vitviz.compare(demo, demo, [tmp/'g.png'])"),
        ("images a string", "vitviz.compare(demo, demo, str(png(tmp/'a.png')))"),
        ("export --compare with a newline in the name", "c, e = cli('export', '--model', demo.spec.source, '--compare', "
         "demo.spec.source, png(tmp/'a\\nb.png'), '--out', tmp/'o', '--quiet', '--no-verify'); c == 0 or bad((c, e[-200:]))"),
        ("export --compare heads past the model", "c, e = cli('export', '--model', demo.spec.source, '--compare', "
         "demo.spec.source, png(tmp/'a.png'), '--out', tmp/'o', '--which-heads', '0-4095'); c == 2 or bad(c)"),
        ("export --compare --maps token:1", "c, e = cli('export', '--model', demo.spec.source, '--compare', "
         "demo.spec.source, png(tmp/'a.png'), '--out', tmp/'o', '--maps', 'token:1'); c == 2 or bad(c)"),
        ("export --compare into a file", "(tmp/'o').write_text('x'); c, e = cli('export', '--model', demo.spec.source, "
         "'--compare', demo.spec.source, png(tmp/'a.png'), '--out', tmp/'o'); c == 2 or bad(c)"),
    ],
    "timeline-2": [
        ("box nan", "c, e = cli('export', '--timeline', tmp, png(tmp/'a.png'), '--out', tmp/'o', '--box', 'nan,0,1,1'); "
         "c == 2 or bad(c)"),
        ("box inverted", "c, e = cli('export', '--timeline', tmp, png(tmp/'a.png'), '--out', tmp/'o', '--box', '1,1,0,0'); "
         "c == 2 or bad(c)"),
        ("box of three numbers", "c, e = cli('export', '--timeline', tmp, png(tmp/'a.png'), '--out', tmp/'o', '--box', "
         "'0,0,1'); c == 2 or bad(c)"),
        ("checkpoint folder a loop to the run", "(tmp/'run').mkdir(); os.symlink(tmp/'run', tmp/'run'/'checkpoint-1'); "
         "from vitviz.core.analyses.timeline import open_run; open_run(tmp/'run')"),
        ("checkpoint number with 200 digits", "import shutil; (tmp/'run').mkdir(); "
         "shutil.copytree(demo.spec.source, tmp/'run'/('checkpoint-' + '9' * 200)); "
         "from vitviz.core.analyses.timeline import open_run; open_run(tmp/'run').model(0)"),
        ("run given as an image", "from vitviz.core.analyses.timeline import open_run; open_run(png(tmp/'a.png'))"),
        ("run of one checkpoint exported", "import shutil; (tmp/'run').mkdir(); shutil.copytree(demo.spec.source, "
         "tmp/'run'/'checkpoint-1'); c, e = cli('export', '--timeline', tmp/'run', png(tmp/'a.png'), '--out', tmp/'o', "
         "'--quiet', '--no-animation'); c in (0, 2) or bad((c, e[-200:]))"),
    ],
    "answers-2": [
        ("store a folder", "(tmp/'a.json').mkdir(); os.environ['VITVIZ_ANSWERS'] = str(tmp/'a.json'); "
         "from vitviz.catalog import answers; answers.read_all() == {} or bad('answers')"),
        ("store heads true", "s = tmp/'a.json'; s.write_text('{\"/m\": {\"heads\": true}}'); "
         "os.environ['VITVIZ_ANSWERS'] = str(s); from vitviz.catalog import answers; "
         "answers.answers_for('/m') == {} or bad(answers.answers_for('/m'))"),
        ("remember heads True", "os.environ['VITVIZ_ANSWERS'] = str(tmp/'a.json'); from vitviz.catalog import answers; "
         "answers.remember('/m', {'heads': True}); answers.answers_for('/m') == {} or bad(answers.answers_for('/m'))"),
        ("store attn_scale negative", "s = tmp/'a.json'; s.write_text('{\"/m\": {\"attn_scale\": -1}}'); "
         "os.environ['VITVIZ_ANSWERS'] = str(s); from vitviz.catalog import answers; "
         "answers.answers_for('/m') == {} or bad(answers.answers_for('/m'))"),
        ("store act unknown", "s = tmp/'a.json'; s.write_text('{\"/m\": {\"act\": \"__import__\"}}'); "
         "os.environ['VITVIZ_ANSWERS'] = str(s); from vitviz.catalog import answers; "
         "answers.answers_for('/m') == {} or bad(answers.answers_for('/m'))"),
        ("store empty variable", "os.environ['VITVIZ_ANSWERS'] = ''; from vitviz.catalog import answers; answers.read_all()"),
        ("remember with a NUL in the model", "os.environ['VITVIZ_ANSWERS'] = str(tmp/'a.json'); "
         "from vitviz.catalog import answers; answers.remember('/m\\x00x', {'heads': 4})"),
        ("remember keeps an unreadable store", "s = tmp/'a.json'; s.write_text('{' * 3 + 'not json'); "
         "os.environ['VITVIZ_ANSWERS'] = str(s); from vitviz.catalog import answers; "
         "before = s.read_text()\ntry:\n    answers.remember('/m', {'heads': 4})\nexcept VitvizError:\n    pass\n"
         "s.read_text() == before or bad('the unreadable store was overwritten: ' + s.read_text()[:80])"),
        ("two remembers at once", "import threading; os.environ['VITVIZ_ANSWERS'] = str(tmp/'a.json'); "
         "from vitviz.catalog import answers; ts = [threading.Thread(target=answers.remember, args=(f'/m{i}', {'heads': 4})) "
         "for i in range(8)]; [t.start() for t in ts]; [t.join() for t in ts]; "
         "n = len(answers.read_all()); n == 8 or bad(f'{n} of 8 remembered (lost updates)')"),
    ],
    "verify-2": [
        ("sizes empty", "vitviz.verify(demo, sizes=[])"),
        ("sizes a one-tuple", "vitviz.verify(demo, sizes=[(64,)])"),
        ("sizes True", "vitviz.verify(demo, sizes=[True])"),
        ("sizes whole float", "vitviz.verify(demo, sizes=[64.0])"),
        ("against timm: bare", "vitviz.verify(demo, against='timm:')"),
        ("against an unknown timm name", "vitviz.verify(demo, against='timm:vit_nope_nope')"),
        ("against hf: bare", "vitviz.verify(demo, against='hf:')"),
        ("device cpu:0", "vitviz.verify(demo, device='cpu:0')"),
        ("code without a factory", "(tmp/'c.py').write_text('x = 1'); vitviz.verify(demo, code=f'{tmp}/c.py')"),
        ("code a folder", "vitviz.verify(demo, code=f'{tmp}:make')"),
    ],
})


def run_surface(name: str, cases: list[tuple[str, str]], seconds: int) -> list[tuple[str, str, str, str]]:
    """Run one surface's cases in a child with a memory cap; a child that dies is a finding for its next case."""
    def limit() -> None:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))

    rows: list[tuple[str, str, str, str]] = []
    todo = list(cases)
    while todo:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")]),
               "VITVIZ_CACHE": tempfile.mkdtemp(prefix="fuzz-cache-"), "HF_HUB_OFFLINE": "1"}
        child = subprocess.run([sys.executable, "-c", CHILD, json.dumps(todo), str(DEMO), str(seconds)],
                               capture_output=True, text=True, env=env, preexec_fn=limit,
                               timeout=seconds * (len(todo) + 2) + 120)
        done = [json.loads(line[2:]) for line in child.stdout.splitlines() if line.startswith("@@")]
        rows += [(name, *row) for row in done]
        todo = todo[len(done):]
        if todo:    # the child died in this case (a crash, the memory cap): say so and go on with the rest
            tail = (child.stderr.strip().splitlines() or ["(no output)"])[-1][:200]
            rows.append((name, todo[0][0], "CRASH", f"exit {child.returncode}: {tail}"))
            todo = todo[1:]
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=sorted(SURFACES), action="append")
    parser.add_argument("--seconds", type=int, default=60, help="per case before it counts as a hang")
    args = parser.parse_args()
    rows = []
    for name in args.only or SURFACES:
        rows += run_surface(name, SURFACES[name], args.seconds)
    width = max(len(r[1]) for r in rows)
    for surface, case, outcome, detail in rows:
        print(f"{surface:13} {case:{width}} {outcome:9} {detail}")
    findings = [r for r in rows if r[2] != "clean"]
    print(f"\n{len(rows)} cases, {len(findings)} findings")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
