"""Published throughput tables the step model (:mod:`comm.step_model`) is checked against.

Each JSON file here holds one paper's tables on one testbed (:mod:`comm.testbed`): per
row its source (``table``, ``where``), the inputs the paper states (``stated``) and the
ones we add (``assumed``), the measured throughput of each system, and per system the
exchange it runs (``systems``: an algorithm, and ``after_backward`` where the paper's
stack starts it only after backward). Nothing in a row tunes the model: the testbed's
parameters are the same for every row (docs/plan.md, "Validation").

Example:
    >>> rows = check("mlsys21")
    >>> all(abs(r.ratio - 1) <= r.tolerance for r in rows)
    True
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from comm.step_model import Step, bucket_count, step
from comm.testbed import Testbed, get_testbed

__all__ = ["VALIDATION_DIR", "Check", "available", "check", "load", "predict"]

VALIDATION_DIR = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Check:
    """One system in one row of a published table, against the step model.

    Attributes:
        table, where, row: the row's source (``Table 3``, the section) and its label.
        system, algorithm: the paper's name of the system and the exchange it runs.
        paper: its measured throughput (samples/s of the whole cluster).
        predicted: the step model's, from the row's inputs and the testbed.
        step: the predicted step, split (:class:`comm.step_model.Step`).
        tolerance: the largest ``|ratio - 1|`` the validation allows.
    """

    table: str
    where: str
    row: str
    system: str
    algorithm: str
    paper: float
    predicted: float
    step: Step
    tolerance: float

    @property
    def ratio(self) -> float:
        """Predicted over measured throughput."""
        return self.predicted / self.paper


def available() -> list[str]:
    """The names of the shipped validation files."""
    return sorted(p.stem for p in VALIDATION_DIR.glob("*.json"))


def load(name: str) -> dict:
    """The validation file ``name`` as parsed JSON.

    Raises:
        ValueError: for an unknown name (lists the shipped ones).
    """
    path = VALIDATION_DIR / f"{name}.json"
    if not isinstance(name, str) or "/" in name or not path.is_file():
        raise ValueError(f"unknown validation {name!r}; valid: {available()}")
    return json.loads(path.read_text())


def predict(testbed: Testbed, row: dict, system: dict, density: float) -> Step:
    """The step of ``system`` (``{"algorithm", "after_backward"?}``) on ``testbed`` with
    ``row``'s inputs (``params``, ``batch_size``, ``images_per_s`` and, where the paper
    states them, ``single_update_ms`` and ``update_ms``)."""
    library, params = testbed.library, int(row["params"])
    if system.get("after_backward"):
        library = dataclasses.replace(library, after_backward=library.after_backward | {system["algorithm"]})
    if "single_update_ms" in row:
        library = dataclasses.replace(library, single_update_s_per_param=row["single_update_ms"] * 1e-3 / params)
    update = row["update_ms"] * 1e-3 if "update_ms" in row else library.update_s(params)
    return step(system["algorithm"], numel=params, density=density, nodes=testbed.nodes,
                local_size=testbed.local_size, link=testbed.link,
                compute_s=library.compute_s(row["batch_size"], row["images_per_s"], params), update_s=update,
                library=library, buckets=bucket_count(params), value_bytes=testbed.value_bytes)


def check(name: str) -> list[Check]:
    """Every measured cell of validation file ``name`` against the step model."""
    data = load(name)
    testbed = get_testbed(data["testbed"])
    gpus = testbed.nodes * testbed.local_size
    out = []
    for row in data["rows"]:
        for system_name, measured in row["paper"].items():
            system = data["systems"][system_name]
            s = predict(testbed, row, system, data["density"]["value"])
            out.append(Check(table=row["table"], where=row["where"], row=row["row"], system=system_name,
                             algorithm=system["algorithm"], paper=float(measured),
                             predicted=gpus * row["batch_size"] / s.total_s, step=s, tolerance=data["tolerance"]))
    return out
