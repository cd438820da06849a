import json
import subprocess
import sys
from pathlib import Path

import pytest

from p2pnode_cli import main
from protocol.identity import NODE_ID_LENGTH


def test_help_and_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and "p2pnode" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["frobnicate"],
        ["keygen"],
        ["bench"],
        ["bench", "protocol", "--trials", "0"],
        ["bench", "protocol", "--sizes", "x"],
    ],
)
def test_usage_errors_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert "usage:" in capsys.readouterr().err


def test_bench_protocol_json(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert main(["bench", "protocol", "--json", "--quick", "--sizes", "1024", "4096", "--out", str(out)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report == json.loads(out.read_text())
    assert [r["payload_bytes"] for r in report["results"]] == [1024, 4096]
    for result in report["results"]:
        for key in ("encode_per_s", "decode_per_s", "sign_per_s", "verify_per_s"):
            assert result[key] > 0
        # The envelope does strictly more work than bare sign + verify of the same bytes.
        assert result["encode_us"] + result["decode_us"] > 0.5 * (result["sign_us"] + result["verify_us"])
        assert result["frame_bytes"] > result["payload_bytes"]


def test_protocol_demo_runs_and_refuses_every_attack(tmp_path, capsys):
    assert main(["protocol-demo", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "ACCEPTED (bug)" not in out
    for reason in (
        "replay",
        "bad_signature",
        "stale",
        "wrong_network",
        "not_allowed",
        "too_large",
        "bad_tensor",
        "malformed",
        "unsupported_version",
        "unknown_type",
    ):
        assert f"rejected, {reason}:" in out
    # A second run reuses the keys it made.
    assert main(["protocol-demo", "--out", str(tmp_path)]) == 0
    assert "loaded" in capsys.readouterr().out


def test_bench_transport_json(capsys):
    """Both variants, a user's defaults and the rate limit lifted, end with every frame accounted
    for, and the result renders as BENCHMARKS.md's table."""
    from tools.bench import transport

    assert main(["bench", "transport", "--json", "--quick", "--sizes", "2048"]) == 0
    report = json.loads(capsys.readouterr().out)
    (result,) = report["results"]
    assert result["payload_bytes"] == 2048 and result["blocking_per_s"] > 0
    for variant in ("defaults", "lifted"):
        row = result[variant]
        assert row["trio_per_s"] > 0 and row["curve_per_s"] > 0  # the same transfer with CURVE on the connection
        # the ratios come from the unrounded rates: the rates printed to 0.1/s reproduce them to 0.001
        assert row["ratio"] == pytest.approx(row["trio_per_s"] / result["blocking_per_s"], abs=1e-3)
        assert row["curve_ratio"] == pytest.approx(row["curve_per_s"] / result["blocking_per_s"], abs=1e-3)
        assert row["unaccounted"] == 0 and row["frames"] == 2 * 2 * result["messages"]  # 2 trials, plain and CURVE
    assert result["lifted"]["refused"] == {}  # raw capacity: nothing refused
    assert report["variants"] == {
        "defaults": {},
        "lifted": {"transport.rate_per_connection": 1_000_000_000, "transport.burst_per_connection": 1_000_000},
    }
    assert report["goal_met"] is None  # 20 KiB was not measured
    table = transport.render({"data": {"runs": [report]}})
    assert "| ratio, defaults | ratio, lifted |" in table and "| 2 KiB |" in table
    assert "`transport.rate_per_connection = 1000000000`" in table
    assert transport.settings() == {
        "lifted runs: transport.rate_per_connection": 1_000_000_000,
        "lifted runs: transport.burst_per_connection": 1_000_000,
    }


def test_bench_transport_presigned_measures_the_receive_path_and_claims_no_goal(capsys):
    """One trial (--quick's seconds, not its two trials: each trial starts five sender processes;
    test_bench_transport_json runs --quick itself)."""
    one_trial = ["--trials", "1", "--seconds", "0.02"]
    assert main(["bench", "transport", "--json", *one_trial, "--presigned", "--sizes", "20480"]) == 0
    report = json.loads(capsys.readouterr().out)
    (result,) = report["results"]
    assert report["presigned"] and "signed before the clock starts" in report["method"]
    assert result["blocking_per_s"] > 0
    assert all(
        result[variant]["trio_per_s"] > 0 and result[variant]["curve_per_s"] > 0 for variant in ("defaults", "lifted")
    )
    assert report["goal_met"] is None  # the goals count signing in


def test_a_key_others_can_read_exits_2_for_keyinfo_and_start_alike(tmp_path, capsys):
    """The documented convention: a setting or an argument that cannot be used is exit 2, found
    before anything starts; `start` reports the key as `[node].key`, keyinfo as itself."""
    from p2pnode.wire.keystore import write_key
    from protocol import Identity

    key = write_key(tmp_path / "node.pem", Identity.generate())
    key.chmod(0o644)
    (tmp_path / "node.toml").write_text('[node]\nkey = "node.pem"\nlisten = "tcp://127.0.0.1:7000"\n')
    assert main(["keyinfo", str(key)]) == 2
    assert "chmod 600" in capsys.readouterr().err
    assert main(["start", "--config", str(tmp_path / "node.toml")]) == 2
    err = capsys.readouterr().err
    assert "[node].key: " in err and "chmod 600" in err
    key.chmod(0o600)
    assert main(["keyinfo", str(key)]) == 0 and json.loads(capsys.readouterr().out)["node_id"]


@pytest.mark.parametrize("command", ["simulate", "testnet"])
def test_simulate_and_testnet_refuse_a_warm_up_the_run_never_ends(tmp_path, capsys, command):
    """The daemon's config check and these commands share one check (algorithms/registry.py):
    exit 2 before any data is loaded or any daemon started."""
    out = tmp_path / "out"
    argv = [command, "--algorithm", "mapl", "--dataset", "digits", "--nodes", "4", "--rounds", "12", "--out", str(out)]
    assert main([*argv, "--set", "warmup_rounds=12"]) == 2
    err = capsys.readouterr().err
    assert "warmup_rounds=12 (given) must be below --rounds (12)" in err
    assert "or the graph is never learned" in err
    assert main([*argv[:-2], "--set", "warmup_rounds=4", "--dataset", "mnist", "--out", str(out)]) == 2
    assert "--data-root: dataset 'mnist' is read from local files" in capsys.readouterr().err
    assert not out.exists()


def test_simulate_says_its_mixed_backbones_are_not_what_init_writes(tmp_path, capsys):
    argv = ["simulate", "--algorithm", "local", "--dataset", "digits", "--nodes", "2", "--rounds", "1"]
    argv += ["--samples-per-class", "1", "--test-per-class", "1", "--engine", "inline", "--out", str(tmp_path)]
    assert main(argv) == 0
    assert "note: the nodes run convnet, resnet in turn" in capsys.readouterr().err
    assert main([*argv, "--backbones", "convnet"]) == 0
    assert "note: the nodes run" not in capsys.readouterr().err


def test_testnet_hands_its_poisoners_and_barrage_to_the_launcher(tmp_path, capsys, monkeypatch):
    """`testnet --poisoners I --attack A --attack-factor X --barrage` reaches run_learning_testnet
    (the run itself: tests/adversarial/test_hostile_learning.py); --barrage needs poisoners."""
    import testnet.launch.learning

    seen = {}

    def launcher(spec, out, **options):
        seen.update(spec=spec, barrage=options["barrage"])
        raise KeyboardInterrupt  # enough: the run is not the point here

    monkeypatch.setattr(testnet.launch.learning, "run_learning_testnet", launcher)
    argv = ["testnet", "--algorithm", "mapl", "--dataset", "digits", "--nodes", "4", "--rounds", "8"]
    argv += ["--set", "warmup_rounds=3", "--out", str(tmp_path / "out")]
    assert main([*argv, "--barrage"]) == 2
    assert "--barrage goes with --poisoners I" in capsys.readouterr().err
    assert main([*argv, "--poisoners", "3", "--attack", "rescale", "--attack-factor", "1e4", "--barrage"]) == 130
    spec = seen["spec"]
    assert (spec.poisoners, spec.attack, spec.attack_factor, seen["barrage"]) == ((3,), "rescale", 1e4, True)


def test_hold_goes_with_exit_on_mesh_and_reaches_the_discovery_run(tmp_path, monkeypatch, capsys):
    import testnet.launch.discovery

    seen = {}

    def launcher(out, nodes, duration, **options):
        seen.update(options)
        return 0, {}

    monkeypatch.setattr(testnet.launch.discovery, "run_discovery_testnet", launcher)
    argv = ["testnet", "--nodes", "3", "--algorithm", "none", "--duration", "30", "--out", str(tmp_path / "out")]
    assert main([*argv, "--hold", "5"]) == 2
    assert "--hold goes with --exit-on-mesh" in capsys.readouterr().err and not seen
    assert main([*argv, "--exit-on-mesh", "--hold", "5"]) == 0
    assert seen["exit_on_mesh"] is True and seen["hold_s"] == 5.0


def test_console_script_is_installed(tmp_path):
    script = Path(sys.executable).with_name("p2pnode")
    result = subprocess.run(
        [str(script), "keygen", "--out", str(tmp_path / "k.pem")], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.strip()) == NODE_ID_LENGTH
