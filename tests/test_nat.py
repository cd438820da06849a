"""The NAT testbed (testnet/launch/nat.py, issue #46) behaves as the NATs it stands for, and a
daemon behind one says why it is not admitted. Needs root, `ip netns`, `iptables` and `conntrack`;
skipped with the reason where one is missing."""

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from p2pnode_cli import main
from testnet.launch.learning import DISCOVERY
from testnet.launch.nat import NatLab, cluster_on, missing, observed, simultaneous_open, survives_flush, tcp_reaches

from .helpers import wait_for

pytestmark = pytest.mark.skipif(missing() is not None, reason=f"the NAT testbed {missing()}")

ROUTED_PEER = Path(__file__).with_name("routed_peer.py")


def test_each_site_is_reachable_as_its_nat_allows_and_maps_ports_as_its_kind_does():
    """Every host dials out; only public hosts are dialled; a home router keeps a host's source
    port for every destination (what one peer observes, another would too), a symmetric NAT
    draws a new one per connection, and two hosts behind one router reach each other."""
    with NatLab() as lab:
        public, other = lab.add("pub", "public"), lab.add("pub2", "public")
        home = lab.add_router("port-restricted")
        behind = [lab.add("home1", "port-restricted", home), lab.add("sym", "symmetric"), lab.add("cgn", "double")]
        walled = lab.add("walled", "firewall")
        lab.add("home2", "port-restricted", home)
        assert tcp_reaches(public, other) and tcp_reaches(walled, public)
        for host in behind:
            assert tcp_reaches(host, public), host
            assert not tcp_reaches(public, host), host
        assert not tcp_reaches(public, walled)
        assert tcp_reaches(lab.hosts[-1], behind[0])  # the same home router's inside
        seen = {host.site: [observed(host, peer, source_port=40000) for peer in (public, other)] for host in behind}
        for site in ("port-restricted", "double"):
            (address, port), again = seen[site]
            assert port == 40000 and again == (address, port) and not address.startswith(("10.", "100.64.")), site
        (address, port), (again_address, again_port) = seen["symmetric"]
        assert address == again_address and port != again_port


def test_a_daemon_behind_a_nat_says_it_is_out_of_its_bootstrap_s_reach(tmp_path, capsys):
    """A public bootstrap and a daemon behind a home router: the daemon's dial gets through, the
    bootstrap's answers do not (they go to an address only the router's inside can reach), and
    the daemon's log says so. Joining from there is issue #46's next step, not this one's."""
    with NatLab() as lab:
        hosts = [lab.add("bootstrap", "public"), lab.add("home", "port-restricted")]
        cluster = cluster_on(hosts, tmp_path / "net", discovery=DISCOVERY)
        log = cluster.specs[1].directory / "node.log"
        with cluster:
            for spec in cluster.specs:
                cluster.start(spec)
            said = wait_for(lambda: log.exists() and re.search(r"bootstrap entry 1: .*", log.read_text()), 30)
            time.sleep(0.2)
            statuses = cluster.statuses()
            doctor = main(["doctor", "--config", str(cluster.specs[1].config_path)])
            printed = capsys.readouterr().out
    line = said[0]
    assert f"the node at tcp://{hosts[0].address}:7000 accepted this node's connection" in line, line
    assert f"advertised address tcp://{hosts[1].address}:7000, which it cannot reach" in line
    assert "behind a NAT or a firewall" in line
    assert [len(status["peers"]) for status in statuses] == [0, 0]
    # It calls itself private; the bootstrap, reached by this one node only, cannot tell yet.
    assert [status["reachability"]["state"] for status in statuses] == ["unknown", "private"]
    # `p2pnode doctor` names its address's kind, its reachability, and what is in the way.
    assert doctor == 1 and f"advertises tcp://{hosts[1].address}:7000: a private address" in printed
    assert "reachability: private" in printed and "takes this node's connection but its answers never" in printed


def test_hole_punching_works_where_both_nats_keep_the_port_and_fails_behind_a_symmetric_one():
    """TCP simultaneous open (libp2p's DCUtR) between hosts behind two home routers gets through
    both; with a symmetric NAT on one side it cannot, whatever the timing: its port is new for
    each destination, so the other side aims at a port nobody holds."""
    with NatLab() as lab:
        home, other_home, symmetric = (lab.add(name, site) for name, site in HOLE_PUNCH_HOSTS)
        assert len({home.seen_from, other_home.seen_from, symmetric.seen_from}) == 3  # three routers
        assert home.seen_from != home.address and home.seen_from.startswith("198.51.100.")
        assert simultaneous_open(home, other_home)
        assert not simultaneous_open(home, symmetric, timeout_s=3.0)


HOLE_PUNCH_HOSTS = (("home1", "port-restricted"), ("home2", "double"), ("sym", "symmetric"))


def test_an_open_connection_outlives_expired_mappings_unless_the_nat_is_symmetric():
    """`conntrack -F` on every router, mid-connection, the inside host sending first (a peer's
    keep-alive): a router that keeps ports maps the connection again as it was, through one NAT
    or two; a symmetric NAT gives it a new port, and the server resets what looks like a stranger.
    So behind a symmetric NAT a node must dial again after a router forgets it."""
    with NatLab() as lab:
        server = lab.add("pub", "public")
        for site, survives in (("port-restricted", True), ("double", True), ("symmetric", False)):
            assert survives_flush(lab, lab.add(site[:4], site), server) is survives, site


def test_a_daemon_behind_a_forwarding_router_is_dialled_back_at_the_routers_address_and_joins_there(tmp_path, capsys):
    """A home router forwards the daemon's two ports, but the daemon advertises its inside
    address: the bootstrap's challenge never reaches it, the bootstrap's dial-back at the host its
    connection came from (the router's) does, and `doctor` says to advertise that. Told so, it is
    admitted."""
    with NatLab() as lab:
        bootstrap, home = lab.add("bootstrap", "public"), lab.add("home", "port-restricted")
        lab.forward(home, 7000, 7001)
        cluster = cluster_on([bootstrap, home], tmp_path / "net", discovery={**DISCOVERY, "dial_back_after_s": 0.5})
        spec = cluster.specs[1]
        spec.settings["node"]["peer_listen"] = f"tcp://{home.address}:7001"
        reached = f"tcp://{home.seen_from}:7000"
        with cluster:
            for each in cluster.specs:
                cluster.start(each)
            seen = wait_for(lambda: ((cluster.status(spec) or {}).get("reachability") or {}).get("dialled_back"), 30)
            doctor = main(["doctor", "--config", str(spec.config_path)])
            printed = capsys.readouterr().out
            assert seen == {reached: 1} and doctor == 1  # one bootstrap: one of the two needed to be sure
            assert f"reached it at {reached} (1 of the 2 needed to be sure): advertise that" in printed, printed
            # As `doctor` says: advertise the router's address (its peers' port forwarded as well).
            cluster.kill(spec, signal.SIGTERM, timeout=20)
            spec.settings["node"].update(advertise=reached, peer_advertise_port=7001)
            cluster.start(spec)
            wait_for(lambda: [len((status or {}).get("peers", [])) for status in cluster.statuses()] == [1, 1], 30)
            assert (cluster.status(spec) or {})["reachability"]["state"] != "private"


def test_a_node_behind_any_nat_is_answered_over_the_connection_it_dialled_even_after_its_router_forgets_it():
    """The ground client mode stands on (issue #46): a client ingress behind each kind of NAT
    dials a public node's peers' socket, and the public node answers over that connection, which
    no dial from outside could open. After `conntrack -F` on every router the inside sends first
    (as keep-alives will): through a router that keeps ports the same connection carries on;
    behind a symmetric NAT the public node resets the stranger's packet and libzmq dials again,
    so the answers resume within seconds, there over a new connection."""
    with NatLab() as lab:
        server = lab.add("pub", "public")
        serving = subprocess.Popen(
            [*server.prefix, sys.executable, str(ROUTED_PEER), "serve", f"tcp://{server.address}:9200"],
            stdout=subprocess.PIPE,
            text=True,
        )
        dialling = []
        try:
            assert serving.stdout.readline().strip() == "listening"
            for site in ("port-restricted", "symmetric", "double"):
                host = lab.add(site[:4], site)
                command = [*host.prefix, sys.executable, str(ROUTED_PEER), "dial", f"tcp://{server.address}:9200"]
                dialling.append(
                    (site, subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
                )

            def answered(process: subprocess.Popen, tries: int) -> int | None:
                """The first of `tries` pings answered (each waits 2 s), or None."""
                for number in range(tries):
                    process.stdin.write(f"go {number}\n")
                    process.stdin.flush()
                    if process.stdout.readline().strip() == "ok":
                        return number
                return None

            for site, process in dialling:
                assert answered(process, 5) is not None, site
            lab.flush()
            after = {site: answered(process, 5) for site, process in dialling}
            assert after["port-restricted"] == 0 and after["double"] == 0, after
            assert after["symmetric"] is not None, after
        finally:
            for process in (*(process for _, process in dialling), serving):
                process.kill()
                process.wait()
                for stream in (process.stdin, process.stdout):
                    if stream is not None:
                        stream.close()


def test_daemons_behind_nats_that_forward_nothing_join_in_client_mode_and_stay_after_their_routers_forget_them(
    tmp_path,
):
    """Client mode (issue #46): behind a port-restricted and a symmetric NAT, forwarding nothing,
    a daemon with `client_mode` is admitted by the public bootstrap over the connection it
    dialled, hears of the other public node from it and dials that one too; both public nodes
    reach it over its connections. Two client nodes cannot reach each other (that takes a
    relay), so each has the two public nodes as peers. After `conntrack -F` on every router the
    clients are peers again within the peer timeout."""
    with NatLab() as lab:
        hosts = [lab.add("boot", "public"), lab.add("pub", "public"), lab.add("home", "port-restricted")]
        hosts.append(lab.add("sym", "symmetric"))
        cluster = cluster_on(hosts, tmp_path / "net", discovery=DISCOVERY)
        for spec in cluster.specs[2:]:
            spec.settings["node"]["client_mode"] = True
        with cluster:
            for spec in cluster.specs:
                cluster.start(spec)
            expected = [3, 3, 2, 2]  # the public nodes have everyone; a client, the public nodes

            def peer_counts() -> list:
                return [(cluster.status(spec) or {}).get("peer_count") for spec in cluster.specs]

            assert wait_for(lambda: peer_counts() == expected, 30), peer_counts()
            client = cluster.status(cluster.specs[3])
            assert client["client_mode"] and client["listen"] is None
            lab.flush()
            time.sleep(DISCOVERY["peer_timeout_s"] + 1)  # anyone not heard from since is evicted by now
            assert wait_for(lambda: peer_counts() == expected, 30), peer_counts()
