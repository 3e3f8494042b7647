"""The affinity memory: prefix key -> the replica it was last sent to, bounded (LRU) and forgetful (TTL),
read by the policy through a read-only view."""

from __future__ import annotations

import pytest

from sluice.policy.affinity import AffinityMemory


def test_the_last_dispatch_of_a_key_wins() -> None:
    memory = AffinityMemory(ttl_s=10.0)
    memory.record(1, "a", now_s=0.0)
    memory.record(2, "b", now_s=0.0)
    memory.record(1, "c", now_s=1.0)
    assert dict(memory.view(1.0)) == {1: "c", 2: "b"} and len(memory) == 2


def test_an_entry_is_forgotten_ttl_after_its_last_use() -> None:
    memory = AffinityMemory(ttl_s=10.0)
    memory.record(1, "a", now_s=0.0)
    memory.record(2, "b", now_s=5.0)
    assert dict(memory.view(9.9)) == {1: "a", 2: "b"}
    assert dict(memory.view(10.0)) == {2: "b"}  # exactly ttl_s old: gone
    memory.record(2, "b", now_s=14.0)  # used again: its clock restarts
    assert dict(memory.view(23.9)) == {2: "b"}
    assert dict(memory.view(24.0)) == {} and len(memory) == 0


def test_past_max_entries_the_least_recently_used_goes() -> None:
    memory = AffinityMemory(ttl_s=100.0, max_entries=2)
    memory.record(1, "a", now_s=0.0)
    memory.record(2, "b", now_s=1.0)
    memory.record(1, "a", now_s=2.0)  # 1 is now the most recently used
    memory.record(3, "c", now_s=3.0)
    assert dict(memory.view(3.0)) == {1: "a", 3: "c"} and len(memory) == 2


def test_the_view_is_read_only_and_follows_the_memory() -> None:
    memory = AffinityMemory(ttl_s=10.0)
    view = memory.view(0.0)
    with pytest.raises(TypeError):
        view[1] = "a"  # type: ignore[index]
    memory.record(1, "a", now_s=0.0)
    assert view.get(1) == "a"


def test_bad_bounds_are_refused() -> None:
    with pytest.raises(ValueError, match="ttl_s"):
        AffinityMemory(ttl_s=0.0)
    with pytest.raises(ValueError, match="max_entries"):
        AffinityMemory(ttl_s=1.0, max_entries=0)
