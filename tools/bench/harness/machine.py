"""The machine a benchmark ran on, as one line and as fields (CPU, cores, RAM, kernel,
torch, GPU, commit), so that every table says where its figures come from."""
from __future__ import annotations

import functools
import glob
import importlib.metadata
import os
import platform
import subprocess
from pathlib import Path

__all__ = ["machine", "machine_line"]

_REPO = Path(__file__).resolve().parents[3]


def _cpu() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def _gpus() -> list[str]:
    """GPU models from the NVIDIA driver's ``/proc`` entries (no torch import, no CUDA context)."""
    names = []
    for info in sorted(glob.glob("/proc/driver/nvidia/gpus/*/information")):
        try:
            with open(info) as f:
                names += [line.split(":", 1)[1].strip() for line in f if line.startswith("Model")]
        except OSError:
            continue
    return names


def _commit() -> str | None:
    """The checkout's commit (``+dirty`` with uncommitted changes to tracked files), None
    outside a git checkout."""
    try:
        head = subprocess.run(["git", "-C", str(_REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10)
        if head.returncode:
            return None
        dirty = subprocess.run(["git", "-C", str(_REPO), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("+dirty" if dirty else "")


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


@functools.cache
def machine() -> dict:
    """``cpu``, ``cores``, ``ram_gib``, ``kernel``, ``torch``, ``gpu`` (None: none),
    ``commit`` (None outside a checkout)."""
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    gpus = _gpus()
    return {"cpu": _cpu(), "cores": os.cpu_count(), "ram_gib": round(ram), "kernel": f"{platform.system()} "
            f"{platform.release()}", "torch": _version("torch"),
            "gpu": f"{len(gpus)} x {gpus[0]}" if len(set(gpus)) == 1 else (", ".join(gpus) or None),
            "commit": _commit()}


def line(info: dict) -> str:
    """:func:`machine`'s fields as one line."""
    return (f"{info['cores']} cores ({info['cpu']}), {info['ram_gib']} GiB RAM, {info['kernel']}, "
            f"torch {info['torch'] or 'not installed'}, {('GPU ' + info['gpu']) if info['gpu'] else 'no GPU'}, "
            f"commit {info['commit'] or 'unknown'}")


def machine_line() -> str:
    """This machine as one line, e.g. ``2 cores (Intel(R) Xeon(R) Processor), 24 GiB RAM,
    Linux 6.18.44, torch 2.13.0+cpu, no GPU, commit dd49bf6``."""
    return line(machine())
