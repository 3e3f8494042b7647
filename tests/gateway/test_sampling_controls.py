"""The sampling controls API clients send (issue 25: presence and frequency penalties, logit_bias, and
vLLM's top_k, min_p and repetition_penalty), with the official client, in process and through a real
tritonserver: each reaches the engine and changes what it makes, the same way on both paths.

The dev model's weights are random, so the checks are built to hold whatever its logits (a few units
either way): a token biased +100 beats every other; +100 against +60 still does, until the repetition
penalty halves the first once it has been seen; and the frequency penalty (2 a use) takes ~50 uses to
wear the +100 down."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import pytest
from harness import MODEL, RunningGateway

from sluice.text import TextCodec


@pytest.fixture(scope="module")
def two_tokens(dev_checkpoint: Path) -> tuple[int, int]:
    codec = TextCodec.from_checkpoint(dev_checkpoint)
    first, second = codec.encode(" apple")[0], codec.encode(" river")[0]
    assert first != second
    return first, second


def _tokens(gateway: RunningGateway, codec: TextCodec, max_tokens: int = 12, **controls: Any) -> list[int]:
    completion = gateway.client().completions.create(
        model=MODEL, prompt="Once upon a time", max_tokens=max_tokens, temperature=0,
        extra_body={"ignore_eos": True, **controls.pop("extra", {})}, **controls,
    )  # fmt: skip
    assert completion.usage is not None and completion.usage.completion_tokens == max_tokens
    return codec.encode(completion.choices[0].text)


@pytest.fixture(scope="module", params=["inprocess", "triton"])
def gateway(request: pytest.FixtureRequest) -> RunningGateway:
    fixture: RunningGateway = request.getfixturevalue(f"{request.param}_gateway")
    return fixture


def test_the_penalties_wear_a_biased_token_down(
    gateway: RunningGateway, dev_checkpoint: Path, two_tokens: tuple[int, int]
) -> None:
    codec = TextCodec.from_checkpoint(dev_checkpoint)
    first, second = two_tokens
    assert set(_tokens(gateway, codec, 64, logit_bias={str(first): 100})) == {first}
    worn = _tokens(
        gateway, codec, 64, logit_bias={str(first): 100}, frequency_penalty=2.0, presence_penalty=2.0
    )
    assert worn[0] == first and set(worn) != {first}  # OpenAI's penalties: 2 + 2 a use of the output
    bias = {str(first): 100, str(second): 60}
    assert set(_tokens(gateway, codec, logit_bias=bias)) == {first}
    halved = _tokens(gateway, codec, logit_bias=bias, extra={"repetition_penalty": 2.0})
    assert halved[:2] == [first, second]  # vLLM's: a seen token's positive logit halves


def test_a_negative_bias_bans_a_token(gateway: RunningGateway, dev_checkpoint: Path) -> None:
    codec = TextCodec.from_checkpoint(dev_checkpoint)
    plain = _tokens(gateway, codec)
    banned = _tokens(gateway, codec, logit_bias={str(plain[0]): -100})
    assert plain[0] not in banned


def test_top_k_and_min_p_that_keep_one_token_sample_as_greedy(gateway: RunningGateway) -> None:
    client = gateway.client()
    greedy = client.completions.create(model=MODEL, prompt="Hello", max_tokens=8, temperature=0)
    for extra in ({"top_k": 1}, {"min_p": 1.0}):
        sampled = client.completions.create(
            model=MODEL, prompt="Hello", max_tokens=8, temperature=1.5, seed=3, extra_body=extra
        )
        assert sampled.choices[0].text == greedy.choices[0].text, extra


def test_both_paths_carry_the_same_controls(
    inprocess_gateway: RunningGateway, triton_gateway: RunningGateway, dev_checkpoint: Path
) -> None:
    codec = TextCodec.from_checkpoint(dev_checkpoint)
    controls: dict[str, Any] = {
        "presence_penalty": 0.7, "frequency_penalty": 0.4, "logit_bias": {"5": 3.0, "9": -2.0},
        "extra": {"repetition_penalty": 1.3},
    }  # fmt: skip
    assert _tokens(inprocess_gateway, codec, **dict(controls)) == _tokens(
        triton_gateway, codec, **dict(controls)
    )


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"logit_bias": {"not-a-token": 1}}, "logit_bias"),
        ({"logit_bias": {"99999999": 1}}, "logit_bias"),
        ({"logit_bias": {"5": 101}}, "logit_bias"),
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"frequency_penalty": -3}, "frequency_penalty"),
        ({"min_p": 1.5}, "min_p"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"top_k": -2}, "top_k"),
    ],
)
def test_out_of_range_controls_are_refused_naming_the_field(
    inprocess_gateway: RunningGateway, body: dict[str, Any], param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        inprocess_gateway.client().completions.create(
            model=MODEL, prompt="Hello", max_tokens=2, extra_body=body
        )
    assert param in str(err.value)


def test_a_completion_with_echo_begins_with_its_prompt(gateway: RunningGateway) -> None:
    client = gateway.client()
    plain = client.completions.create(model=MODEL, prompt="Once upon", max_tokens=6, temperature=0)
    echoed = client.completions.create(
        model=MODEL, prompt="Once upon", max_tokens=6, temperature=0, echo=True
    )
    assert echoed.choices[0].text == "Once upon" + plain.choices[0].text
    assert echoed.usage is not None and echoed.usage.completion_tokens == plain.usage.completion_tokens  # type: ignore[union-attr]
    streamed = client.completions.create(
        model=MODEL, prompt="Once upon", max_tokens=6, temperature=0, echo=True, stream=True
    )
    texts = [c.choices[0].text for c in streamed if c.choices]
    assert texts[0] == "Once upon" and "".join(texts) == echoed.choices[0].text


def test_a_top_k_past_the_vocabulary_is_no_cut_and_one_past_int32_a_400(gateway: RunningGateway) -> None:
    client = gateway.client()
    greedy = client.completions.create(model=MODEL, prompt="Hello", max_tokens=4, temperature=0)
    huge = client.completions.create(
        model=MODEL, prompt="Hello", max_tokens=4, temperature=0, extra_body={"top_k": 2**31 - 1}
    )
    assert huge.choices[0].text == greedy.choices[0].text
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL, prompt="Hello", max_tokens=4, extra_body={"top_k": 2**31})
