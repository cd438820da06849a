import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol import ProtocolError, Reason, ReplayGuard, SequenceCounter, SequenceExhausted

pytestmark = pytest.mark.quick  # no daemons, no training: make test-quick runs it

NOW = 1_700_000_000_000_000
A, B, C = b"a" * 32, b"b" * 32, b"c" * 32


def reason(guard, sender, seq, ts=NOW, now=NOW):
    try:
        guard.admit(sender, seq, ts, now)
    except ProtocolError as exc:
        return exc.reason
    return None


def trusted(*senders, window=1024, **kwargs):
    """A guard that trusts `senders` from before sequence number 0 on."""
    guard = ReplayGuard(window=window, **kwargs)
    for sender in senders:
        guard.trust(sender, -window)
    return guard


def test_a_repeat_is_a_replay_and_senders_are_independent():
    guard = trusted(A, B)
    assert reason(guard, A, 10) is None
    assert reason(guard, A, 10) is Reason.REPLAY
    assert reason(guard, B, 10) is None
    assert reason(guard, A, 11) is None


def test_reordering_within_the_window_is_accepted_once():
    guard = trusted(A, window=8)
    guard.trust(A, 90)
    for seq in (100, 104, 101, 103, 97):
        assert reason(guard, A, seq) is None, seq
    for seq in (100, 104, 101, 103, 97):
        assert reason(guard, A, seq) is Reason.REPLAY, seq
    assert reason(guard, A, 96) is Reason.REPLAY  # below the window: can no longer be told apart
    assert reason(guard, A, 102) is None


def test_a_jump_far_ahead_moves_the_window():
    guard = trusted(A, window=8)
    guard.admit(A, 5, NOW, NOW)
    guard.admit(A, 5_000, NOW, NOW)
    assert reason(guard, A, 4_995) is None
    assert reason(guard, A, 5) is Reason.REPLAY


@given(st.lists(st.integers(0, 200), max_size=300), st.integers(1, 64))
def test_guard_matches_a_reference_model(seqs, window):
    guard, accepted = trusted(A, window=window), set()
    for seq in seqs:
        expected_ok = seq not in accepted and (not accepted or seq > max(accepted) - window)
        assert (reason(guard, A, seq) is None) == expected_ok
        if expected_ok:
            accepted.add(seq)


def test_timestamps_outside_the_skew_bound_are_stale():
    guard = trusted(A, max_skew_us=5_000_000)
    assert reason(guard, A, 1, ts=NOW - 6_000_000) is Reason.STALE
    assert reason(guard, A, 2, ts=NOW + 6_000_000) is Reason.STALE
    assert reason(guard, A, 3, ts=NOW - 5_000_000) is None
    # A stale frame is not recorded: the same numbers stay usable for fresh frames.
    assert reason(guard, A, 1) is None
    # Strangers get the same bound, statelessly.
    assert reason(guard, B, 1, ts=NOW + 6_000_000) is Reason.STALE
    with pytest.raises(ProtocolError):
        guard.check_fresh(NOW - 6_000_000, NOW)


def test_strangers_leave_no_state_and_cannot_shut_out_anyone():
    """The isolation attack of issue #14: thousands of throwaway keys, each with one frame
    dated far ahead, must neither grow the guard nor make it refuse an honest frame."""
    guard = trusted(A)
    for i in range(10_000):
        stranger = i.to_bytes(32, "big")
        assert guard.admit(stranger, 1, NOW + 55_000_000, NOW) is False
    assert len(guard) == 1 and A in guard
    assert guard.admit(A, 1, NOW, NOW) is True
    assert reason(guard, B, 7) is None  # an honest newcomer's handshake frame goes through


def test_trust_counts_everything_before_the_proof_as_seen():
    guard = ReplayGuard(window=64)
    guard.trust(A, 1_000)
    for seq in (1_000, 999, 940, 5):
        assert reason(guard, A, seq) is Reason.REPLAY, seq
    assert reason(guard, A, 1_001) is None
    # Forgotten (evicted) and trusted again after a new handshake: old frames stay refused.
    guard.forget(A)
    assert A not in guard and reason(guard, A, 1_001) is None  # a stranger: stateless tier
    guard.trust(A, 2_000)
    assert reason(guard, A, 1_500) is Reason.REPLAY


def test_frames_held_while_the_sender_was_verified_are_accepted_once():
    """A peer may send before the PONG that gets it admitted is sent (it admitted us first, and
    answered our challenge later): those frames, parked meanwhile, are numbered below the PONG.
    Trusting from the lowest of them leaves them unseen: each is accepted once; older stay refused."""
    guard = ReplayGuard(window=64)
    guard.trust(A, 1_000, unseen_from=990)
    for seq in (990, 995, 999):
        assert reason(guard, A, seq) is None, seq
        assert reason(guard, A, seq) is Reason.REPLAY, seq
    for seq in (1_000, 989, 900):  # the admitting frame itself, and what came before the parked ones
        assert reason(guard, A, seq) is Reason.REPLAY, seq
    guard.trust(B, 1_000, unseen_from=1)  # far below: only the window's worth stays open
    assert reason(guard, B, 1_000 - 63) is None and reason(guard, B, 1_000 - 64) is Reason.REPLAY


def test_trusted_senders_are_bounded():
    guard = ReplayGuard(max_senders=2)
    guard.trust(A, 0)
    guard.trust(B, 0)
    guard.admit(A, 1, NOW, NOW)  # A used most recently
    guard.trust(C, 0)  # B, the least recently used, is a stranger again
    assert len(guard) == 2 and A in guard and C in guard and B not in guard


def test_guard_rejects_bad_configuration():
    for kwargs in (dict(window=0), dict(max_skew_us=-1), dict(max_senders=1.5)):
        with pytest.raises(ValueError):
            ReplayGuard(**kwargs)


def _started(persisted, now, block=100):
    counter = SequenceCounter(persisted=persisted, now_us=now, block=block)
    counter.confirm_reservation(counter.propose_reservation())
    return counter


def test_no_number_is_used_before_its_reservation_is_confirmed():
    counter = SequenceCounter(persisted=0, now_us=1000, block=10)
    with pytest.raises(SequenceExhausted):
        counter.next()
    limit = counter.propose_reservation()
    with pytest.raises(SequenceExhausted):  # proposed is not persisted
        counter.next()
    counter.confirm_reservation(limit)
    assert [counter.next() for _ in range(10)] == list(range(1000, 1010))
    with pytest.raises(SequenceExhausted):
        counter.next()


def test_reservation_is_asked_for_when_half_the_block_is_used():
    counter = _started(0, 0, block=10)
    for _ in range(4):
        counter.next()
        assert not counter.needs_reservation
    counter.next()
    assert counter.needs_reservation
    counter.confirm_reservation(counter.propose_reservation())
    assert not counter.needs_reservation and counter.reserved_until == 15


@given(
    st.lists(st.tuples(st.integers(0, 500), st.integers(-(10**6), 10**6)), min_size=1, max_size=8),
    st.integers(1, 64),
)
def test_numbers_never_repeat_across_restarts(runs, block):
    """Each run sends some frames and persists reservations; the clock may jump backwards
    between restarts. No sequence number may ever come out twice."""
    persisted, clock, used = 0, 10**9, set()
    for sent, clock_jump in runs:
        clock = max(0, clock + clock_jump)
        counter = SequenceCounter(persisted=persisted, now_us=clock, block=block)
        for _ in range(sent):
            if counter.needs_reservation:
                persisted = counter.propose_reservation()  # the durable write
                counter.confirm_reservation(persisted)
            seq = counter.next()
            assert seq not in used
            used.add(seq)
        # crash here: only `persisted` survives


def test_a_lost_state_file_is_covered_by_the_clock():
    first = _started(0, 5_000)
    used = [first.next() for _ in range(10)]
    restarted = _started(0, 6_000)  # state file lost, clock moved on
    assert restarted.next() > max(used)


def test_counter_rejects_bad_arguments():
    for kwargs in (dict(persisted=-1, now_us=0), dict(persisted=0, now_us=0, block=0), dict(persisted=0.5, now_us=0)):
        with pytest.raises(ValueError):
            SequenceCounter(**kwargs)
