"""Listing a 200,000-line list: this branch's `collect_sources` against b40acc5's (its module, with the
`is_image_file` and `inside` it used then), time and peak memory of the process.

    git show b40acc5:vitviz/batch/ray_engine.py > /tmp/h34/old_ray_engine.py
    python -c "open('/tmp/h34/big.txt','w').writelines(f'imgs/d{i%100}/img_{i}.png\\n' for i in range(200000))"
    PYTHONPATH=. python scripts/hostile3/measure_list.py old
    PYTHONPATH=. python scripts/hostile3/measure_list.py new
"""
from __future__ import annotations

import importlib.util
import resource
import sys
import time
from pathlib import Path, PurePosixPath


def old_module():  # noqa: ANN201
    spec = importlib.util.spec_from_file_location("old_ray_engine", "/tmp/h34/old_ray_engine.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["old_ray_engine"] = mod
    spec.loader.exec_module(mod)
    from vitviz.core.running.images import IMAGE_EXTENSIONS

    def inside(sub):  # noqa: ANN001, ANN202
        parts = [p for p in PurePosixPath(Path(sub).as_posix()).parts if p not in ("..", ".", "/")]
        return Path(*parts) if parts else Path(".")

    mod.is_image_file = lambda p: Path(p).suffix.lower() in IMAGE_EXTENSIONS
    mod.inside = inside
    return mod


if __name__ == "__main__":
    which = sys.argv[1]
    if which == "old":
        module = old_module()
    else:
        import vitviz.batch.ray_engine as module
    start = time.perf_counter()
    sources = module.collect_sources(["/tmp/h34/big.txt"], Path("/tmp/h34/out"), None)
    print(which, len(sources), f"{time.perf_counter() - start:.1f} s",
          f"max RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")
