"""BENCHMARKS.md's tables are drawn from result files that say where their figures came from
(tools/bench/results.py, tools/bench/render.py)."""

import dataclasses
import itertools
import json
import re

import pytest

from tools.bench import protocol
from tools.bench.render import BENCHMARKS, blocks, render_document, stale
from tools.bench.results import REQUIRED, RESULTS, capture, save


def test_every_drawn_table_is_what_its_result_file_renders():
    text = BENCHMARKS.read_text()
    assert blocks(text), "BENCHMARKS.md draws no table from a result file"
    assert stale(text) == [], "run `make bench-report` (python -m tools.bench.render) and commit"


def tables_outside_results(text: str) -> list[str]:
    """The heading row of every markdown table not drawn from a result file."""
    text = re.sub(r"<!-- result: .*? -->.*?<!-- /result -->", "", text, flags=re.S)
    lines = text.splitlines()
    return [
        line
        for line, below in itertools.pairwise(lines)
        if line.startswith("|") and re.fullmatch(r"\|[-| :]+\|", below)
    ]


def test_every_table_of_benchmarks_md_is_drawn_from_a_result_file():
    """A table typed by hand can drift from what its command gives (issue #31); a figure of older
    code belongs in docs/benchmarks-history.md."""
    assert tables_outside_results(BENCHMARKS.read_text()) == []
    found = tables_outside_results("| a |\n|---|\n| 1 |\n<!-- result: x -->\n| b |\n|---|\n<!-- /result -->\n")
    assert found == ["| a |"]


def test_every_result_file_is_drawn_and_says_where_it_came_from():
    drawn = set(blocks(BENCHMARKS.read_text()))
    for path in RESULTS.glob("*.json"):
        result = json.loads(path.read_text())
        assert result["name"] == path.stem and path.stem in drawn, f"{path.name} is drawn nowhere in BENCHMARKS.md"
        provenance = result["provenance"]
        assert set(REQUIRED) <= set(provenance), path.name
        assert provenance["commit"] and provenance["dirty"] is False, f"{path.name}: measured on uncommitted code"
        machine = provenance["machine"]
        assert machine["cpu"] and machine["cores"] and machine["load_before"] and machine["load_after"], path.name


def test_a_table_that_drifts_from_its_data_is_found(tmp_path):
    with capture("p2pnode bench protocol --quick", runs=1) as provenance:
        runs = [protocol.run((1024,), trials=1, seconds=0.001)]
    save("probe", "tools.bench.protocol", provenance, {"runs": runs}, directory=tmp_path)
    document = "# x\n<!-- result: probe -->\nold\n<!-- /result -->\n"
    assert stale(document, tmp_path) == ["probe"]
    drawn = render_document(document, tmp_path)
    assert (
        stale(drawn, tmp_path) == [] and "| 1 KiB |" in drawn and "settings other than a user's defaults: none" in drawn
    )
    assert drawn.replace("| 1 KiB |", "| 2 KiB |") != drawn and stale(drawn.replace("| 1 KiB |", "| 2 KiB |"), tmp_path)
    with pytest.raises(ValueError, match="provenance lacks seeds"):
        save("bad", "tools.bench.protocol", {k: v for k, v in provenance.items() if k != "seeds"}, {}, tmp_path)


def test_a_cached_run_is_reused_only_for_the_same_committed_code(tmp_path):
    """tools/bench/runs.py: a finished run's report is read instead of run again only when the
    same spec ran on the commit checked out now; another commit's run is run again."""
    from algorithms.data.setup import ScenarioSpec
    from testnet.reporting.provenance import CODE_ROOT, git_state
    from testnet.reporting.report import write_report
    from testnet.simulation.simulator import SimulationSpec, run_simulation
    from tools.bench.runs import _finished

    spec = SimulationSpec(
        algorithm="local", data=ScenarioSpec(dataset="digits", scenario="1", nodes=2, samples_per_class=5), rounds=1
    )
    write_report(run_simulation(spec), tmp_path)
    code = git_state(CODE_ROOT)
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["provenance"]["git"] == code
    assert _finished(spec, str(tmp_path), code) == report
    assert _finished(spec, str(tmp_path), {**code, "commit": "0" * 40}) is None
    assert _finished(dataclasses.replace(spec, rounds=2), str(tmp_path), code) is None


@pytest.mark.parametrize(
    "argv0, shown",
    [("/x/.venv/bin/p2pnode", "p2pnode"), ("/x/p2pnode_cli/__main__.py", "p2pnode"), ("-m", "python")],
)
def test_a_result_names_the_command_a_reader_types(monkeypatch, argv0, shown):
    monkeypatch.setattr("sys.argv", [argv0, "bench", "adapters", "--save", "adapters"])
    with capture() as provenance:
        pass
    assert provenance["command"] == f"{shown} bench adapters --save adapters"
