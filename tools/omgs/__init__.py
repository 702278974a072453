"""Helpers of ``cachepipe bench omgs``: an emulated-backward model and the per-rank
benchmark body (the ResNet-50 profiled is the trainer's, ``trainer.models``)."""
