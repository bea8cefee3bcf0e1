"""``ImagePipeline.process_body``: image parts found, processed in real workers, tokens counted, 400s."""

from __future__ import annotations

import base64
import io
from collections.abc import AsyncIterator
from typing import Any

import pytest
from PIL import Image

from fleetgate.config import ImageTargetConfig, MultimodalConfig
from fleetgate.core.errors import InvalidRequestError
from fleetgate.multimodal.cpu import CpuBudget
from fleetgate.multimodal.pipeline import ImagePipeline, has_image_parts, split_data_url


def data_url(w: int, h: int, fmt: str = "JPEG") -> str:
    buf = io.BytesIO()
    Image.new("RGB", (w, h), (120, 30, 60)).save(buf, fmt)
    return f"data:image/{fmt.lower()};base64," + base64.b64encode(buf.getvalue()).decode()


def body(*parts: Any) -> dict[str, Any]:
    return {
        "model": "vlm",
        "max_tokens": 5,
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "what is this?"}, *parts]},
        ],
    }


BUDGET = CpuBudget(cpus=2.0, source="test", host_cpus=2)


@pytest.fixture
async def pipeline() -> AsyncIterator[ImagePipeline]:
    cfg = MultimodalConfig(
        workers=1,
        per_model={"qwen": ImageTargetConfig(max_edge=448, patch_size=14, merge_size=2, output_format="png")},
        fetch_urls=False,
    )
    p = ImagePipeline(cfg, budget=BUDGET)
    try:
        yield p
    finally:
        await p.close()


def test_has_image_parts() -> None:
    assert has_image_parts(body({"type": "image_url", "image_url": {"url": "x"}}))
    assert not has_image_parts(body())
    assert not has_image_parts({"messages": "nope"})


def test_split_data_url() -> None:
    assert split_data_url("data:image/png;base64,QUJD") == ("image/png", "QUJD")
    with pytest.raises(Exception, match="base64"):
        split_data_url("data:image/png,rawbytes")
    with pytest.raises(Exception, match="not an image"):
        split_data_url("data:text/html;base64,QUJD")


async def test_resizes_and_counts_tokens(pipeline: ImagePipeline) -> None:
    original = body({"type": "image_url", "image_url": {"url": data_url(1344, 1008), "detail": "high"}})
    new, tokens = await pipeline.process_body(original, "vlm")
    part = new["messages"][1]["content"][1]
    assert part["image_url"]["detail"] == "high"
    out = Image.open(io.BytesIO(base64.b64decode(part["image_url"]["url"].split(",", 1)[1])))
    assert out.size == (336, 252)
    assert tokens == 24 * 18  # ceil(336/14) * ceil(252/14): patch geometry of the default target
    assert original["messages"][1]["content"][1]["image_url"]["url"].startswith(
        "data:image/jpeg"
    )  # not mutated
    assert new["messages"][0] is original["messages"][0]  # untouched messages are shared, not copied


async def test_per_model_target(pipeline: ImagePipeline) -> None:
    new, tokens = await pipeline.process_body(
        body({"type": "image_url", "image_url": data_url(896, 448)}), "qwen"
    )
    url = new["messages"][1]["content"][1]["image_url"]
    assert url.startswith("data:image/png;base64,")
    assert tokens == 16 * 8  # 448x224 with 28-px cells (patch 14, merge 2)


async def test_several_images_add_up(pipeline: ImagePipeline) -> None:
    parts = [{"type": "image_url", "image_url": {"url": data_url(140, 140)}} for _ in range(3)]
    _, tokens = await pipeline.process_body(body(*parts), "vlm")
    assert tokens == 3 * 100


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("data:image/png;base64,bm90IGFuIGltYWdl", "cannot identify the image format"),
        ("data:image/png;base64,%%%", "not valid base64"),
        ("data:image/png,abc", "base64-encoded"),
        ("ftp://example.com/x.png", "data: URL or an http"),
        ("http://example.com/x.png", "not fetched by this gateway"),
    ],
)
async def test_bad_images_are_400s_naming_the_part(pipeline: ImagePipeline, url: str, message: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        await pipeline.process_body(body({"type": "image_url", "image_url": {"url": url}}), "vlm")
    assert info.value.status == 400
    assert info.value.param == "messages[1].content[1]"
    assert message in info.value.message and "Invalid image in 'messages[1].content[1]'" in info.value.message


async def test_missing_url_and_too_many_images(pipeline: ImagePipeline) -> None:
    with pytest.raises(InvalidRequestError, match="must be a non-empty string"):
        await pipeline.process_body(body({"type": "image_url", "image_url": {}}), "vlm")
    parts = [{"type": "image_url", "image_url": {"url": "data:,"}} for _ in range(17)]
    with pytest.raises(InvalidRequestError, match="17 images; at most 16"):
        await pipeline.process_body(body(*parts), "vlm")


async def test_one_bad_image_among_good_ones(pipeline: ImagePipeline) -> None:
    parts = [
        {"type": "image_url", "image_url": {"url": data_url(100, 100)}},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
    ]
    with pytest.raises(InvalidRequestError) as info:
        await pipeline.process_body(body(*parts), "vlm")
    assert info.value.param == "messages[1].content[2]"
    _, tokens = await pipeline.process_body(body(parts[0]), "vlm")  # the pool keeps serving
    assert tokens > 0


async def test_naive_mode_gives_same_shape() -> None:
    p = ImagePipeline(MultimodalConfig(mode="naive", fetch_urls=False), budget=BUDGET)
    assert p.pool is None
    _, tokens = await p.process_body(body({"type": "image_url", "image_url": {"url": data_url(1344, 1008)}}))
    assert tokens == 24 * 18
    await p.close()


async def test_overrunning_worker_gives_clear_400_and_is_replaced() -> None:
    p = ImagePipeline(MultimodalConfig(workers=1, task_timeout_s=0.001, fetch_urls=False), budget=BUDGET)
    try:
        await p.start()
        assert p.pool is not None
        first = p.pool.pids()
        with pytest.raises(InvalidRequestError) as info:
            await p.process_body(body({"type": "image_url", "image_url": {"url": data_url(4000, 3000)}}))
        assert info.value.status == 400 and info.value.code == "image_processing_failed"
        assert "took longer than 0.001 s; the worker was stopped and replaced" in info.value.message
        assert p.pool.pids() != first and len(p.pool.pids()) == 1
    finally:
        await p.close()
