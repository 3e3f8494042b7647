"""Greedy tokens from our engine equal transformers' LlamaForCausalLM.generate, token for token."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cpu_engine.config import EngineConfig
from cpu_engine.engine import LLMEngine
from cpu_engine.sampling import SamplingParams

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def hf_greedy(model, prompt: list[int], num_new: int) -> list[int]:
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=num_new,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=0,
        )
    return out[0, len(prompt) :].tolist()


@pytest.fixture(scope="module")
def hf_model(dev_checkpoint: Path):
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM.from_pretrained(dev_checkpoint, torch_dtype=torch.float32)
    model.generation_config.eos_token_id = None  # compare fixed-length runs (the engine uses ignore_eos)
    return model.eval()


def run_engine(engine: LLMEngine, prompts: list[list[int]], num_new: int) -> dict[str, list[int]]:
    params = SamplingParams(max_tokens=num_new, temperature=0.0, ignore_eos=True)
    for i, prompt in enumerate(prompts):
        engine.add_request(f"r{i}", prompt, params)
    produced: dict[str, list[int]] = {f"r{i}": [] for i in range(len(prompts))}
    for _ in range(10_000):
        if not engine.has_unfinished():
            break
        for out in engine.step():
            produced[out.request_id].extend(out.new_token_ids)
    return produced


def test_single_sequences_match(dev_checkpoint: Path, hf_model) -> None:
    engine = LLMEngine.from_checkpoint(dev_checkpoint, EngineConfig(num_kv_blocks=256, dtype="float32"))
    rng = np.random.default_rng(1)
    for length in (1, 7, 16, 33):
        prompt = rng.integers(0, 8192, length).tolist()
        got = run_engine(engine, [prompt], 24)["r0"]
        assert got == hf_greedy(hf_model, prompt, 24), f"prompt length {length}"


def test_sixteen_together_with_chunked_prefill_and_preemption(dev_checkpoint: Path, hf_model) -> None:
    rng = np.random.default_rng(2)
    lengths = [3, 9, 17, 30, 41, 64, 77, 100, 5, 12, 140, 23, 55, 88, 33, 200]
    prompts = [rng.integers(0, 8192, n).tolist() for n in lengths]
    num_new = 20
    # Budget 48 splits every long prompt into chunks; 40 blocks of 16 cannot hold all 16 at once.
    cfg = EngineConfig(num_kv_blocks=40, step_token_budget=48, watermark_fraction=0.0, dtype="float32")
    engine = LLMEngine.from_checkpoint(dev_checkpoint, cfg)
    got = run_engine(engine, prompts, num_new)
    assert engine.stats().num_preemptions_total > 0, "the pool was meant to force preemption"
    assert engine.block_pool.num_used_blocks == 0
    for i, prompt in enumerate(prompts):
        assert got[f"r{i}"] == hf_greedy(hf_model, prompt, num_new), f"sequence {i} (prompt {len(prompt)})"


def test_shared_prefix_hits_and_still_match(dev_checkpoint: Path, hf_model) -> None:
    rng = np.random.default_rng(3)
    system = rng.integers(0, 8192, 48).tolist()  # three full blocks shared by every prompt
    prompts = [system + rng.integers(0, 8192, n).tolist() for n in (0, 5, 20)]
    engine = LLMEngine.from_checkpoint(dev_checkpoint, EngineConfig(num_kv_blocks=128, dtype="float32"))
    first = run_engine(engine, prompts[:1], 12)
    assert first["r0"] == hf_greedy(hf_model, prompts[0], 12)
    engine2_outputs = {}
    for i, prompt in enumerate(prompts):
        engine.add_request(
            f"again{i}", prompt, SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
        )
        engine2_outputs[f"again{i}"] = []
    while engine.has_unfinished():
        for out in engine.step():
            engine2_outputs[out.request_id].extend(out.new_token_ids)
    stats = engine.stats()
    assert stats.num_prefix_hit_tokens_total >= 47 * 3  # whole-prompt hit recomputes its last token
    for i, prompt in enumerate(prompts):
        assert engine2_outputs[f"again{i}"] == hf_greedy(hf_model, prompt, 12)


def test_bfloat16_engine_stays_close_to_the_float32_reference(dev_checkpoint: Path) -> None:
    """bf16 linear layers round weights and activations, so tokens may drift late; they must not drift early.

    Deterministic: the bf16 kernel's rows are bit-identical whatever the batch, so this cannot flake.
    """
    rng = np.random.default_rng(4)
    prompts = [rng.integers(0, 8192, n).tolist() for n in (4, 9, 16, 25, 40, 64, 90, 130)]
    outputs = {}
    for dtype in ("float32", "bfloat16"):
        engine = LLMEngine.from_checkpoint(dev_checkpoint, EngineConfig(num_kv_blocks=256, dtype=dtype))
        outputs[dtype] = run_engine(engine, prompts, 16)
    same = sum(outputs["float32"][k] == outputs["bfloat16"][k] for k in outputs["float32"])
    first_tokens_same = sum(
        outputs["float32"][k][:4] == outputs["bfloat16"][k][:4] for k in outputs["float32"]
    )
    assert same >= 6 and first_tokens_same >= 7, (same, first_tokens_same)


def test_float32_layers_over_a_bf16_kv_cache_stay_close_to_the_float32_reference(
    dev_checkpoint: Path,
) -> None:
    """What "auto" runs on a CPU without bf16 instructions: the cache rounds keys and values to bf16, so
    tokens may drift late; they must not drift early. The same prompts in the same batches both times."""
    rng = np.random.default_rng(4)
    prompts = [rng.integers(0, 8192, n).tolist() for n in (4, 9, 16, 25, 40, 64, 90, 130)]
    outputs = {}
    for kv_cache_dtype in ("float32", "bfloat16"):
        config = EngineConfig(num_kv_blocks=256, dtype="float32", kv_cache_dtype=kv_cache_dtype)
        engine = LLMEngine.from_checkpoint(dev_checkpoint, config)
        assert engine.dtype_choice.kv_cache_dtype == kv_cache_dtype
        outputs[kv_cache_dtype] = run_engine(engine, prompts, 16)
    reference, rounded = outputs["float32"], outputs["bfloat16"]
    same = sum(reference[k] == rounded[k] for k in reference)
    first_tokens_same = sum(reference[k][:4] == rounded[k][:4] for k in reference)
    assert same >= 6 and first_tokens_same >= 7, (same, first_tokens_same)
