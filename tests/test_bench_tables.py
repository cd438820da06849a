"""The heterogeneous and SCooL benchmarks' tables as drawn from a result file (render(result)),
on hand-made runs whose figures are known, and their refusal of the seeds that tuned the defaults."""

import pytest

from tools.bench import heterogeneous, scool
from tools.bench.render import render_result
from tools.bench.results import capture, save


def _hetero_run(label: str, seed: int, per_node: list[float], predictors: dict | None = None) -> dict:
    return {
        "label": label,
        "algorithm": label.partition("@")[0],
        "scenario": "1",
        "samples_per_class": 10,
        "seed": seed,
        "accuracy": {"mean": sum(per_node) / len(per_node), "std": 0.0, "per_node": per_node},
        "accuracy_by_predictor": {
            name: {"mean": sum(values) / len(values), "per_node": values} for name, values in (predictors or {}).items()
        },
        "graph": {"within_cluster_mass": 1.0, "l1_to_truth": 0.08, "community_agreement": 1.0},
        "kib_per_node_round": 545.0,
        "wall_s": 60.0,
    }


def test_heterogeneous_table_pairs_each_method_with_local_on_the_same_nodes(tmp_path):
    runs = [
        _hetero_run("local", 3, [0.80, 0.90]),
        _hetero_run("local", 4, [0.70, 0.90]),
        _hetero_run("mapl-dual", 3, [0.90, 0.95], {"personal": [0.85, 0.90], "ensemble": [0.90, 0.95]}),
        _hetero_run("mapl-dual", 4, [0.80, 0.95], {"personal": [0.70, 0.90], "ensemble": [0.80, 0.95]}),
    ]
    data = {"rounds": 80, "test_per_class": 80, "tuning_seeds": [0, 1, 2], "set": {"encoding": "float16"}, "runs": runs}
    with capture("python -m tools.bench.heterogeneous", settings=data["set"], seeds=[3, 4], threads=1, runs=4) as p:
        pass
    save("hetero", "tools.bench.heterogeneous", p, data, directory=tmp_path)
    drawn = render_result("hetero", tmp_path)
    # Seed 3: +7.5 points, seed 4: +7.5; the pooled mean over the four node pairs is +7.5.
    assert "| 10 | 1 | local | 85.0 / 80.0; 82.5 | — | — | 1.000 | 0.080 | 1.00 | 545 |" in drawn
    assert "| 10 | 1 | **mapl-dual** | 92.5 / 87.5; **90.0** | +7.5 / +7.5 (local) | +7.5 [" in drawn
    assert "| 10 | 1 | mapl-dual | `personal` | 87.5 / 80.0; 83.8 | +1.2 [" in drawn  # 1.25 rounds half to even
    assert drawn.index("`personal`") < drawn.index("`ensemble`")
    assert "seeds 3 / 4; mean" in drawn and "defaults chosen on seeds 0, 1, 2" in drawn
    assert "`encoding = float16` for every method but the baselines" in drawn
    assert "settings other than a user's defaults: `encoding = float16`" in drawn


def test_scool_table_gives_means_over_seeds_and_the_worst_node(tmp_path):
    def run(method: str, seed: int, own: list[float], l1: list[float], recipients: list[int]) -> dict:
        return {
            "algorithm": method,
            "nodes": 4,
            "seed": seed,
            "rounds": len(l1),
            "accuracy": {"mean": sum(own) / len(own) - 0.1, "std": 0.0, "per_node": own},
            "accuracy_own_classes": {"mean": sum(own) / len(own), "std": 0.0, "per_node": own},
            "l1_to_truth_per_round": l1,
            "bytes": 4 * len(l1) * 1024 * 100,
            "recipients_last_round": recipients,
            "wall_s": 10.0,
        }

    l1 = [1.0] * 9 + [0.2] + [0.1] * 9 + [0.05]
    runs = [
        run("scool-sbm", 3, [0.9, 1.0, 1.0, 0.9], l1, [1, 1, 1, 1]),
        run("scool-sbm", 4, [0.8, 1.0, 1.0, 0.8], [x * 2 for x in l1], [1, 1, 1, 1]),
    ]
    data = {"rounds": 20, "samples_per_class": 10, "test_per_class": 15, "tuning_seeds": [0, 1, 2], "runs": runs}
    with capture("python -m tools.bench.scool", seeds=[3, 4], threads=1, runs=2) as provenance:
        pass
    save("scool-probe", "tools.bench.scool", provenance, data, directory=tmp_path)
    drawn = render_result("scool-probe", tmp_path)
    assert (
        "| 4 | scool-sbm | 82.5 ± 2.5 | 92.5 ± 2.5 | 80 % | 0.300 (max 0.400) | 0.075 (max 0.100) | 0.100 | 33% | 100 |"
        in drawn
    )
    assert "seeds 3, 4; defaults chosen on seeds 0, 1, 2" in drawn


@pytest.mark.parametrize("bench", [heterogeneous, scool])
def test_the_seeds_that_tuned_the_defaults_are_refused(bench, capsys):
    with pytest.raises(SystemExit):
        bench.main(["--seeds", "3", "1", "--out", "unused", "--save", "unused"])  # a table from them
    assert "tuned" in capsys.readouterr().err
