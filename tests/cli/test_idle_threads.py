"""The window's entry lets torch's idle threads sleep (`vitviz.cli.window.quiet_idle_threads`): OMP_WAIT_POLICY is
PASSIVE before torch is imported, a policy the user set is kept, and nothing is set once torch is loaded (libgomp
read the policy then). Each case runs in a fresh interpreter: this one has torch loaded."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# run_window with the window itself replaced: what the environment holds, and whether torch was loaded, when the
# window would start
PROBE = r"""
import os, sys, types
import vitviz.gui
fake = types.ModuleType("vitviz.gui.app")
fake.run_app = lambda args: print(os.environ.get("OMP_WAIT_POLICY"), "torch" in sys.modules) or 0
sys.modules["vitviz.gui.app"] = fake
if sys.argv[1] == "torch-first":
    import torch
import argparse
from vitviz.cli.window import add_window_arguments, run_window
parser = argparse.ArgumentParser()
add_window_arguments(parser)
raise SystemExit(run_window(parser.parse_args([])))
"""


def _probe(case: str, policy: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if policy is not None:
        env["OMP_WAIT_POLICY"] = policy
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    done = subprocess.run([sys.executable, "-c", PROBE, case], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize(("case", "policy", "seen"), [
    ("plain", None, "PASSIVE False"),          # set, and torch not loaded yet: libgomp will read it
    ("plain", "ACTIVE", "ACTIVE False"),       # the user's own policy kept
    ("torch-first", None, "None True"),        # too late to matter: not set, not pretended
])
def test_the_window_lets_idle_torch_threads_sleep(case: str, policy: str | None, seen: str) -> None:
    assert _probe(case, policy) == seen
