"""Jobs on the emulated cluster (tools/bench/harness): per-node Redis servers, torchrun-style
ranks, link counters, the ``--emulate`` flag."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from tools.bench.harness.cluster import EmulatedCluster, netns_unavailable_reason
from tools.bench.harness.emulate import Emulation, parse_emulate
from tools.bench.harness.jobs import JobFailed, launch, link_bytes, run_on_node
from tools.bench.harness.redis import private_redis

REASON = netns_unavailable_reason()
def netns(test):
    """Needs root and iproute2 for network namespaces."""
    return pytest.mark.netns(pytest.mark.skipif(REASON is not None, reason=str(REASON))(test))

# a rank as a script (a process of its own) and as a module of this interpreter (forked from
# the fork server: NOTE [forked emulated ranks] in tools/forked_command.py)
PROBE = {"script": lambda *a: [sys.executable, str(Path(__file__).with_name("rank_probe.py")), *map(str, a)],
         "module": lambda *a: [sys.executable, "-m", "tests.tools.rank_probe", *map(str, a)]}
_SET = ("import redis, sys; r = redis.Redis.from_url(sys.argv[1]); r.set('k', b'x' * int(sys.argv[2])); "
        "assert len(r.get('k')) == int(sys.argv[2])")


@pytest.mark.parametrize("text, want", [("2x2@10", Emulation(2, 2, 10.0)), ("4x1@0.5", Emulation(4, 1, 0.5)),
                                        ("2x2", Emulation(2, 2, 25.0)), (" 1x4@200 ", Emulation(1, 4, 200.0))])
def test_parse_emulate(text, want):
    assert parse_emulate(text, default_mbit=25.0) == want


@pytest.mark.parametrize("text, match", [("2by2@10", r"expected MxN\[@MBIT\]"), ("2x2@", r"expected MxN\[@MBIT\]"),
                                         ("2x2@-5", r"expected MxN\[@MBIT\]"), ("2x2@0", "MBIT must be > 0"),
                                         ("0x2@10", "1 <= M <= 250"), ("1x1@10", "at least 2 processes"),
                                         ("2x0@10", "N >= 1"), ("251x1@10", "M <= 250"), ("", r"expected MxN\[@MBIT\]")])
def test_parse_emulate_rejects_bad_values_naming_the_flag(text, match):
    with pytest.raises(ValueError, match=match) as info:
        parse_emulate(text, default_mbit=10.0)
    assert str(info.value).startswith("--emulate ")


def test_parse_emulate_without_a_rate_or_a_default_is_loopback():
    assert parse_emulate("2x1@200") == Emulation(2, 1, 200.0)
    assert parse_emulate("2x2") == Emulation(2, 2, None)  # NOTE [emulate flag]: no namespaces
    assert Emulation(2, 2, None).describe() == "2x2 on loopback (no rate limit)"


def _envs(tmp_path, world):
    return [json.loads((tmp_path / f"env{r}.json").read_text()) for r in range(world)]


@netns
@pytest.mark.parametrize("kind", sorted(PROBE))
def test_ranks_are_node_major_inside_their_namespaces(tmp_path, monkeypatch, kind):
    monkeypatch.chdir(tmp_path)
    with EmulatedCluster(nodes=2, inter_mbit=100) as cluster:
        codes = launch(cluster, lambda r: PROBE[kind](tmp_path / f"env{r}.json"), local_size=2, port=29612,
                       log_dir=tmp_path / "logs", timeout=60)
        assert codes == [0, 0, 0, 0]
        envs = _envs(tmp_path, 4)
    for r, env in enumerate(envs):
        assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"]) == (str(r), "4", "2")
        assert (env["LOCAL_RANK"], env["GROUP_RANK"]) == (str(r % 2), str(r // 2))
        assert (env["MASTER_ADDR"], env["MASTER_PORT"], env["GLOO_SOCKET_IFNAME"]) == (cluster.address(0), "29612", "eth0")
        assert env["interfaces"] == ["eth0", "lo"]  # the node's namespace, not this host's
        assert env["cwd"] == str(tmp_path) and env["main"] == "__main__"
        assert env["argv"][1:] == [str(tmp_path / f"env{r}.json")] and env["argv"][0].endswith("rank_probe.py")


@pytest.mark.parametrize("kind", sorted(PROBE))
def test_loopback_job_without_a_cluster(tmp_path, kind):
    codes = launch(None, lambda r: PROBE[kind](tmp_path / f"env{r}.json"), local_size=1, nodes=2, port=29613,
                   timeout=60)
    assert codes == [0, 0]
    envs = _envs(tmp_path, 2)
    assert [e["GROUP_RANK"] for e in envs] == ["0", "1"] and envs[0]["MASTER_ADDR"] == "127.0.0.1"
    assert [e["preloaded"] for e in envs] == [kind == "module"] * 2


def test_a_forked_rank_runs_the_thread_count_of_its_environment(tmp_path):
    """torch sized its pool in the fork server; the rank's OMP_NUM_THREADS must still decide
    (NOTE [forked emulated ranks]): 3 is nobody's default here."""
    codes = launch(None, lambda r: PROBE["module"](tmp_path / f"env{r}.json"), local_size=1, nodes=2, port=29615,
                   env={"OMP_NUM_THREADS": "3"}, timeout=60)
    assert codes == [0, 0]
    assert [(e["preloaded"], e["threads"]) for e in _envs(tmp_path, 2)] == [(True, 3)] * 2


def test_without_fork_every_rank_is_a_new_interpreter(tmp_path):
    codes = launch(None, lambda r: PROBE["module"](tmp_path / f"env{r}.json"), local_size=2, nodes=1, port=29614,
                   timeout=60, fork=False)
    assert codes == [0, 0] and not any(e["preloaded"] for e in _envs(tmp_path, 2))


@pytest.mark.parametrize("kind", sorted(PROBE))
def test_a_failing_rank_stops_the_job_and_is_named(tmp_path, kind):
    def argv(rank):
        return PROBE[kind]("fail" if rank == 1 else "sleep")

    start = time.monotonic()
    with pytest.raises(JobFailed, match=r"rank 1 exited with status 3; see .*rank1\.log"):
        launch(None, argv, local_size=2, nodes=1, log_dir=tmp_path, timeout=60)
    assert time.monotonic() - start < 30  # the sleeping rank was stopped, not waited for
    assert "boom" in (tmp_path / "rank1.log").read_text()


def test_job_timeout_is_reported(tmp_path):
    with pytest.raises(JobFailed, match="still running after 1 s"):
        launch(None, lambda r: [sys.executable, "-c", "import time; time.sleep(60)"], local_size=1, nodes=1,
               timeout=1)


def test_bad_layout_is_refused():
    with pytest.raises(ValueError, match="local_size >= 1 and nodes >= 1"):
        launch(None, lambda r: ["true"], local_size=1)


@netns
def test_node_redis_is_reached_across_the_link_and_counted(tmp_path):
    with EmulatedCluster(nodes=2, inter_mbit=200) as cluster:
        with private_redis(tmp_path / "redis", cluster=cluster, node=1, maxmemory="64mb") as server:
            assert server.url == f"redis://{cluster.address(1)}:6379/0"
            before = link_bytes(cluster)
            size = 1 << 20
            done = run_on_node(cluster, 0, [sys.executable, "-c", _SET, server.url, str(size)], timeout=60)
            assert done.returncode == 0, done.stderr
            after = link_bytes(cluster)
        # the value went node 0 -> node 1 and came back: both directions carried it
        for node in (0, 1):
            assert after[node]["tx"] - before[node]["tx"] >= size
            assert after[node]["rx"] - before[node]["rx"] >= size
        assert server.proc.poll() is not None  # stopped on exit


# One rank of a 2-node job: "warm" warms its own node's L2 partition and L1 (NOTE [warm-up
# partitions]); "node" / "global" read the validation split through its node's cache that way (no
# process group: the rank asks the servers for the placement itself) and print the bytes its node's
# eth0 received meanwhile (the emulated link's kernel counter, as ``link_bytes`` reads it).
_VALIDATE = """
import sys
from cachepipe import TwoLevelCache
from cachepipe.warmup import warmup
from loaders import cached_dataloader
root, cache_dir, rank, steps, urls = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4].split(","), sys.argv[5:]
def received():
    return int(open("/sys/class/net/eth0/statistics/rx_bytes").read())
for step in steps:
    if step == "warm":
        cache = TwoLevelCache(root, cache_dir, redis=urls, cache_size=48)
        warmup(cache, node_rank=rank, num_nodes=2, progress=False)
        cache.close()
        continue
    loader = cached_dataloader(root, batch_size=4, train=False, size=32, workers=0, cache_dir=cache_dir, redis=urls,
                               cache_size=48, distributed=(rank, 2), local_size=1, locality=step)
    start = received()
    assert sum(len(y) for _, y in loader) > 0 and loader.cache_hits["l2_hits"] > 0
    print(step, received() - start)
    loader.close()
"""


@netns
def test_node_local_validation_sends_no_sample_across_the_link(tiny_dataset, tmp_path):
    """NOTE [validation on its node], checked with the emulated links' own byte counters:
    node-local validation leaves the link idle, global validation reads half the split from the
    other node."""
    root = tiny_dataset / "train"  # 24 samples of 48 x 48 px: 6.9 KB each in L2
    received = {"node": 0, "global": 0}
    with EmulatedCluster(nodes=2, inter_mbit=100) as cluster:
        servers = [private_redis(tmp_path / f"redis{i}", cluster=cluster, node=i, maxmemory="64mb") for i in range(2)]
        try:
            for rank, steps in ((1, "warm,node"), (0, "warm,node,global"), (1, "global")):
                done = run_on_node(cluster, rank, [sys.executable, "-c", _VALIDATE, str(root), str(tmp_path / f"c{rank}"),
                                                   str(rank), steps, *[s.url for s in servers]], timeout=120)
                assert done.returncode == 0, done.stderr[-2000:]
                for line in done.stdout.split("\n"):
                    if line.strip():
                        locality, count = line.split()
                        received[locality] += int(count)
        finally:
            for s in servers:
                s.stop()
    assert received["node"] < 1_000 and received["global"] > 40_000, received  # not one sample vs half of them
