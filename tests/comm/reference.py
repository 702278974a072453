"""Plain single-process references of the sparse exchanges, written from the papers'
definitions with Python loops and dicts (no shared code with ``comm``)."""
from __future__ import annotations

import math

import torch


def _topk(x: torch.Tensor, k: int) -> list[int]:
    order = sorted(range(x.numel()), key=lambda i: -abs(float(x[i])))
    return order[:k]


def _k(numel, density):
    return max(1, min(numel, math.ceil(density * numel - 1e-9)))


def topk_ag(inputs, residuals, density):
    """Algorithm 1: returns (output, new residuals)."""
    p, d = len(inputs), inputs[0].numel()
    out = torch.zeros(d, dtype=torch.float64)
    new_res = []
    for g, r in zip(inputs, residuals):
        acc = g + r
        sel = _topk(acc, _k(d, density))
        res = acc.clone()
        for i in sel:
            out[i] += acc[i]
            res[i] = 0.0
        new_res.append(res)
    return out / p, new_res


def gtopk(inputs, residuals, density):
    """Algorithms 3 + 4 with the dropped-sum notes of NOTE [gtopk error feedback]."""
    p, d = len(inputs), inputs[0].numel()
    k = _k(d, density)
    accs = [g + r for g, r in zip(inputs, residuals)]
    local = [{i: float(a[i]) for i in _topk(a, k)} for a in accs]
    res = [a.clone() for a in accs]
    for r, sel in zip(res, local):
        for i in sel:
            r[i] = 0.0
    sets = [dict(s) for s in local]
    dropped = [dict() for _ in range(p)]
    step = 1
    while step < p:
        for rank in range(0, p, 2 * step):
            if rank + step < p:
                merged = dict(sets[rank])
                for i, v in sets[rank + step].items():
                    merged[i] = merged.get(i, 0.0) + v
                keep = sorted(merged, key=lambda i: -abs(merged[i]))[:k]
                for i in merged:
                    if i not in keep:
                        dropped[rank][i] = dropped[rank].get(i, 0.0) + merged[i]
                sets[rank] = {i: merged[i] for i in keep}
        step *= 2
    final = sets[0]
    out = torch.zeros(d, dtype=torch.float64)
    for i, v in final.items():
        out[i] = v
    for rank in range(p):
        for i, v in local[rank].items():
            if i not in final:
                res[rank][i] += v
        for i, v in dropped[rank].items():
            if i in final:
                res[rank][i] += v
    return out / p, res


def hitopk(inputs, residuals, density, nodes, local_size):
    """Algorithm 2; residuals are per (node, chunk) of size ceil(d/n) (NOTE [hitopk error feedback])."""
    m, n, d = nodes, local_size, inputs[0].numel()
    c = -(-d // n)
    padded = [torch.cat([g, torch.zeros(n * c - d, dtype=g.dtype)]) for g in inputs]
    out = torch.zeros(n * c, dtype=torch.float64)
    new_res = []
    for rank in range(m * n):
        node, j = divmod(rank, n)
        node_sum = sum(padded[node * n + q][j * c:(j + 1) * c] for q in range(n))
        acc = node_sum + residuals[rank]
        res = acc.clone()
        for i in _topk(acc, _k(c, density)):
            out[j * c + i] += acc[i]
            res[i] = 0.0
        new_res.append(res)
    return out[:d] / (m * n), new_res
