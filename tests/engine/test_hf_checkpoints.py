"""Checkpoints shaped like the real families a user points the engine at, written by transformers itself.

No network here, so the checkpoints are small random ones with the families' distinguishing features:
tied embeddings (SmolLM), bf16 weights on disk (most hub checkpoints), Llama 3 rope scaling with
grouped-query attention and head_dim 128-style layouts.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cpu_engine.config import EngineConfig, ModelConfig
from cpu_engine.engine import LLMEngine
from cpu_engine.rope import inverse_frequencies
from cpu_engine.sampling import SamplingParams

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

FAMILIES = {
    "smollm-like (tied embeddings, bf16)": dict(
        tie_word_embeddings=True, dtype=torch.bfloat16, rope_scaling=None, num_key_value_heads=1
    ),
    "tinyllama-like (fp16 on disk)": dict(
        tie_word_embeddings=False, dtype=torch.float16, rope_scaling=None, num_key_value_heads=2
    ),
    "llama3-like (rope scaling, bf16)": dict(
        tie_word_embeddings=False,
        dtype=torch.bfloat16,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
        num_key_value_heads=2,
    ),
}


def write_family(
    path: Path, tie_word_embeddings: bool, dtype, rope_scaling, num_key_value_heads: int
) -> Path:
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=512,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=num_key_value_heads,
        max_position_embeddings=512,
        rope_theta=500000.0 if rope_scaling else 10000.0,
        rope_scaling=rope_scaling,
        tie_word_embeddings=tie_word_embeddings,
        bos_token_id=1,
        eos_token_id=2,
    )
    model = transformers.LlamaForCausalLM(cfg)
    with torch.no_grad():  # a wider init than HF's 0.02 so greedy decoding has clear margins
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.15)
    model.to(dtype).save_pretrained(path)
    return path


@pytest.mark.parametrize("family", list(FAMILIES))
def test_family_checkpoint_matches_transformers(tmp_path: Path, family: str) -> None:
    path = write_family(tmp_path / "ckpt", **FAMILIES[family])
    # The reference runs in float32 on the same (upcast) weights the engine loads.
    ref = transformers.LlamaForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval()
    ref.generation_config.eos_token_id = None
    engine = LLMEngine.from_checkpoint(path, EngineConfig(num_kv_blocks=64, dtype="float32"))
    rng = np.random.default_rng(0)
    for n, prompt_len in enumerate((5, 70)):  # 70 > original_max_position_embeddings: scaling matters
        prompt = rng.integers(3, 512, prompt_len).tolist()
        engine.add_request(f"r{n}", prompt, SamplingParams(max_tokens=16, temperature=0, ignore_eos=True))
        got: list[int] = []
        while engine.has_unfinished():
            got += [t for o in engine.step() for t in o.new_token_ids]
        with torch.inference_mode():
            want = ref.generate(
                torch.tensor([prompt]), max_new_tokens=16, do_sample=False, eos_token_id=None, pad_token_id=0
            )[0, prompt_len:].tolist()
        assert got == want, f"{family}, prompt of {prompt_len}"


def test_llama3_inverse_frequencies_match_transformers() -> None:
    scaling = FAMILIES["llama3-like (rope scaling, bf16)"]["rope_scaling"]
    cfg = transformers.LlamaConfig(
        hidden_size=256,
        num_attention_heads=2,
        rope_theta=500000.0,
        rope_scaling=scaling,
        max_position_embeddings=512,
    )
    rope = transformers.models.llama.modeling_llama.LlamaRotaryEmbedding(cfg)
    ours = inverse_frequencies(128, 500000.0, ModelConfig.from_dict(cfg.to_dict()).rope_scaling)
    np.testing.assert_allclose(ours, rope.inv_freq.numpy(), rtol=1e-6)


def test_unsupported_rope_and_sliding_window_are_refused() -> None:
    base = dict(vocab_size=10, hidden_size=8, intermediate_size=8, num_hidden_layers=1, num_attention_heads=2)
    with pytest.raises(ValueError, match="rope scaling"):
        inverse_frequencies(8, 1e4, {"rope_type": "yarn", "factor": 2.0})
    with pytest.raises(ValueError, match="sliding-window"):
        ModelConfig.from_dict({**base, "sliding_window": 4, "max_position_embeddings": 64})
