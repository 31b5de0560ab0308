"""Text is encoded as transformers and vLLM encode a prompt: with the tokenizer's special tokens (a Llama
tokenizer's BOS), so that prompt lengths and outputs match theirs; an output's text counted again takes
none of its own."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from llmbench.models.tokenizer import HFTokenizer


def bos_tokenizer(folder: Path) -> Path:
    vocab = {"<s>": 0, "</s>": 1, "<unk>": 2, "hello": 3, "world": 4}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    ).save_pretrained(folder)
    return folder


def test_a_prompt_keeps_the_tokenizers_bos_as_transformers_encodes_it(tmp_path):
    folder = bos_tokenizer(tmp_path / "tok")
    ours = HFTokenizer(folder)
    theirs = AutoTokenizer.from_pretrained(str(folder))
    assert ours.encode("hello world") == theirs("hello world").input_ids == [0, 3, 4]
    assert ours.encode("hello world", special=False) == [3, 4]  # an output's text, counted again
