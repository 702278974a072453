"""The step model against the papers' published throughput tables (comm/plan_validation/),
and the testbeds those tables were measured on (comm/testbeds/)."""
from __future__ import annotations

import json

import pytest

from comm.plan_validation import available, check, load
from comm.testbed import KINDS, LIBRARY_PARAMETERS, TESTBED_DIR, get_testbed, load_testbed, with_parameters
from trainer import models
from trainer.models.param_counts import param_count

CELLS = [(name, c) for name in available() for c in check(name)]


def test_the_papers_tables_are_all_here():
    assert available() == ["icdcs19", "mlsys21"]
    tables = {(name, c.table) for name, c in CELLS}
    assert tables == {("mlsys21", "Table 3"), ("mlsys21", "Table 4"), ("icdcs19", "Table IV")}
    assert sum(1 for name, c in CELLS if c.table == "Table 3") == 12  # 4 rows x 3 systems
    assert sum(1 for name, c in CELLS if c.table == "Table 4") == 4
    assert sum(1 for name, c in CELLS if c.table == "Table IV") == 12


@pytest.mark.parametrize("name, cell", CELLS, ids=[f"{n}-{c.row}-{c.system}" for n, c in CELLS])
def test_every_cell_within_the_tolerance(name, cell):
    why = f"{cell.row} {cell.system}: {cell.predicted:,.0f} vs {cell.paper:,.0f}"
    assert abs(cell.ratio - 1) <= cell.tolerance, why


def test_the_tolerances_are_the_issues():
    assert load("mlsys21")["tolerance"] == 0.15 and load("icdcs19")["tolerance"] == 0.25


@pytest.mark.parametrize("name", available())
def test_the_systems_keep_their_order_in_every_row(name):
    for row in load(name)["rows"]:
        cells = [c for c in check(name) if c.row == row["row"]]
        if len(cells) > 1:
            assert sorted(cells, key=lambda c: c.predicted) == sorted(cells, key=lambda c: c.paper), row["row"]


@pytest.mark.parametrize("name", available())
def test_every_row_says_where_it_comes_from_and_what_it_assumes(name):
    data = load(name)
    assert data["paper"] and data["pages"] and data["density"]["kind"] in KINDS and data["density"]["why"]
    for system in data["systems"].values():
        assert system["why"] and system["algorithm"]
    for row in data["rows"]:
        assert row["table"] and row["where"] and row["stated"] and isinstance(row["assumed"], list)
        assert set(row["paper"]) <= set(data["systems"])


@pytest.mark.parametrize("name", available())
def test_rows_of_a_registered_model_count_its_parameters_from_the_model_code(name):
    rows = [r for r in load(name)["rows"] if r["model"] in models.MODELS]
    assert rows
    for row in rows:
        assert row["params"] == param_count(row["model"]) == sum(
            p.numel() for p in models.create(row["model"]).parameters())


def test_sparse_after_backward_is_what_makes_the_seeds_2dtar_win_at_224_px():
    cells = {c.system: c for c in check("mlsys21") if c.row == "ResNet-50 (224*224)"}
    assert cells["MSTopK-SGD"].step.overlapped_s == 0
    assert cells["2DTAR-SGD"].step.overlapped_s > 0


@pytest.mark.parametrize("name", ["icdcs19", "mlsys21"])
def test_every_testbed_parameter_has_a_kind_and_a_reason(name):
    bed = get_testbed(name)
    assert bed.title and bed.source
    for key, entry in bed.parameters.items():
        assert entry["kind"] in KINDS and len(entry["why"]) > 20, key


def _write(tmp_path, params):
    base = json.loads((TESTBED_DIR / "mlsys21.json").read_text())
    base["parameters"] = params
    path = tmp_path / "bed.json"
    path.write_text(json.dumps(base))
    return path


def test_a_testbed_file_without_a_reason_or_with_an_unknown_parameter_is_refused(tmp_path):
    params = json.loads((TESTBED_DIR / "mlsys21.json").read_text())["parameters"]
    assert load_testbed(_write(tmp_path, params)).nodes == 16
    for broken in ({**params, "nodes": {"value": 16, "kind": "stated"}},
                   {**params, "nodes": {"value": 16, "kind": "guessed", "why": "x"}},
                   {**params, "speed": {"value": 1, "kind": "assumed", "why": "x"}},
                   {k: v for k, v in params.items() if k != "inter_gbit"},
                   {**params, "overlap_share": {"value": 2, "kind": "fitted", "why": "x"}}):
        with pytest.raises(ValueError, match="testbed bed.json"):
            load_testbed(_write(tmp_path, broken))


def test_unknown_testbed_lists_the_shipped_ones():
    with pytest.raises(ValueError, match=r"valid: \['icdcs19', 'mlsys21'\]"):
        get_testbed("aws")


def test_library_parameters_take_testbed_names_and_units():
    lib = with_parameters(get_testbed("mlsys21").library, {"overhead_ms": 5, "update_ns_per_param": 1})
    assert lib.overhead_s == pytest.approx(0.005) and lib.update_s_per_param == pytest.approx(1e-9)
    assert set(LIBRARY_PARAMETERS) >= {"flow_gbit", "overlap_share", "efficiency", "overhead_ms"}
    with pytest.raises(ValueError, match="unknown library parameter"):
        with_parameters(lib, {"speed": 1})
