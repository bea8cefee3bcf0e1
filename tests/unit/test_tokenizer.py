"""Real-tokenizer path (core.tokenizer, fleetgate.hf_tokenizer): counts, id-block hashes, parse_request."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from fleetgate.core.openai import parse_request
from fleetgate.core.tokenizer import count_and_hash_text, id_block_hashes
from fleetgate.hf_tokenizer import TokenizerFileError, load_tokenizer


class ByteTokenizer:
    """One token per UTF-8 byte: a stand-in with an exactly known count."""

    def encode(self, text: str) -> Sequence[int]:
        return list(text.encode("utf-8"))


def test_id_block_hashes_chain_over_full_blocks() -> None:
    a = id_block_hashes(list(range(40)), 16)
    b = id_block_hashes([*range(32), 99, 98], 16)
    assert len(a) == 2 and a == b  # the same first 32 ids, a partial third block never hashed
    c = id_block_hashes([1, *range(1, 40)], 16)
    assert c[0] != a[0] and c[1] != a[1]  # each hash covers the whole prefix
    with pytest.raises(ValueError):
        id_block_hashes([1], 0)


def test_parse_request_counts_with_the_tokenizer() -> None:
    tok = ByteTokenizer()
    body = {"model": "m", "messages": [{"role": "user", "content": "你好, world"}]}
    approx = parse_request(body, "chat")
    real = parse_request(body, "chat", 4, tokenizer=tok)
    rendered = "<|im_start|>user\n你好, world<|im_end|>\n<|im_start|>assistant\n"
    assert real.prompt_text == rendered == approx.prompt_text
    assert real.input_tokens == len(rendered.encode("utf-8"))
    assert real.prefix_hashes == id_block_hashes(list(rendered.encode("utf-8")), 4)
    assert real.block_tokens == 4
    comp = parse_request({"model": "m", "prompt": "abcdefgh"}, "completions", 4, tokenizer=tok)
    assert (comp.input_tokens, comp.prefix_hashes) == count_and_hash_text(tok, "abcdefgh", 4)
    assert parse_request(body, "chat", tokenizer=tok, hashes=False).prefix_hashes == ()


def test_load_tokenizer_from_a_trained_file(tmp_path: Path) -> None:
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import models, pre_tokenizers, trainers

    tok = tokenizers.Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.BpeTrainer(vocab_size=200, special_tokens=["[UNK]", "<|im_start|>", "<|im_end|>"])
    tok.train_from_iterator(["the cat sat on the mat"] * 50, trainer)
    tok.save(str(tmp_path / "tokenizer.json"))
    loaded = load_tokenizer(tmp_path)  # a folder holding tokenizer.json
    ids = loaded.encode("<|im_start|>the cat<|im_end|>")
    assert ids[0] == tok.token_to_id("<|im_start|>") and ids[-1] == tok.token_to_id("<|im_end|>")
    (tmp_path / "bad.json").write_text(json.dumps({"not": "a tokenizer"}))
    with pytest.raises(TokenizerFileError):
        load_tokenizer(tmp_path / "bad.json")
    with pytest.raises(TokenizerFileError):
        load_tokenizer(tmp_path / "missing.json")
