"""The benchmark harness (tools/bench/harness): a benchmark is one module plus one registry
entry; the harness owns the shared flags, the output and the one-line errors."""
from __future__ import annotations

import json
import sys
import textwrap

import pytest

from tools.bench import BENCHMARKS
from tools.bench.harness.registry import register_benchmark
from tools.cli import main

TINY = '''
"""A tiny benchmark: n rows of squares."""
from tools.bench.harness import Result


def configure(parser):
    parser.add_argument("--n", type=int, default=2, help="rows")


def run(args):
    rows = [{"i": i, "square": i * i, "hidden": "only in the JSON"} for i in range(args.n)]
    def figure(path):
        path.write_bytes(b"PNG of " + str(args.n).encode())
    return Result(rows, ["i", "square"], notes=["squares of 0..n-1"], headline=f"{args.n} squares", figure=figure)
'''

# the arguments each benchmark needs before its flags are parsed at all (positional SRC)
NEEDS = {"cache": ["SRC", "--cache-dir", "C"], "loader": ["SRC", "--cache-dir", "C"], "feed": ["SRC", "--cache-dir", "C"],
         "io": ["SRC", "--cache-dir", "C"]}


@pytest.fixture
def tiny(tmp_path, monkeypatch):
    (tmp_path / "tiny_bench.py").write_text(textwrap.dedent(TINY))
    monkeypatch.syspath_prepend(str(tmp_path))
    register_benchmark("tiny", "tiny_bench", "a tiny benchmark", plot=True)
    yield "tiny"
    del BENCHMARKS["tiny"]
    sys.modules.pop("tiny_bench", None)


def test_a_benchmark_is_one_module_and_one_registry_entry(tiny, tmp_path, capsys):
    assert main(["bench", "tiny", "--n", "3", "--json", str(tmp_path / "r.json"), "--plot", str(tmp_path / "f.png")]) == 0
    out = capsys.readouterr().out
    assert "| i | square |" in out and "| 2 | 4      |" in out and "hidden" not in out
    assert "squares of 0..n-1" in out and "\nmachine: " in out and " cores (" in out and "commit " in out
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["benchmark"] == "tiny" and doc["command"].startswith("cachepipe bench tiny --n 3")
    assert doc["rows"][2] == {"i": 2, "square": 4, "hidden": "only in the JSON"} and doc["columns"] == ["i", "square"]
    assert doc["headline"] == "3 squares" and doc["machine_info"]["cores"] > 0 and doc["date"].endswith("Z")
    assert (tmp_path / "f.png").read_bytes() == b"PNG of 3"
    assert _exit(["bench", "--help"]) == 0
    assert "tiny" in capsys.readouterr().out  # the list is the registry's


def test_the_registry_refuses_bad_names_and_a_second_module():
    with pytest.raises(ValueError, match="lower-case letters"):
        register_benchmark("Bad Name", "x", "y")
    with pytest.raises(ValueError, match="registered already"):
        register_benchmark("cache", "somewhere.else", "another cache benchmark")


def _exit(argv) -> int:
    try:
        return main(argv)
    except SystemExit as exc:  # argparse's own checks
        return exc.code


@pytest.mark.parametrize("name", sorted(BENCHMARKS))
def test_a_flag_the_benchmark_does_not_take_is_one_line_exit_2(name, capsys):
    assert _exit(["bench", name, *NEEDS.get(name, []), "--no-such-flag"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == f"cachepipe bench {name}: error: unrecognized arguments: --no-such-flag"


@pytest.mark.parametrize("name", sorted(BENCHMARKS))
def test_an_unwritable_json_path_is_refused_before_any_work(name, tmp_path, capsys):
    (tmp_path / "file").write_text("not a folder")
    argv = ["bench", name, *[str(tmp_path / a) if a in ("SRC", "C") else a for a in NEEDS.get(name, [])]]
    assert _exit([*argv, "--json", str(tmp_path / "file" / "r.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"cachepipe bench {name}: error: --json ") and "not a directory" in err[0]
    assert not (tmp_path / "C").exists()  # no cache dir made: nothing ran


@pytest.mark.parametrize("name", sorted(n for n, b in BENCHMARKS.items() if b.cluster is not None))
@pytest.mark.parametrize("value, message", [("2by2", r"expected MxN\[@MBIT\]"), ("1x1", "at least 2 processes"),
                                            ("2x2@0", "MBIT must be > 0")])
def test_a_malformed_emulate_is_one_line_exit_2(name, value, message, capsys):
    import re

    assert _exit(["bench", name, *NEEDS.get(name, []), "--emulate", value]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"cachepipe bench {name}: error: --emulate '{value}'")
    assert re.search(message, err[0])


def test_plot_is_offered_only_where_a_figure_is_drawn(capsys):
    assert _exit(["bench", "l2", "--plot", "x.png"]) == 2
    assert "unrecognized arguments: --plot" in capsys.readouterr().err
