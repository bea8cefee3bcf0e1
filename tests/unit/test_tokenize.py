"""The shared tokenizer approximation: counts, lossless pieces, chained block hashes, chat rendering."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleetgate.core.tokenize import (
    block_hashes,
    count_and_hash,
    count_tokens,
    render_chat_prompt,
    token_pieces,
)


def test_counts_follow_documented_rules() -> None:
    assert count_tokens("") == 0
    assert count_tokens("hello") == 1
    assert count_tokens("hello world") == 2  # " world" absorbs its leading space
    assert count_tokens("international") == 3  # letter runs are cut every 6 characters
    assert count_tokens("123456") == 2  # digit runs every 3
    assert count_tokens("a, b!") == 4  # "a" "," " b" "!"
    assert count_tokens("a\n\nb") == 3
    assert count_tokens("x_y") == 3


def test_english_prose_is_about_four_chars_per_token() -> None:
    text = "The quick brown fox jumps over the lazy dog while the sun sets slowly behind the hills. " * 50
    ratio = len(text) / count_tokens(text)
    assert 3.5 <= ratio <= 5.5


@given(st.text(max_size=300))
def test_pieces_cover_text_exactly(text: str) -> None:
    pieces = token_pieces(text)
    assert "".join(pieces) == text
    assert len(pieces) == count_tokens(text)


def test_block_hashes_only_full_blocks() -> None:
    text = " word" * 40  # 40 tokens
    assert count_tokens(text) == 40
    assert len(block_hashes(text)) == 2
    assert len(block_hashes(text, block_tokens=8)) == 5
    assert block_hashes(" word" * 15) == ()
    with pytest.raises(ValueError):
        block_hashes(text, 0)


def test_block_hashes_share_exactly_the_common_prefix() -> None:
    base = " alpha" * 32 + " beta" * 16
    same_prefix = " alpha" * 32 + " gamma" * 16
    a, b = block_hashes(base), block_hashes(same_prefix)
    assert len(a) == len(b) == 3
    assert a[:2] == b[:2]
    assert a[2] != b[2]
    # Chained: an identical block after a different prefix hashes differently.
    c = block_hashes(" gamma" * 16 + " beta" * 16)
    d = block_hashes(" alpha" * 16 + " beta" * 16)
    assert c[1] != d[1]


def test_block_hashes_stable_across_processes() -> None:
    text = "Stable hashing across interpreter runs, please. " * 10
    code = f"from fleetgate.core.tokenize import block_hashes;print(block_hashes({text!r}))"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONHASHSEED": "123"},
    ).stdout.strip()
    assert out == str(block_hashes(text))


def test_render_chat_prompt() -> None:
    prompt = render_chat_prompt(
        [
            {"role": "system", "content": "Be brief."},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Look at "},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                    {"type": "text", "text": "this."},
                ],
            },
        ]
    )
    assert prompt == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nLook at this.<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert render_chat_prompt([{"role": "user", "content": None}]).startswith("<|im_start|>user\n<|im_end|>")


def test_count_and_hash_matches_separate_calls() -> None:
    text = "Some prompt text, repeated for a while. " * 20
    assert count_and_hash(text, 8) == (count_tokens(text), block_hashes(text, 8))


def test_simengine_filler_words_are_one_token_each() -> None:
    from fleetgate.simengine.textgen import WORDS, plan_output, start_index, tokens_text

    assert all(count_tokens(w) == 1 for w in WORDS)
    start = start_index("some prompt")
    assert start == start_index("some prompt")
    assert count_tokens(tokens_text(start, 0, 137)) == 137
    plan = plan_output(start, 20, [])
    assert (plan.tokens, plan.finish_reason, plan.text_chars) == (20, "length", None)
    assert plan_output(start, 20, [], eos_at=5).finish_reason == "stop"
    text = tokens_text(start, 0, 20)
    stop = text.split()[6]
    stopped = plan_output(start, 20, [stop])
    assert stopped.finish_reason == "stop" and stopped.text_chars is not None
    assert stop not in text[: stopped.text_chars].split()
    assert stopped.tokens <= 7 + 1
