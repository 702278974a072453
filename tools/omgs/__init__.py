"""Helpers of ``cachepipe bench omgs``: a ResNet-50, an emulated-backward model, the
network-namespace cluster and the per-rank benchmark body."""
