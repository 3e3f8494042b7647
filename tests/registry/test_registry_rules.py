"""The registry's pure input rules (no database): weights, percentages, names and digests."""

from __future__ import annotations

from typing import Any

import pytest

from sluice.policy.rollout import choose_version, rollout_split
from sluice.stores.registry.base import (
    VERSION_TRANSITIONS,
    InvalidChange,
    Route,
    RouteEntry,
    VersionState,
    check_build_config,
    check_digest,
    check_metrics_url,
    check_model_name,
    check_weights,
    weights_bp_from_pct,
)


def test_weights_are_sorted_whole_basis_points_summing_to_100_percent() -> None:
    assert check_weights({"v2": 2_500, "v1": 7_500, "v0": 0}) == (
        RouteEntry("v0", 0),
        RouteEntry("v1", 7_500),
        RouteEntry("v2", 2_500),
    )
    bad: list[Any] = [{}, [("v1", 10_000)], {"v1": 10_000.0}, {"v1": True}, {"v1": 9_999}, {"v 1": 10_000}]
    for weights in bad:
        with pytest.raises(InvalidChange):
            check_weights(weights)


def test_percent_splits_convert_to_basis_points_exactly() -> None:
    assert weights_bp_from_pct(rollout_split("v1", "v2", 12.5)) == {"v1": 8_750, "v2": 1_250}
    assert weights_bp_from_pct({"v1": 99.99, "v2": 0.01}) == {"v1": 9_999, "v2": 1}
    for pct in (33.333, float("nan"), "50"):
        with pytest.raises(InvalidChange, match=r"multiple of 0\.01%"):
            weights_bp_from_pct({"v1": pct})  # type: ignore[dict-item]


def test_a_route_gives_the_rollout_policy_its_split() -> None:
    route = Route("tiny", check_weights(weights_bp_from_pct({"v1": 90, "v2": 10})))
    assert route.split_pct() == {"v1": 90.0, "v2": 10.0}
    assert choose_version(route.split_pct(), "acme", "conversation:c1") in {"v1", "v2"}


def test_names_digests_and_build_configs() -> None:
    check_model_name("meta-llama/Llama-3.1-8B-Instruct")
    check_digest("sha256:" + "0f" * 32)
    for digest in ("sha256:" + "0f" * 31, "sha512:" + "0f" * 32, "sha256:" + "0F" * 32, None):
        with pytest.raises(InvalidChange):
            check_digest(digest)
    assert check_build_config({"a": (1, 2)}) == {"a": [1, 2]}  # as JSON stores it
    for config in ({"a": float("inf")}, {1: "x"}, {"a": object()}, ["a"]):
        with pytest.raises(InvalidChange):
            check_build_config(config)


def test_metrics_urls_are_http_with_host_port_and_path_or_empty() -> None:
    for url in (
        "",
        "http://127.0.0.1:8002/metrics",
        "https://[::1]:8002/metrics",
        "http://triton-0.triton.svc.cluster.local:8002/metrics?format=text",
        "http://h:65535/",
    ):
        assert check_metrics_url(url) == url
    for bad in ("http://h:8002", "http://:8002/metrics", "http://h:8002/a b", " ", 8002):
        with pytest.raises(InvalidChange, match="metrics_url"):
            check_metrics_url(bad)


def test_the_lifecycle_table_covers_every_state_and_retired_is_final() -> None:
    assert set(VERSION_TRANSITIONS) == set(VersionState)
    assert VERSION_TRANSITIONS[VersionState.RETIRED] == frozenset()
    assert all(state not in targets for state, targets in VERSION_TRANSITIONS.items())
