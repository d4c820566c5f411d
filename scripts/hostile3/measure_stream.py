"""The Ray engine's driver on a long list, before and after it streamed its inputs (issue 34): time until the
first chunk of jobs is handed to Ray Data, the whole run's time and the process's peak memory.

Ray itself is left out (the same for both: what is measured is what the driver holds): the Ray Data run is
replaced by one that builds the rows Ray Data would be given and marks every image done, so the listing, the
naming, the jobs, the settling and the manifest (written as the CLI writes it) all run for every image.

    git show 48713d9:vitviz/batch/ray_engine.py > /tmp/h34/old_ray_engine_48713d9.py   # before streaming
    PYTHONPATH=. python scripts/hostile3/measure_stream.py old 200000
    PYTHONPATH=. python scripts/hostile3/measure_stream.py new 200000

Each run is a process of its own (peak RSS is per process). The list's paths need not exist: neither engine
looks at a listed file before a decoding task reads it.
"""
from __future__ import annotations

import importlib.util
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

OLD = "/tmp/h34/old_ray_engine_48713d9.py"


def make_list(n: int) -> Path:
    path = Path(f"/tmp/h34/list_{n}.txt")
    if not path.exists():
        with open(path, "w") as f:
            f.writelines(f"imgs/d{i % 100}/img_{i}.png\n" for i in range(n))
    return path


def plan():  # noqa: ANN201
    from vitviz.batch.plan import Plan
    from vitviz.core.analyses.maps import MapKind
    from vitviz.core.drawing.render import RenderOptions

    return Plan(maps=[MapKind.parse("cls"), MapKind.parse("rollout")], layers=[11], heads=["mean"],
                render=RenderOptions())


def peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def progress(start: float, listed: int) -> None:
    """A line on stderr as each chunk is listed (a run stopped early still says how far it got)."""
    print(json.dumps({"listed": listed, "s": round(time.perf_counter() - start, 1), "peak_rss_mib": round(peak_mib())}),
          file=sys.stderr, flush=True)


def run_new(listing: Path, out: Path) -> dict:
    from vitviz.batch import ray_engine as engine

    start = time.perf_counter()
    first: list[float] = []

    def fake_run(self, todo):  # noqa: ANN001, ANN202
        first.append(time.perf_counter() - start) if not first else None
        rows = [self._row(job) for job in todo]
        for job, row in zip(todo, rows):
            job.status, job.written = "done", list(job.outputs)
            self.counts["done"] += 1

    engine.RayExporter._run = fake_run
    engine.RayExporter._present = lambda self, jobs: set()   # nothing on disk: the files are not written here
    engine.RayExporter._settle = lambda self, jobs: self.counts.__setitem__(
        "files", self.counts["files"] + sum(len(j.written) for j in jobs))
    sources = engine.SourceStream([str(listing)], out, None)
    dest = engine.Destination(out)
    exporter = engine.RayExporter(None, {}, "cpu", None, plan(), sources, out, dest,  # type: ignore[arg-type]
                                  engine.RaySettings(), quiet=True, on_listed=lambda n: progress(start, n))
    exporter.run()
    dest.write_json("manifest.json", {"summary": exporter.counts, "images": exporter.records()})
    return {"first_job_s": first[0], "total_s": time.perf_counter() - start, "images": exporter.total}


def run_old(listing: Path, out: Path) -> dict:
    spec = importlib.util.spec_from_file_location("old_ray_engine", OLD)
    engine = importlib.util.module_from_spec(spec)
    sys.modules["old_ray_engine"] = engine
    spec.loader.exec_module(engine)
    from vitviz.batch.jobs import unique_stems
    from vitviz.batch.plan import safe_stem
    from vitviz.core.files import remove_stale_temps, write_json_atomic

    start = time.perf_counter()
    first: list[float] = []

    def fake_run(self, todo):  # noqa: ANN001, ANN202
        first.append(time.perf_counter() - start)
        progress(start, len(todo))
        rows = [self._row(job) for job in todo]
        for job, row in zip(todo, rows):
            job.status, job.written = "done", list(job.outputs)
            self.counts["done"] += 1

    engine.RayExporter._run = fake_run
    engine.RayExporter._quiet_ray = staticmethod(lambda: None)
    engine.RayExporter._connect = lambda self: False
    engine.RayExporter._size = lambda self, joined: None
    engine.RayLogs.start = lambda self: None
    engine.RayLogs.stop = lambda self: None
    engine.RayExporter._settle = lambda self: None
    # as the CLI did before: every source listed, named and made a job before the run
    sources = engine.collect_sources([str(listing)], out, None)
    pairs = [(s.path, s.sub) for s in sources]
    stems = unique_stems([(s.named, s.sub) for s in sources], safe_stem)
    jobs = plan().jobs(pairs, out, stems)
    remove_stale_temps([path for job in jobs for path in job.outputs] + [out / "manifest.json"])
    exporter = engine.RayExporter(None, {}, "cpu", None, plan(), jobs, stems, out, sources, engine.Destination(out),
                                  engine.RaySettings())
    exporter.run()
    write_json_atomic(out / "manifest.json", {"summary": exporter.counts, "images": [j.record(out) for j in jobs]})
    return {"first_job_s": first[0], "total_s": time.perf_counter() - start, "images": len(jobs)}


if __name__ == "__main__":
    which, n = sys.argv[1], int(sys.argv[2])
    listing = make_list(n)
    import ray.data  # noqa: F401 - both drivers import Ray (and torch: the driver loads the model) before a run
    import torch  # noqa: F401

    base = peak_mib()
    with tempfile.TemporaryDirectory(prefix="vitviz-measure-") as tmp:
        (Path(tmp) / "out").mkdir()
        result = (run_old if which == "old" else run_new)(listing, Path(tmp) / "out")
        size = (Path(tmp) / "out" / "manifest.json").stat().st_size
    print(json.dumps({"engine": which, "lines": n, **{k: round(v, 2) if isinstance(v, float) else v
                                                       for k, v in result.items()},
                      "peak_rss_mib": round(peak_mib()), "rss_after_imports_mib": round(base),
                      "manifest_mib": round(size / 2**20, 1)}))
