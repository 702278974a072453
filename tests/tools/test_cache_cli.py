"""``cachepipe make-dataset / warmup / stats / server``: exit codes, messages, JSON."""
from __future__ import annotations

import json
import re
import shutil

import pytest

from cachepipe.server.embedded import EmbeddedRedis
from tools.cli import main


@pytest.fixture
def cache_dir(tmp_path):
    path = tmp_path / "cache"
    yield path
    EmbeddedRedis(path).stop()


@pytest.fixture
def src(tiny_dataset, tmp_path):
    dst = tmp_path / "src"
    shutil.copytree(tiny_dataset / "train", dst)
    return dst


def _err_line(capsys):
    err = capsys.readouterr().err.strip().splitlines()
    return err[-1] if err else ""


def test_make_dataset(tmp_path, capsys):
    assert main(["make-dataset", str(tmp_path / "d"), "--classes", "3", "--per-class", "2",
                 "--val-per-class", "1", "--size", "20"]) == 0
    assert "wrote 6 training images" in capsys.readouterr().out
    assert len(list((tmp_path / "d" / "train").rglob("*.JPEG"))) == 6
    assert len(list((tmp_path / "d" / "val").rglob("*.JPEG"))) == 3
    assert main(["make-dataset", str(tmp_path / "e"), "--classes", "1"]) == 2
    assert "--classes 1: must be >= 2" in _err_line(capsys)  # names the flag


def test_warmup_embedded_then_nothing_to_do_then_stats_and_server(src, cache_dir, tmp_path, capsys):
    out_json = tmp_path / "w.json"
    args = ["warmup", str(src), "--cache-dir", str(cache_dir), "--cache-size", "32",
            "--l2-memory", "64mb", "--quiet"]
    assert main(args + ["--workers", "2", "--json", str(out_json)]) == 0
    out = capsys.readouterr().out
    assert "L1 written: 24 entries   L2 written: 24 entries" in out and "corrupt files: 0" in out
    report = json.loads(out_json.read_text())
    assert (report["samples"], report["l1_written"], report["l2_written"], report["corrupt"]) == (24, 24, 24, [])
    assert report["seconds"] > 0
    assert main(args + ["--workers", "1"]) == 0
    assert "nothing to do" in capsys.readouterr().out
    assert main(["stats", str(src), "--cache-dir", str(cache_dir), "--json"]) == 0  # finds the size
    cov = json.loads(capsys.readouterr().out)
    assert cov["l1"]["entries"] == 24 and cov["l2"]["kind"] == "embedded"
    assert [(r["size"], r["present"], r["partial"]) for r in cov["l2"]["sizes"]] == [(32, 24, {})]
    assert main(["stats", str(src), "--cache-dir", str(cache_dir), "--cache-size", "64"]) == 0
    assert "L2      embedded 64 px: 0/24 (0.0 %)" in capsys.readouterr().out  # another size: another namespace
    assert main(["server", "status", "--cache-dir", str(cache_dir)]) == 0
    assert "running: pid" in capsys.readouterr().out
    assert main(["server", "stop", "--cache-dir", str(cache_dir)]) == 0
    assert main(["server", "status", "--cache-dir", str(cache_dir)]) == 1
    assert main(["server", "start", "--cache-dir", str(cache_dir), "--l2-memory", "16mb"]) == 0
    assert "started: pid" in capsys.readouterr().out


def test_several_sizes_warm_in_turn_and_stats_finds_each(src, cache_dir, redis_servers, tmp_path, capsys):
    server = redis_servers(1)[0]
    base = ["--cache-dir", str(cache_dir), "--redis", server.url]
    assert main(["stats", str(src), *base]) == 0
    assert "L2      shards: nothing cached for this source" in capsys.readouterr().out
    assert main(["warmup", str(src), *base, "--cache-size", "40,24", "--quiet", "--workers", "1",
                 "--json", str(tmp_path / "w.json")]) == 0
    out = capsys.readouterr().out
    assert "24 in this node, 40 px" in out and "24 in this node, 24 px" in out
    reports = json.loads((tmp_path / "w.json").read_text())
    assert [(r["cache_size"], r["l1_written"], r["l2_written"]) for r in reports] == [(40, 24, 24), (24, 0, 24)]
    assert main(["stats", str(src), *base]) == 0
    out = capsys.readouterr().out
    assert "L2      shards 24 px: 24/24 (100.0 %)" in out and "L2      shards 40 px: 24/24 (100.0 %)" in out
    big = redis_servers(1, maxmemory="3mb")[0]
    assert main(["warmup", str(src), "--cache-dir", str(cache_dir), "--redis", big.url, "--quiet",
                 "--cache-size", "256", "--workers", "1"]) == 0
    capsys.readouterr()
    assert main(["stats", str(src), "--cache-dir", str(cache_dir), "--redis", big.url, "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)["l2"]["sizes"]
    assert row["size"] == 256 and 0 < row["present"] < 24 and row["partial"] == {"0/1": 24 - row["present"]}
    assert main(["stats", str(src), "--cache-dir", str(cache_dir), "--redis", big.url]) == 0
    assert f"a fixed subset (warm-up left out {24 - row['present']} of node 0/1" in capsys.readouterr().out


@pytest.mark.parametrize("command", ["warmup", "stats", "bench"])
@pytest.mark.parametrize("value", ["128,x", "128,,256", "0", "128,128", ""])
def test_bad_cache_size_list_is_one_line_naming_the_flag(src, cache_dir, command, value, capsys):
    argv = ["bench", "cache"] if command == "bench" else [command]
    assert main([*argv, str(src), "--cache-dir", str(cache_dir), "--cache-size", value, "--no-l2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"cachepipe {' '.join(argv)}: error: --cache-size {value!r}")


def test_train_warmup_and_stats_share_the_cache_flags(tiny_dataset, tmp_path, capsys):
    import argparse

    from tools import stats, train, warmup

    def options(module):
        parser = argparse.ArgumentParser()
        module.configure(parser)
        return {o for action in parser._actions for o in action.option_strings}

    shared = {"--cache-dir", "--redis", "--redis-cluster", "--no-l2", "--replicas", "--prefix", "--l2-memory",
              "--timeout", "--follow-external-links"}
    for module in (train, warmup, stats):
        assert shared <= options(module), module.__name__
    base = ["train", "--data", str(tiny_dataset), "--recipe", "demo", "--out", str(tmp_path / "o")]
    for flags, message in ((["--no-l2", "--redis", "redis://h:1"], "--no-l2 cannot be combined"),
                           (["--replicas", "2"], "replicas must be in 1..1"),
                           (["--redis-cluster", "h:1", "--replicas", "2"], "a cluster L2 replicates by itself")):
        assert main([*base, *flags]) == 2  # resolved at the entry point, before anything starts
        assert message in _err_line(capsys)


def test_bench_cache_takes_one_size(src, cache_dir, capsys):
    assert main(["bench", "cache", str(src), "--cache-dir", str(cache_dir), "--cache-size", "32,64"]) == 2
    assert _err_line(capsys).endswith("--cache-size 32,64: the benchmark takes one size")


def test_missing_or_invalid_source(tmp_path, cache_dir, capsys):
    assert main(["warmup", str(tmp_path / "nope"), "--cache-dir", str(cache_dir)]) == 3
    assert _err_line(capsys) == (f"cachepipe warmup: error: source '{tmp_path / 'nope'}' does not "
                                 f"exist or is not a directory")
    (tmp_path / "flat").mkdir()
    (tmp_path / "flat" / "a.jpg").write_bytes(b"x")
    assert main(["warmup", str(tmp_path / "flat"), "--cache-dir", str(cache_dir)]) == 3
    assert "Couldn't find any class folder in" in _err_line(capsys)
    assert main(["stats", str(tmp_path / "nope"), "--cache-dir", str(cache_dir)]) == 3


def test_partitions_need_a_shared_l2(src, cache_dir, capsys):
    assert main(["warmup", str(src), "--cache-dir", str(cache_dir), "--num-nodes", "2", "--quiet"]) == 2
    assert "needs an L2 placed by node" in _err_line(capsys)


def test_l1_size_flag_and_a_full_l1_that_says_what_it_needs(src, cache_dir, capsys):
    warm = ["warmup", str(src), "--cache-dir", str(cache_dir), "--no-l2", "--quiet", "--workers", "1"]
    assert main([*warm, "--l1-size", "70kb"]) == 6
    line = _err_line(capsys)
    assert "is full" in line and re.search(r"the source's 24 entries need about \d+ MiB", line)
    assert main([*warm, "--l1-size", "1gb"]) == 0
    assert main([*warm, "--l1-size", "many"]) == 2 and "--l1-size 'many'" in _err_line(capsys)


def test_unreachable_redis(src, cache_dir, redis_server, capsys):
    url = redis_server.url
    redis_server.kill()
    assert main(["warmup", str(src), "--cache-dir", str(cache_dir), "--redis", url, "--quiet"]) == 4
    line = _err_line(capsys)
    assert line.startswith(f"cachepipe warmup: error: cannot reach L2 shard {url}") and "refused" in line
    assert main(["stats", str(src), "--cache-dir", str(cache_dir), "--redis", url]) == 4
    assert main(["warmup", str(src), "--cache-dir", str(cache_dir), "--redis", "ftp://x"]) == 2
    assert "unknown L2 URL scheme" in _err_line(capsys)


def test_shm_store_by_l2_or_its_alias_redis_warm_stats_drop_and_bad_ones(src, cache_dir, shm_url, tmp_path, capsys):
    args = ["--cache-dir", str(cache_dir), "--cache-size", "32"]
    assert main(["warmup", str(src), *args, "--l2", shm_url, "--l2-memory", "64mb", "--quiet"]) == 0
    assert "L2 written: 24 entries" in capsys.readouterr().out
    assert main(["stats", str(src), *args, "--redis", shm_url]) == 0  # --redis: the old name of --l2
    out = capsys.readouterr().out
    assert "L2      shm 32 px: 24/24 (100.0 %)" in out and f"shard {shm_url}: 24 keys" in out and "of 64.0 MiB" in out
    (src / "class_0000" / "x.jpg").write_bytes(next((src / "class_0000").iterdir()).read_bytes())  # a new version
    assert main(["drop", str(src), *args, "--l2", shm_url, "--rescan"]) == 0
    assert ": 24 L2 keys, 1 cache dir entry" in capsys.readouterr().out
    assert main(["stats", str(src), *args, "--l2", shm_url]) == 0
    assert f"shard {shm_url}: 0 keys" in capsys.readouterr().out  # freed
    assert main(["warmup", str(src), *args, "--l2", f"shm://{tmp_path}/l2", "--quiet"]) == 4
    line = _err_line(capsys)
    assert line.startswith(f"cachepipe warmup: error: cannot use L2 store shm://{tmp_path}/l2 (") and "tmpfs" in line
    assert main(["warmup", str(src), *args, "--l2", "shm://host/x", "--quiet"]) == 2
    assert "an shm:// URL takes no host" in _err_line(capsys)


def test_l2_too_small_caches_a_fixed_subset_or_exits_5_with_require_full(src, cache_dir, redis_servers,
                                                                          tmp_path, capsys):
    server = redis_servers(1, maxmemory="3mb")[0]
    args = ["warmup", str(src), "--cache-dir", str(cache_dir), "--redis", server.url, "--workers", "1", "--quiet"]
    assert main(args + ["--require-full"]) == 5
    line = _err_line(capsys)
    assert f"L2 shard {server.url} is too small: 24 samples need ~" in line
    assert "needs maxmemory >=" in line and line.endswith("(--require-full)")
    assert server.client().dbsize() == 0  # refused before writing anything
    assert main(args + ["--json", str(tmp_path / "w.json")]) == 0
    report = json.loads((tmp_path / "w.json").read_text())
    cached = report["l2_cached"]
    assert 0 < cached < 24 and report["l2_uncached"] == 24 - cached and report["l2_write_errors"] == 0
    out = capsys.readouterr().out
    assert f"L2 holds {cached}/24 samples of this node at 256 px" in out and "did not fit" in out
    assert main(args) == 0  # the subset stays; at most the odd sample more fits once the first
    # run's client buffers are freed (Redis counts them in used_memory): seen once under load
    held = int(re.search(r"L2 holds (\d+)/24 samples", capsys.readouterr().out).group(1))
    assert cached <= held < 24
    assert main(args + ["--require-full"]) == 5
    assert "(--require-full)" in _err_line(capsys)


def test_strict_makes_corrupt_files_an_error(src, cache_dir, redis_server, capsys):
    victim = sorted(src.rglob("*.JPEG"))[3]
    victim.write_bytes(victim.read_bytes()[:200])
    rel = str(victim.relative_to(src))
    args = ["warmup", str(src), "--cache-dir", str(cache_dir), "--redis", redis_server.url,
            "--workers", "1", "--quiet", "--cache-size", "32"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "corrupt files: 1" in out and rel in out
    assert main(args + ["--strict"]) == 1
    captured = capsys.readouterr()
    assert "nothing to do" in captured.out and "1 corrupt file(s) (--strict)" in captured.err
