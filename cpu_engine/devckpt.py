"""Write a small, reproducible Llama checkpoint for development and tests, offline.

`python -m cpu_engine.devckpt --out DIR [--seed N]` (or `write_checkpoint(out_dir, seed)`) writes
config.json, generation_config.json, model.safetensors, tokenizer.json and tokenizer_config.json.
The same seed gives the same bytes on every run and platform: weights come from numpy's PCG64 in a
fixed order, and the byte-level BPE tokenizer is trained on a fixed, sorted list of the interpreter's
own standard-library sources (so tokenizer.json depends on the Python version, nothing else does).
Every file is written atomically (temp file + rename), so an interrupted run never leaves half a file.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import struct
import sysconfig
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

VOCAB_SIZE = 8192
HIDDEN_SIZE = 256
INTERMEDIATE_SIZE = 688
NUM_LAYERS = 4
NUM_HEADS = 4
NUM_KV_HEADS = 2
HEAD_DIM = HIDDEN_SIZE // NUM_HEADS
MAX_POSITIONS = 2048

CHECKPOINT_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer_config.json",
    "tokenizer.json",
    "model.safetensors",
)
ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
# The trainer gives special tokens the first ids, in this order.
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)
ENDOFTEXT_ID, IM_START_ID, IM_END_ID = 0, 1, 2

# Init scales. Projections are N(0, 1/fan_in), so each layer adds about as much as the unit-std embedding.
# Measured over 8 prompts x 64 greedy tokens in transformers: logit std 8, top-1 margin median 1.5 and
# 1st percentile 0.02, against a float32-vs-float64 logit error of ~3e-5 (tests/engine/test_devckpt.py).
EMBED_STD = 1.0
LM_HEAD_STD = 0.5  # logits = rmsnorm(h) @ W: std ≈ 0.5 * sqrt(256) = 8
NORM_NOISE_STD = 0.05

# Standard-library modules present in both 3.11 and 3.12 (requires-python), read in this order.
CORPUS_MODULES = (
    "argparse.py", "ast.py", "base64.py", "bisect.py", "calendar.py", "collections/__init__.py",
    "configparser.py", "contextlib.py", "copy.py", "csv.py", "dataclasses.py", "difflib.py",
    "email/message.py", "enum.py", "fractions.py", "functools.py", "gettext.py", "heapq.py",
    "html/parser.py", "http/client.py", "inspect.py", "ipaddress.py", "json/decoder.py",
    "json/encoder.py", "logging/__init__.py", "pathlib.py", "pprint.py", "queue.py", "random.py",
    "re/_parser.py", "shlex.py", "shutil.py", "statistics.py", "string.py", "subprocess.py",
    "tarfile.py", "textwrap.py", "threading.py", "tokenize.py", "typing.py", "unittest/case.py",
    "urllib/parse.py", "uuid.py",
)  # fmt: skip

# ChatML, with tools as Qwen 2.5 renders them (Hermes style): the tools' JSON in a system block (merged
# with a leading system message), an assistant's calls as <tool_call> blocks, tool results as
# <tool_response> blocks in a user turn. Without tools it is plain ChatML.
CHAT_TEMPLATE = (
    "{% if tools %}"
    "{{ '<|im_start|>system\\n' }}"
    "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] + '\\n\\n' }}{% endif %}"
    "{{ '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{% for tool in tools %}{{ '\\n' }}{{ tool | tojson }}{% endfor %}"
    "{{ '\\n</tools>\\n\\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\\n</tool_call><|im_end|>\\n\' }}'
    "{% endif %}"
    "{% for message in messages %}"
    "{% if tools and loop.first and message['role'] == 'system' %}"
    "{% elif message['role'] == 'assistant' and message['tool_calls'] %}"
    "{{ '<|im_start|>assistant' }}"
    "{% if message['content'] %}{{ '\\n' + message['content'] }}{% endif %}"
    "{% for tool_call in message['tool_calls'] %}"
    "{% set call = tool_call['function'] if tool_call['function'] is defined else tool_call %}"
    "{{ '\\n<tool_call>\\n{\"name\": \"' + call['name'] + '\", \"arguments\": ' }}"
    "{% if call['arguments'] is string %}{{ call['arguments'] }}"
    "{% else %}{{ call['arguments'] | tojson }}{% endif %}"
    "{{ '}\\n</tool_call>' }}"
    "{% endfor %}"
    "{{ '<|im_end|>\\n' }}"
    "{% elif message['role'] == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}{{ '<|im_start|>user' }}{% endif %}"
    "{{ '\\n<tool_response>\\n' + message['content'] + '\\n</tool_response>' }}"
    "{% if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}{{ '<|im_end|>\\n' }}{% endif %}"
    "{% else %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def model_config() -> dict[str, Any]:
    """The config.json contents (Hugging Face LlamaConfig keys)."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": VOCAB_SIZE,
        "hidden_size": HIDDEN_SIZE,
        "intermediate_size": INTERMEDIATE_SIZE,
        "num_hidden_layers": NUM_LAYERS,
        "num_attention_heads": NUM_HEADS,
        "num_key_value_heads": NUM_KV_HEADS,
        "head_dim": HEAD_DIM,
        "max_position_embeddings": MAX_POSITIONS,
        "rope_theta": 10000.0,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        # ChatML models have no BOS prefix; <|endoftext|> doubles as BOS id, pad, and end of a document.
        "bos_token_id": ENDOFTEXT_ID,
        "eos_token_id": [IM_END_ID, ENDOFTEXT_ID],
        "pad_token_id": ENDOFTEXT_ID,
    }


def make_weights(seed: int = 0) -> dict[str, npt.NDArray[np.float32]]:
    """Random float32 weights under the standard HF names, drawn in a fixed order from PCG64(seed).

    Draws are float64 then rounded to float32: numpy's float64 normal stream is the long-stable one.
    """
    rng = np.random.Generator(np.random.PCG64(seed))

    def normal(shape: tuple[int, ...], std: float) -> npt.NDArray[np.float32]:
        return (rng.standard_normal(shape) * std).astype(np.float32)

    def linear(out_features: int, in_features: int) -> npt.NDArray[np.float32]:
        return normal((out_features, in_features), 1.0 / np.sqrt(in_features))

    def norm() -> npt.NDArray[np.float32]:
        return (1.0 + rng.standard_normal(HIDDEN_SIZE) * NORM_NOISE_STD).astype(np.float32)

    kv_dim = NUM_KV_HEADS * HEAD_DIM
    out: dict[str, npt.NDArray[np.float32]] = {
        "model.embed_tokens.weight": normal((VOCAB_SIZE, HIDDEN_SIZE), EMBED_STD)
    }
    for i in range(NUM_LAYERS):
        p = f"model.layers.{i}."
        out[p + "self_attn.q_proj.weight"] = linear(NUM_HEADS * HEAD_DIM, HIDDEN_SIZE)
        out[p + "self_attn.k_proj.weight"] = linear(kv_dim, HIDDEN_SIZE)
        out[p + "self_attn.v_proj.weight"] = linear(kv_dim, HIDDEN_SIZE)
        out[p + "self_attn.o_proj.weight"] = linear(HIDDEN_SIZE, NUM_HEADS * HEAD_DIM)
        out[p + "mlp.gate_proj.weight"] = linear(INTERMEDIATE_SIZE, HIDDEN_SIZE)
        out[p + "mlp.up_proj.weight"] = linear(INTERMEDIATE_SIZE, HIDDEN_SIZE)
        out[p + "mlp.down_proj.weight"] = linear(HIDDEN_SIZE, INTERMEDIATE_SIZE)
        out[p + "input_layernorm.weight"] = norm()
        out[p + "post_attention_layernorm.weight"] = norm()
    out["model.norm.weight"] = norm()
    out["lm_head.weight"] = normal((VOCAB_SIZE, HIDDEN_SIZE), LM_HEAD_STD)
    return out


def safetensors_bytes(tensors: dict[str, npt.NDArray[np.float32]]) -> Iterator[bytes]:
    """A float32 safetensors file in chunks: u64 header length, JSON header, then data sorted by name.

    Written by hand rather than with the safetensors library so the bytes depend only on this code.
    """
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    names = sorted(tensors)
    for name in names:
        nbytes = tensors[name].size * 4
        header[name] = {
            "dtype": "F32",
            "shape": list(tensors[name].shape),
            "data_offsets": [offset, offset + nbytes],
        }
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the format pads the header so the data starts 8-byte aligned
    yield struct.pack("<Q", len(raw)) + raw
    for name in names:
        yield np.ascontiguousarray(tensors[name], dtype="<f4").tobytes()


def corpus_texts() -> list[str]:
    """The tokenizer's training text: CORPUS_MODULES from this interpreter's standard library."""
    root = Path(sysconfig.get_paths()["stdlib"])
    missing = [m for m in CORPUS_MODULES if not (root / m).is_file()]
    if missing:
        raise FileNotFoundError(f"standard-library sources missing under {root}: {missing}")
    return [(root / m).read_bytes().decode("utf-8") for m in CORPUS_MODULES]


def train_tokenizer() -> str:
    """Train the byte-level BPE tokenizer and return its tokenizer.json text (deterministic)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(SPECIAL_TOKENS),
        # All 256 byte symbols up front: any UTF-8 text encodes, and symbol ids do not depend on the corpus.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    texts = corpus_texts()
    tokenizer.train_from_iterator(texts, trainer, length=len(texts))
    for token_id, token in enumerate(SPECIAL_TOKENS):
        assert tokenizer.token_to_id(token) == token_id, f"{token} did not get id {token_id}"
    return tokenizer.to_str()


def tokenizer_config() -> dict[str, Any]:
    """The tokenizer_config.json contents: ChatML template, <|im_end|> ends a turn, no BOS prefix."""
    return {
        "add_bos_token": False,
        "add_eos_token": False,
        "bos_token": None,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": IM_END,
        "model_max_length": MAX_POSITIONS,
        "pad_token": ENDOFTEXT,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": None,
    }


def generation_config() -> dict[str, Any]:
    """The generation_config.json contents: generation stops at <|im_end|> or <|endoftext|>."""
    return {
        "bos_token_id": ENDOFTEXT_ID,
        "eos_token_id": [IM_END_ID, ENDOFTEXT_ID],
        "pad_token_id": ENDOFTEXT_ID,
    }


def _json_bytes(obj: dict[str, Any]) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode()


def _write_atomic(path: Path, chunks: Iterator[bytes] | bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            for chunk in [chunks] if isinstance(chunks, bytes) else chunks:
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_checkpoint(out_dir: str | Path, seed: int = 0) -> Path:
    """Write the dev checkpoint into out_dir (created if needed) and return out_dir as a Path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    contents: dict[str, Iterator[bytes] | bytes] = {
        "config.json": _json_bytes(model_config()),
        "generation_config.json": _json_bytes(generation_config()),
        "tokenizer_config.json": _json_bytes(tokenizer_config()),
        "tokenizer.json": train_tokenizer().encode(),
        "model.safetensors": safetensors_bytes(make_weights(seed)),
    }
    assert tuple(contents) == CHECKPOINT_FILES
    for name, chunks in contents.items():
        _write_atomic(out / name, chunks)
    return out


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", required=True, type=Path, help="directory to write the checkpoint into")
    parser.add_argument("--seed", type=int, default=0, help="weight seed (default 0)")
    args = parser.parse_args(argv)
    out = write_checkpoint(args.out, seed=args.seed)
    for name in CHECKPOINT_FILES:
        path = out / name
        print(f"{path}  {path.stat().st_size} bytes  sha256 {file_sha256(path)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
