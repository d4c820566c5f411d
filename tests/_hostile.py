"""Helpers of the hostile-input tests (issue 13; tests/core/reading/test_checkpoint.py, test_validate.py,
tests/batch/test_pipeline.py; issues 20 and 34 in the tests of the modules they attack): the promise every mutation is
held to (`refused`, `outcome`), a fresh Python with a timeout for hangs (`run_script`), the timm hub config of the
tiny model (`HUB_CONFIG`), a load that keeps its warnings quiet (`quiet_load`), a copy of a folder with one config
field changed (`variant`), a named pipe (`fifo`), a random picture (`random_png`) and a training run of copies of one
checkpoint (`run_folder`); `DEMO`, the bundled demo model's folder."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path
from typing import Any, Callable

import pytest
from _tiny import tiny_state_dict
from safetensors.torch import save_file

from vitviz.errors import VitvizError

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "resources" / "demo"   # the bundled demo model


NET = "please report"   # the loader's last-resort message: no mutation here may need it


def refused(fn: Callable[[], Any], error: type[VitvizError] = VitvizError, *needles: str) -> str:
    """Run `fn`, expect `error` whose message holds every needle; return the message."""
    with pytest.raises(error) as caught:
        fn()
    text = str(caught.value)
    for needle in needles:
        assert needle in text, f"{needle!r} not in {text!r}"
    assert NET not in text, text
    return text


def outcome(fn: Callable[[], Any], name: str) -> str:
    """'loaded', or the VitvizError's class; anything else fails, as does an error that does not name `name`."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fn()
    except VitvizError as e:
        assert name in str(e), f"the error does not name {name!r}: {e}"
        assert NET not in str(e), f"only the loader's safety net caught it: {e}"
        return type(e).__name__
    return "loaded"


def subprocess_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(REPO / "tests"), env.get("PYTHONPATH", "")])
    env["PYTHONWARNINGS"] = "ignore"
    return env


def run_script(script: str, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """Run `script` in a fresh Python; a hang fails the test with what was printed so far."""
    try:
        return subprocess.run([sys.executable, "-c", textwrap.dedent(script), *args], capture_output=True, text=True,
                              timeout=timeout, env=subprocess_env())
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"hung for {timeout} s; last output: {(e.stdout or b'')[-500:]!r} {(e.stderr or b'')[-500:]!r}")


HUB_CONFIG = {"architecture": "vit_tiny_patch8_32", "num_classes": 5,
              "model_args": {"num_heads": 2, "img_size": 32, "patch_size": 8, "embed_dim": 32, "depth": 2},
              "pretrained_cfg": {"input_size": [3, 32, 32], "crop_pct": 0.9, "interpolation": "bicubic",
                                 "mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5], "num_classes": 5}}


def _copy(path: Path, dest: Path) -> Path:
    if path.is_dir():
        shutil.copytree(path, dest)
    else:
        shutil.copy(path, dest)
    return dest


def _hub_with(dest: Path, config: Any) -> Path:
    dest.mkdir()
    save_file(tiny_state_dict(), str(dest / "model.safetensors"))
    (dest / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    return dest


def quiet_load(path: Path, **kw: object) -> Any:
    """`vitviz.load(path, device="cpu", **kw)` with its warnings (the assumptions said) kept quiet."""
    import vitviz

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return vitviz.load(path, device="cpu", **kw)


def variant(src: Path, dest: Path, file: str, section: str, field: str, value: object) -> Path:
    """A copy of the folder `src` whose `file` has `section.field` (section '' = the top level) set to `value`."""
    shutil.copytree(src, dest)
    data = json.loads((dest / file).read_text())
    target = data
    for part in [p for p in section.split(".") if p]:
        target = target.setdefault(part, {})
    target[field] = value
    (dest / file).write_text(json.dumps(data))
    return dest


def fifo(path: Path) -> Path:
    """A named pipe at `path`: reading it blocks until someone writes, so nothing may read it unchecked."""
    os.mkfifo(path)
    return path


def random_png(path: Path, seed: int = 0, size: int = 32) -> Path:
    """A `size` x `size` random RGB PNG at `path` (its folder made)."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(rng.integers(0, 255, (size, size, 3), dtype=np.uint8)).save(path)
    return path


def run_folder(tmp_path: Path, source: Path, count: int = 2) -> Path:
    """A training run at `tmp_path/run`: `count` copies of the checkpoint folder `source` (checkpoint-1/, ...)."""
    run = tmp_path / "run"
    for k in range(count):
        shutil.copytree(source, run / f"checkpoint-{k + 1}")
    return run
