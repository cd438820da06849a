"""`p2pnode testnet --engine ray`: real daemons placed by Ray launchers, on a local Ray instance
(two CPUs), and the same report as the local launcher's. Skipped, with the reason, where Ray
(the `[ray]` extra) is not installed; the two tests that need no Ray run everywhere.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

from testnet.launch.discovery import run_discovery_testnet

from .helpers import namespaces_work, run_ip, same_keys, wait_for

ROOT = Path(__file__).resolve().parent.parent

try:
    import ray
except ImportError:
    ray = None

P2PNODE_TESTNET = [sys.executable, "-m", "p2pnode_cli", "testnet"]
RAY = shutil.which("ray", path=str(Path(sys.executable).parent)) or "ray"  # the CLI beside this Python
needs_ray = pytest.mark.skipif(ray is None, reason="needs Ray: pip install '.[ray]'")


def test_importing_the_daemon_and_the_testnet_loads_no_ray():
    code = (
        "import sys, p2pnode_cli, testnet.launch.cluster, testnet.launch.discovery, testnet.launch.learning, "
        "testnet.launch.choose_placement; "
        "print('ray' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


def test_engine_ray_without_ray_is_a_usage_error_naming_the_extra(tmp_path):
    """Ray made unimportable (as where it is not installed): exit 2 before anything starts."""
    out = tmp_path / "net"
    code = (
        "import sys; sys.modules['ray'] = None; from p2pnode_cli import main; "
        f"sys.exit(main(['testnet', '--nodes', '2', '--duration', '5', '--out', {str(out)!r}, '--engine', 'ray']))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert result.returncode == 2, result.stderr
    assert "p2pnode: error: --engine ray needs Ray, an optional extra: pip install 'p2pnode[ray]'" in result.stderr
    assert not out.exists()
    result = subprocess.run(
        [*P2PNODE_TESTNET, "--nodes", "2", "--duration", "5", "--out", str(out), "--ray-address", "127.0.0.1:6379"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert result.returncode == 2 and "--ray-address goes with --engine ray" in result.stderr


@needs_ray
def test_a_ray_address_where_nothing_answers_fails_at_once_naming_it(tmp_path):
    command = [*P2PNODE_TESTNET, "--nodes", "2", "--duration", "5", "--out", str(tmp_path / "net")]
    command += ["--engine", "ray", "--ray-address", "127.0.0.1:1"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert result.returncode == 1, result.stderr
    assert "p2pnode: error: nothing answers at the Ray address 127.0.0.1:1: Connection refused" in result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "net").exists()


@pytest.fixture(scope="module")
def local_ray():
    """One local Ray instance for the module (about 5 s to start on an idle machine), shipping
    this checkout's code to its workers as `p2pnode testnet --engine ray` does."""
    from testnet.launch.raynodes import code

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, runtime_env=code())
    yield ray.nodes()[0]["NodeManagerAddress"]
    ray.shutdown()


def _placement():
    from testnet.launch.raynodes import RayPlacement

    return RayPlacement.connect(None, progress=io.StringIO())  # joins the module's Ray


def _gone(pid: int) -> bool:
    """Not running: no such process, or a zombie waiting for whoever inherited it to reap it."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@needs_ray
def test_a_discovery_testnet_on_ray_reaches_full_mesh_with_the_local_reports_shape(tmp_path, local_ray):
    with _placement() as placement:
        code, report = run_discovery_testnet(
            tmp_path / "ray", 4, 60, exit_on_mesh=True, progress=io.StringIO(), placement=placement
        )
        launcher_dirs = [Path(ray.get(launcher.ready.remote())) for _, launcher, _ in placement.launchers]
    assert code == 0, report["discovery"]
    assert report["engine"] == "ray" and report["discovery"]["peer_counts"] == [3] * 4
    assert report["node_exit_codes"] == [0] * 4  # SIGTERM through the launcher: a clean stop
    for node in report["nodes_detail"]:
        assert node["address"].startswith(f"tcp://{local_ray}:")  # the Ray node's address, not 127.0.0.1
        log = Path(node["log"]).read_text()  # brought back from the Ray node
        assert "SIGTERM received: shutting down" in log and "Traceback" not in log
    assert not any(path.exists() for path in launcher_dirs)  # keys and data directories removed

    code, local = run_discovery_testnet(tmp_path / "local", 4, 60, exit_on_mesh=True, progress=io.StringIO())
    assert code == 0 and local["engine"] == "local"
    for key in ("", "discovery", "comm"):  # the schema; what was counted, by kind, is data
        assert set(report.get(key, report)) == set(local.get(key, local)), key
    assert set(report["nodes_detail"][0]) == set(local["nodes_detail"][0])


@needs_ray
def test_a_learning_testnet_on_ray_finishes_with_check(tmp_path, local_ray):
    from algorithms.data.setup import ScenarioSpec
    from testnet.launch.learning import run_learning_testnet
    from testnet.reporting.report import CheckThresholds
    from testnet.simulation.simulator import SimulationSpec, run_simulation

    spec = SimulationSpec(
        algorithm="mapl",
        data=ScenarioSpec(dataset="digits", nodes=3, samples_per_class=10),
        rounds=3,
        backbones=("mlp",),
        overrides={"warmup_rounds": "1"},
    )
    with _placement() as placement:
        code, report = run_learning_testnet(
            spec,
            tmp_path / "net",
            round_deadline_s=10,
            check=CheckThresholds(accuracy=0.5, within_cluster_mass=0.0),
            progress=io.StringIO(),
            placement=placement,
        )
    assert code == 0, report["check"]
    assert report["rounds_completed_per_node"] == [3, 3, 3] and report["processes"]["exit_codes"] == [0, 0, 0]
    assert report["processes"]["engine"] == "ray"
    assert all(address.startswith(f"tcp://{local_ray}:") for address in report["processes"]["addresses"])
    assert same_keys(report, run_simulation(spec)) == []  # one report builder, whatever ran the daemons


@needs_ray
def test_churn_restarts_a_daemon_on_its_ray_node(tmp_path, local_ray):
    from testnet.launch.churn import ChurnSpec

    with _placement() as placement:
        code, report = run_discovery_testnet(
            tmp_path / "net",
            3,
            60,
            exit_on_mesh=True,
            churn=ChurnSpec(every_s=2.0, down_s=1.0, count=1),
            progress=io.StringIO(),
            placement=placement,
        )
    assert code == 0, report["churn"]
    (event,) = report["churn"]["events"]
    assert event["exit_code"] == -signal.SIGKILL and event["mesh_s"] is not None
    assert report["discovery"]["peer_counts"] == [2] * 3 and report["node_exit_codes"] == [0] * 3


@needs_ray
def test_a_lost_launcher_takes_its_daemons_with_it_and_they_count_as_exited(tmp_path, local_ray):
    """The actor's process dies (killed as a lost Ray node would lose it): its daemons get
    SIGTERM from PR_SET_PDEATHSIG, nothing is left running, and the launcher reports them lost."""
    from testnet.launch.cluster import Cluster
    from testnet.launch.raynodes import LOST

    with _placement() as placement, Cluster.prepare(tmp_path, 2, placement=placement) as cluster:
        cluster.start_all()
        wait_for(lambda: all(status is not None for status in cluster.statuses()), timeout=60)
        pids = [spec.process.pid for spec in cluster.specs]
        (_, launcher, _), *_ = placement.launchers
        directory = Path(ray.get(launcher.ready.remote()))
        ray.kill(launcher)
        wait_for(lambda: all(_gone(pid) for pid in pids), timeout=30)
        assert [cluster.alive(spec) for spec in cluster.specs] == [False, False]
        assert [spec.process.returncode for spec in cluster.specs] == [LOST, LOST]
        assert cluster.stop() == {0: LOST, 1: LOST}
    assert directory.exists()  # a launcher killed outright cannot clean up after itself (docs/ray.md)
    shutil.rmtree(directory)


def _session_processes(sid: int) -> list[int]:
    """The processes of session `sid`: a `ray start --block` and everything Ray started under it
    (its workers change process group, not session)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        if int(fields[3]) == sid:
            found.append(int(stat.parent.name))
    return found


def _stop_session(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGTERM)  # `ray start --block` stops what it started
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass
    for pid in _session_processes(process.pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    process.wait()


def _ray_nodes_alive(namespace: str, address: str, env: dict) -> int:
    command = ["ip", "netns", "exec", namespace, RAY, "status", "--address", address]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, env=env)
    active = result.stdout.split("Active:", 1)[-1].split("Pending:", 1)[0]
    return len(re.findall(r"^\s*\d+ node_", active, flags=re.M))


@pytest.fixture
def ray_on_two_hosts(tmp_path):
    """A Ray cluster of two hosts: a head in one network namespace (10.79.x.1) and a worker node
    in another (10.79.x.2), joined by a veth pair; both stopped, and the namespaces removed,
    afterwards. Token authentication off: the namespaces are this test's own."""
    tag = uuid.uuid4().hex[:6]
    subnet = int(tag, 16) % 250 + 1
    head_ns, worker_ns = f"p2prh{tag}", f"p2prw{tag}"
    head_ip, worker_ip = f"10.79.{subnet}.1", f"10.79.{subnet}.2"
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    started: list[subprocess.Popen] = []
    temps: list[str] = []
    run_ip("netns", "add", head_ns)
    run_ip("netns", "add", worker_ns)
    try:
        run_ip("link", "add", f"rh{tag}", "type", "veth", "peer", "name", f"rw{tag}")
        for namespace, link, address in ((head_ns, f"rh{tag}", head_ip), (worker_ns, f"rw{tag}", worker_ip)):
            run_ip("link", "set", link, "netns", namespace)
            run_ip("-n", namespace, "addr", "add", f"{address}/24", "dev", link)
            run_ip("-n", namespace, "link", "set", link, "up")
            run_ip("-n", namespace, "link", "set", "lo", "up")
        gcs = f"{head_ip}:6379"
        common = ["--num-cpus=1", "--disable-usage-stats", "--block"]
        for namespace, arguments in (
            (head_ns, ["--head", f"--node-ip-address={head_ip}", "--port=6379", "--include-dashboard=false"]),
            (worker_ns, [f"--address={gcs}", f"--node-ip-address={worker_ip}"]),
        ):
            temps.append(tempfile.mkdtemp(prefix="ray", dir="/tmp"))  # short: Ray's socket paths live under it
            command = ["ip", "netns", "exec", namespace, RAY, "start", *arguments, *common, f"--temp-dir={temps[-1]}"]
            with open(tmp_path / f"{namespace}.log", "wb") as log:  # the child keeps its own descriptor
                process = subprocess.Popen(
                    command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
                )
            started.append(process)
            wait_for(lambda: _ray_nodes_alive(head_ns, gcs, env) == len(started), timeout=180, interval=2)
        yield {"namespace": head_ns, "address": gcs, "hosts": (head_ip, worker_ip), "env": env}
    finally:
        for process in reversed(started):
            _stop_session(process)
        for namespace in (head_ns, worker_ns):
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True, timeout=10)
        for temp in temps:
            shutil.rmtree(temp, ignore_errors=True)


@pytest.mark.skipif(ray is None or not namespaces_work(), reason="needs Ray, root and `ip netns` for two hosts")
@pytest.mark.timeout(600)
def test_daemons_on_two_ray_hosts_reach_full_mesh_over_tcp(tmp_path, ray_on_two_hosts):
    """`p2pnode testnet --engine ray --ray-address` from the head's host: two daemons on each
    Ray node, each on its own host's address, all four in a full mesh across the link."""
    cluster = ray_on_two_hosts
    out = tmp_path / "net"
    command = ["ip", "netns", "exec", cluster["namespace"], *P2PNODE_TESTNET, "--nodes", "4", "--duration", "90"]
    command += ["--exit-on-mesh", "--out", str(out), "--engine", "ray", "--ray-address", cluster["address"]]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=ROOT, env=cluster["env"])
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    hosts = [node["address"].removeprefix("tcp://").rsplit(":", 1)[0] for node in report["nodes_detail"]]
    assert sorted(hosts) == sorted(cluster["hosts"] * 2)  # spread by CPUs: one each, two each
    assert report["discovery"]["peer_counts"] == [3] * 4 and report["node_exit_codes"] == [0] * 4
    assert report["rejections"] == {}  # every CURVE handshake and every frame across the link accepted


@needs_ray
def test_daemons_are_spread_over_ray_nodes_in_proportion_to_their_cpus():
    from testnet.launch.raynodes import next_node

    def spread(cpus: list[float], daemons: int) -> list[int]:
        load = [0] * len(cpus)
        order = []
        for _ in range(daemons):
            order.append(next_node(load, cpus))
            load[order[-1]] += 1
        return order

    assert spread([1, 1], 5) == [0, 1, 0, 1, 0]
    assert spread([2, 1], 6) == [0, 0, 1, 0, 0, 1]  # 4 on the node of 2 CPUs, 2 on the other
    assert spread([1, 4], 5) == [1, 1, 1, 0, 1]
