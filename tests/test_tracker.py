"""The seed's tracker unit tests (awa-worker v0.6.1 maintenance.rs), same
scenarios, against the pure state machines. Cooldown lengths follow our paced
rule: min(120, 2 * ceil(sample / interval)) instead of a fixed 120."""

from awa_trio.tracker import (
    MAX_COOLDOWN_TICKS,
    MAX_PRUNE_BACKOFF_LEVEL,
    OVERRUN_HYSTERESIS_K,
    OverrunTracker,
    PruneBackoffTracker,
    PruneOutcome,
    cooldown_ticks_for,
    to_nanos,
)

MS = 0.001
LEASE, CLAIM = "lease", "claim"


def replay_ticks(tracker, branch, body_duration, tick_interval, n, *, cooldown=True):
    """Drive n ticks; when a body runs, record body_duration as its sample.
    Skipped ticks record nothing, as in production. Returns ran-per-tick."""
    ran = []
    for _ in range(n):
        decision = tracker.begin(branch, tick_interval, cooldown=cooldown)
        ran.append(decision.run)
        if decision.run:
            tracker.finish(branch, body_duration)
    return ran


def seed_last_duration(tracker, branch, duration):
    tracker.finish(branch, duration)


def counters(tracker, branch):
    state = tracker.state(branch)
    return state.cooldown_ticks_remaining, state.consecutive_overrun, state.consecutive_ontime


def is_delayed(tracker, branch):
    return tracker.state(branch).is_delayed


# Paced cooldown for the seed scenarios: 250ms bodies on a 100ms tick is
# 2 * ceil(2.5) = 6 quiet ticks, the flipping (or re-arming) tick included,
# so 5 remain after it. (The seed armed a fixed 120 after the flipping tick.)
COOLDOWN_250_ON_100 = 2 * 3
REMAINING_AFTER_FLIP = COOLDOWN_250_ON_100 - 1


def test_paced_cooldown_formula():
    assert cooldown_ticks_for(to_nanos(250 * MS), to_nanos(100 * MS)) == COOLDOWN_250_ON_100
    assert cooldown_ticks_for(to_nanos(151 * MS), to_nanos(100 * MS)) == 4
    assert cooldown_ticks_for(to_nanos(1000), to_nanos(1)) == MAX_COOLDOWN_TICKS


def test_branch_tracker_initial_state_has_no_history():
    assert OverrunTracker().state("promote_scheduled") is None


def test_branch_tracker_finish_records_last_duration():
    tracker = OverrunTracker()
    assert tracker.begin("promote_scheduled", 1.0).run, "first tick should not be skipped"
    tracker.finish("promote_scheduled", 0.004)
    state = tracker.state("promote_scheduled")
    assert state.last_duration_ns == to_nanos(0.004)
    assert not state.is_delayed, "first tick has no prior duration -> not delayed"


def test_branch_tracker_single_overrun_does_not_flip():
    tracker = OverrunTracker()
    seed_last_duration(tracker, "cleanup", 200 * MS)
    replay_ticks(tracker, "cleanup", 200 * MS, 100 * MS, 1)
    assert not is_delayed(tracker, "cleanup"), "single overrun must not flip (K=3 required)"


def test_branch_tracker_deadband_sample_does_not_advance_counters():
    tracker = OverrunTracker()
    seed_last_duration(tracker, "cleanup", 101 * MS)
    replay_ticks(tracker, "cleanup", 101 * MS, 100 * MS, 5)
    assert counters(tracker, "cleanup") == (0, 0, 0)


def test_branch_tracker_k_consecutive_overruns_flips_and_arms_cooldown():
    tracker = OverrunTracker()
    seed_last_duration(tracker, "cleanup", 250 * MS)
    ran = replay_ticks(tracker, "cleanup", 250 * MS, 100 * MS, OVERRUN_HYSTERESIS_K)
    assert ran == [True, True, False], "flip-tick skips body"
    cooldown, overrun, _ = counters(tracker, "cleanup")
    assert is_delayed(tracker, "cleanup")
    assert overrun == OVERRUN_HYSTERESIS_K
    assert cooldown == REMAINING_AFTER_FLIP, "cooldown paced by the offending body"


def test_branch_tracker_without_cooldown_tracks_overrun_but_keeps_running():
    tracker = OverrunTracker()
    seed_last_duration(tracker, "terminal_count_rollup", 250 * MS)
    ran = replay_ticks(
        tracker, "terminal_count_rollup", 250 * MS, 100 * MS, OVERRUN_HYSTERESIS_K, cooldown=False
    )
    assert ran == [True, True, True], "no-cooldown branches keep running on overrun"
    cooldown, overrun, _ = counters(tracker, "terminal_count_rollup")
    assert cooldown == 0
    assert overrun == OVERRUN_HYSTERESIS_K
    assert is_delayed(tracker, "terminal_count_rollup"), "overrun state still observable"


def test_branch_tracker_cooldown_skips_body():
    tracker = OverrunTracker()
    seed_last_duration(tracker, "cleanup", 250 * MS)
    replay_ticks(tracker, "cleanup", 250 * MS, 100 * MS, OVERRUN_HYSTERESIS_K)
    ran = replay_ticks(tracker, "cleanup", 50 * MS, 100 * MS, REMAINING_AFTER_FLIP)
    assert not any(ran), "every tick during cooldown must skip body"
    assert counters(tracker, "cleanup")[0] == 0, "cooldown decrements to zero"


def test_branch_tracker_cooldown_expires_then_body_runs():
    tracker = OverrunTracker()
    seed_last_duration(tracker, "cleanup", 250 * MS)
    replay_ticks(tracker, "cleanup", 250 * MS, 100 * MS, OVERRUN_HYSTERESIS_K)
    replay_ticks(tracker, "cleanup", 50 * MS, 100 * MS, REMAINING_AFTER_FLIP)
    assert replay_ticks(tracker, "cleanup", 50 * MS, 100 * MS, 1) == [True]
    cooldown, overrun, ontime = counters(tracker, "cleanup")
    assert cooldown == 0
    assert overrun == OVERRUN_HYSTERESIS_K, "overrun count preserved across cooldown"
    assert ontime == 0, "this tick had no sample to evaluate"


def test_branch_tracker_cooldown_rearms_on_continued_overrun():
    tracker = OverrunTracker()
    seed_last_duration(tracker, "cleanup", 250 * MS)
    replay_ticks(tracker, "cleanup", 250 * MS, 100 * MS, OVERRUN_HYSTERESIS_K)
    replay_ticks(tracker, "cleanup", 50 * MS, 100 * MS, REMAINING_AFTER_FLIP)
    ran = replay_ticks(tracker, "cleanup", 250 * MS, 100 * MS, 2)
    assert ran == [True, False], "first tick runs body; second re-arms cooldown"
    assert counters(tracker, "cleanup")[0] == REMAINING_AFTER_FLIP
    assert is_delayed(tracker, "cleanup")


def test_branch_tracker_intermittent_overrun_does_not_flip():
    tracker = OverrunTracker()
    seed_last_duration(tracker, "cleanup", 200 * MS)
    for over in (True, False, True, False, True):
        replay_ticks(tracker, "cleanup", (200 if over else 50) * MS, 100 * MS, 1)
    assert not is_delayed(tracker, "cleanup")


def test_branch_tracker_recovers_only_after_k_ontime_ticks_post_cooldown():
    tracker = OverrunTracker()
    seed_last_duration(tracker, "cleanup", 250 * MS)
    replay_ticks(tracker, "cleanup", 250 * MS, 100 * MS, OVERRUN_HYSTERESIS_K)
    replay_ticks(tracker, "cleanup", 50 * MS, 100 * MS, REMAINING_AFTER_FLIP)
    replay_ticks(tracker, "cleanup", 50 * MS, 100 * MS, OVERRUN_HYSTERESIS_K)
    assert is_delayed(tracker, "cleanup"), "still delayed after only K-1 evaluations"
    replay_ticks(tracker, "cleanup", 50 * MS, 100 * MS, 1)
    assert not is_delayed(tracker, "cleanup"), "recovered after K evaluable on-time samples"


def test_branch_tracker_per_branch_state_is_independent():
    tracker = OverrunTracker()
    seed_last_duration(tracker, "cleanup", 500 * MS)
    replay_ticks(tracker, "cleanup", 500 * MS, 100 * MS, OVERRUN_HYSTERESIS_K)
    seed_last_duration(tracker, "promote_scheduled", 10 * MS)
    replay_ticks(tracker, "promote_scheduled", 10 * MS, 250 * MS, OVERRUN_HYSTERESIS_K)
    assert is_delayed(tracker, "cleanup")
    assert not is_delayed(tracker, "promote_scheduled")


def test_branch_tracker_threshold_samples_are_deadband():
    """Exactly 3/2 and exactly 7/10 of the interval are inside the deadband
    (strict comparisons, integer nanoseconds)."""
    tracker = OverrunTracker()
    for sample in (150 * MS, 70 * MS):
        seed_last_duration(tracker, "b", sample)
        tracker.begin("b", 100 * MS)
    assert counters(tracker, "b") == (0, 0, 0)


def test_fixed_120_tick_starvation_is_gone():
    """Upstream defect 1: a 250ms body on a 100ms interval ran once per 120+
    ticks. With paced cooldown it keeps about a third of its ticks."""
    tracker = OverrunTracker()
    seed_last_duration(tracker, "rescue_expired_deadlines", 250 * MS)
    ran = replay_ticks(tracker, "rescue_expired_deadlines", 250 * MS, 100 * MS, 1200)
    assert sum(ran) >= 1200 // (COOLDOWN_250_ON_100 + 1)
    assert sum(ran) > 1200 // 121 * 10


# -- PruneBackoffTracker (#169) -------------------------------------------


def test_prune_backoff_initial_state_does_not_skip():
    tracker = PruneBackoffTracker()
    assert not tracker.should_skip(LEASE)
    state = tracker.state(LEASE)
    assert (state.skip_remaining, state.backoff_level) == (0, 0)


def snapshot(tracker, branch):
    state = tracker.state(branch)
    return None if state is None else (state.skip_remaining, state.backoff_level)


def test_prune_backoff_skipped_active_doubles_then_resets_on_pruned():
    tracker = PruneBackoffTracker()
    tracker.record_outcome(LEASE, PruneOutcome.SKIPPED_ACTIVE)
    assert snapshot(tracker, LEASE) == (2, 1)
    assert tracker.should_skip(LEASE)
    assert tracker.should_skip(LEASE)
    assert not tracker.should_skip(LEASE)
    tracker.record_outcome(LEASE, PruneOutcome.SKIPPED_ACTIVE)
    assert snapshot(tracker, LEASE) == (4, 2)
    tracker.record_outcome(LEASE, PruneOutcome.PRUNED)
    assert snapshot(tracker, LEASE) == (0, 0)
    assert not tracker.should_skip(LEASE)


def test_prune_backoff_blocked_increases_level_same_as_skipped_active():
    tracker = PruneBackoffTracker()
    tracker.record_outcome(LEASE, PruneOutcome.BLOCKED)
    assert snapshot(tracker, LEASE) == (2, 1)
    tracker.record_outcome(LEASE, PruneOutcome.BLOCKED)
    assert snapshot(tracker, LEASE) == (4, 2)


def test_prune_backoff_noop_is_neutral():
    tracker = PruneBackoffTracker()
    tracker.record_outcome(LEASE, PruneOutcome.SKIPPED_ACTIVE)
    before = snapshot(tracker, LEASE)
    tracker.record_outcome(LEASE, PruneOutcome.NOOP)
    assert snapshot(tracker, LEASE) == before


def test_prune_backoff_caps_at_max_level():
    tracker = PruneBackoffTracker()
    for _ in range(MAX_PRUNE_BACKOFF_LEVEL + 5):
        tracker.record_outcome(LEASE, PruneOutcome.SKIPPED_ACTIVE)
    assert snapshot(tracker, LEASE) == (1 << MAX_PRUNE_BACKOFF_LEVEL, MAX_PRUNE_BACKOFF_LEVEL)


def test_prune_backoff_per_branch_state_is_independent():
    tracker = PruneBackoffTracker()
    tracker.record_outcome(LEASE, PruneOutcome.SKIPPED_ACTIVE)
    tracker.record_outcome(LEASE, PruneOutcome.SKIPPED_ACTIVE)
    assert snapshot(tracker, LEASE) == (4, 2)
    assert snapshot(tracker, CLAIM) is None
    assert not tracker.should_skip(CLAIM)


async def test_a_branch_whose_term_ends_is_cancelled_not_broken_when_the_tracker_has_gone():
    """Requests are queued without a checkpoint; when the tracker's channel
    is already closed (its term ending), a branch being cancelled with that
    term must see Cancelled, not BrokenResourceError (which reads as a
    branch crash)."""
    import pytest
    import trio

    from awa_trio.tracker_actor import TrackerClient

    send, receive = trio.open_memory_channel(10)
    client = TrackerClient(send)
    await receive.aclose()
    with trio.CancelScope() as scope:
        scope.cancel()
        await client.finish_tick("promote_scheduled", 0.01)
    assert scope.cancelled_caught
    with pytest.raises(trio.BrokenResourceError):  # not being cancelled: the loss shows
        await client.finish_tick("promote_scheduled", 0.01)


async def test_a_branch_reporting_after_the_real_tracker_actor_stopped_is_cancelled_not_crashed():
    """The tracker actor itself, cancelled with its term: a branch whose
    body came back (a cancelled query can surface as a driver error) and
    reports into it while being cancelled sees Cancelled. It once saw
    ClosedResourceError, because the tracker closed the branches' send end."""
    import pytest
    import trio

    from awa_trio.metrics import MaintenanceMetrics
    from awa_trio.tracker_actor import run_tracker

    async with trio.open_nursery() as nursery:
        client = await nursery.start(run_tracker, MaintenanceMetrics())
        nursery.cancel_scope.cancel()
    with trio.CancelScope() as scope:
        scope.cancel()
        await client.finish_tick("cron_eval", 0.01, error="database error")
    assert scope.cancelled_caught
    with pytest.raises(trio.BrokenResourceError):
        await client.finish_tick("cron_eval", 0.01)


async def test_the_tracker_actor_survives_an_asker_that_left_before_its_answer():
    """A branch cancelled after its request was already handed to the
    tracker has closed its reply channel; the tracker must go on serving
    the others (it once died of BrokenResourceError, ending the term)."""
    import trio

    from awa_trio.metrics import MaintenanceMetrics
    from awa_trio.tracker_actor import _BeginTick, run_tracker

    async with trio.open_nursery() as nursery:
        client = await nursery.start(run_tracker, MaintenanceMetrics())
        reply_send, reply_receive = trio.open_memory_channel(1)
        await reply_receive.aclose()
        await client._post(_BeginTick("cron_eval", 1.0, True, reply_send))
        assert (await client.begin_tick("cron_eval", 1.0)).run
        assert "cron_eval" in await client.snapshot()
        nursery.cancel_scope.cancel()
