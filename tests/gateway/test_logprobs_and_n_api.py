"""Log-probabilities and n > 1 through the API (issue 25), with the official client, in process and through
a real tritonserver: chat's ``logprobs``/``top_logprobs`` in OpenAI's shape, streamed per chunk;
completions' ``logprobs`` with tokens, offsets and alternatives; ``n`` answers streamed with their
``index``, the prompt counted once in the usage; the combinations Sluice refuses, each a 400 naming it."""

from __future__ import annotations

import openai
import pytest
from harness import MODEL, RunningGateway

CHAT = [{"role": "user", "content": "Tell me a story."}]


@pytest.fixture(scope="module", params=["inprocess", "triton"])
def gateway(request: pytest.FixtureRequest) -> RunningGateway:
    fixture: RunningGateway = request.getfixturevalue(f"{request.param}_gateway")
    return fixture


def test_chat_logprobs_stream_with_each_chunk(gateway: RunningGateway) -> None:
    stream = gateway.client().chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=12, logprobs=True, top_logprobs=5, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
    )  # fmt: skip
    text, entries, usage = "", [], None
    for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            text += choice.delta.content or ""
            if choice.logprobs is not None and choice.logprobs.content:
                entries.extend(choice.logprobs.content)
    assert usage is not None and len(entries) == usage.completion_tokens == 12
    assert b"".join(bytes(e.bytes or []) for e in entries).decode("utf-8", "replace") == text
    for entry in entries:
        assert entry.logprob <= 0 and len(entry.top_logprobs) == 5
        values = [alt.logprob for alt in entry.top_logprobs]
        assert values == sorted(values, reverse=True)
        assert entry.logprob <= values[0] + 1e-6  # nothing beats the most likely


def test_whole_chat_logprobs_and_none_unless_asked(gateway: RunningGateway) -> None:
    client = gateway.client()
    plain = client.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=6)
    assert plain.choices[0].logprobs is None
    asked = client.chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=6, logprobs=True, extra_body={"ignore_eos": True}
    )
    content = asked.choices[0].logprobs.content if asked.choices[0].logprobs else None
    assert content is not None and len(content) == 6
    assert all(entry.top_logprobs == [] for entry in content)


def test_completion_logprobs(gateway: RunningGateway) -> None:
    completion = gateway.client().completions.create(
        model=MODEL, prompt="Once upon a time", max_tokens=10, logprobs=2, temperature=0,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    choice = completion.choices[0]
    lp = choice.logprobs
    assert lp is not None and lp.tokens is not None and lp.token_logprobs is not None
    assert lp.top_logprobs is not None and lp.text_offset is not None
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 10
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0
    for token, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert top is not None and len(top) <= 2
        # Greedy: the chosen token is the most likely one.
        assert value == pytest.approx(max(top.values()), abs=1e-5)
        assert token in top or "\ufffd" in token


def test_n_answers_stream_with_their_index_and_one_prompt_in_the_usage(gateway: RunningGateway) -> None:
    client = gateway.client()
    one = client.chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=8, extra_body={"ignore_eos": True}
    )
    stream = client.chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=8, n=3, temperature=1.0, seed=4, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
    )  # fmt: skip
    texts: dict[int, str] = {}
    reasons: dict[int, str] = {}
    usage = None
    for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
            if choice.finish_reason is not None:
                reasons[choice.index] = choice.finish_reason
    assert sorted(texts) == [0, 1, 2] and reasons == {0: "length", 1: "length", 2: "length"}
    assert one.usage is not None and usage is not None
    assert usage.prompt_tokens == one.usage.prompt_tokens  # the prompt once
    assert usage.completion_tokens == 3 * 8  # every answer's tokens
    assert len(set(texts.values())) > 1  # each its own draws


def test_n_answers_whole(gateway: RunningGateway) -> None:
    completion = gateway.client().completions.create(
        model=MODEL, prompt="Hello", max_tokens=5, n=2, temperature=1.0, seed=9, logprobs=1,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    assert [c.index for c in completion.choices] == [0, 1]
    assert all(c.finish_reason == "length" and c.logprobs is not None for c in completion.choices)
    assert completion.usage is not None and completion.usage.completion_tokens == 10


@pytest.mark.parametrize(
    ("call", "param"),
    [
        ({"top_logprobs": 2}, "top_logprobs"),  # without logprobs: true
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"n": 0}, "n"),
        ({"n": 9}, "n"),
    ],
)
def test_bad_combinations_are_400s_naming_the_param(
    inprocess_gateway: RunningGateway, call: dict[str, object], param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        inprocess_gateway.client().chat.completions.create(model=MODEL, messages=CHAT, max_tokens=4, **call)  # type: ignore[call-overload]
    assert refused.value.param == param


def test_an_idempotency_key_with_n_is_refused(inprocess_gateway: RunningGateway) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        inprocess_gateway.client().chat.completions.create(
            model=MODEL, messages=CHAT, max_tokens=4, n=2, extra_headers={"Idempotency-Key": "k-n-2"}
        )
    assert refused.value.param == "Idempotency-Key"


def test_echo_with_logprobs_reports_the_prompt_too(gateway: RunningGateway) -> None:
    """OpenAI's legacy form: the prompt's tokens first (the very first without a log-probability), then
    the completion's, with offsets into the echoed text."""
    client = gateway.client()
    prompt = "Once upon a time there was"
    for stream in (False, True):
        created = client.completions.create(
            model=MODEL, prompt=prompt, max_tokens=4, echo=True, logprobs=2, temperature=0, stream=stream,
            extra_body={"ignore_eos": True},
        )  # fmt: skip
        chunks = list(created) if stream else [created]  # type: ignore[call-overload]
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        tokens, values, offsets = [], [], []
        for chunk in chunks:
            lp = chunk.choices[0].logprobs if chunk.choices else None
            if lp is not None and lp.tokens:
                tokens += lp.tokens
                values += lp.token_logprobs or []
                offsets += lp.text_offset or []
        assert text.startswith(prompt)
        assert values[0] is None and all(v is not None and v <= 0 for v in values[1:])
        assert "".join(tokens).startswith(prompt) and len(tokens) == len(offsets)
        assert offsets == sorted(offsets) and offsets[0] == 0
        assert sum(1 for o in offsets if o >= len(prompt)) == 4  # the completion's four tokens


def test_a_list_of_prompts_answers_each_with_its_own_choices(gateway: RunningGateway) -> None:
    """OpenAI's prompt list: prompt i's answer j is choice i * n + j; usage sums every prompt."""
    client = gateway.client()
    prompts = ["Once upon a time", "The weather today", "Hello"]
    singles = [
        client.completions.create(
            model=MODEL, prompt=p, max_tokens=4, temperature=0, extra_body={"ignore_eos": True}
        )
        for p in prompts
    ]
    many = client.completions.create(
        model=MODEL, prompt=prompts, max_tokens=4, temperature=0, n=2, extra_body={"ignore_eos": True}
    )
    assert [c.index for c in many.choices] == list(range(6))
    for i, single in enumerate(singles):
        assert many.choices[2 * i].text == many.choices[2 * i + 1].text == single.choices[0].text  # greedy
    assert many.usage is not None
    assert many.usage.prompt_tokens == sum(s.usage.prompt_tokens for s in singles if s.usage)
    assert many.usage.completion_tokens == 6 * 4
    streamed = client.completions.create(
        model=MODEL, prompt=[[5, 6, 7], [8, 9]], max_tokens=3, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
    )  # fmt: skip
    texts: dict[int, str] = {}
    usage = None
    for chunk in streamed:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + choice.text
    assert sorted(texts) == [0, 1] and usage is not None and usage.prompt_tokens == 5


@pytest.mark.parametrize(
    ("prompt", "param"),
    [([], "prompt"), (["a", [1, 2]], "prompt"), (["x"] * 33, "prompt"), (["ok", ""], "prompt[1]")],
)
def test_bad_prompt_lists_are_400s(inprocess_gateway: RunningGateway, prompt: object, param: str) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        inprocess_gateway.client().completions.create(model=MODEL, prompt=prompt, max_tokens=2)  # type: ignore[arg-type]
    assert refused.value.param == param
