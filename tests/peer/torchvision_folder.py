"""Run torchvision's own ``ImageFolderTestCase``/``DatasetFolderTestCase`` against torchvision and cachepipe.

Usage (docs/peer-suites.md)::

    python -m tests.peer.torchvision_folder --vision /tmp/vision --python /tmp/tvenv/bin/python

``--vision``: a checkout of pytorch/vision (its ``test/``: ``test_datasets.py``,
``datasets_utils.py``, ``common_utils.py``); nothing of it is kept in this repository.
``--python``: an interpreter where torchvision imports (torch's and torchvision's wheels must
match) and cachepipe's dependencies are installed. The two test classes and the imports of
``test_datasets.py`` are taken out of the file as they are (by ``ast``, so the rest of the
file, with its hundred other datasets, is not needed) into a module of a temporary
directory, twice: once as they are (target ``torchvision``) and once with
``datasets = tests.peer.cachepipe_datasets.datasets`` after the imports (target
``cachepipe``: ``ImageFolder``/``DatasetFolder`` are ``CachedImageFolder(output="pil")``).
Each runs under pytest with the checkout's ``test/`` on the path; the table lists every
test with both outcomes. Exit status: 0 when every test that passes for torchvision passes
for cachepipe, 1 otherwise, 2 for a bad flag.
"""
from __future__ import annotations

import argparse
import ast
import json
import os
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

__all__ = ["CASES", "extract", "main", "run_target"]

CASES = ("ImageFolderTestCase", "DatasetFolderTestCase")
TARGETS = ("torchvision", "cachepipe")
REPO = Path(__file__).resolve().parents[2]
_REBIND = "from tests.peer.cachepipe_datasets import datasets  # ImageFolder/DatasetFolder: CachedImageFolder\n"


def extract(test_file: Path, target: str) -> str:
    """The imports and the :data:`CASES` classes of torchvision's ``test_datasets.py``, as a module."""
    text = test_file.read_text()
    tree = ast.parse(text, str(test_file))
    lines = text.splitlines()

    def source(node: ast.stmt) -> str:  # whole lines, so a comment that ends the last one stays
        first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        return "\n".join(lines[first - 1:node.end_lineno])

    imports = [source(n) for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    classes = {n.name: source(n) for n in tree.body if isinstance(n, ast.ClassDef)}
    missing = [c for c in CASES if c not in classes]
    if missing:
        raise ValueError(f"--vision: {test_file} has no {', '.join(missing)}")
    head = "\n".join(imports) + "\n"
    return head + (_REBIND if target == "cachepipe" else "") + "\n\n" + "\n\n\n".join(classes[c] for c in CASES) + "\n"


def _outcomes(junit: Path) -> dict[str, tuple[str, str]]:
    """``Class.test -> (outcome, first line of the reason)`` from pytest's JUnit XML."""
    out = {}
    for case in ET.parse(junit).iter("testcase"):
        name = f"{case.get('classname', '').rpartition('.')[2]}.{case.get('name')}"
        outcome, why = "passed", ""
        for tag in ("failure", "error", "skipped"):
            node = case.find(tag)
            if node is not None:
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                why = (node.get("message") or node.text or "").strip().splitlines()[:1]
                why = why[0][:160] if why else ""
                break
        out[name] = (outcome, why)
    return out


def run_target(target: str, vision_test: Path, python: str, work: Path, l2: str = "none",
               timeout: float = 600) -> dict[str, tuple[str, str]]:
    """Run the extracted cases for ``target`` under ``python``; outcomes by test."""
    where = work / target
    where.mkdir(parents=True)
    (where / "test_folder_peer.py").write_text(extract(vision_test / "test_datasets.py", target))
    (where / "pytest.ini").write_text("[pytest]\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(vision_test), str(REPO)]),
               PEER_CACHE_ROOT=str(work / f"{target}-caches"), PEER_L2=l2)
    junit = where / "junit.xml"
    proc = subprocess.run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", str(where / "pytest.ini"),
                           "--rootdir", str(where), f"--junitxml={junit}", "test_folder_peer.py"],
                          cwd=where, env=env, capture_output=True, text=True, timeout=timeout)
    if not junit.is_file():
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-5:]
        raise RuntimeError(f"pytest for {target} wrote no results (exit {proc.returncode}): {' | '.join(tail)}")
    return _outcomes(junit)


def _stop_servers(root: Path) -> None:
    """Stop embedded servers left in the cache dirs of a run (``--l2 embedded``)."""
    from cachepipe.server.embedded import EmbeddedRedis

    for d in sorted(root.glob("*-caches/*")):
        if (d / "redis").is_dir():
            EmbeddedRedis(d).stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.peer.torchvision_folder", description=__doc__.split("\n")[0])
    parser.add_argument("--vision", required=True, help="checkout of pytorch/vision (its test/ is used)")
    parser.add_argument("--python", default=sys.executable,
                        help="interpreter where torchvision imports (default: this one)")
    parser.add_argument("--target", choices=("both", *TARGETS), default="both", help="what to run (default: both)")
    parser.add_argument("--l2", choices=("none", "embedded"), default="none",
                        help="cachepipe's L2: none (L1 only, default) or the embedded redis-server per cache dir")
    parser.add_argument("--json", default=None, help="also write the table as JSON to this file")
    args = parser.parse_args(argv)
    vision_test = Path(args.vision).absolute() / "test"
    for name in ("test_datasets.py", "datasets_utils.py", "common_utils.py"):
        if not (vision_test / name).is_file():
            print(f"torchvision_folder: error: --vision {args.vision}: no test/{name}", file=sys.stderr)
            return 2
    targets = TARGETS if args.target == "both" else (args.target,)
    work = Path(tempfile.mkdtemp(prefix="cachepipe-peer-tv-"))
    try:
        results = {t: run_target(t, vision_test, args.python, work, args.l2) for t in targets}
    except (RuntimeError, ValueError, subprocess.TimeoutExpired) as exc:
        print(f"torchvision_folder: error: {exc}", file=sys.stderr)
        return 1
    finally:
        _stop_servers(work)
        shutil.rmtree(work, ignore_errors=True)
    tests = sorted({name for r in results.values() for name in r})
    rows = [{"test": name, **{t: results[t].get(name, ("missing", ""))[0] for t in targets},
             **{f"{t}_reason": results[t].get(name, ("", ""))[1] for t in targets if
                results[t].get(name, ("passed", ""))[0] != "passed"}} for name in tests]
    print("| test | " + " | ".join(targets) + " |\n|---|" + "---|" * len(targets))
    for row in rows:
        print(f"| {row['test']} | " + " | ".join(row[t] for t in targets) + " |")
    for row in rows:
        for t in targets:
            if f"{t}_reason" in row:
                print(f"{t} {row['test']}: {row[f'{t}_reason']}")
    regressions = [r["test"] for r in rows if len(targets) == 2 and r["torchvision"] == "passed"
                   and r["cachepipe"] != "passed"]
    summary = {t: {o: sum(r[t] == o for r in rows) for o in ("passed", "failed", "error", "skipped")} for t in targets}
    print(f"summary: {json.dumps(summary)}; passing for torchvision, not for cachepipe: {regressions or 'none'}")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "summary": summary, "regressions": regressions,
                                               "l2": args.l2}, indent=1) + "\n")
    return 1 if regressions else 0


if __name__ == "__main__":
    sys.exit(main())
