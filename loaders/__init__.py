"""Loaders fed from the cachepipe cache: a drop-in cached ImageFolder/DataLoader and DALI pipelines."""
