"""Medium #7 of issue 22: images were fetched and decoded before the tenant's limits were checked.

A tenant already receiving 429s made the image workers decode 64 images of 40 MP, slowing another tenant's
small image from 0.04 s to 3.2 s. Now limits and the queue come first (admission budgets the largest image
the deployment can get), and one tenant's images take at most half the workers at once.
"""

from __future__ import annotations

import base64
import io
import time
from typing import Any

import httpx
from sec_env import KEYS, MODEL, tenants_config


def _image_url(edge: int = 1200) -> str:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (edge, edge), (120, 30, 200)).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _chat(url: str, tenant: str, image: str | None = None) -> httpx.Response:
    content: Any = "describe"
    if image is not None:
        content = [{"type": "text", "text": "describe"}, {"type": "image_url", "image_url": {"url": image}}]
    return httpx.post(
        url + "/v1/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 2},
        headers={"Authorization": f"Bearer {KEYS[tenant]}"},
        timeout=30,
    )


def _processed(url: str) -> float:
    text = httpx.get(url + "/metrics", headers={"Authorization": f"Bearer {KEYS['admin']}"}, timeout=10).text
    for line in text.splitlines():
        if line.startswith("fleetgate_images_processed"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_refused_tenant_never_makes_the_workers_decode(engine: Any, start_gateway: Any) -> None:
    gw = start_gateway(tenants_config(engine.url))
    image = _image_url()
    first = _chat(gw.url, "gold", image)
    assert first.status_code == 200  # images work (and start the workers)
    # gold's reservation: 3,000 MU/min = 50 MU/s with burst_s 0, so a request passes only once the meter has
    # drained what the previous ones were charged; the image request is charged ~40.5 MU (the largest image
    # the deployment can get), i.e. gold's meter is free again 0.81 s after this first admission
    gold_rate = 3000.0 / 60.0
    charged = 3000.0 - float(first.headers["x-ratelimit-remaining-mu"])
    gold_free_at = time.monotonic() + charged / gold_rate
    before = _processed(gw.url)
    assert before >= 1
    statuses = [_chat(gw.url, "free", image).status_code for _ in range(6)]  # over its 20 MU/min at once
    assert statuses.count(429) >= 5, statuses
    admitted = statuses.count(200)
    assert _processed(gw.url) - before == admitted, "images of refused requests were decoded"
    # gold is still served: the refused flood charged none of gold's meter. The flood takes ~0.4 s on a
    # quiet machine, so right away gold's second request would wait ~0.42 s in the queue against the 0.5 s
    # deadline (a fast client or a late gateway ate that margin in 1 CI run of 5): send it once its own
    # first request drained
    time.sleep(max(0.0, gold_free_at - time.monotonic()))
    last = _chat(gw.url, "gold", image)
    assert last.status_code == 200, last.text  # (had the flood charged gold ~40 MU a request: a 429)
