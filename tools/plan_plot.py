"""``cachepipe plan --plot``: scaling efficiency against nodes, one line per exchange
algorithm, as the seed draws its Fig. 7/8 (matplotlib imported only here)."""
from __future__ import annotations

from collections.abc import Mapping, Sequence

from tools.writable import write_output

__all__ = ["plot_scaling"]


def plot_scaling(path: str, nodes: Sequence[int], curves: Mapping[str, Sequence[float]], title: str) -> None:
    """Write the PNG (``--plot``; NOTE [output paths checked first] in tools/writable.py)."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, values in curves.items():
        ax.plot(nodes, [100 * v for v in values], "o-", label=name)
    ax.set(xscale="log", xlabel="nodes", ylabel="scaling efficiency (%)", ylim=(0, 105),
           title=f"cachepipe plan: {title}")
    ax.set_xticks(list(nodes), [str(n) for n in nodes])
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120)
    plt.close(fig)
    write_output(path, buf.getvalue(), "--plot")
