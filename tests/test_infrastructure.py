"""The shared test infrastructure itself: real Redis servers and real gloo groups."""
import pytest
import redis
import torch
import torch.distributed as dist

from tests.distributed import run_distributed


def test_redis_server_kill_and_restart(redis_server):
    client = redis_server.client()
    client.set("k", b"v")
    assert client.get("k") == b"v"
    redis_server.kill()
    with pytest.raises(redis.ConnectionError):
        redis_server.client().ping()
    redis_server.start()
    assert redis_server.client().get("k") is None  # persistence is off


def _all_reduce_rank(rank, world_size):
    t = torch.tensor([float(rank)])
    dist.all_reduce(t)
    return t.item()


def test_run_distributed_all_reduce():
    assert run_distributed(_all_reduce_rank, 3) == [3.0, 3.0, 3.0]


def _fail_on_rank_one(rank, world_size):
    if rank == 1:
        raise RuntimeError("boom on purpose")
    return rank


def test_run_distributed_reports_failing_rank():
    with pytest.raises(AssertionError, match="rank 1 failed"):
        run_distributed(_fail_on_rank_one, 2, timeout=60)


def test_cli_lists_commands(capsys):
    from tools.cli import main

    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "warmup" in out and "bench" in out
