"""The Triton-served classifier end to end: a real tritonserver with only the safety classifier model
(the rules behind the Llama Guard tensor contract), called over gRPC by ``TritonClassifier``."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from ports import free_ports

from replicas.launcher import TritonServer, TritonServerConfig
from replicas.render import CpuEngineModelSettings, render_model_repository, render_safety_classifier
from sluice.safety.base import ClassifierUnavailableError, Verdict
from sluice.safety.config import SafetyConfig
from sluice.safety.policy import build_policy
from sluice.safety.triton import TritonClassifier

T = TypeVar("T")
Aio = Callable[[Coroutine[Any, Any, T]], T]
# Only the served model blocks this phrase: the gateway's own rules (empty config) do not.
GUARD_ONLY_PHRASE = "forbidden guard phrase"


@pytest.fixture(scope="module")
def guard_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    root = tmp_path_factory.mktemp("guard")
    config_path = root / "safety.json"
    config_path.write_text(json.dumps({"blocklist": [GUARD_ONLY_PHRASE, "bomb"]}))
    render_safety_classifier(root / "repo", config_path)
    http, grpc, metrics = free_ports(3)
    config = TritonServerConfig(
        model_repository=root / "repo",
        http_port=http,
        grpc_port=grpc,
        metrics_port=metrics,
        state_dir=root / "state",
        shm_prefix=f"sluice_test_{os.getpid()}_guard_",
        exit_timeout_s=1,
        stop_timeout_s=10,
    )
    with TritonServer(config) as server:
        yield server


@pytest.fixture
def guard(guard_server: TritonServer, aio: Aio[Any]) -> Iterator[TritonClassifier]:
    classifier = TritonClassifier(guard_server.grpc_url)
    yield classifier
    aio(classifier.close())


def test_blocked_and_clean_texts_over_grpc(guard: TritonClassifier, aio: Aio[Any]) -> None:
    assert guard.name == "triton:sluice-guard" and not guard.supports_streaming
    verdict = aio(guard.classify(f"please say the {GUARD_ONLY_PHRASE.upper()} now"))
    assert verdict == Verdict.block("triton:sluice-guard", "blocklist")
    assert GUARD_ONLY_PHRASE not in verdict.message.lower()
    assert aio(guard.classify("write to bob@example.com")).category == "pii:email"
    assert aio(guard.classify("a bombastic but clean text, naïve 日本 😀")) == Verdict.allow(
        "triton:sluice-guard"
    )
    assert aio(guard.classify("")) == Verdict.allow("triton:sluice-guard")


def test_concurrent_requests_each_get_their_own_verdict(guard: TritonClassifier, aio: Aio[Any]) -> None:
    texts = [f"text {i} " + ("bomb" if i % 3 == 0 else "fine") for i in range(30)]

    async def all_of_them() -> list[Verdict]:
        return list(await asyncio.gather(*(guard.classify(t) for t in texts)))

    verdicts = aio(all_of_them())
    assert [v.blocked for v in verdicts] == [i % 3 == 0 for i in range(30)]


def test_strict_policy_asks_the_served_model(guard: TritonClassifier, aio: Aio[Any]) -> None:
    strict = build_policy("strict", SafetyConfig(), triton=guard)
    default = build_policy("default", SafetyConfig())
    prompt = f"tell me the {GUARD_ONLY_PHRASE}"
    assert aio(default.screen_input(prompt)) is None  # the in-process rules do not know it
    verdict = aio(strict.screen_input(prompt))
    assert verdict is not None and verdict.classifier == "triton:sluice-guard"


def test_failures_raise_classifier_unavailable(guard_server: TritonServer, aio: Aio[Any]) -> None:
    missing = TritonClassifier(guard_server.grpc_url, model_name="no-such-guard")
    with pytest.raises(ClassifierUnavailableError, match="triton:no-such-guard"):
        aio(missing.classify("hello"))
    aio(missing.close())
    nobody = TritonClassifier(f"127.0.0.1:{free_ports(1)[0]}", timeout_s=2.0)
    with pytest.raises(ClassifierUnavailableError):
        aio(nobody.classify("hello"))
    aio(nobody.close())


def test_render_adds_the_classifier_next_to_the_engine(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    # A digest given: the engine's checkpoint is not read when rendering.
    settings = CpuEngineModelSettings(checkpoint_dir=tmp_path / "ckpt", weights_digest="sha256:" + "0" * 64)
    engine = render_model_repository(repo, settings)
    engine_config = (engine / "config.pbtxt").read_text()
    model = render_safety_classifier(repo, None, model_name="guard-dev")
    assert sorted(p.name for p in repo.iterdir()) == ["guard-dev", "sluice-tiny"]
    assert (engine / "config.pbtxt").read_text() == engine_config
    config = (model / "config.pbtxt").read_text()
    assert 'name: "guard-dev"' in config and "max_batch_size: 0" in config and "decoupled" not in config
    assert 'key: "config_path" value: { string_value: "" }' in config
    assert (model / "1" / "model.py").is_file()
    with pytest.raises(ValueError, match="is not a file"):
        render_safety_classifier(repo, tmp_path / "missing.json")
    with pytest.raises(ValueError, match="model name must match"):
        render_safety_classifier(repo, None, model_name="bad name")
