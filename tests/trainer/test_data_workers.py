"""Loader workers per rank: the machine's cores shared among its ranks, the recipe's value as a cap."""
from __future__ import annotations

import os
import warnings

import torch

from trainer.data import loader_workers

CORES = len(os.sched_getaffinity(0))


def test_workers_divide_the_cores_among_local_ranks_with_the_recipe_as_cap():
    assert loader_workers(8, 1) == min(8, CORES)
    assert loader_workers(8, 2) == min(8, max(1, CORES // 2))
    assert loader_workers(8, 4 * CORES) == 1  # more ranks than cores: still one worker each
    assert loader_workers(0, 1) == 0  # the recipe loads in the training process
    assert loader_workers(1, 1) == 1


def test_chosen_workers_do_not_trigger_torchs_too_many_workers_warning():
    data = list(range(4))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.utils.data.DataLoader(data, num_workers=CORES + 6).check_worker_number_rationality()
    assert any("worker processes" in str(w.message) for w in caught)  # the recipe's 8 on a small machine
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.utils.data.DataLoader(data, num_workers=loader_workers(CORES + 6, 1)).check_worker_number_rationality()
        torch.utils.data.DataLoader(data, num_workers=loader_workers(8, 2)).check_worker_number_rationality()
