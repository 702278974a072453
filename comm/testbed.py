"""Named testbeds: a cluster that a paper measured on, as the step model's inputs
(:mod:`comm.step_model`), each value with where it comes from.

A testbed is one JSON file in ``comm/testbeds/`` (its name is the file's stem: the
registry is the folder). Every parameter is ``{"value": V, "kind": K, "why": TEXT}`` where
``K`` is ``stated`` (the paper says it; ``why`` cites where), ``assumed`` (we add it;
``why`` says on what ground) or ``fitted`` (one value for the whole testbed, fitted once to
the measurements ``why`` names; docs/plan.md shows how well it predicts the rest). Units are
in the names: ``_gbit`` Gbit/s, ``_us`` microseconds, ``_ns`` nanoseconds, ``_ms``
milliseconds.

Example:
    >>> bed = get_testbed("mlsys21")
    >>> bed.nodes, bed.local_size, bed.parameters["inter_gbit"]["kind"]
    (16, 8, 'stated')
"""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from comm.cost_model import LinkParams
from comm.step_model import Library

__all__ = ["KINDS", "LIBRARY_PARAMETERS", "TESTBED_DIR", "Testbed", "available", "get_testbed", "load_testbed",
           "with_parameters"]

TESTBED_DIR = Path(__file__).resolve().parent / "testbeds"
KINDS = ("stated", "assumed", "fitted")
_REQUIRED = ("nodes", "local_size", "inter_gbit", "intra_gbit", "inter_latency_us", "intra_latency_us",
             "value_bytes", "gamma_ns", "images_per_s")
# library parameters: JSON name -> (Library field, factor to its unit)
LIBRARY_PARAMETERS = {"flow_gbit": ("flow_gbit", 1.0), "efficiency": ("efficiency", None),
            "overlap_share": ("overlap_share", 1.0), "after_backward": ("after_backward", None),
            "allgather": ("allgather", None), "host_ns_per_element": ("host_s_per_element", 1e-9),
            "single_update_ns_per_param": ("single_update_s_per_param", 1e-9),
            "update_ns_per_param": ("update_s_per_param", 1e-9), "overhead_ms": ("overhead_s", 1e-3)}


@dataclass(frozen=True)
class Testbed:
    """A cluster as measured in a paper.

    Attributes:
        name: the registry name (``--preset``).
        title: one line naming the cluster.
        source: the paper (and section) it comes from.
        nodes, local_size: ``nodes x local_size`` GPUs.
        link: the links' alpha/beta and the top-k selection's ``gamma`` per element.
        library: what its training stack adds (NOTE [library efficiency] in comm/step_model.py).
        value_bytes: bytes of one gradient value on the wire.
        images_per_s: model -> image size -> single-GPU training throughput.
        parameters: every value as written, with its ``kind`` and ``why``.
    """

    name: str
    title: str
    source: str
    nodes: int
    local_size: int
    link: LinkParams
    library: Library
    value_bytes: int
    images_per_s: Mapping[str, Mapping[int, float]]
    parameters: Mapping[str, Mapping]


def available() -> list[str]:
    """The names of the shipped testbeds."""
    return sorted(p.stem for p in TESTBED_DIR.glob("*.json"))


def get_testbed(name: str) -> Testbed:
    """The shipped testbed ``name``.

    Raises:
        ValueError: for an unknown name (lists the shipped ones) or a malformed file.
    """
    path = TESTBED_DIR / f"{name}.json"
    if not isinstance(name, str) or "/" in name or not path.is_file():
        raise ValueError(f"unknown testbed {name!r}; valid: {available()}")
    return load_testbed(path)


def load_testbed(path: str | Path) -> Testbed:
    """Read a testbed file (module docstring).

    Raises:
        ValueError: one line naming the file and what is wrong (a missing parameter, an
            unknown one, a kind outside ``KINDS``, a parameter without ``why``, a bad value).
    """
    path = Path(path)
    data = json.loads(path.read_text())
    params = data.get("parameters", {})
    where = f"testbed {path.name}"
    missing = [k for k in _REQUIRED if k not in params]
    unknown = sorted(set(params) - set(_REQUIRED) - set(LIBRARY_PARAMETERS))
    if missing or unknown:
        raise ValueError(f"{where}: missing parameter(s) {missing}, unknown parameter(s) {unknown}")
    for key, entry in params.items():
        if not (isinstance(entry, dict) and entry.get("kind") in KINDS and entry.get("why") and "value" in entry):
            raise ValueError(f"{where}: parameter {key} needs a value, a kind in {list(KINDS)} and a why")
    value = {k: e["value"] for k, e in params.items()}
    try:
        link = LinkParams(alpha_intra=value["intra_latency_us"] * 1e-6, beta_intra=8 / (value["intra_gbit"] * 1e9),
                          alpha_inter=value["inter_latency_us"] * 1e-6, beta_inter=8 / (value["inter_gbit"] * 1e9),
                          gamma=value["gamma_ns"] * 1e-9)
        library = with_parameters(Library(), {k: v for k, v in value.items() if k in LIBRARY_PARAMETERS})
    except (ValueError, TypeError, ZeroDivisionError) as exc:
        raise ValueError(f"{where}: {exc}") from None
    rates = {model: {int(size): float(rate) for size, rate in sizes.items()}
             for model, sizes in value["images_per_s"].items()}
    return Testbed(name=path.stem, title=data["title"], source=data["source"], nodes=int(value["nodes"]),
                   local_size=int(value["local_size"]), link=link, library=library,
                   value_bytes=int(value["value_bytes"]), images_per_s=rates, parameters=params)


def with_parameters(library: Library, values: Mapping[str, object]) -> Library:
    """``library`` with the parameters ``values`` (testbed names and units, e.g.
    ``{"overhead_ms": 20}``) replaced.

    Raises:
        ValueError: for an unknown name (lists the valid ones) or a bad value.
    """
    unknown = sorted(set(values) - set(LIBRARY_PARAMETERS))
    if unknown:
        raise ValueError(f"unknown library parameter(s) {unknown}; valid: {sorted(LIBRARY_PARAMETERS)}")
    changes = {}
    for key, value in values.items():
        field, factor = LIBRARY_PARAMETERS[key]
        changes[field] = value if factor is None or value is None else float(value) * factor
    return dataclasses.replace(library, **changes)
