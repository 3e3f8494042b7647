"""One version's scheduler over several replicas: dispatch goes to those in rotation, a drained replica
finishes what it holds and takes nothing new, its client is handed back once idle, and a replica
re-admitted with a new client is a new entry beside the old one still draining."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from fakes import ScriptedFakeEngine
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.errors import OpenAIError
from gateway.metrics import GatewayMetrics
from gateway.scheduling.replicas import ReplicaView, Slot, p95
from gateway.scheduling.scheduler import ModelScheduler
from sluice.domain import RequestClass
from sluice.engine_client import EngineClient
from sluice.policy.batch_bound import BatchBound
from sluice.policy.fair_queue import WaitingRequest
from sluice.settings import Settings
from sluice.wire import EnginePriority

pytestmark = pytest.mark.anyio


def _engine(name: str) -> ScriptedFakeEngine:
    engine = ScriptedFakeEngine(token_id=5, interval_s=0.001)
    engine.replica = name  # an instance attribute: each fake is its own replica
    return engine


def _queued(request_id: str) -> WaitingRequest:
    now = time.monotonic()
    return WaitingRequest(request_id, "acme", 1.0, RequestClass.INTERACTIVE, 8, 8, now, now + 30)


async def test_a_drained_replica_finishes_its_requests_takes_nothing_new_and_is_handed_back(
    tmp_path: Path,
) -> None:
    drained: list[EngineClient] = []
    settings = Settings(state_dir=tmp_path, checkpoint_dir=tmp_path)
    scheduler = ModelScheduler("m", (), settings, GatewayMetrics(), version="1", on_drained=drained.append)
    a, b = _engine("a"), _engine("b")
    await scheduler.add_replica(a, "a#1")
    await scheduler.add_replica(b, "b#1")
    first = await scheduler.wait_for_dispatch(_queued("r1"))
    held_key = first.replica_key
    scheduler.drain_replica(held_key)
    assert scheduler.replica_ids == [k for k in ("a#1", "b#1") if k != held_key] and drained == []
    later = [await scheduler.wait_for_dispatch(_queued(f"r{i}")) for i in range(2, 6)]
    assert {s.replica_key for s in later} == {k for k in ("a#1", "b#1") if k != held_key}
    scheduler.release(first)  # its last request ends: the client goes back
    assert drained == [first.engine]
    # The same replica admitted again with a new client: a new key, while nothing of the old one is left.
    again = _engine(first.engine.replica)
    await scheduler.add_replica(again, held_key.replace("#1", "#2"))
    with pytest.raises(ValueError, match="held by another engine client"):
        await scheduler.add_replica(_engine("x"), held_key.replace("#1", "#2"))
    for slot in later:
        scheduler.release(slot)
    await scheduler.close()


async def test_closing_fails_the_requests_still_waiting_with_503_instead_of_leaving_them_hanging(
    tmp_path: Path,
) -> None:
    """A scheduler closes when its version leaves routing with no replica and nothing dispatched; what is
    queued then gets a 503 at once, and the queue-depth gauge reads 0."""
    metrics = GatewayMetrics()
    settings = Settings(state_dir=tmp_path, checkpoint_dir=tmp_path)
    scheduler = ModelScheduler("m", (), settings, metrics, version="1")
    await scheduler.start()
    waiting = [asyncio.create_task(scheduler.wait_for_dispatch(_queued(f"r{i}"))) for i in range(3)]
    await asyncio.sleep(0.05)
    assert not any(task.done() for task in waiting)  # no replica: they queue
    await asyncio.wait_for(scheduler.close(), 5)
    for task in waiting:
        with pytest.raises(OpenAIError) as refused:
            await asyncio.wait_for(task, 1)
        assert (refused.value.status_code, refused.value.code) == (503, "model_unavailable")
    depth = metrics.queue_depth.labels("m", "1", "general", RequestClass.INTERACTIVE)
    assert depth._value.get() == 0


async def test_the_oldest_wait_counts_requests_waiting_to_be_dispatched_again(tmp_path: Path) -> None:
    """The overload detector's signal: a request that lost its replica waits in the re-dispatch queue and
    is older than anything in the fair queue."""
    settings = Settings(state_dir=tmp_path, checkpoint_dir=tmp_path)
    scheduler = ModelScheduler("m", (), settings, GatewayMetrics(), version="1")
    now = time.monotonic()
    assert scheduler.oldest_wait_s(now) == 0.0
    fresh = _queued("fresh")
    lost = WaitingRequest("lost", "acme", 1.0, RequestClass.INTERACTIVE, 8, 8, now - 5.0, now + 30)
    waiting = [
        asyncio.create_task(scheduler.wait_for_dispatch(fresh)),
        asyncio.create_task(scheduler.wait_for_dispatch(lost, redispatch=True)),
    ]
    await asyncio.sleep(0.01)
    assert scheduler.oldest_wait_s(now) == pytest.approx(5.0)
    await scheduler.close()
    await asyncio.gather(*waiting, return_exceptions=True)


def test_a_replicas_inter_token_latency_is_the_p95_of_the_gaps_clients_wait() -> None:
    """Not the gap per token: a delta of 4 tokens after 30 ms is a 30 ms wait (a replica sending a
    stream's tokens together once per budget is judged by the gaps it leaves)."""
    view = ReplicaView(_engine("a"))
    view.observe_gap(0.030, 4)
    assert view.itl_ms == pytest.approx(30.0)  # the first gap is the estimate at once
    for _ in range(228):
        view.observe_gap(0.010, 1)
    for _ in range(12):
        view.observe_gap(0.200, 1)  # 12 of 241: the tail above the p95 (re-estimated every 16 gaps)
    assert view.itl_ms == pytest.approx(30.0)  # nearest rank: the 229th of 241 sorted gaps
    for _ in range(256):
        view.observe_gap(0.050, 1)  # the window moves on: only the recent gaps count
    assert view.itl_ms == pytest.approx(50.0)


def test_p95_is_the_nearest_rank() -> None:
    assert p95([5.0]) == 5.0
    assert p95(range(1, 101)) == 95
    assert p95([3.0, 1.0, 2.0]) == 3.0


def test_a_replicas_running_cap_follows_its_gaps() -> None:
    """Slow gaps with 64 running: held at the batch it runs at once, then, once two windows of gaps in a
    row are slow, the cap drops to what would have met the target; fast gaps while the cap holds the
    batch back: it grows, once per window of new gaps (not on every estimate)."""
    view = ReplicaView(_engine("a"), bound=BatchBound(itl_target_ms=40.0, num_gaps_between_moves=128))
    view.slots = {str(i): object() for i in range(64)}  # type: ignore[misc]
    for _ in range(255):
        assert not view.observe_gap(0.080, 1)
    assert view.running_cap is None  # one slow window judged, the second not full yet
    assert view.held_at == 64 and view.load("a").running_cap == 64  # but it takes no more
    view.observe_gap(0.080, 1)
    assert view.running_cap == 48  # 64 x 40 / 80 = 32, but a quarter off at most
    view.slots = {str(i): object() for i in range(60)}  # type: ignore[misc]  # more than the cap (a race)
    grew = [view.observe_gap(0.010, 1) for _ in range(256)]
    assert view.running_cap == 75 and sum(grew) == 2  # once per window of fast gaps: 48 x 1.25 x 1.25


def _window(view: ReplicaView, num_slow: int, size: int = 128) -> None:
    """One window of gaps: ``num_slow`` of 80 ms among 10 ms ones."""
    for i in range(size):
        view.observe_gap(0.080 if i < num_slow else 0.010, 1)


def test_an_unbounded_replica_over_the_target_is_held_at_the_batch_it_ran_not_closed() -> None:
    """Not closed to new work until the slow gaps leave the estimate: each request that ends is replaced
    (a closed gate let 10 running drain to 1 in ~400 ms at 16 streams, its arrivals queued); free again
    once the estimate is back under, with no cap left behind."""
    view = ReplicaView(_engine("a"), bound=BatchBound(itl_target_ms=40.0, num_gaps_between_moves=1024))
    view.slots = {str(i): object() for i in range(10)}  # type: ignore[misc]
    for _ in range(241):  # estimated on the 1st gap, then every 16th
        view.observe_gap(0.010, 1)
    assert view.held_at is None and view.load("a").running_cap is None  # under the target: unbounded
    view.slots = {str(i): object() for i in range(8)}  # type: ignore[misc]  # two ended, not replaced yet
    for _ in range(16):
        assert not view.observe_gap(0.045, 1)  # 16 of 257 over: the estimate is 45 ms (no window judged yet)
    assert view.itl_ms == pytest.approx(45.0)
    assert view.held_at == 10  # the most that ran since the last judgement, not the 8 left now
    assert view.load("a").running_cap == 10 and view.running_cap is None
    released = [view.observe_gap(0.010, 1) for _ in range(64)]  # 16 of 321 over: under 5%, the p95 is 10 ms
    assert view.itl_ms == pytest.approx(10.0) and view.held_at is None and view.running_cap is None
    assert released == [False] * 63 + [True]  # free again: the caller may dispatch


def test_a_wave_of_arrivals_holds_an_unbounded_replica_for_its_one_slow_window_and_bounds_nothing() -> None:
    """16 requests at once on a quiet replica: their prefills and the serving path's per-request work
    make one window of long gaps. That holds the replica (it takes no more) while the estimate is over,
    and leaves no cap behind; the 16 streams after it run at once (a cap set on it queued them for the
    ~1.5 s its windows took to grow back). Slow windows that keep coming bound it."""
    view = ReplicaView(_engine("a"), bound=BatchBound(itl_target_ms=40.0, num_gaps_between_moves=128))
    view.slots = {str(i): object() for i in range(12)}  # type: ignore[misc]
    _window(view, num_slow=0)
    _window(view, num_slow=20)  # the wave: 20 of 128 at 80 ms
    assert view.running_cap is None and view.held_at == 12
    view.slots = {str(i): object() for i in range(16)}  # type: ignore[misc]
    _window(view, num_slow=0)
    assert view.running_cap is None and view.held_at is None and view.load("a").running_cap is None
    _window(view, num_slow=20)
    assert view.running_cap is None  # one slow window again: held only
    _window(view, num_slow=20)
    assert view.running_cap == 12  # the second in a row: 16 x 0.75


def test_one_slow_window_does_not_cut_a_cap_the_windows_before_it_showed_sound() -> None:
    """One slow step makes every running stream's gap long at once: 10 of a window of 128 (8%) puts its
    p95 over the target. While the cap holds, a judgement reads the gaps since it last moved (two windows
    at most): one such window among fast ones does not cut; two in a row do. Right after a move, the one
    window since it is all there is."""
    view = ReplicaView(_engine("a"), bound=BatchBound(itl_target_ms=40.0, num_gaps_between_moves=128))
    view.slots = {str(i): object() for i in range(16)}  # type: ignore[misc]
    view.running_cap = 16  # holding the batch at 16: a fast window would grow it
    _window(view, num_slow=0)
    assert view.running_cap == 20  # grew (a move): the record starts again
    view.slots = {str(i): object() for i in range(12)}  # type: ignore[misc]  # under the cap: it holds
    _window(view, num_slow=0)
    assert view.running_cap == 20
    _window(view, num_slow=10)  # 10 of 256 since the move: p95 10 ms
    assert view.running_cap == 20
    _window(view, num_slow=10)  # 20 of the last 256: p95 80 ms
    assert view.running_cap == 9  # 12 running x 0.75 (a quarter at most)
    view.slots = {str(i): object() for i in range(9)}  # type: ignore[misc]
    _window(view, num_slow=10)  # right after the cut this window alone is read: 10 of 128
    assert view.running_cap == 6  # 9 x 0.75: the cut did not hold the p95, so it is cut again at once


def _slot(view: ReplicaView, request_id: str, tenant: str, priority: EnginePriority) -> Slot:
    now = time.monotonic()
    request = WaitingRequest(request_id, tenant, 1.0, RequestClass.INTERACTIVE, 8, 8, now, now + 30)
    return Slot(request, now, view.engine, "a#1", priority)


def test_a_stream_the_replica_paces_for_another_tenant_is_marked_so_its_gaps_are_not_counted() -> None:
    """The CPU engine sends a stream at most once per its yield interval (50 ms) while another tenant's
    higher-priority work is live: those gaps are its choice. Counted, they cut the running cap to 2-3 in
    the noisy-tenant bench (a flood's 50 ms gaps against a 40 ms target), and the quiet tenant then
    waited for room in a replica running a handful of streams."""
    view = ReplicaView(_engine("a"))
    flood = [_slot(view, f"g{i}", "globex", EnginePriority.OVER_SHARE) for i in range(3)]
    own_first = _slot(view, "g-first", "globex", EnginePriority.UNDER_SHARE)
    for slot in (*flood, own_first):
        view.add(slot)
    assert not any(view.paced(s) for s in flood)  # one tenant's own priorities: nothing is held
    quiet = _slot(view, "a1", "acme", EnginePriority.UNDER_SHARE)
    view.add(quiet)
    assert all(view.paced(s) for s in flood) and not view.paced(own_first) and not view.paced(quiet)
    assert view.remove("a1") is quiet and view.remove("a1") is None
    assert not any(view.paced(s) for s in flood)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["add", "first", "remove"]), st.integers(0, 11), st.integers(0, 3)),
        max_size=60,
    )
)
def test_the_views_running_counts_are_what_its_slots_add_up_to(steps: list[tuple[str, int, int]]) -> None:
    """``load`` and ``paced`` read counts kept as slots come and go (so a dispatch costs the same with
    1,000 streams as with 10); after any sequence of adds, first tokens and removals they are what
    recounting the slots gives, and ``paced`` is the replica's rule taken over every other tenant."""
    view = ReplicaView(_engine("a"))
    view.total_kv_tokens, view.free_kv_tokens = 10_000, 9_000
    for action, i, tenant in steps:
        request_id = f"r{i}"
        if action == "add" and request_id not in view.slots:
            priority = EnginePriority(i % 3)
            request = WaitingRequest(request_id, f"t{tenant}", 1.0, RequestClass.INTERACTIVE, i, 8 * i, 0, 30)
            view.add(Slot(request, 0.0, view.engine, "a#1", priority))
        elif action == "first" and request_id in view.slots:
            view.first_token(view.slots[request_id])
        elif action == "remove":
            view.remove(request_id)
    slots = list(view.slots.values())
    load = view.load("a#1")
    for priority in EnginePriority:
        mine = [s for s in slots if s.priority == priority]
        got = load.by_priority[priority]
        assert got.num_in_flight == len(mine)
        assert got.num_waiting == sum(not s.has_first_token for s in mine)
        assert got.kv_tokens == sum(s.kv_tokens for s in mine)
    assert load.free_kv_tokens == min(9_000, 10_000 - sum(s.kv_tokens for s in slots))
    assert load.num_running == len(slots)
    for slot in slots:
        others = [s.priority for s in slots if s.tenant_id != slot.tenant_id]
        assert view.paced(slot) == any(p < slot.priority for p in others)


async def test_the_scheduler_judges_the_running_cap_on_unpaced_gaps_only(tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path, checkpoint_dir=tmp_path)
    scheduler = ModelScheduler("m", (), settings, GatewayMetrics(), version="1")
    await scheduler.add_replica(_engine("a"), "a#1")
    view = scheduler._replicas["a#1"]
    # Another tenant's higher-priority request on the replica: the replica paces this stream.
    above = _slot(view, "g1", "globex", EnginePriority.UNDER_SHARE)
    slot = _slot(view, "a1", "acme", EnginePriority.OVER_SHARE)
    view.add(above)
    view.add(slot)
    assert view.paced(slot)
    for _ in range(1_000):
        scheduler.on_tokens(slot, 1, 0.050)
    assert view.itl_ms is None and view.running_cap is None
    view.remove("g1")
    assert not view.paced(slot)
    bound = BatchBound()
    for _ in range(bound.num_gaps_between_moves * bound.num_slow_windows_to_bound):
        scheduler.on_tokens(slot, 1, 0.050)
    assert view.itl_ms == pytest.approx(50.0) and view.running_cap == 1
    view.remove("a1")


def test_the_cap_is_cut_from_the_most_that_ran_while_the_gaps_were_left() -> None:
    """Windows of slow gaps left by 64 streams, judged as the burst drains to 2: cut from 64, not to 1."""
    view = ReplicaView(_engine("a"), bound=BatchBound(itl_target_ms=40.0, num_gaps_between_moves=128))
    view.slots = {str(i): object() for i in range(64)}  # type: ignore[misc]
    for _ in range(248):
        view.observe_gap(0.050, 1)
    view.slots = {str(i): object() for i in range(2)}  # type: ignore[misc]
    for _ in range(8):
        view.observe_gap(0.050, 1)
    assert view.running_cap == 51  # 64 x 40 / 50


def test_the_gateway_holds_its_read_of_the_gaps_the_headroom_under_the_target(tmp_path: Path) -> None:
    """The client reads a gap after the gateway's SSE write and its own read: the batch bound and the
    dispatch gate judge the gateway's read against the target less the headroom (the engine's render
    and the deadline estimates keep the target itself)."""
    settings = Settings(
        state_dir=tmp_path, checkpoint_dir=tmp_path, itl_target_ms=40.0, itl_headroom_fraction=0.1
    )
    scheduler = ModelScheduler("m", (), settings, GatewayMetrics(), version="1")
    assert settings.itl_setpoint_ms == pytest.approx(36.0)
    assert scheduler._bound.itl_target_ms == pytest.approx(36.0)
    assert scheduler._dispatch.itl_target_ms == pytest.approx(36.0)
    assert Settings(state_dir=tmp_path, checkpoint_dir=tmp_path).itl_setpoint_ms == pytest.approx(34.0)
