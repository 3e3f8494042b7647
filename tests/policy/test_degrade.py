"""Degradation under persistent overload: the configuration's parsing, the overload detector's hysteresis,
and which fallbacks a request takes."""

from __future__ import annotations

import re

import pytest

from sluice.policy.degrade import (
    Action,
    Degraded,
    Fallbacks,
    OverloadDetector,
    Transition,
    degrade,
    parse_degradation,
)


def test_the_configuration_parses_per_model() -> None:
    config = parse_degradation(
        '{"big": {"alias_to": "small", "max_tokens_cap": 64, "to_batch": true, "overload_wait_s": 1.5,'
        ' "enter_after_s": 5, "exit_after_s": 20}, "other": {"to_batch": true}}'
    )
    assert config == {
        "big": Fallbacks("small", 64, True, overload_wait_s=1.5, enter_after_s=5, exit_after_s=20),
        "other": Fallbacks(to_batch=True),
    }
    assert parse_degradation("{}") == {}


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("not json", "not valid JSON"),
        ("[1]", "must be a JSON object"),
        ('{"m": 3}', "model 'm': must be an object"),
        ('{"m": {"to_batch": true, "max_token_cap": 5}}', "model 'm': unknown field(s) max_token_cap"),
        ('{"m": {}}', "model 'm': names no fallback"),
        ('{"m": {"to_batch": false}}', "model 'm': names no fallback"),
        ('{"m": {"max_tokens_cap": 0}}', "max_tokens_cap must be an integer >= 1, got 0"),
        ('{"m": {"max_tokens_cap": 6.5}}', "max_tokens_cap must be an integer >= 1, got 6.5"),
        ('{"m": {"max_tokens_cap": true}}', "max_tokens_cap must be an integer >= 1, got True"),
        ('{"m": {"to_batch": "yes"}}', "to_batch must be true or false"),
        ('{"m": {"alias_to": ""}}', "alias_to must be a model name"),
        ('{"m": {"alias_to": "m"}}', "alias_to names the model itself"),
        ('{"m": {"to_batch": true, "enter_after_s": -1}}', "enter_after_s must be a finite number"),
        ('{"m": {"to_batch": true, "exit_after_s": "30"}}', "exit_after_s must be a finite number"),
        ('{"m": {"to_batch": true, "overload_wait_s": 0}}', "overload_wait_s must be > 0"),
    ],
)
def test_a_bad_configuration_says_which_model_and_field(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=re.escape(says)):
        parse_degradation(text)


def test_overload_starts_only_after_the_signal_stays_high_for_enter_after() -> None:
    detector = OverloadDetector(overload_wait_s=2.0, enter_after_s=10.0, exit_after_s=30.0)
    assert detector.observe(0.0, 5.0) is None  # high from t=0
    assert detector.observe(9.0, 5.0) is None and not detector.overloaded
    assert detector.observe(10.0, 5.0) is Transition.ENTERED and detector.overloaded
    assert detector.changed_at_s == 10.0
    assert detector.observe(11.0, 9.0) is None  # entered once, not again


def test_a_dip_below_the_threshold_restarts_the_wait_to_enter() -> None:
    detector = OverloadDetector(overload_wait_s=2.0, enter_after_s=10.0, exit_after_s=30.0)
    detector.observe(0.0, 5.0)
    detector.observe(8.0, 2.0)  # at the threshold is not above it
    assert detector.observe(12.0, 5.0) is None  # high again since 12
    assert detector.observe(21.9, 5.0) is None and not detector.overloaded
    assert detector.observe(22.0, 5.0) is Transition.ENTERED


def test_overload_ends_only_after_the_signal_stays_low_for_exit_after() -> None:
    detector = OverloadDetector(overload_wait_s=2.0, enter_after_s=0.0, exit_after_s=30.0)
    assert detector.observe(0.0, 3.0) is Transition.ENTERED  # enter_after_s 0: at the first high sample
    assert detector.observe(5.0, 0.0) is None  # low since 5
    assert detector.observe(20.0, 3.0) is None  # high again: the wait to exit restarts
    assert detector.observe(25.0, 1.0) is None  # low since 25
    assert detector.observe(54.9, 0.0) is None and detector.overloaded
    assert detector.observe(55.0, 0.0) is Transition.EXITED and not detector.overloaded
    assert detector.observe(56.0, 0.0) is None


def test_an_overloaded_model_takes_only_the_fallbacks_that_apply() -> None:
    fallbacks = Fallbacks(alias_to="small", max_tokens_cap=64, to_batch=True)
    every = degrade(fallbacks, alias_allowed=True, class_chosen=False, batch_allowed=True)
    assert every == Degraded("small", 64, True)
    assert every.taken(100) == (Action.ALIAS_TO, Action.MAX_TOKENS_CAP, Action.TO_BATCH)
    assert every.header(100) == "alias_to=small, max_tokens_cap=64, to_batch"
    assert every.capped(100) == 64
    # Asking for no more than the cap: the cap changes nothing and is not named.
    assert every.capped(64) == 64 and every.header(64) == "alias_to=small, to_batch"
    # A request that chose its class keeps it; a tenant without batch keeps interactive; an alias the
    # tenant may not use (or that is not routed) is not taken.
    chosen = degrade(fallbacks, alias_allowed=False, class_chosen=True, batch_allowed=True)
    assert chosen.taken(10) == () and chosen.header(10) == ""
    no_batch = degrade(fallbacks, alias_allowed=False, class_chosen=False, batch_allowed=False)
    assert no_batch.taken(65) == (Action.MAX_TOKENS_CAP,) and no_batch.header(65) == "max_tokens_cap=64"
    only_batch = degrade(Fallbacks(to_batch=True), alias_allowed=True, class_chosen=False, batch_allowed=True)
    assert only_batch == Degraded(None, None, True) and only_batch.capped(500) == 500
