"""Image URL fetching cannot reach addresses the configuration forbids.

Only 127.0.0.1 listeners started here are ever contacted; the other addresses are checked by the address
policy alone (no connection is attempted to them).
"""

from __future__ import annotations

import io
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from aiohttp import web
from PIL import Image
from sec_env import MODEL

from aiohttp_site import start_site
from fleetgate.multimodal.fetch import AddressPolicy
from fleetgate.multimodal.image import ImageError


def _png() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (32, 24), (200, 10, 10)).save(buf, format="PNG")
    return buf.getvalue()


class Listener:
    """A 127.0.0.1 HTTP server that counts hits: ``/img.png`` serves a PNG, ``/hop?to=URL`` redirects."""

    def __init__(self) -> None:
        self.hits: list[str] = []
        self.url = ""
        self.runner: web.AppRunner | None = None

    async def start(self) -> None:
        png = _png()

        async def img(request: web.Request) -> web.StreamResponse:
            self.hits.append(request.path_qs)
            return web.Response(body=png, content_type="image/png")

        async def hop(request: web.Request) -> web.StreamResponse:
            self.hits.append(request.path_qs)
            raise web.HTTPFound(request.query["to"])

        app = web.Application()
        app.router.add_get("/img.png", img)
        app.router.add_get("/hop", hop)
        self.runner, self.url = await start_site(app, access_log=None)

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


@pytest.fixture
async def listeners() -> AsyncIterator[tuple[Listener, Listener]]:
    a, b = Listener(), Listener()
    await a.start()
    await b.start()
    yield a, b
    await a.stop()
    await b.stop()


def _config(engine_url: str, **multimodal: Any) -> dict[str, Any]:
    return {
        "gateway": {"host": "127.0.0.1", "port": 0},
        "deployments": [{"model": MODEL, "replicas": [{"name": "r0", "url": engine_url}]}],
        "multimodal": {"mode": "naive", "fetch_timeout_s": 3.0, **multimodal},
    }


async def _image_request(gateway_url: str, image_url: str) -> httpx.Response:
    body = {
        "model": MODEL,
        "max_tokens": 4,
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "what is this?"},
                    {"type": "image_url", "image_url": {"url": image_url}},
                ],
            }
        ],
    }
    async with httpx.AsyncClient() as client:
        return await client.post(gateway_url + "/v1/chat/completions", json=body, timeout=15)


async def test_loopback_refused_by_default(
    engine: Any, start_gateway: Any, listeners: tuple[Listener, Listener]
) -> None:
    a, _ = listeners
    gw = start_gateway(_config(engine.url))
    r = await _image_request(gw.url, a.url + "/img.png")
    assert r.status_code == 400, r.text
    assert r.json()["error"]["type"] == "invalid_request_error"
    assert a.hits == []  # never contacted


async def test_allow_list_permits_only_what_it_names(
    engine: Any, start_gateway: Any, listeners: tuple[Listener, Listener]
) -> None:
    a, b = listeners
    gw = start_gateway(_config(engine.url, url_allow=["127.0.0.1"], url_deny=["localhost"]))
    r = await _image_request(gw.url, a.url + "/img.png")
    assert r.status_code == 200, r.text
    assert a.hits == ["/img.png"]
    # a redirect from an allowed host to a host name not on the allow list is not followed
    port_b = b.url.rsplit(":", 1)[1]
    r = await _image_request(gw.url, f"{a.url}/hop?to=http://localhost:{port_b}/img.png")
    assert r.status_code == 400, r.text
    assert b.hits == []
    # credentials in URLs and other schemes are refused without a connection
    for url in (f"http://user:pw@127.0.0.1:{port_b}/img.png", "file:///etc/passwd", "gopher://127.0.0.1/"):
        r = await _image_request(gw.url, url)
        assert r.status_code == 400, (url, r.text)
    assert b.hits == []


async def test_fetching_disabled(
    engine: Any, start_gateway: Any, listeners: tuple[Listener, Listener]
) -> None:
    a, _ = listeners
    gw = start_gateway(_config(engine.url, fetch_urls=False, url_allow=["127.0.0.1"]))
    r = await _image_request(gw.url, a.url + "/img.png")
    assert r.status_code == 400, r.text
    assert a.hits == []


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "10.1.2.3",
        "172.16.0.5",
        "192.168.1.1",
        "169.254.169.254",
        "100.100.100.200",
        "0.0.0.0",
        "::1",
        "fe80::1",
        "fd00:ec2::254",
        "::ffff:127.0.0.1",
        "::ffff:169.254.169.254",
        "224.0.0.1",
        "100.64.0.1",
    ],
)
def test_rejected_addresses(address: str) -> None:
    """The default policy refuses every private, loopback, link-local, metadata, mapped or odd address."""
    with pytest.raises(ImageError):
        AddressPolicy.from_lists().check_address(address)


def test_metadata_refused_even_with_private_networks_allowed() -> None:
    policy = AddressPolicy.from_lists(allow_private=True)
    for address in ("169.254.169.254", "fd00:ec2::254", "::ffff:169.254.169.254"):
        with pytest.raises(ImageError):
            policy.check_address(address)
    with pytest.raises(ImageError):
        policy.check_host("metadata.google.internal")
