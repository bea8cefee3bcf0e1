"""Image preprocessing benchmark: decoder backends, and image requests/s through the gateway, side by side.

Part 1 (``backends``): time to turn one photo into the deployment's input (decode, resize to 336 px,
JPEG re-encode) with each library that is importable: Pillow full decode + Lanczos (the naive path),
Pillow draft/reduce (fleetgate's path), OpenCV ``IMREAD_REDUCED_COLOR_*`` + ``INTER_AREA``, pyvips
``thumbnail_buffer``. One process, one thread, best of ``--repeat`` runs (ms per image).

Part 2 (``gateway``): for ``multimodal.mode`` = naive (PIL on the event loop, thread env from the host CPU
count) and pool (fleetgate: worker processes sized from the cgroup/affinity budget), one gateway process in
front of simulated engines at time-scale 0 (never the bottleneck), a closed-loop flood of image requests
(``--concurrency`` clients) for ``--seconds``, while a prober sends ``GET /healthz`` and a small text chat
request every 50 ms. Reports completed image requests/s and the probes' latency at idle and during the flood
(added latency = flood percentile - idle median), and, per second of flood, the run-queue wait and CPU of the
gateway and of its workers (``/proc/PID/schedstat``, ``/proc/PID/stat``) and the host's CPU pressure
(``/proc/pressure/cpu``), to tell the loop's own work from a host short of CPU. ``--modes pool``: one mode.

    .venv/bin/python bench/multimodal_throughput.py                # both parts
    .venv/bin/python bench/multimodal_throughput.py --extra-path /tmp/mmlibs   # opencv/pyvips from there
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import io
import json
import multiprocessing
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import yaml
from PIL import Image

from fleetgate.engines.calibration_probe import process_cpu_seconds

MODEL = "bench-vlm"
READY = re.compile(r"ready on (http://127\.0\.0\.1:\d+)")


# -- test images ------------------------------------------------------------------------------------------


def photo(width: int, height: int, seed: int = 1) -> Image.Image:
    """A photo-like picture: smooth colour gradients plus sensor-like noise (JPEG cannot shrink it to
    nothing, unlike a flat synthetic image)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    r = 128 + 100 * np.sin(x / 97.0) * np.cos(y / 71.0)
    g = 128 + 100 * np.sin((x + y) / 143.0)
    b = 128 + 100 * np.cos(x / 53.0 - y / 89.0)
    arr = np.stack([r, g, b], axis=-1) + rng.normal(0, 4, (height, width, 3))
    return Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8), "RGB")


def encode(img: Image.Image, fmt: str, **kw: Any) -> bytes:
    buf = io.BytesIO()
    img.save(buf, fmt, **kw)
    return buf.getvalue()


# -- part 1: backends -------------------------------------------------------------------------------------

MAX_EDGE = 336


def _target(w: int, h: int) -> tuple[int, int]:
    s = MAX_EDGE / max(w, h)
    return max(1, round(w * s)), max(1, round(h * s))


def pillow_naive(raw: bytes) -> bytes:
    img = Image.open(io.BytesIO(raw)).convert("RGB")
    out = img.resize(_target(*img.size), Image.Resampling.LANCZOS)
    return encode(out, "JPEG", quality=90)


def pillow_fast(raw: bytes) -> bytes:
    from fleetgate.multimodal.image import ImageSpec, process_image

    return process_image(raw, ImageSpec(max_edge=MAX_EDGE, backend="pillow")).data_url.encode()


def fleetgate_auto(raw: bytes) -> bytes:
    from fleetgate.multimodal.image import ImageSpec, process_image

    return process_image(raw, ImageSpec(max_edge=MAX_EDGE, backend="auto")).data_url.encode()


def backends() -> dict[str, Callable[[bytes], bytes]]:
    found: dict[str, Callable[[bytes], bytes]] = {
        "pillow full decode + Lanczos (naive)": pillow_naive,
        "pillow draft + bicubic (fleetgate, backend=pillow)": pillow_fast,
        "fleetgate process_image, backend=auto (checks + encode + base64 included)": fleetgate_auto,
    }
    try:
        import cv2

        cv2.setNumThreads(1)

        def opencv(raw: bytes) -> bytes:
            buf = np.frombuffer(raw, np.uint8)
            head = cv2.imdecode(buf, cv2.IMREAD_UNCHANGED) if raw[:4] == b"\x89PNG" else None
            if head is None:
                # JPEG: libjpeg scales while decoding (like Pillow's draft); factor from the header size.
                w, h = Image.open(io.BytesIO(raw)).size
                factor = max(1, min(8, max(w, h) // MAX_EDGE))
                flag = {
                    1: cv2.IMREAD_COLOR,
                    2: cv2.IMREAD_REDUCED_COLOR_2,
                    4: cv2.IMREAD_REDUCED_COLOR_4,
                }.get(factor if factor in (1, 2, 4) else (4 if factor < 8 else 8), cv2.IMREAD_REDUCED_COLOR_8)
                head = cv2.imdecode(buf, flag)
            h2, w2 = head.shape[:2]
            out = cv2.resize(head, _target(w2, h2), interpolation=cv2.INTER_AREA)
            _ok, enc = cv2.imencode(".jpg", out, [cv2.IMWRITE_JPEG_QUALITY, 90])
            return bytes(enc)

        found[f"opencv-headless {cv2.__version__} reduced decode + INTER_AREA"] = opencv
    except Exception as exc:  # not installed here
        print(f"(opencv unavailable: {exc.__class__.__name__})", file=sys.stderr)
    try:
        import pyvips

        pyvips.concurrency_set(1)

        def vips(raw: bytes) -> bytes:
            img = pyvips.Image.thumbnail_buffer(raw, MAX_EDGE)
            return bytes(img.jpegsave_buffer(Q=90))

        found[f"pyvips {pyvips.version(0)}.{pyvips.version(1)} thumbnail_buffer"] = vips
    except Exception as exc:
        print(f"(pyvips unavailable: {exc.__class__.__name__})", file=sys.stderr)
    return found


def bench_backends(images: dict[str, bytes], repeat: int) -> list[dict[str, Any]]:
    rows = []
    for name, fn in backends().items():
        row: dict[str, Any] = {"backend": name}
        for label, raw in images.items():
            fn(raw)  # warm up
            times = []
            for _ in range(repeat):
                t = time.perf_counter()
                fn(raw)
                times.append(time.perf_counter() - t)
            row[label] = min(times) * 1000  # best of N: the machine is shared, the minimum is the cost
        rows.append(row)
    return rows


# -- part 2: through the gateway --------------------------------------------------------------------------


class Proc:
    def __init__(self, args: list[str], env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            args,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        )
        self.url: str | None = None
        self.lines: list[str] = []
        self._ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            m = READY.search(line)
            if m and self.url is None:
                self.url = m.group(1)
                self._ready.set()
        self._ready.set()

    def wait(self, timeout: float = 60) -> str:
        if not self._ready.wait(timeout) or self.url is None:
            self.stop()
            raise RuntimeError("process did not start:\n" + "".join(self.lines[-30:]))
        return self.url

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, 15)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, 9)
            self.proc.wait(5)


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    return float(np.percentile(np.array(values), q))


def probe_process(url: str, text_body: bytes, seconds: float, out: Any) -> None:
    """In its own process (so the flood's client loop cannot delay it): every 50 ms one ``GET /healthz``
    and one small text chat request on keep-alive connections; sends back both latency lists."""
    import http.client

    host, port = url.removeprefix("http://").split(":")
    health_conn = http.client.HTTPConnection(host, int(port), timeout=30)
    text_conn = http.client.HTTPConnection(host, int(port), timeout=30)
    health: list[float] = []
    text: list[float] = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        t = time.perf_counter()
        health_conn.request("GET", "/healthz")
        health_conn.getresponse().read()
        health.append(time.perf_counter() - t)
        t = time.perf_counter()
        text_conn.request(
            "POST", "/v1/chat/completions", body=text_body, headers={"Content-Type": "application/json"}
        )
        resp = text_conn.getresponse()
        resp.read()
        if resp.status == 200:
            text.append(time.perf_counter() - t)
        time.sleep(0.05)
    out.send((health, text))


def probes(url: str, text_body: bytes, seconds: float) -> tuple[Any, Any]:
    """Start ``probe_process``; returns (process, receiving end)."""
    ctx = multiprocessing.get_context("spawn")
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=probe_process, args=(url, text_body, seconds, send), daemon=True)
    proc.start()
    return proc, recv


def sched_wait_s(pid: int) -> float:
    """Seconds the process's threads spent runnable but not running (``/proc/PID/task/*/schedstat``)."""
    total = 0
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError, IndexError, ValueError):
                total += int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[1])
    return total / 1e9


def children(pid: int) -> list[int]:
    """Direct child processes (the image workers of a gateway), whichever of its threads started them."""
    out: list[int] = []
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError):
                out += [int(x) for x in Path(f"/proc/{pid}/task/{tid}/children").read_text().split()]
    return out


def psi_cpu_some_s() -> float:
    """Host CPU pressure: seconds in which some runnable task waited for a CPU (/proc/pressure/cpu)."""
    try:
        return int(Path("/proc/pressure/cpu").read_text().splitlines()[0].rsplit("total=", 1)[1]) / 1e6
    except (OSError, IndexError, ValueError):
        return 0.0


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (0 when it is gone)."""
    return process_cpu_seconds(pid, missing=0.0)


def contention(pid: int) -> dict[str, float]:
    """Counters to diff over the flood: the gateway's and its workers' run-queue wait and CPU, host PSI."""
    workers = children(pid)
    return {
        "gateway_runqueue_wait_s": sched_wait_s(pid),
        "workers_runqueue_wait_s": sum(sched_wait_s(w) for w in workers),
        "gateway_cpu_s": cpu_s(pid),
        "workers_cpu_s": sum(cpu_s(w) for w in workers),
        "host_cpu_pressure_s": psi_cpu_some_s(),
        "t": time.perf_counter(),
    }


async def flood(
    url: str, image_body: bytes, text_body: bytes, seconds: float, concurrency: int, gateway_pid: int = 0
) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    # idle baseline
    proc, recv = probes(url, text_body, 3.0)
    idle_h, idle_t = await loop.run_in_executor(None, recv.recv)
    proc.join()

    connector = aiohttp.TCPConnector(limit=concurrency + 8)
    timeout = aiohttp.ClientTimeout(total=120)
    headers = {"Content-Type": "application/json"}
    done = 0
    errors: dict[int, int] = {}
    image_lat: list[float] = []
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        deadline = time.perf_counter() + seconds

        async def client() -> None:
            nonlocal done
            while time.perf_counter() < deadline:
                t = time.perf_counter()
                async with session.post(url + "/v1/chat/completions", data=image_body, headers=headers) as r:
                    await r.read()
                    if r.status == 200:
                        done += 1
                        image_lat.append(time.perf_counter() - t)
                    else:
                        errors[r.status] = errors.get(r.status, 0) + 1

        proc, recv = probes(url, text_body, seconds)
        start = time.perf_counter()
        c0 = contention(gateway_pid)
        await asyncio.gather(*(client() for _ in range(concurrency)))
        c1 = contention(gateway_pid)
        elapsed = time.perf_counter() - start
    flood_h, flood_t = await loop.run_in_executor(None, recv.recv)
    proc.join()
    idle_h_med = statistics.median(idle_h)
    idle_t_med = statistics.median(idle_t)
    return {
        "image_requests": done,
        "errors": errors,
        "elapsed_s": elapsed,
        "image_rps": done / elapsed,
        "image_latency_p50_ms": pct(image_lat, 50) * 1000,
        "image_latency_p99_ms": pct(image_lat, 99) * 1000,
        "healthz_idle_p50_ms": idle_h_med * 1000,
        "healthz_flood_p50_ms": pct(flood_h, 50) * 1000,
        "healthz_flood_p99_ms": pct(flood_h, 99) * 1000,
        "healthz_added_p99_ms": (pct(flood_h, 99) - idle_h_med) * 1000,
        "text_idle_p50_ms": idle_t_med * 1000,
        "text_flood_p50_ms": pct(flood_t, 50) * 1000,
        "text_flood_p99_ms": pct(flood_t, 99) * 1000,
        "text_added_p99_ms": (pct(flood_t, 99) - idle_t_med) * 1000,
        "probes_during_flood": len(flood_h),
        "healthz_flood_max_ms": max(flood_h, default=float("nan")) * 1000,
        "text_flood_max_ms": max(flood_t, default=float("nan")) * 1000,
        # per second of flood: run-queue waits and CPU (cores) of the gateway process and its workers,
        # and the share of time some task on the host waited for a CPU
        "per_s": {
            k.removesuffix("_s"): round((c1[k] - c0[k]) / max(c1["t"] - c0["t"], 1e-6), 3)
            for k in c0
            if k != "t"
        },
    }


def run_gateway_mode(
    mode: str, engines: list[str], image_body: bytes, text_body: bytes, args: argparse.Namespace, tmp: Path
) -> dict[str, Any]:
    cfg = {
        "gateway": {"host": "127.0.0.1", "port": 0, "max_body_bytes": 32 * 1024 * 1024},
        "deployments": [
            {
                "model": MODEL,
                "routing": {"policy": "least_requests"},
                "replicas": [{"name": f"e{i}", "url": u} for i, u in enumerate(engines)],
            }
        ],
        "multimodal": {"mode": mode, "prestart": True, "worker_nice": args.worker_nice},
    }
    path = tmp / f"gateway-{mode}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    env: dict[str, str] = {}
    if mode == "naive":  # what a container-unaware process does: size native pools from the host
        host = str(os.cpu_count() or 1)
        env = dict.fromkeys(("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"), host)
    gw = Proc([sys.executable, "-m", "fleetgate.cli", "serve", "--config", str(path)], env)
    try:
        url = gw.wait()
        time.sleep(1.0)  # workers import their libraries
        result = asyncio.run(flood(url, image_body, text_body, args.seconds, args.concurrency, gw.proc.pid))
    finally:
        gw.stop()
    result["mode"] = mode
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--part", choices=["all", "backends", "gateway"], default="all")
    parser.add_argument("--seconds", type=float, default=15.0, help="flood duration per mode")
    parser.add_argument("--concurrency", type=int, default=8, help="concurrent image clients")
    parser.add_argument("--engines", type=int, default=1, help="simulated engine replicas")
    parser.add_argument("--repeat", type=int, default=15, help="runs per backend timing")
    parser.add_argument("--width", type=int, default=1920)
    parser.add_argument("--height", type=int, default=1440)
    parser.add_argument("--worker-nice", type=int, default=5, help="multimodal.worker_nice (pool mode)")
    parser.add_argument("--extra-path", default=None, help="extra sys.path entry (e.g. opencv/pyvips)")
    parser.add_argument("--json", default=None, help="write the results here")
    parser.add_argument("--modes", default="naive,pool", help="gateway modes to run, in order")
    args = parser.parse_args()
    if args.extra_path:
        sys.path.insert(0, args.extra_path)
    from fleetgate.multimodal.cpu import pool_sizing, read_cpu_budget

    budget = read_cpu_budget()
    out: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": f"{platform.machine()} {platform.processor() or ''} host_cpus={budget.host_cpus} "
        f"budget={budget.cpus:g} ({budget.source})",
        "pool": pool_sizing(budget).__repr__(),
        "python": platform.python_version(),
        "pillow": Image.__version__,
    }
    print(json.dumps(out), flush=True)
    main_photo = encode(photo(args.width, args.height), "JPEG", quality=90)
    if args.part in ("all", "backends"):
        images = {
            f"JPEG {args.width}x{args.height} ({len(main_photo) // 1024} KiB)": main_photo,
            "JPEG 4032x3024": encode(photo(4032, 3024, 2), "JPEG", quality=90),
            "PNG 1024x1024": encode(photo(1024, 1024, 3), "PNG"),
        }
        out["backends_ms_per_image"] = bench_backends(images, args.repeat)
        for row in out["backends_ms_per_image"]:
            print(json.dumps(row), flush=True)
    if args.part in ("all", "gateway"):
        url = "data:image/jpeg;base64," + base64.b64encode(main_photo).decode()
        image_body = json.dumps(
            {
                "model": MODEL,
                "max_tokens": 8,
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "Describe this picture."},
                            {"type": "image_url", "image_url": {"url": url}},
                        ],
                    }
                ],
            }
        ).encode()
        text_body = json.dumps(
            {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "Hello there!"}]}
        ).encode()
        engine_cmd = [sys.executable, "-m", "fleetgate.cli", "engine", "sim", "--port", "0"]
        engine_cmd += ["--model", MODEL, "--time-scale", "0"]
        engines = [Proc(engine_cmd) for _ in range(args.engines)]
        try:
            urls = [e.wait() for e in engines]
            with tempfile.TemporaryDirectory() as tmp:
                results = [
                    run_gateway_mode(mode, urls, image_body, text_body, args, Path(tmp))
                    for mode in args.modes.split(",")
                ]
        finally:
            for e in engines:
                e.stop()
        out["gateway"] = results
        for r in results:
            print(json.dumps(r), flush=True)
        by_mode = {r["mode"]: r for r in results}
        if "naive" in by_mode and "pool" in by_mode:
            naive, pool = by_mode["naive"], by_mode["pool"]
            out["speedup"] = pool["image_rps"] / naive["image_rps"] if naive["image_rps"] else float("inf")
            print(json.dumps({"speedup_pool_vs_naive": out["speedup"]}), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
