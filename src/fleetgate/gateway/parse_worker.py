"""The parse lane's worker process: large request bodies are decoded, validated, tokenized and hashed here.

Why a process and not a thread: a thread that tokenizes competes with the event loop for the interpreter
lock, and on a loaded machine the loop then waited up to 90 ms behind a 4 MB prompt; a process leaves the
loop only the cost of handing the bytes over. The worker keeps its own ``PromptTokenizer`` (sized from the
same setting as the fleet's), so multi-turn chats with long histories are still hashed incrementally.
Imports only ``fleetgate.core``: a fresh interpreter starts it quickly.
"""

from __future__ import annotations

import dataclasses

from fleetgate.core.errors import NotFoundError
from fleetgate.core.openai import Endpoint, ParsedRequest, RequestLimits, load_json_body, parse_request
from fleetgate.core.tokenize import PromptTokenizer
from fleetgate.orjson_codec import ORJSON

#: This worker process's tokenizer (set by ``init``; a worker process holds exactly one).
_tokenizer: PromptTokenizer | None = None


def init(cache_mb: float) -> None:
    """Process initializer: the tokenizer and its cache budget."""
    global _tokenizer
    _tokenizer = PromptTokenizer.with_budget(cache_mb)


#: model -> (whether routing reads prefix hashes, the tenant's salt, prefix block size, real tokenizer?)
Routes = dict[str, tuple[bool, bytes, int, bool]]


class NeedsRealTokenizer(Exception):
    """The model has a real tokenizer, which lives in the gateway process: parse it there."""


def parse_body(raw: bytes, endpoint: Endpoint, limits: RequestLimits, routes: Routes) -> ParsedRequest:
    """Bounded decode, model lookup (404 before any tokenizing), then count and hash.

    Returns the parsed request without ``body`` and ``prompt_text`` (the parent decodes the body itself:
    sending it back would cost the loop more than decoding it).
    """
    body = load_json_body(raw, limits, ORJSON)
    model = body.get("model")
    hashes, salt, block_tokens = False, b"", 16
    if isinstance(model, str) and model:
        route = routes.get(model)
        if route is None:
            raise NotFoundError(f"The model `{model}` does not exist.", param="model")
        hashes, salt, block_tokens, real = route
        if real:
            raise NeedsRealTokenizer(model)
    parsed = parse_request(
        body, endpoint, block_tokens, hashes=hashes, prompt_tokenizer=_tokenizer, limits=limits, salt=salt
    )
    return dataclasses.replace(parsed, body={}, prompt_text="")
