"""End-to-end training: models, LARS with PTO, recipes, the training loop, checkpoints, metrics."""
