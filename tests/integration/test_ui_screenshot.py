"""The /ui status page end to end: a real ``fleetgate up --config examples/tenants.yaml`` fleet under light
load, rendered by headless Chromium (Debian's ``chromium``; ``scripts/test.sh`` installs it where missing).

Checks: the DOM after the page's own polling contains the running fleet's replica names, health and tenant
names with real request counts, and the GPU pool's picture (capacity, sold and used over time); the
screenshot is a real, non-blank PNG. Set ``FLEETGATE_UI_SCREENSHOT`` to a path to keep the screenshot.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from fleetgate.providers.local import free_port

ROOT = Path(__file__).resolve().parents[2]
ADMIN = "sk-admin-demo"


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def _load(url: str, stop: threading.Event, counts: dict[str, int]) -> None:
    """Light load: gold and free take turns, one request at a time (stream and non-stream)."""
    keys = {"gold": "sk-gold-demo", "free": "sk-free-demo"}
    with httpx.Client(timeout=30) as client:
        i = 0
        while not stop.is_set():
            tenant = ("gold", "free")[i % 2]
            body = {
                "model": "fleetgate-sim",
                "messages": [{"role": "user", "content": f"Summarise item {i % 5} of the report."}],
                "max_tokens": 24,
                "stream": i % 3 != 0,
            }
            resp = client.post(
                f"{url}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {keys[tenant]}"}
            )
            resp.read()
            counts[f"{tenant}:{resp.status_code}"] = counts.get(f"{tenant}:{resp.status_code}", 0) + 1
            i += 1
            time.sleep(0.05)


def _run_chromium(binary: str, args: list[str], url: str, tmp: Path) -> subprocess.CompletedProcess[str]:
    cmd = [
        binary,
        "--headless",
        "--no-sandbox",  # tests may run as root in a container
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--hide-scrollbars",
        f"--user-data-dir={tmp / 'chromium-profile'}",
        "--window-size=1400,1000",
        "--virtual-time-budget=5000",  # lets the page fetch /admin/status and render before the dump
        *args,
        url,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=90, check=False)


def _assert_pool_picture(html: str, latency: list[str]) -> None:
    """The pool's chart is drawn from its history: capacity, sold and used lines over at least two
    decisions, sold at gold's 100 MU/min, used between zero and capacity; the member table, and the latency
    headroom of every tenant class admission reports (else the placeholder)."""
    chart = re.search(r'<svg [^>]*class="chart pool" data-pool="gpus" data-points="(\d+)"', html)
    assert chart and int(chart.group(1)) >= 2, html[:3000]
    lines = dict(
        (m.group(2), (m.group(1), float(m.group(3))))
        for m in re.finditer(r'<path d="([^"]+)" class="(\w+)" data-series="\w+" data-last="([^"]+)"', html)
    )
    assert {"capacity", "sold", "used"} <= set(lines), lines.keys()
    assert lines["sold"][1] == 100.0 and lines["capacity"][1] >= 200.0
    baseline = 160 - 28  # the chart's y for 0 MU/min (H - P in app.js)
    ys = {k: [float(v) for v in re.findall(r"[ML][\d.]+ ([\d.]+)", d)] for k, (d, _) in lines.items()}
    points = int(chart.group(1))
    assert all(len(ys[k]) == points for k in ("capacity", "sold", "used")), ys
    # drawn from the values: capacity (>= 200) above sold (100) above the zero line; used between
    assert ys["capacity"][-1] < ys["sold"][-1] < baseline, ys
    assert all(ys["capacity"][-1] <= y <= baseline for y in ys["used"]), ys
    assert lines["used"][1] > 0  # MU was settled in the last minute
    head = re.search(
        r'<h3 class="pool-head" data-used="([^"]+)">gpus · \d / 3 GPUs in use \((\d) lent\)', html
    )
    assert head and float(head.group(1)) > 0, html[:3000]
    assert "sold 100.0" in html and "<td><strong>fleetgate-sim</strong></td><td>" in html
    assert "Latency headroom" in html
    if latency:  # admission's latency headroom per tenant class, as /admin/capacity had it
        cell = re.search(r'<span class="latency">([^<]+)</span>', html)
        assert cell and all(f"{c}: TTFT p95" in cell.group(1) for c in latency), html[:3000]
    else:
        assert '<span class="muted">not reported</span>' in html


def test_ui_renders_live_fleet(tools: Any, tmp_path: Path) -> None:
    chromium = _chromium()
    if chromium is None:
        pytest.skip("headless Chromium not installed: `apt-get install chromium` (make test does this)")
    config = yaml.safe_load((ROOT / "examples" / "tenants.yaml").read_text())
    # the example fleet, engines 5x faster, with an autoscaler for the chart, in a pool of 3 GPUs (its
    # third GPU idle: lent as a warm replica) for the pool's picture
    (deployment,) = config["deployments"]
    deployment["provider"]["engine_args"] = ["--time-scale", "0.2"]
    deployment["autoscaler"] = {"policy": "fleetgate", "min_replicas": 2, "max_replicas": 3}
    deployment["pool"] = "gpus"
    config["pools"] = [{"name": "gpus", "gpus": 3}]
    path = tmp_path / "tenants.yaml"
    path.write_text(yaml.safe_dump(config))
    port = free_port()
    up = tools.ServerProcess(
        [tools.PY, "-m", "fleetgate.cli", "up", "--port", str(port), "--config", str(path)],
        name="fleetgate-up",
    )
    stop = threading.Event()
    counts: dict[str, int] = {}
    loader: threading.Thread | None = None
    try:
        url = up.wait_ready(60)
        replicas = re.findall(r"^replica (\S+) http", up.output, re.M)
        assert len(replicas) == 2, up.output
        loader = threading.Thread(target=_load, args=(url, stop, counts), daemon=True)
        loader.start()
        time.sleep(3.0)
        deadline = time.monotonic() + 30.0  # a loaded machine: wait for both tenants' first answers
        while min(counts.get("gold:200", 0), counts.get("free:200", 0)) < 2 and time.monotonic() < deadline:
            time.sleep(0.5)

        # the data the page shows is admin-only
        assert httpx.get(f"{url}/admin/status").status_code == 401
        bad = httpx.get(f"{url}/admin/status", headers={"Authorization": "Bearer sk-gold-demo"})
        assert bad.status_code == 403
        status = httpx.get(f"{url}/admin/status", headers={"Authorization": f"Bearer {ADMIN}"}).json()
        assert set(replicas) <= {r["name"] for r in status["replicas"]}
        assert (
            status["autoscalers"][0]["deployment"] == "fleetgate-sim" and status["autoscalers"][0]["history"]
        )
        by_name = {t["name"]: t for t in status["tenants"]}
        assert by_name["gold"]["requests"] > 0 and by_name["free"]["requests"] > 0
        assert by_name["gold"]["reserved_mu_per_min"] == 100.0
        assert by_name["gold"]["used_mu_per_min"] > 0
        assert by_name["gold"]["ttft_p95_s"] is not None

        capacity = httpx.get(f"{url}/admin/capacity", headers={"Authorization": f"Bearer {ADMIN}"}).json()
        (pool,) = capacity["pools"]
        (row,) = capacity["deployments"]
        latency = sorted((row.get("latency") or {}).get("classes") or {})  # tenant classes reported
        assert pool["pool"] == "gpus" and pool["decided"] and pool["used_scope"] == "gateway"
        assert (
            pool["sold_mu_per_min"] == 100.0
            and pool["used_mu_per_min"] > 0
            and pool["capacity_mu_per_min"] > 0
        )
        assert len(pool["history"]) >= 2 and pool["history"][-1]["t"] <= 0

        page = f"{url}/ui?key={ADMIN}"
        dom = _run_chromium(chromium, ["--dump-dom"], page, tmp_path)
        assert dom.returncode == 0, dom.stderr[-2000:]
        html = dom.stdout
        replica_cells = re.findall(r"<td><strong>([^<]+)</strong></td><td>fleetgate-sim</td>", html)
        assert set(replicas) <= set(replica_cells), html[:3000]
        assert html.count('class="badge healthy"') >= 2
        for tenant in ("gold", "free"):
            assert f"<td><strong>{tenant}</strong></td>" in html
        assert re.search(r"\d replicas \(\d healthy\) · 2 tenants · \d+ requests seen", html)
        assert 'class="chart"' in html and "fleetgate-sim · desired" in html  # autoscaler history drawn
        assert "sk-admin-demo" not in html  # the key left the address bar and never enters the DOM
        _assert_pool_picture(html, latency)

        shot = tmp_path / "ui.png"
        result = _run_chromium(chromium, [f"--screenshot={shot}"], page, tmp_path)
        assert result.returncode == 0 and shot.exists(), result.stderr[-2000:]
        from PIL import Image

        with Image.open(shot) as img:
            assert img.size == (1400, 1000)
            colours = img.convert("RGB").getcolors(maxcolors=1 << 20) or []
        assert len(colours) > 200  # text, badges, bars: far from a blank or error page
        assert shot.stat().st_size > 30_000
        keep = os.environ.get("FLEETGATE_UI_SCREENSHOT")
        if keep:
            shutil.copyfile(shot, keep)
    finally:
        stop.set()
        if loader is not None:  # let its request in flight finish: killing the gateway under it raised in it
            loader.join(timeout=35)
        up.kill()
    assert sum(v for k, v in counts.items() if k.endswith(":200")) > 5, counts
