"""A rank of tests/tools/test_emulated_job.py, run as ``python -m tests.tools.rank_probe``.

``rank_probe OUT``: writes its torchrun environment, network interfaces, working directory,
``sys.argv`` and (forked) torch's thread count to OUT as JSON; ``rank_probe fail``: prints ``boom`` and exits 3;
``rank_probe sleep``: sleeps for a minute.
"""
import json
import os
import socket
import sys
import time

KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
        "GLOO_SOCKET_IFNAME")

if sys.argv[1] == "fail":
    print("boom")
    sys.exit(3)
elif sys.argv[1] == "sleep":
    time.sleep(60)
else:
    with open(sys.argv[1], "w") as f:
        json.dump({**{k: os.environ[k] for k in KEYS}, "interfaces": sorted(n for _, n in socket.if_nameindex()),
                   "cwd": os.getcwd(), "argv": sys.argv, "main": __name__,
                   "preloaded": "torch" in sys.modules,  # forked from the fork server, which imported it
                   "threads": sys.modules["torch"].get_num_threads() if "torch" in sys.modules else None}, f)
