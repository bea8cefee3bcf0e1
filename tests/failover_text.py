"""Check a continued stream's text token for token: which engines' outputs, spliced, make it exactly.

A stream that broke and was continued on another replica reads ``segment_1 + segment_2 + ...``, each
segment being what its engine produces given the prompt and everything before it: the simulated engine's
running text (``simengine.textgen``) or, for the real llama.cpp replica pinned to one "stamp" token by a
+100 logit bias, that token repeated. A duplicated, lost or foreign token makes every splice fail.
"""

from __future__ import annotations

from fleetgate.simengine.textgen import WordChain, start_index


def splice(
    prompt: str, stamp: str | None, text: str, tokens: int, *, partial: bool = False, _prefix: str = ""
) -> list[str] | None:
    """The engines (``"sim"``/``"llama"``) whose segments make ``text`` of ``tokens`` tokens, or ``None``.

    ``prompt``: the simulated engine's rendered prompt (salted as it salts seeded requests); ``stamp``: the
    llama.cpp stamp text (``None``: no llama.cpp replica); ``partial``: ``text`` may stop early (a stream
    that ended with an error event). Adjacent simulated segments are one segment (their text is the same)."""
    if not text:
        return [] if (partial or tokens == 0) else None
    if stamp:
        m = 0
        while m < tokens and text.startswith(stamp, m * len(stamp)):
            m += 1
        for k in range(m, 0, -1):
            cut = k * len(stamp)
            after = _prefix + text[:cut]
            rest = splice(prompt, stamp, text[cut:], tokens - k, partial=partial, _prefix=after)
            if rest is not None:
                return ["llama", *rest]
    chain = WordChain(start_index(prompt + _prefix))
    ends: list[int] = []
    used = 0
    while len(ends) < tokens:
        word = chain.next()
        if not text.startswith(word, used):
            if partial and word.startswith(text[used:]) and used < len(text):  # a cut word at the very end
                return ["sim"]
            break
        used += len(word)
        ends.append(used)
    for n in range(len(ends), 0, -1):
        cut = ends[n - 1]
        if stamp is None and cut < len(text):
            break  # without llama.cpp a simulated segment is only followed by more of the same
        after = _prefix + text[:cut]
        rest = splice(prompt, stamp, text[cut:], tokens - n, partial=partial, _prefix=after)
        if rest is not None:
            return ["sim", *rest]
    return None
