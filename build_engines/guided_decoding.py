"""Structured output on the ``tensorrt_llm`` model: the tokenizer info its guided decoder reads.

TensorRT-LLM's C++ Triton backend does guided decoding with xgrammar only
(triton_backend/inflight_batcher_llm/src/model_instance_state.cc, getGuidedDecodingConfigFromParams: any
other ``guided_decoding_backend`` throws; cpp/tensorrt_llm/batch_manager/guidedDecoder.cpp: "LLGuidance is
not supported for guided decoding in C++ runtime"), so Sluice's gateway validates guides with llguidance and
this model's engine masks with xgrammar. The backend takes the tokenizer as a JSON file
(``xgrammar_tokenizer_info_path``; ``tokenizer_dir`` is ignored by the C++ path) with three keys, read by
that same function: ``encoded_vocab`` (every token's string, in id order), ``tokenizer_str`` (the
tokenizer.json serialization, from which xgrammar detects the vocabulary's encoding) and
``stop_token_ids``. TensorRT-LLM writes it with examples/generate_xgrammar_tokenizer_info.py
(tensorrt_llm/llmapi/tokenizer.py ``_xgrammar_tokenizer_info``, for a fast tokenizer: ``get_vocab()`` sorted
by id, ``backend_tokenizer.to_str()``, ``[eos_token_id]``); this is the same file from the ``tokenizers``
library the gateway already uses, so a replica renders it at start from its artifact's tokenizer, with no
TensorRT-LLM or transformers import. The stop ids are the model's end-of-sequence ids as the gateway reads
them (``sluice.text.TextCodec``): the ones it sends as ``end_id`` and stop words.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from sluice.text.tokenizer import TextCodec

# The file's name beside the rendered config.pbtxt, and its keys (getGuidedDecodingConfigFromParams).
XGRAMMAR_TOKENIZER_INFO = "xgrammar_tokenizer_info.json"
XGRAMMAR_INFO_KEYS = ("encoded_vocab", "tokenizer_str", "stop_token_ids")
GUIDED_DECODING_BACKEND = "xgrammar"


def xgrammar_tokenizer_info(checkpoint_dir: Path) -> dict[str, Any] | None:
    """The tokenizer info of the tokenizer in ``checkpoint_dir`` (an artifact's top level or a checkpoint),
    or None without its ``tokenizer.json`` and ``tokenizer_config.json``. A tokenizer whose ids have holes,
    or a model without an end-of-sequence id, is a ValueError: xgrammar indexes ``encoded_vocab`` by token
    id and ends a finished guide only at a stop token."""
    if not all((checkpoint_dir / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json")):
        return None  # no tokenizer as the gateway reads one (sluice.text.TextCodec)
    tokenizer = Tokenizer.from_file(str(checkpoint_dir / "tokenizer.json"))
    by_id = {token_id: token for token, token_id in tokenizer.get_vocab(with_added_tokens=True).items()}
    if sorted(by_id) != list(range(len(by_id))):
        raise ValueError(f"{checkpoint_dir}/tokenizer.json has holes in its token ids")
    stop_token_ids = list(TextCodec.from_checkpoint(checkpoint_dir).eos_token_ids)
    if not stop_token_ids:
        raise ValueError(f"{checkpoint_dir} names no end-of-sequence id (generation_config.json)")
    return {
        "encoded_vocab": [by_id[i] for i in range(len(by_id))],
        "tokenizer_str": tokenizer.to_str(),
        "stop_token_ids": stop_token_ids,
    }


def xgrammar_tokenizer_info_text(checkpoint_dir: Path) -> str | None:
    """``xgrammar_tokenizer_info`` as the file's text, or None (no tokenizer.json)."""
    info = xgrammar_tokenizer_info(checkpoint_dir)
    return None if info is None else json.dumps(info)
