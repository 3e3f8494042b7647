"""The replica's send path decisions (send_schedule.py beside the CPU engine's model.py): no Triton, no
threads, no clock."""

from __future__ import annotations

import pytest
from send_schedule import CancelSweep, SendBudget, SendQueue, StepClock, YieldPacer, top_of_other_tenants


def drain(queue: SendQueue) -> list[str]:
    out = []
    while (request_id := queue.pop()) is not None:
        out.append(request_id)
    return out


def test_higher_priority_is_sent_first_then_first_tokens_then_arrival_order() -> None:
    queue = SendQueue()
    queue.push("flood-a", priority=1, first_token_sent=True)
    queue.push("batch", priority=2, first_token_sent=False)
    queue.push("quiet-streaming", priority=0, first_token_sent=True)
    queue.push("flood-new", priority=1, first_token_sent=False)
    queue.push("flood-b", priority=1, first_token_sent=True)
    queue.push("quiet-new", priority=0, first_token_sent=False)
    assert len(queue) == 6
    assert drain(queue) == ["quiet-new", "quiet-streaming", "flood-new", "flood-a", "flood-b", "batch"]
    assert queue.pop() is None and len(queue) == 0


def test_a_stream_marked_dirty_twice_is_queued_once_at_its_first_place() -> None:
    queue = SendQueue()
    queue.push("a", 1, True)
    queue.push("b", 1, True)
    queue.push("a", 1, True)
    assert drain(queue) == ["a", "b"]
    queue.push("a", 1, True)  # popped streams can be queued again
    assert drain(queue) == ["a"]


def test_a_stream_queued_while_others_wait_overtakes_lower_priorities() -> None:
    queue = SendQueue()
    for i in range(5):
        queue.push(f"flood-{i}", 1, True)
    assert queue.pop() == "flood-0"
    queue.push("quiet", 0, False)  # made dirty during the first send
    assert drain(queue) == ["quiet", "flood-1", "flood-2", "flood-3", "flood-4"]


def test_period_zero_asks_every_live_request_on_every_pass() -> None:
    sweep = CancelSweep(0.0)
    live = {"a", "b", "c"}
    assert sorted(sweep.due(live, 0.0)) == ["a", "b", "c"]
    assert sorted(sweep.due(live, 0.0)) == ["a", "b", "c"]
    assert sweep.due(set(), 1.0) == []


def test_a_period_spreads_the_asks_and_asks_each_request_once_per_period() -> None:
    sweep = CancelSweep(0.040)
    live = {f"r{i}": None for i in range(32)}.keys()
    assert sweep.due(live, 0.0) == []  # the first pass only starts the clock
    asked: dict[str, list[float]] = {r: [] for r in live}
    now = 0.0
    for _ in range(40):  # 8 ms passes: 32 * 8 / 40 = 6.4 asks per pass
        now += 0.008
        due = sweep.due(live, now)
        assert len(due) in (6, 7)
        for request_id in due:
            asked[request_id].append(now)
    for times in asked.values():
        gaps = [b - a for a, b in zip([0.0, *times], times, strict=False)]
        assert max(gaps) <= 0.040 + 0.008 + 1e-9  # within one period, give or take one pass


def test_new_requests_join_the_rotation_and_finished_ones_leave_it() -> None:
    sweep = CancelSweep(1.0)
    sweep.due({"a", "b"}, 0.0)
    assert sorted(sweep.due({"a", "b"}, 1.0)) == ["a", "b"]
    # b finished, c arrived: one period later both live requests are asked, b never again.
    assert sorted(sweep.due({"a", "c"}, 2.0)) == ["a", "c"]
    assert sweep.due({"a", "c"}, 2.5) == ["a"]  # half a period: half the requests, oldest ask first
    assert sweep.due({"a", "c"}, 3.0) == ["c"]


def test_a_long_pause_does_not_ask_a_request_twice_in_one_pass() -> None:
    sweep = CancelSweep(1.0)
    sweep.due({"a", "b"}, 0.0)
    assert sorted(sweep.due({"a", "b"}, 100.0)) == ["a", "b"]
    assert sweep.due({"a", "b"}, 100.25) == []  # the credit was capped at one ask each


def test_a_negative_period_is_refused() -> None:
    with pytest.raises(ValueError, match="period_s"):
        CancelSweep(-1.0)


def test_the_pacer_holds_only_work_below_another_tenants_top_priority() -> None:
    pacer = YieldPacer(interval_s=0.25)  # binary fractions: the sums below are exact
    # A flood stream (priority 1) next to another tenant's quiet one (0): at most once per interval.
    assert pacer.hold_until(priority=1, top_other_priority=0, last_send_s=10.0, now_s=10.125) == 10.25
    assert pacer.hold_until(priority=1, top_other_priority=0, last_send_s=10.0, now_s=10.25) is None
    assert pacer.hold_until(priority=2, top_other_priority=1, last_send_s=10.0, now_s=10.125) == 10.25
    # Its first token (never sent) is never held, nor a stream at or above the others' top, nor one
    # whose tenant is alone.
    assert pacer.hold_until(priority=1, top_other_priority=0, last_send_s=None, now_s=10.125) is None
    assert pacer.hold_until(priority=0, top_other_priority=0, last_send_s=10.0, now_s=10.125) is None
    assert pacer.hold_until(priority=1, top_other_priority=1, last_send_s=10.0, now_s=10.125) is None
    assert pacer.hold_until(priority=2, top_other_priority=None, last_send_s=10.0, now_s=10.125) is None


def test_a_pacer_of_zero_holds_nothing_and_a_negative_one_is_refused() -> None:
    assert YieldPacer(0.0).hold_until(priority=2, top_other_priority=0, last_send_s=10.0, now_s=10.0) is None
    with pytest.raises(ValueError):
        YieldPacer(-0.001)


def test_the_top_priority_of_other_tenants() -> None:
    top = top_of_other_tenants([("globex", 1), ("globex", 0), ("globex", 2), ("acme", 1), ("initech", 2)])
    assert top("acme") == 0  # globex has a 0
    assert top("globex") == 1  # acme's 1 is the best of the others
    assert top("initech") == 0
    assert top("nobody-live") == 0
    alone = top_of_other_tenants([("acme", 0), ("acme", 1)])
    assert alone("acme") is None  # one tenant's own streams never hold each other
    assert top_of_other_tenants([])("acme") is None


def test_the_send_budget_grows_with_the_live_streams_up_to_its_cap() -> None:
    budget = SendBudget(max_interval_s=0.25, max_responses_per_s=64.0)  # binary fractions: exact sums
    assert budget.interval_s(1) == 1 / 64  # nearly alone: about one response per token
    assert budget.interval_s(8) == 0.125  # the replica's responses stay at max_responses_per_s ...
    assert budget.interval_s(16) == budget.interval_s(1000) == 0.25  # ... until the cap (the ITL target's)


def test_the_send_budget_holds_a_stream_only_after_its_first_token() -> None:
    budget = SendBudget(max_interval_s=0.25, max_responses_per_s=64.0)
    assert budget.hold_until(last_send_s=None, num_live=1000, now_s=10.0) is None  # the first token goes
    assert budget.hold_until(last_send_s=10.0, num_live=8, now_s=10.0625) == 10.125
    assert budget.hold_until(last_send_s=10.0, num_live=8, now_s=10.125) is None  # due: send now
    assert budget.hold_until(last_send_s=10.0, num_live=1000, now_s=10.125) == 10.25


def test_a_response_spans_the_interval_rounded_down_to_whole_steps_but_long_steps_go_two_at_a_time() -> None:
    budget = SendBudget(max_interval_s=0.25, max_responses_per_s=64.0)  # binary fractions: exact sums
    assert budget.steps_per_response(1000, step_s=0.0625) == 4  # an exact multiple: the whole interval
    assert budget.steps_per_response(1000, step_s=0.09375) == 2  # 2.67 steps: two, the gap within it
    # Steps over half the interval: two steps a response (a 0.375 s gap, the first token waiting one
    # 0.1875 s step, under the interval), where rounding down would send every token alone.
    assert budget.steps_per_response(1000, step_s=0.1875) == 2
    assert budget.steps_per_response(1000, step_s=0.25) == 1  # a step as long as the interval: each step
    assert budget.steps_per_response(1000, step_s=0.3) == 1
    assert budget.steps_per_response(1, step_s=0.0625) == 1  # nearly alone: every token as it is made
    with pytest.raises(ValueError):
        budget.steps_per_response(8, step_s=0.0)


def test_with_the_step_time_known_a_hold_ends_half_a_step_past_its_last_step_end() -> None:
    """The sender lets a hold go at the last step end before its due time: half a step past the k-th
    step end after the last send, that is the k-th, with up to half a step of jitter either way."""
    budget = SendBudget(max_interval_s=0.25, max_responses_per_s=64.0)
    step_s = 0.1875
    due_s = budget.hold_until(last_send_s=10.0, num_live=1000, now_s=10.0, step_s=step_s)
    assert due_s == 10.0 + 2.5 * step_s
    # Let go "at the last step end before its due time": one step ahead of now (model.py's horizon).
    step_ends = [10.0 + k * step_s for k in range(1, 4)]
    for jitter_s in (-0.09, 0.0, 0.09):
        first_let_go = next(end for end in step_ends if end + jitter_s + step_s >= due_s)
        assert first_let_go == step_ends[1]  # the second step end: a response of two steps
    assert budget.hold_until(last_send_s=10.0, num_live=1000, now_s=10.5, step_s=step_s) is None  # due
    assert budget.hold_until(last_send_s=10.0, num_live=1000, now_s=10.0, step_s=0.3) is None  # 1 step
    assert budget.hold_until(last_send_s=None, num_live=1000, now_s=10.0, step_s=step_s) is None


def test_a_send_budget_of_zero_holds_nothing_and_bad_values_are_refused() -> None:
    assert SendBudget(0.0, 1.0).hold_until(last_send_s=10.0, num_live=1000, now_s=10.0) is None
    with pytest.raises(ValueError):
        SendBudget(-0.001, 1000.0)
    with pytest.raises(ValueError):
        SendBudget(0.02, 0.0)


def test_the_step_clock_keeps_the_last_steps_and_a_moving_average_one_long_step_barely_moves() -> None:
    clock = StepClock(window_steps=4)
    assert clock.last_s == clock.typical_s == 0.0  # nothing seen yet: the budget's interval alone decides
    clock.observe(num_steps_total=2, step_ms_sum=20.0)
    assert clock.last_s == clock.typical_s == 0.010  # the first look sets both
    clock.observe(num_steps_total=2, step_ms_sum=20.0)  # no step ran: nothing changes
    assert clock.typical_s == 0.010
    clock.observe(num_steps_total=3, step_ms_sum=50.0)  # one 30 ms step (a prompt's chunk on it)
    assert clock.last_s == 0.030  # how far off the next step end may be
    assert clock.typical_s == 0.015  # a quarter of the way: responses keep spanning the usual steps
    clock.observe(num_steps_total=103, step_ms_sum=1050.0)  # a hundred 10 ms steps: back to them
    assert clock.last_s == 0.010 and abs(clock.typical_s - 0.010) < 1e-9
    with pytest.raises(ValueError):
        StepClock(window_steps=0)
