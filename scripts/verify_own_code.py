"""`vitviz.verify` of timm architectures vitviz runs by their own code, built tiny as the zoo sweep builds them
(`scripts/trial_zoo.py`'s `build_timm`) and handed over live: one line per architecture with its verdict, the largest
attention and output differences, and the reason when it is not verified.

    PYTHONPATH=$PWD python scripts/verify_own_code.py cait_m36_384 hiera_base_224 levit_128 efficientformerv2_l
"""
from __future__ import annotations

import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))


def main(archs: list[str]) -> int:
    import trial_zoo

    import vitviz

    warnings.simplefilter("ignore")
    for arch in archs:
        start = time.time()
        try:
            model, _ = trial_zoo.build_timm(arch)
            check = vitviz.verify(vitviz.load(model, device="cpu"))
            print(f"{arch}: {check.verdict} (attention {check.max_attention}, output {check.max_output}) "
                  f"{check.reason[:200]} [{time.time() - start:.1f} s]", flush=True)
        except Exception as e:  # noqa: BLE001 - said per architecture, the next one runs
            print(f"{arch}: {type(e).__name__}: {str(e)[:200]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
