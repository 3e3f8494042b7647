"""Text in and out of the model: tokenization, the chat template and incremental detokenization."""

from sluice.text.detokenizer import IncrementalDetokenizer
from sluice.text.tokenizer import ChatTemplateError, TextCodec

__all__ = ["ChatTemplateError", "IncrementalDetokenizer", "TextCodec"]
