"""End-to-end training: models, LARS with PTO, recipes, the training loop, checkpoints, metrics.

Modules: ``models`` (registry: resnet50, resnet18, resnet_small), ``lars`` (LARS with FP32
trust ratios), ``schedules`` (warm-up + poly/cosine/step), ``config`` and ``recipes``
(validated YAML recipes and overrides), ``loop`` (``train(RunConfig)``), ``exchange``
(per-phase gradient exchange), ``checkpoint`` / ``serialize`` (atomic, pickle-free),
``metrics`` (time breakdown, metrics.jsonl), ``report`` (plots), ``launch`` (local
processes that fail fast). The parallel tensor operator lives in ``comm.pto``.
"""
