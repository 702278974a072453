"""``cachepipe bench train`` (throughput mode): every source timed, the cache flags of ``cachepipe train``."""
from __future__ import annotations

import json

from tools.cli import main as cli
from tools.bench.harness.output import read_rows


def _bench(tmp_path, tiny_dataset, *flags):
    out = tmp_path / "rows.json"
    code = cli(["bench", "train", "--data", str(tiny_dataset), "--sources", "synthetic", "torch", "torch-gpu",
                "--device", "cpu", "--model", "resnet_small", "--size", "32", "--cache-size", "48",
                "--batch-size", "4", "--workers", "0", "--steps", "1", "--warmup-steps", "1", "--rounds", "1",
                "--json", str(out), *flags])
    return code, (read_rows(out) if out.exists() else None)


def test_synthetic_and_the_cached_loader_through_a_redis_shard(tmp_path, tiny_dataset, redis_server, capsys):
    code, rows = _bench(tmp_path, tiny_dataset, "--cache-dir", str(tmp_path / "cache"), "--redis", redis_server.url)
    assert code == 0
    by = {r["source"]: r for r in rows}
    assert by["synthetic"]["vs_synthetic"] == 1.0 and by["torch"]["images_per_s"] > 0
    assert by["torch-gpu"]["note"].startswith("needs CUDA")
    assert redis_server.client().dbsize() == 24  # the warm-up went to --redis, the loader read it
    assert "source" in capsys.readouterr().out


def test_cache_flags_are_train_s_and_a_bad_one_is_one_line(tmp_path, tiny_dataset, capsys):
    code, rows = _bench(tmp_path, tiny_dataset, "--no-l2")  # L1 + source, in a temporary --cache-dir
    assert code == 0 and {r["source"] for r in rows} == {"synthetic", "torch", "torch-gpu"}
    code, _ = _bench(tmp_path, tiny_dataset, "--no-l2", "--redis", "redis://127.0.0.1:1/0")
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err == ["cachepipe bench train: error: --no-l2 cannot be combined with --l2/--redis/--redis-cluster"]


def test_bench_train_takes_the_cache_flags_of_train():
    import argparse

    from tools import train
    from tools.bench import train as bench_train

    def options(module):
        parser = argparse.ArgumentParser()
        module.configure(parser)
        return {o for action in parser._actions for o in action.option_strings if "cache" in action.dest
                or action.dest in ("redis", "redis_cluster", "no_l2", "replicas", "prefix", "l2_memory", "l2_servers",
                                   "timeout", "max_file_size", "follow_external_links")}

    assert options(train) - {"--cache-size"} == options(bench_train) - {"--cache-size"}
