"""The chaos checker itself: it must flag what it is there to catch. Hand-made ledger entries (no processes),
each answered the way a simulated engine or the llama.cpp replica would, or wrongly."""

from __future__ import annotations

import orjson
from chaos_ledger import LLAMA, Entry, check, served_by

STAMP_A = (300, "il")
STAMP_B = (1500, "var")


def _entry(nonce: str, *, stamp: tuple[int, str] | None = STAMP_A, max_tokens: int = 5) -> Entry:
    return Entry(
        nonce=nonce,
        tenant="alpha",
        stream=True,
        max_tokens=max_tokens,
        stamp=stamp,
        status=200,
        echoed_id=nonce,
    )


def _answered(e: Entry, text: str, tokens: int, replica: str | None) -> Entry:
    e.outcome = "ok"
    e.text = text
    e.completion_tokens = tokens
    e.finish_reason = "length"
    e.response_ids = {f"chatcmpl-{e.nonce}"}
    e.replica = replica
    return e


def _check(*entries: Entry, logs: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    return check(list(entries), capped_rpm=120, capped_concurrency=10, access_logs=logs or {})


def test_correct_llama_and_simulated_answers_pass() -> None:
    llama = _answered(_entry("c1"), "il" * 5, 5, LLAMA)
    sim = _entry("c2")
    sim = _answered(sim, sim.expected_text(5), 5, "e0")
    report = _check(llama, sim)
    assert report.violations == []
    assert report.by_replica == {LLAMA: {"ok": 1}, "e0": {"ok": 1}}


def test_llama_answer_of_another_request_is_mixing() -> None:
    # request c1 (stamp "il") got the answer of a request stamped "var"
    report = _check(_answered(_entry("c1"), "var" * 5, 5, LLAMA))
    assert report.duplicated_or_mixed == 1
    assert report.replica_violations.get(LLAMA, 0) >= 1


def test_simulated_text_from_the_llama_replica_is_mixing() -> None:
    e = _entry("c1")
    report = _check(_answered(e, e.expected_text(5), 5, LLAMA))
    assert report.duplicated_or_mixed == 1


def test_short_llama_answer_is_truncation() -> None:
    # fewer tokens than asked, whatever usage claims
    report = _check(_answered(_entry("c1"), "il" * 4, 5, LLAMA), _answered(_entry("c2"), "il" * 5, 4, LLAMA))
    assert report.truncated >= 2
    assert report.replica_violations == {LLAMA: 3}  # c1: wrong text + wrong count; c2: usage != asked


def test_partial_llama_stream_with_explicit_error_must_be_own_prefix() -> None:
    good = _entry("c1")
    good.outcome, good.text, good.replica, good.error = "error", "ilil", LLAMA, "SSE error event: stalled"
    bad = _entry("c2")
    bad.outcome, bad.text, bad.replica, bad.error = "error", "varvar", LLAMA, "SSE error event: stalled"
    report = _check(good, bad)
    assert report.duplicated_or_mixed == 1
    assert [v for v in report.violations if v.startswith("c2")]


def test_unknown_replica_accepts_either_exact_answer_only() -> None:
    ok = _answered(_entry("c1"), "il" * 5, 5, None)
    wrong = _answered(_entry("c2"), "il" * 5, 5, None)
    wrong.stamp = STAMP_B
    report = _check(ok, wrong)
    assert report.duplicated_or_mixed == 1


def test_replica_comes_from_the_access_log() -> None:
    line = {"msg": "request finished", "request_id": "c1", "replica": LLAMA, "status": 200}
    logs = {"http://gw": "noise\n" + orjson.dumps(line).decode()}
    assert served_by(logs) == {"c1": [(LLAMA, 200)]}
    e = _answered(_entry("c1"), "il" * 5, 5, None)
    report = _check(e, logs=logs)
    assert e.replica == LLAMA and report.violations == []


def test_continued_stream_splices_pass_and_duplicates_are_caught() -> None:
    """A stream continued after a break reads as a splice of the engines' outputs; one duplicated token at
    the seam is caught, and the gateways' logs tell which streams broke and how fast they resumed."""
    from fleetgate.core.tokenize import render_chat_prompt
    from fleetgate.simengine.textgen import start_index, tokens_text

    good = _entry("c1", max_tokens=8)
    head = "il" * 3  # three tokens from the llama.cpp replica, then the simulated engine went on
    tail = tokens_text(start_index(render_chat_prompt(good.messages) + head), 0, 5)
    good = _answered(good, head + tail, 8, "e0")
    dup = _entry("c2", max_tokens=8)
    head2 = "il" * 3
    tail2 = tokens_text(start_index(render_chat_prompt(dup.messages) + head2), 0, 5)
    dup = _answered(dup, head2 + "il" + tail2[: -len(tail2.split(" ")[-1]) - 1], 8, "e0")
    logs = {
        "gw": "\n".join(
            [
                '{"msg": "request c1: replica llama stream broke: ClientPayloadError"}',
                '{"msg": "request c1: stream continued on replica e0 after 3 tokens, resumed in 0.0042 s"}',
                '{"msg": "request c2: replica llama stream stalled for 1.5 s"}',
            ]
        )
    }
    report = _check(good, dup, logs=logs)
    assert good.splice == ["llama", "sim"]
    assert [v for v in report.violations if v.startswith("c1")] == []
    assert any(v.startswith("c2") for v in report.violations)
    assert report.interrupted == 2 and report.continued_ok == 2  # c2 "completed", but its text is caught
    assert report.resume_s == [0.0042]
