"""The readable form of a node's status (`p2pnode status` without --json)."""

from __future__ import annotations

from p2pnode.learning.rounds import served_because

from .doctor import relay_line

__all__ = ["format_status", "format_fleet"]


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} s"


def _memory(status: dict) -> str:
    """Resident memory now and at its peak (older nodes and non-Linux hosts may lack them)."""
    rss, peak = status.get("rss_mb"), status.get("peak_rss_mb")
    return f"rss {'-' if rss is None else f'{rss:.0f} MB'} (peak {'-' if peak is None else f'{peak:.0f} MB'})"


TOP_NEIGHBOURS = 5  # neighbours listed by weight; the rest are counted


def _local_baseline_text(accuracy: float | None, baseline: dict | None) -> str:
    """`[algorithm].local_baseline`'s last accuracy, and what collaboration gained over it."""
    local = (baseline or {}).get("accuracy")
    if local is None:
        return ""
    gain = "" if accuracy is None else f" (gain {100 * (accuracy - local):+.1f} points)"
    return f"  local baseline {local:.3f}{gain}"


def _learning_lines(learning: dict, own_id: str) -> list[str]:
    """Algorithm, progress, last accuracy, then the heaviest neighbours with the age of the
    latest payload each sent."""
    accuracy = "-" if learning["accuracy"] is None else f"{learning['accuracy']:.3f}"
    history = learning.get("history") or []
    last = history[-1] if history else {}
    predictor = last.get("predictor")  # where it has several (MAPL-Dual, -Auto), and why where it chose
    if predictor:
        validation, images = last.get("validation_by_predictor") or {}, last.get("validation_samples", 0)
        predictor = served_because(predictor, validation, images, last.get("predictor_why", ""))
    lines = [
        f"learning {learning['algorithm'] or '(loading data and model)'}  phase {learning['phase']}  "
        f"rounds completed {learning['completed']}/{learning['rounds']}  accuracy {accuracy}"
        + (f"  predicting with: {predictor}" if predictor else "")
        + _local_baseline_text(learning["accuracy"], last.get("local_baseline"))
        + (f"  resumed after round {learning['resumed_from']}" if learning["resumed_from"] is not None else "")
        + (f"  catch-ups {learning['catch_ups']}" if learning["catch_ups"] else "")
        + (f"  superseded {learning['superseded']}" if learning.get("superseded") else "")
    ]
    neighbours = sorted(learning["neighbours"].items(), key=lambda item: (-item[1], item[0]))
    if neighbours:
        lines.append(f"  {'neighbour':<18}{'weight':>8}  last payload")
        for peer, weight in neighbours[:TOP_NEIGHBOURS]:
            seen = learning["last_payloads"].get(peer)
            when = "-" if seen is None else f"{_seconds(seen['age_s'])} ago, round {seen['round']}"
            name = "(this node)" if peer == own_id else peer
            lines.append(f"  {name:<18}{weight:>8.3f}  {'' if peer == own_id else when}".rstrip())
        if len(neighbours) > TOP_NEIGHBOURS:
            lines.append(f"  ... and {len(neighbours) - TOP_NEIGHBOURS} more (status --json lists all)")
    missing = sorted(learning["missing_payloads"].items(), key=lambda item: (-item[1], item[0]))
    if missing:
        shown = ", ".join(f"{peer} {count}" for peer, count in missing[:TOP_NEIGHBOURS])
        more = f", ... {len(missing) - TOP_NEIGHBOURS} more" if len(missing) > TOP_NEIGHBOURS else ""
        lines.append(f"  payloads missed, by peer: {shown}{more}")
    return lines


def _ingress_line(ingress: dict) -> str:
    """The inbound sockets' processes (wire/inbound/supervisor.py): up or not, and how often they were restarted."""
    parts = []
    for name, process in ingress.items():
        state = f"pid {process['pid']}" if process["up"] else "down"
        last = process["exits"][-1]["how"] if process["exits"] else None
        restarts = f", {process['restarts']} restarts (last: {last})" if process["restarts"] else ""
        parts.append(f"{name} {state}{restarts}")
    return "inbound sockets: " + "; ".join(parts)


def _peer_lines(status: dict) -> list[str]:
    """The peers, one a line; a peer that is not a learning peer says why (older nodes do not)."""
    excluded = (status.get("learning") or {}).get("excluded", {})
    lines = []
    if status["peers"]:
        # As wide as the longest address: a client node's (tcp://<32 hex>.client.invalid:1) is 49 characters.
        width = max(28, *(len(peer["address"]) + 2 for peer in status["peers"]))
        lines.append(f"  {'node id':<18}{'address':<{width}}{'last seen':>10}{'rtt':>10}  reached")
        for peer in status["peers"]:
            rtt = "-" if peer["rtt_ms"] is None else f"{peer['rtt_ms']:.2f} ms"
            why = excluded.get(peer["node_id"])
            lines.append(
                f"  {peer['node_id']:<18}{peer['address']:<{width}}{_seconds(peer['last_seen_s']):>10}{rtt:>10}"
                + f"  {_reached(peer.get('route'))}"
                + (f"  not learning with it: it {why}" if why else "")
            )
    return lines


def _reached(route: str | None) -> str:
    """How a peer is reached (`Circuits.route`); older nodes do not say."""
    if route is None:
        return "-"
    if route.startswith("relay:"):
        return f"through relay {route.removeprefix('relay:')}"
    return {"connection": "over its connection", "dialled": "dialled"}.get(route, route)


def _is_failure(reason: str) -> bool:
    """A connection counter (zap.py, discovery/membership_actions.py) that says something went wrong:
    inbound handshakes that failed, the ZAP handler's refusals, and the failed or refused
    handshakes of this node's own dials to its bootstrap entries."""
    return any(word in reason for word in ("failed", "denied", "refused"))


# Refusals of peers' connections made before this node admitted them, and then resolved (zap.py
# `NotPeerRefusals`); each also failed its handshake (libzmq reports a ZAP refusal as one
# HANDSHAKE_FAILED_AUTH), so both counts are shown less these.
RACE_RESOLVED = "not_peer_race_resolved"
RACE_COUNTED_IN = ("zap_denied_not_peer", "handshake_failed")


def _connection_lines(connections: dict) -> list[str]:
    """The connections refused or failed, by reason, less the start-up race, which has a line of
    its own: a peer that connected before this node admitted it, as happens when nodes start
    together, is no trouble (`[security].not_peer_race_s`)."""
    resolved = connections.get(RACE_RESOLVED, 0)
    failed = {
        reason: count - resolved if reason in RACE_COUNTED_IN else count
        for reason, count in connections.items()
        if _is_failure(reason)
    }
    failed = {reason: count for reason, count in failed.items() if count > 0}
    lines = []
    if failed:
        lines.append(
            "connections refused or failed: " + ", ".join(f"{reason} {count}" for reason, count in failed.items())
        )
    if resolved:
        lines.append(
            f"start-up race (resolved): zap_denied_not_peer {resolved} from keys admitted as peers "
            "within [security].not_peer_race_s after (normal when nodes start together; not counted above)"
        )
    return lines


def format_status(status: dict) -> str:
    lines = [
        f"node {status['node_id']}  {status['address']}  network {status['network']}  "
        f"up {_seconds(status['uptime_s'])}  round {status['round']}  pid {status['pid']}  {_memory(status)}",
        f"peers {status['peer_count']}/{status['max_peers']}"
        + (f"  dialing {len(status['dialing'])}" if status["dialing"] else ""),
    ]
    if "reachability" in status:  # older nodes do not say
        lines.insert(1, f"reachability: {status['reachability']['state']} ({status['reachability']['why']})")
    lines[2:2] = [line for line in (relay_line(status),) if line]
    excluded = (status.get("learning") or {}).get("excluded", {})
    if excluded:
        lines[-1] += f"  ({len(excluded)} not learning with this node: see below)"
    if "ingress" in status:  # older nodes have no ingress processes
        lines.insert(1, _ingress_line(status["ingress"]))
    lines += _peer_lines(status)
    traffic = status["traffic"]
    lines.append(f"traffic  {'in msgs':>9}{'in bytes':>12}{'out msgs':>10}{'out bytes':>12}")
    for kind, row in traffic["by_type"].items():
        lines.append(
            f"  {kind:<10}{row['messages_in']:>7}{row['bytes_in']:>12}{row['messages_out']:>10}{row['bytes_out']:>12}"
        )
    lines.append(
        "  "
        f"{'total':<10}{traffic['messages_in']:>7}{traffic['bytes_in']:>12}{traffic['messages_out']:>10}{traffic['bytes_out']:>12}"
    )
    rejections = traffic["rejections"]
    lines.append(
        "rejections: "
        + (", ".join(f"{reason} {count}" for reason, count in rejections.items()) if rejections else "none")
    )
    lines += _connection_lines(traffic.get("connections", {}))
    if traffic["send_dropped"]:
        lines.append(
            "sends dropped: " + ", ".join(f"{kind} {count}" for kind, count in traffic["send_dropped"].items())
        )
    if traffic.get("send_refused"):
        lines.append(
            "sends refused (no sequence number reserved): "
            + ", ".join(f"{kind} {count}" for kind, count in traffic["send_refused"].items())
        )
    if status.get("state_write_failures"):
        lines.append(f"sequence reservation not saved: {status['state_write_failures']} times (see the log)")
    learning = status.get("learning") or {}
    if learning:
        lines += _learning_lines(learning, status["node_id"])
    if learning.get("checkpoint_failures"):
        lines.append(
            f"checkpoints not saved: {learning['checkpoint_failures']} (on disk: round {learning['checkpoint_round']}; "
            f"last error: {learning['checkpoint_error'] or 'none since'})"
        )
    if learning.get("history_failures"):
        lines.append(
            f"history lines not written: {learning['history_failures']} ({learning['history_path']}; "
            f"last error: {learning['history_error'] or 'none since'})"
        )
    if traffic.get("beacon_sends_failed"):
        lines.append(f"beacon sends failed: {traffic['beacon_sends_failed']}")
    return "\n".join(lines)


def format_fleet(rows: list[dict]) -> str:
    """One line per node (`p2pnode status --fleet`): its round and rounds done, peers, accuracy,
    its local baseline's and the difference where it trains one, or why it did not answer."""
    lines = [f"{'config':<28}{'node':<18}{'phase':<10}{'rounds':>9}{'peers':>7}{'accuracy':>10}{'local':>8}{'gain':>8}"]
    for row in rows:
        name = _short(row["config"])
        if "error" in row:
            lines.append(f"{name:<28}{row['error']}")
            continue
        status = row["status"]
        learning = status.get("learning") or {}
        done = f"{learning.get('completed', '-')}/{learning.get('rounds', '-')}" if learning else "-"
        accuracy = learning.get("accuracy")
        history = learning.get("history") or []
        local = (history[-1].get("local_baseline") or {}).get("accuracy") if history else None
        gain = None if accuracy is None or local is None else accuracy - local
        lines.append(
            f"{name:<28}{status['node_id']:<18}{learning.get('phase', 'none'):<10}{done:>9}"
            f"{status['peer_count']:>7}{_percent(accuracy):>10}{_percent(local):>8}"
            f"{'-' if gain is None else f'{gain * 100:+.1f}':>8}"
        )
    return "\n".join(lines)


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.1f} %"


def _short(path: str) -> str:
    """The config's folder and name (fleet/node0/node.toml -> node0/node.toml), at most 27 characters."""
    parts = path.replace("\\", "/").split("/")
    short = "/".join(parts[-2:])
    return short if len(short) < 28 else "..." + short[-24:]
