"""Image requests through a real in-process gateway to a real simulated engine (and, to see exactly what
the gateway forwards, a recording upstream on 127.0.0.1 that answers like an engine)."""

from __future__ import annotations

import asyncio
import base64
import io
import struct
import zlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from aiohttp import web
from PIL import Image

from aiohttp_site import serve_app
from fleetgate.config import parse_config
from fleetgate.core.types import RequestInfo, Usage
from fleetgate.gateway.admission import OpenAdmission
from fleetgate.runtime import build_gateway

MODEL = "sim-model"


class RecordingAdmission(OpenAdmission):
    """Open admission that remembers what the gateway estimated and settled."""

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[RequestInfo] = []
        self.settlements: list[tuple[float, Usage | None]] = []

    async def admit(self, tenant: Any, request: RequestInfo, now: float) -> object:
        self.requests.append(request)
        return await super().admit(tenant, request, now)

    async def settle(self, ticket: Any, actual_mu: float, now: float, *, usage: Usage | None = None) -> None:
        self.settlements.append((actual_mu, usage))
        await super().settle(ticket, actual_mu, now, usage=usage)


def encode(img: Image.Image, fmt: str) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt)
    return buf.getvalue()


def data_url(raw: bytes, mime: str = "image/jpeg") -> str:
    return f"data:{mime};base64," + base64.b64encode(raw).decode()


def bomb_png(width: int, height: int) -> bytes:
    raw = encode(Image.new("L", (4, 4)), "PNG")
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    chunk = b"IHDR" + ihdr
    patched = struct.pack(">I", len(ihdr)) + chunk + struct.pack(">I", zlib.crc32(chunk) & 0xFFFFFFFF)
    return raw[:8] + patched + raw[8 + 8 + 13 + 4 :]


PHOTO = encode(Image.linear_gradient("L").resize((1600, 1200)).convert("RGB"), "JPEG")


def chat(url: str, text: str = "What is in this picture?") -> dict[str, Any]:
    return {
        "model": MODEL,
        "max_tokens": 4,
        "messages": [
            {
                "role": "user",
                "content": [{"type": "text", "text": text}, {"type": "image_url", "image_url": {"url": url}}],
            }
        ],
    }


@pytest.fixture
async def image_server() -> AsyncIterator[str]:
    """Serves test images on 127.0.0.1 (explicitly allowed in the gateway config)."""

    async def photo(_: web.Request) -> web.Response:
        return web.Response(body=PHOTO, content_type="image/jpeg")

    async def slow(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        await resp.prepare(request)
        await resp.write(PHOTO[:100])
        await asyncio.sleep(2.0)
        return resp

    app = web.Application()
    app.router.add_get("/photo.jpg", photo)
    app.router.add_get("/slow.jpg", slow)
    async with serve_app(app) as url:
        yield url


@pytest.fixture
async def recording_engine() -> AsyncIterator[tuple[str, list[dict[str, Any]]]]:
    """A stand-in engine that records request bodies (the simulated engine does not expose them)."""
    bodies: list[dict[str, Any]] = []

    async def completions(request: web.Request) -> web.Response:
        bodies.append(await request.json())
        usage = {"prompt_tokens": 600, "completion_tokens": 1, "total_tokens": 601}
        return web.json_response(
            {"id": "x", "object": "chat.completion", "model": MODEL, "choices": [], "usage": usage}
        )

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/v1/chat/completions", completions)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}", bodies
    finally:
        await runner.cleanup()


async def _gateway(engine_url: str, admission: OpenAdmission, **multimodal: Any) -> Any:
    cfg = parse_config(
        {
            "gateway": {"host": "127.0.0.1", "port": 0, "max_body_bytes": 16 * 1024 * 1024},
            "deployments": [{"model": MODEL, "replicas": [{"name": "r0", "url": engine_url}]}],
            "multimodal": {"workers": 1, "url_allow": ["127.0.0.1"], "fetch_timeout_s": 0.5, **multimodal},
        }
    )
    server = build_gateway(cfg, admission=admission)
    await server.start(0)
    return server


async def test_image_request_end_to_end_with_simulated_engine(start_engine: Any, image_server: str) -> None:
    engine = start_engine(MODEL, time_scale="0")
    admission = RecordingAdmission()
    server = await _gateway(engine.url, admission)
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            text = await client.post(
                "/v1/chat/completions",
                json={"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]},
            )
            assert text.status_code == 200
            assert server.proxy.images is not None and not server.proxy.images.pool.started  # text: no pool
            r = await client.post("/v1/chat/completions", json=chat(data_url(PHOTO)))
            assert r.status_code == 200, r.text
            usage = r.json()["usage"]
            assert usage["prompt_tokens_details"]["image_tokens"] == 576  # the engine charges image tokens
            r2 = await client.post("/v1/chat/completions", json=chat(image_server + "/photo.jpg"))
            assert r2.status_code == 200, r2.text
        # Admission comes before any image is decoded (issue 22 #7): the estimate budgets the largest image
        # the deployment can get, 336x336 -> 24*24 tokens (this 1600x1200 photo becomes 336x252, 24*18).
        image_req = admission.requests[1]
        assert image_req.image_tokens == 24 * 24 and admission.requests[0].image_tokens == 0
        assert image_req.cost_mu > admission.requests[0].cost_mu
        assert admission.settlements[1][1] is not None and admission.settlements[1][1].image_tokens == 576
    finally:
        await server.stop(1.0)


async def test_forwarded_body_has_resized_image(recording_engine: tuple[str, list[dict[str, Any]]]) -> None:
    url, bodies = recording_engine
    server = await _gateway(url, OpenAdmission())
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            r = await client.post("/v1/chat/completions", json=chat(data_url(PHOTO)))
            assert r.status_code == 200, r.text
            await client.post(
                "/v1/chat/completions",
                json={"model": MODEL, "messages": [{"role": "user", "content": "plain text"}]},
            )
        sent = bodies[0]["messages"][0]["content"][1]["image_url"]["url"]
        img = Image.open(io.BytesIO(base64.b64decode(sent.split(",", 1)[1])))
        assert img.format == "JPEG" and img.size == (336, 252)
        assert bodies[0]["messages"][0]["content"][0]["text"] == "What is in this picture?"
        assert bodies[1]["messages"][0]["content"] == "plain text"
    finally:
        await server.stop(1.0)


async def test_bad_images_get_clear_400s_and_pool_keeps_serving(start_engine: Any, image_server: str) -> None:
    engine = start_engine(MODEL, time_scale="0")
    server = await _gateway(engine.url, OpenAdmission(), max_pixels=20_000_000)
    tiff = encode(Image.new("RGB", (20, 20)), "TIFF")
    cases = [
        (data_url(b"this is not an image"), "cannot identify the image format"),
        (data_url(PHOTO[: len(PHOTO) // 2]), "corrupt or truncated"),
        (data_url(bomb_png(60_000, 60_000), "image/png"), "refused before decoding"),
        (data_url(tiff, "image/tiff"), "unsupported image format TIFF"),
        (image_server + "/slow.jpg", "longer than 0.5 s"),
        ("http://169.254.169.254/latest/meta-data/", "metadata"),
        ("http://10.0.0.1/cat.png", "not on the allow list"),
    ]
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            for url, message in cases:
                r = await client.post("/v1/chat/completions", json=chat(url))
                assert r.status_code == 400, (message, r.text)
                err = r.json()["error"]
                assert message in err["message"], err
                assert err["type"] == "invalid_request_error" and err["param"] == "messages[0].content[1]"
            ok = await client.post("/v1/chat/completions", json=chat(data_url(PHOTO)))
            assert ok.status_code == 200, ok.text
            health = await client.get("/healthz")
            assert health.status_code == 200
            metrics = (await client.get("/metrics")).text
        assert f"fleetgate_images_rejected_total {float(len(cases))}" in metrics
        assert "fleetgate_images_processed_total 1.0" in metrics
        assert "fleetgate_image_workers 1.0" in metrics
    finally:
        await server.stop(1.0)
