"""`p2pnode bench transport` under a rate limit it meets: a trial ends, with every frame node A
sent accounted for as delivered or refused (and why), instead of waiting for frames node B
refused (tools/bench/transport.py)."""

from dataclasses import replace

from tools.bench.transport import DEFAULTS, run_trio, trial_settings


def test_a_trial_that_meets_the_rate_limit_ends_and_reports_the_refusals():
    # The defaults' limit (5,000 frames a second, bursts of 1,000) made tighter, so that a sender
    # on any machine meets it: the mechanism the 1 KiB trial meets under the defaults on a fast one.
    tight = replace(trial_settings(DEFAULTS), rate_per_connection=20, burst_per_connection=50)
    outcome = run_trio(1024, 600, tight)
    refused = outcome["refused"]
    assert refused.get("rate_limited", 0) > 0 and set(refused) == {"rate_limited"}
    assert outcome["delivered"] + refused["rate_limited"] == 600 and outcome["unaccounted"] == 0
    assert outcome["per_s"] > 0


def test_a_trial_past_its_deadline_ends_and_reports_the_frames_neither_delivered_nor_refused():
    outcome = run_trio(1024, 5000, trial_settings(DEFAULTS), deadline_s=0.01)
    assert outcome["unaccounted"] > 0
    assert outcome["delivered"] + sum(outcome["refused"].values()) + outcome["unaccounted"] == 5000
