"""The ASCII fast path of core.tokenize gives exactly the pieces, counts and hashes of TOKEN_PATTERN."""

from __future__ import annotations

import random
from hashlib import blake2b

from hypothesis import given, settings
from hypothesis import strategies as st

from fleetgate.core.tokenize import (
    _ASCII_PATTERN,
    TOKEN_PATTERN,
    PromptTokenizer,
    _chunk_pieces,
    block_hashes,
    count_and_hash,
    count_and_hash_chat,
    count_tokens,
    render_chat_prompt,
)

_ASCII = st.text(alphabet=st.characters(max_codepoint=127), max_size=200)
_MIXED = st.text(
    alphabet=st.sampled_from(list(" \t\n\r\x0b\x0c\x1c\x1f\x85\xa0ab_1.,!é中"))
    | st.characters(max_codepoint=127),
    max_size=200,
)


def _reference_hashes(text: str, block_tokens: int) -> tuple[int, ...]:
    pieces = TOKEN_PATTERN.findall(text)
    out, prev = [], b""
    for i in range(len(pieces) // block_tokens):
        chunk = "".join(pieces[i * block_tokens : (i + 1) * block_tokens]).encode("utf-8", "surrogatepass")
        prev = blake2b(prev + chunk, digest_size=8).digest()
        out.append(int.from_bytes(prev, "big"))
    return tuple(out)


@settings(max_examples=500, deadline=None)
@given(_ASCII)
def test_ascii_pattern_same_pieces(text: str) -> None:
    assert [p.decode() for p in _ASCII_PATTERN.findall(text.encode())] == TOKEN_PATTERN.findall(text)


@settings(max_examples=300, deadline=None)
@given(_MIXED, st.integers(min_value=1, max_value=5))
def test_counts_and_hashes_match_reference(text: str, block: int) -> None:
    assert count_tokens(text) == len(TOKEN_PATTERN.findall(text))
    assert block_hashes(text, block) == _reference_hashes(text, block)
    assert count_and_hash(text, block) == (len(TOKEN_PATTERN.findall(text)), _reference_hashes(text, block))


def test_every_ascii_character() -> None:
    rng = random.Random(7)
    chars = [chr(i) for i in range(128)]
    for _ in range(3000):
        text = "".join(rng.choice(chars) for _ in range(rng.randint(0, 40)))
        assert count_and_hash(text, 4) == (len(TOKEN_PATTERN.findall(text)), _reference_hashes(text, 4))


_MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "assistant", "tool", "a b"]), "content": _MIXED}
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_MESSAGE, min_size=1, max_size=5), st.integers(min_value=1, max_value=8))
def test_chat_per_message_matches_rendered_text(messages: list[dict[str, str]], block: int) -> None:
    text = render_chat_prompt(messages)
    expected = (text, len(TOKEN_PATTERN.findall(text)), _reference_hashes(text, block))
    tok = PromptTokenizer()
    assert count_and_hash_chat(messages, block) == expected
    assert tok.count_and_hash_chat(messages, block) == expected
    assert tok.count_and_hash_chat(messages, block) == expected  # from the cache this time
    assert tok.count_and_hash_chat(messages, block, hashes=False) == (*expected[:2], ())


def test_chat_cache_long_history() -> None:
    tok = PromptTokenizer()
    rng = random.Random(3)
    words = ["hello", " world", "international", "42", ",", "\n\n", "  ", "_x", "é", "naïve"]
    history: list[dict[str, str]] = []
    for turn in range(6):
        content = "".join(rng.choice(words) for _ in range(300))
        history.append({"role": "user" if turn % 2 == 0 else "assistant", "content": content})
        text = render_chat_prompt(history)
        assert tok.count_and_hash_chat(history) == (
            text,
            len(TOKEN_PATTERN.findall(text)),
            _reference_hashes(text, 16),
        )
        assert tok.cached_histories() == turn + 1  # each turn's history is remembered, and resumed from


@settings(max_examples=400, deadline=None)
@given(_MIXED, st.integers(min_value=1, max_value=16))
def test_chunked_pieces_are_the_pieces(text: str, chunk: int) -> None:
    """Tokenizing a long text chunk by chunk (to hold the interpreter lock briefly) changes no piece."""
    assert _chunk_pieces(TOKEN_PATTERN, text, chunk) == TOKEN_PATTERN.findall(text)
    if text.isascii():
        raw = text.encode()
        assert _chunk_pieces(_ASCII_PATTERN, raw, chunk) == _ASCII_PATTERN.findall(raw)


@settings(max_examples=100, deadline=None)
@given(_MIXED, st.integers(min_value=1, max_value=6), st.binary(min_size=1, max_size=8))
def test_salted_hashes(text: str, block: int, salt: bytes) -> None:
    """A salt changes every block hash (tenant scope) and nothing else; the chat path agrees."""
    plain = block_hashes(text, block)
    salted = block_hashes(text, block, salt)
    assert len(plain) == len(salted)
    assert not set(plain) & set(salted)
    messages = [{"role": "user", "content": text}]
    rendered = render_chat_prompt(messages)
    assert PromptTokenizer().count_and_hash_chat(messages, block, salt=salt)[2] == block_hashes(
        rendered, block, salt
    )


def test_history_digest_is_linear() -> None:
    """Many tiny messages: the history lookup is one pass (it was one key per prefix: quadratic). Each size
    is timed 5 times with a fresh tokenizer (no cache) and the fastest run counts, so that a scheduling
    hiccup on a loaded machine (a single timing once read 0.39 s against 0.31 s allowed) is not read as
    quadratic growth."""
    import time

    timings = []
    for n in (2000, 8000):
        messages = [{"role": "user", "content": "x"} for _ in range(n)]
        runs = []
        for _ in range(5):
            tok = PromptTokenizer()
            t0 = time.perf_counter()
            tok.count_and_hash_chat(messages)
            runs.append(time.perf_counter() - t0)
        timings.append(min(runs))
    assert timings[1] < 12 * timings[0] + 0.05  # 4x the messages: about 4x the time, not 16x
