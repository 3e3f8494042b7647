"""Named safety policies and the safety config: what each policy screens, and clear errors for a
config that cannot work."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from sluice.safety.base import Classifier, Verdict
from sluice.safety.config import (
    BUILTIN_POLICY_NAMES,
    SafetyConfig,
    SafetyConfigError,
    load_safety_config,
    parse_safety_config,
    policy_names,
)
from sluice.safety.policy import BUILTIN_POLICIES, UnknownPolicyError, build_policies, build_policy
from sluice.safety.rules import RulesClassifier
from sluice.safety.triton import TritonClassifier
from sluice.settings import SettingsError, load_settings

CONFIG = parse_safety_config(
    {
        "blocklist": ["bomb"],
        "regexes": [{"name": "ticket", "pattern": r"\bTCK-\d{4,8}\b", "max_match_chars": 12}],
        "policies": {"pii-only": {"input": ["pii"], "output": ["pii"]}, "quiet": {}},
    }
)


class RecordingRemote(Classifier):
    """Stands in for the Triton classifier: blocks "remote-only", records what it was asked."""

    def __init__(self) -> None:
        self.name = "triton:fake"
        self.seen: list[str] = []

    async def classify(self, text: str) -> Verdict:
        self.seen.append(text)
        return Verdict.block(self.name, "S1") if "remote-only" in text else Verdict.allow(self.name)


def test_builtin_policies() -> None:
    assert tuple(BUILTIN_POLICIES) == BUILTIN_POLICY_NAMES == ("none", "default", "pii", "strict")
    assert policy_names(CONFIG) == ["none", "default", "pii", "strict", "pii-only", "quiet"]
    none = build_policy("none", CONFIG)
    assert none.input_classifiers == () and not none.screens_output and none.output_screen(64) is None
    default, pii = build_policy("default", CONFIG), build_policy("pii", CONFIG)
    assert (
        [c.name for c in default.input_classifiers]
        == ["content"]
        == [c.name for c in default.output_classifiers]
    )
    assert [c.name for c in pii.input_classifiers] == ["rules"] == [c.name for c in pii.output_classifiers]
    strict = build_policy("strict", CONFIG, triton_url="127.0.0.1:1", classifier_model="guard-x")
    assert [c.name for c in strict.input_classifiers] == ["rules", "triton:guard-x"]
    assert [c.name for c in strict.output_classifiers] == ["rules"]


def test_what_each_policy_blocks() -> None:
    async def check() -> None:
        default, pii, pii_only = (build_policy(n, CONFIG) for n in ("default", "pii", "pii-only"))
        for text in ["a bomb", "TCK-12345"]:
            for policy in (default, pii):
                verdict = await policy.screen_input(text)
                assert verdict is not None and verdict.blocked
                assert policy.screen_output(text) == verdict
        # An ordinary prompt with an address or a card number in it: served on the default policy, as
        # every peer serves it; refused on the policies that opt into the PII rules.
        for text in ["mail bob@example.com", "card 4111 1111 1111 1111"]:
            assert await default.screen_input(text) is None and default.screen_output(text) is None
            verdict = await pii.screen_input(text)
            assert verdict is not None and verdict.category.startswith("pii:")
        assert await default.screen_input("all fine") is None and default.screen_output("all fine") is None
        assert await pii_only.screen_input("a bomb") is None
        verdict = await pii_only.screen_input("bob@example.com")
        assert verdict is not None and (verdict.classifier, verdict.category) == ("pii", "pii:email")
        assert await build_policy("quiet", CONFIG).screen_input("a bomb") is None

    asyncio.run(check())


def test_input_runs_the_rules_before_the_remote_classifier() -> None:
    remote = RecordingRemote()
    strict = build_policy("strict", CONFIG, triton=remote)  # type: ignore[arg-type]

    async def check() -> None:
        blocked = await strict.screen_input("a bomb")
        assert blocked is not None and blocked.classifier == "rules"
        assert remote.seen == []  # blocked by the rules: no remote call
        blocked = await strict.screen_input("a remote-only problem")
        assert blocked is not None and (blocked.classifier, blocked.category) == ("triton:fake", "S1")
        assert await strict.screen_input("fine") is None and remote.seen == ["a remote-only problem", "fine"]

    asyncio.run(check())


def test_output_screen_holds_back_at_least_the_longest_match() -> None:
    pii = build_policy("pii", CONFIG)
    screen = pii.output_screen(8)
    assert screen is not None and screen.holdback_chars == 64  # the e-mail rule's bound
    screen = pii.output_screen(200)
    assert screen is not None and screen.holdback_chars == 200
    # A block list alone: the holdback is the longest phrase's bound, not the e-mail rule's.
    config = parse_safety_config(
        {"blocklist": ["make a weapon"], "policies": {"bl": {"output": ["blocklist"]}}}
    )
    screen = build_policy("bl", config).output_screen(1)
    assert screen is not None and screen.holdback_chars == len("make a weapon") + 2 * 2
    # Nothing configured: the default policy screens nothing, so it holds nothing back.
    empty = build_policy("default", parse_safety_config({}))
    assert empty.input_classifiers == () and empty.output_screen(200) is None


def test_policies_share_classifiers_and_need_a_triton_url_only_when_used() -> None:
    policies = build_policies(CONFIG, triton_url="127.0.0.1:1")
    assert list(policies) == policy_names(CONFIG)
    assert policies["pii"].input_classifiers[0] is policies["strict"].input_classifiers[0]
    assert isinstance(policies["strict"].input_classifiers[1], TritonClassifier)
    assert isinstance(policies["default"].output_classifiers[0], RulesClassifier)
    with pytest.raises(ValueError, match="policy 'strict' uses the Triton classifier"):
        build_policies(CONFIG)
    with pytest.raises(ValueError, match="give triton_url"):
        build_policy("strict", CONFIG)
    build_policy("default", CONFIG)  # no url needed
    with pytest.raises(
        UnknownPolicyError, match="unknown safety policy 'lax'; known: none, default, pii, strict"
    ):
        build_policy("lax", CONFIG)


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        ({"blocklist": ["ok", "  "]}, "blocklist: Value error, entries must hold at least one word"),
        ({"blocklist": ["x" * 257]}, "at most 256 characters"),
        ({"regexes": [{"name": "a", "pattern": "("}]}, "regexes.0.pattern: Value error, not a valid regular"),
        ({"regexes": [{"name": "a", "pattern": "x*"}]}, "matches the empty string"),
        ({"regexes": [{"name": "Bad Name", "pattern": "x"}]}, "regexes.0.name"),
        ({"regexes": [{"name": "a", "pattern": "x"}, {"name": "a", "pattern": "y"}]}, "repeated: a"),
        ({"regexes": [{"name": "a", "pattern": "x", "max_match_chars": 0}]}, "max_match_chars"),
        ({"regex_max_match_chars": 0}, "regex_max_match_chars"),
        ({"policies": {"default": {}}}, "policy 'default' is built in and cannot be redefined"),
        ({"policies": {"Loud!": {}}}, "policy name 'Loud!' must match"),
        ({"policies": {"p": {"output": ["triton"]}}}, "screens input only"),
        ({"policies": {"p": {"input": ["llama"]}}}, "policies.p.input.0"),
        ({"pii": {"phone": True}}, "pii.phone: Extra inputs are not permitted"),
        ({"block_list": ["x"]}, "block_list: Extra inputs are not permitted"),
        ([], "(top level)"),
    ],
)
def test_config_errors_name_the_source_and_the_field(data: object, fragment: str) -> None:
    with pytest.raises(SafetyConfigError, match=r"invalid safety\.json") as exc:
        parse_safety_config(data, source="safety.json")
    assert fragment in str(exc.value)


def test_config_file_loading(tmp_path: Path) -> None:
    assert load_safety_config(None) == SafetyConfig()
    path = tmp_path / "safety.json"
    path.write_text(json.dumps({"blocklist": ["bomb"], "pii": {"ssn": True}}))
    config = load_safety_config(path)
    assert config.blocklist == ("bomb",) and config.pii.ssn and config.pii.email
    with pytest.raises(SafetyConfigError, match=f"cannot read the safety config {tmp_path}/missing.json"):
        load_safety_config(tmp_path / "missing.json")
    path.write_text("{not json")
    with pytest.raises(SafetyConfigError, match="is not valid JSON"):
        load_safety_config(path)
    path.write_text(json.dumps({"policies": {"default": {}}}))
    with pytest.raises(SafetyConfigError, match=f"invalid {path}"):
        load_safety_config(path)


def test_safety_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("SLUICE_SAFETY_CONFIG_PATH", "SLUICE_SAFETY_HOLDBACK_CHARS"):
        monkeypatch.delenv(name, raising=False)
    settings = load_settings()
    assert settings.safety_config_path is None
    assert settings.safety_classifier_model == "sluice-guard" and settings.safety_holdback_chars == 64
    monkeypatch.setenv("SLUICE_SAFETY_HOLDBACK_CHARS", "0")
    with pytest.raises(SettingsError, match="SLUICE_SAFETY_HOLDBACK_CHARS"):
        load_settings()
