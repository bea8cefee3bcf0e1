"""Image URL fetching: pure address-policy checks, and real fetches from 127.0.0.1 listeners only."""

from __future__ import annotations

import asyncio
import io
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from PIL import Image

from aiohttp_site import serve_app
from fleetgate.multimodal.fetch import AddressPolicy, UrlFetcher
from fleetgate.multimodal.image import ImageError

# -- pure address checks (no network) ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "10.1.2.3",
        "172.16.0.5",
        "192.168.1.1",
        "169.254.1.1",
        "::1",
        "fe80::1",
        "fc00::1",
        "0.0.0.0",
        "100.64.0.1",
        "::ffff:10.0.0.1",
    ],
)
def test_private_and_local_addresses_refused_by_default(address: str) -> None:
    with pytest.raises(ImageError, match="private, loopback, link-local or reserved"):
        AddressPolicy().check_address(address)


@pytest.mark.parametrize("address", ["169.254.169.254", "fd00:ec2::254", "100.100.100.200"])
def test_metadata_refused_even_with_private_allowed(address: str) -> None:
    with pytest.raises(ImageError, match="metadata"):
        AddressPolicy(allow_private=True).check_address(address)


def test_metadata_refused_even_inside_an_allowed_range() -> None:
    with pytest.raises(ImageError, match="metadata"):
        AddressPolicy.from_lists(["169.254.0.0/16"]).check_address("169.254.169.254")


def test_metadata_allowed_only_when_named_exactly() -> None:
    AddressPolicy.from_lists(["169.254.169.254"]).check_address("169.254.169.254")


def test_public_addresses_allowed() -> None:
    AddressPolicy().check_address("93.184.216.34")
    AddressPolicy().check_address("2606:2800:220:1:248:1893:25c8:1946")


def test_allow_private_flag() -> None:
    AddressPolicy(allow_private=True).check_address("10.0.0.1")


def test_allow_list_restricts_and_overrides_private() -> None:
    policy = AddressPolicy.from_lists(["127.0.0.1", "images.example.com", ".cdn.example.org"])
    policy.check_address("127.0.0.1")
    policy.check_address("93.184.216.34", "images.example.com")
    policy.check_address("93.184.216.34", "a.b.cdn.example.org")
    with pytest.raises(ImageError, match="not on the allow list"):
        policy.check_address("93.184.216.34", "other.example.com")
    with pytest.raises(ImageError, match="not on the allow list"):
        policy.check_address("127.0.0.2")


def test_deny_list_wins() -> None:
    policy = AddressPolicy.from_lists(["10.0.0.0/8"], ["10.9.0.0/16", "bad.example.com"])
    policy.check_address("10.1.0.1")
    with pytest.raises(ImageError, match="deny list"):
        policy.check_address("10.9.1.1")
    with pytest.raises(ImageError, match="deny list"):
        policy.check_host("bad.example.com")
    with pytest.raises(ImageError, match="metadata"):
        policy.check_host("metadata.google.internal")


def test_url_checks_without_network() -> None:
    fetcher = UrlFetcher(AddressPolicy(), max_bytes=1000, timeout_s=1)
    for url, pattern in [
        ("ftp://example.com/a.png", "scheme 'ftp'"),
        ("file:///etc/passwd", "scheme 'file'"),
        ("http://user:pw@example.com/a.png", "credentials"),
        ("http://169.254.169.254/latest/meta-data", "metadata"),
        ("http://[::1]:8080/a.png", "private, loopback"),
        ("http://10.0.0.1/a.png", "private, loopback"),
    ]:
        with pytest.raises(ImageError, match=pattern):
            fetcher.check_url(url)
    assert fetcher.check_url("https://example.com/cat.png") == "example.com"


# -- real fetches from a 127.0.0.1 listener ---------------------------------------------------------------


def _png() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (64, 48), (1, 2, 3)).save(buf, "PNG")
    return buf.getvalue()


@pytest.fixture
async def server() -> AsyncIterator[str]:
    png = _png()

    async def ok(_: web.Request) -> web.Response:
        return web.Response(body=png, content_type="image/png")

    async def big(_: web.Request) -> web.Response:
        return web.Response(body=b"\0" * 50_000, content_type="image/png")

    async def chunked(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        await resp.prepare(request)
        for _ in range(20):
            await resp.write(b"\0" * 5000)
        await resp.write_eof()
        return resp

    async def slow(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        await resp.prepare(request)
        await resp.write(b"\x89PNG")
        await asyncio.sleep(1.5)
        return resp

    async def redirect(request: web.Request) -> web.Response:
        raise web.HTTPFound(request.query.get("to", "/ok"))

    async def missing(_: web.Request) -> web.Response:
        return web.Response(status=404)

    app = web.Application()
    app.router.add_get("/ok", ok)
    app.router.add_get("/big", big)
    app.router.add_get("/chunked", chunked)
    app.router.add_get("/slow", slow)
    app.router.add_get("/redirect", redirect)
    app.router.add_get("/missing", missing)
    async with serve_app(app) as url:
        yield url


def _fetcher(**kw: object) -> UrlFetcher:
    args: dict[str, object] = {"max_bytes": 20_000, "timeout_s": 0.5}
    args.update(kw)
    return UrlFetcher(AddressPolicy.from_lists(["127.0.0.1"]), **args)  # type: ignore[arg-type]


async def test_fetch_ok_and_limits(server: str) -> None:
    fetcher = _fetcher()
    try:
        assert await fetcher.fetch(server + "/ok") == _png()
        with pytest.raises(ImageError, match="50000 bytes, more than the limit of 20000"):
            await fetcher.fetch(server + "/big")
        with pytest.raises(ImageError, match="larger than the limit of 20000"):
            await fetcher.fetch(server + "/chunked")
        with pytest.raises(ImageError, match=r"longer than 0\.5 s"):
            await fetcher.fetch(server + "/slow")
        with pytest.raises(ImageError, match="HTTP 404"):
            await fetcher.fetch(server + "/missing")
        assert await fetcher.fetch(server + "/redirect") == _png()
    finally:
        await fetcher.close()


async def test_redirect_to_forbidden_address_refused(server: str) -> None:
    fetcher = _fetcher()
    try:
        with pytest.raises(ImageError, match="metadata"):
            await fetcher.fetch(server + "/redirect?to=http://169.254.169.254/latest/meta-data")
        with pytest.raises(ImageError, match="not on the allow list"):
            await fetcher.fetch(server + "/redirect?to=http://127.0.0.2/ok")
    finally:
        await fetcher.close()


async def test_loopback_refused_without_allow_list(server: str) -> None:
    fetcher = UrlFetcher(AddressPolicy(), max_bytes=20_000, timeout_s=1)
    try:
        with pytest.raises(ImageError, match="private, loopback"):
            await fetcher.fetch(server + "/ok")
        port = server.rsplit(":", 1)[1]
        with pytest.raises(ImageError, match="private, loopback"):  # through the resolver, not a literal
            await fetcher.fetch(f"http://localhost:{port}/ok")
    finally:
        await fetcher.close()
