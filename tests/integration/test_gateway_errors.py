"""The one HTTP error mapping (gateway/errors.py) and the static provider, in process (no servers needed)."""

from __future__ import annotations

import orjson
import pytest
from aiohttp import web

from fleetgate.config import ReplicaConfig
from fleetgate.core.errors import RateLimitError, ServiceUnavailableError, UpstreamTimeoutError
from fleetgate.core.sse import parse_all
from fleetgate.gateway.errors import error_response, from_http_exception, sse_error_event, upstream_rejection
from fleetgate.providers.base import ProviderError, ReplicaStatus
from fleetgate.providers.static import StaticProvider


def test_error_response_shape_and_retry_after() -> None:
    resp = error_response(RateLimitError("slow down", retry_after_s=1.2), "rid-1")
    assert resp.status == 429
    assert resp.headers["Retry-After"] == "2" and resp.headers["x-request-id"] == "rid-1"
    assert resp.body is not None
    body = orjson.loads(resp.body)  # type: ignore[arg-type]
    assert body == {
        "error": {
            "message": "slow down",
            "type": "rate_limit_error",
            "param": None,
            "code": "rate_limit_exceeded",
        }
    }
    assert error_response(ServiceUnavailableError("busy", retry_after_s=0.1)).headers["Retry-After"] == "1"


def test_sse_error_event_is_one_openai_error() -> None:
    events = parse_all(sse_error_event(UpstreamTimeoutError("stalled", retryable=False)))
    assert len(events) == 1
    err = orjson.loads(events[0].data)["error"]
    assert err["code"] == "upstream_timeout" and err["message"] == "stalled"


@pytest.mark.parametrize(
    ("status", "raw", "expected"),
    [
        (
            400,
            b'{"error": {"message": "too long", "param": "max_tokens", "code": null}}',
            ("too long", "max_tokens"),
        ),
        (422, b'{"detail": "bad field"}', ("bad field", None)),
        (404, b"not json", ("The engine rejected the request (HTTP 404).", None)),
    ],
)
def test_engine_rejections_are_relayed(status: int, raw: bytes, expected: tuple[str, str | None]) -> None:
    err = upstream_rejection(status, raw)
    assert err is not None and err.status == status
    assert (err.message, err.param) == expected


@pytest.mark.parametrize("status", [408, 429, 500, 502, 503])
def test_retryable_statuses_are_not_rejections(status: int) -> None:
    assert upstream_rejection(status, b"{}") is None


def test_aiohttp_exceptions_map_onto_the_tree() -> None:
    assert from_http_exception(web.HTTPRequestEntityTooLarge(max_size=10, actual_size=20)).status == 413
    assert from_http_exception(web.HTTPNotFound()).status == 404
    assert from_http_exception(web.HTTPMethodNotAllowed("GET", ["POST"])).status == 405


async def test_static_provider() -> None:
    drained: list[str] = []

    async def hook(name: str, timeout_s: float) -> None:
        drained.append(name)

    provider = StaticProvider([ReplicaConfig(name="a", url="http://127.0.0.1:1")], drain_hook=hook)
    assert [r.name for r in await provider.list()] == ["a"]
    assert len(await provider.scale_to(1)) == 1
    with pytest.raises(ProviderError):
        await provider.scale_to(2)
    with pytest.raises(ProviderError):
        await provider.restart("a")
    await provider.drain("a")
    assert drained == ["a"] and (await provider.list())[0].status == ReplicaStatus.DRAINING
