"""Real ``redis-server`` processes for tests (no fakes), started by the harness's one launcher."""
from __future__ import annotations

from trainer.launch import free_port
from tools.bench.harness.redis import private_redis

__all__ = ["free_port", "private_redis"]
