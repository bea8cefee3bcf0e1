"""Deterministic per-request profile of fleetgate's streamed path: Python opcodes or cProfile call counts.

Same setup as ``gateway_callgrind.sh`` (nginx with the canned SSE body, round_robin, access log and health
checks off), but the load is a fixed number of sequential keep-alive requests from a client process, and
``fleetgate serve`` runs under a switch: SIGUSR1 starts counting after the warm-up, SIGUSR2 stops and writes
the counts. ``opcodes`` counts executed Python opcodes per function (``sys.settrace`` with
``f_trace_opcodes``: the same requests give the same count, whatever the machine's load; ``lines``: per
source line); ``calls`` counts
calls per function (cProfile). Several trees are run one after the other (``PYTHONPATH`` per tree) and the
per-request figures are printed side by side, per package and per function, the largest differences first.

Usage: python bench/gateway_profile.py [--mode opcodes|calls] [--requests N] [--connections C] [--top K]
       SRC [SRC ...]
With one connection every request runs alone on the replica (the engine-rate learner takes a prefill sample
from each); ``--connections 4`` is the callgrind bench's mix (few run alone), and no longer exactly
repeatable: the interleaving decides which requests ran alone.
"""

from __future__ import annotations

import argparse
import collections
import http.client
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
BODY = (
    b'{"model":"bench","messages":[{"role":"user","content":"Say hello"}],"max_tokens":2,"stream":true,'
    b'"stream_options":{"include_usage":true}}'
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(port: int, path: str, proc: subprocess.Popen[bytes] | None = None) -> None:
    for _ in range(600):
        if proc is not None and proc.poll() is not None:
            raise SystemExit(f"the server exited ({proc.returncode})")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", path)
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"not ready: {port}{path}")


def _send(port: int, n: int, connections: int = 1) -> None:
    """``n`` streamed requests over ``connections`` keep-alive connections (one thread each)."""
    if connections > 1:
        import concurrent.futures

        with concurrent.futures.ThreadPoolExecutor(connections) as pool:
            for f in [pool.submit(_send, port, n // connections) for _ in range(connections)]:
                f.result()
        return
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    headers = {"Content-Type": "application/json", "Authorization": "Bearer sk-bench"}
    for _ in range(n):
        conn.request("POST", "/v1/chat/completions", BODY, headers)
        resp = conn.getresponse()
        body = resp.read()
        if resp.status != 200 or b"[DONE]" not in body:
            raise SystemExit(f"bad answer {resp.status}: {body[:200]!r}")
    conn.close()


def _where(filename: str) -> str:
    """A code object's package: fleetgate, aiohttp, asyncio, ... (the first path part after site-packages or
    the standard library's directory)."""
    parts = pathlib.PurePath(filename).parts
    for anchor in ("fleetgate", "site-packages"):
        if anchor in parts:
            i = parts.index(anchor)
            return "fleetgate" if anchor == "fleetgate" else parts[i + 1].removesuffix(".py")
    if filename.startswith("<") or len(parts) < 2:
        return "builtins" if filename == "~" else filename
    top = parts[-2] if parts[-2] not in ("lib", "python3.11") else parts[-1].removesuffix(".py")
    return "stdlib:" + top


def _short(filename: str) -> str:
    parts = pathlib.PurePath(filename).parts
    if "fleetgate" in parts:
        return "/".join(parts[parts.index("fleetgate") + 1 :])
    return "/".join(parts[-2:])


def serve_traced(mode: str, out: str, argv: list[str]) -> None:
    """Run ``fleetgate serve`` in this process with the SIGUSR1/SIGUSR2 switch (the child side)."""
    import cProfile
    import runpy

    counts: collections.Counter[tuple[str, int, str]] = collections.Counter()
    profile = cProfile.Profile()

    by_line = mode == "lines"

    def local(frame, event, arg):  # type: ignore[no-untyped-def]
        if event == "opcode":
            code = frame.f_code
            line = frame.f_lineno if by_line else code.co_firstlineno
            counts[(code.co_filename, line, code.co_qualname)] += 1
        return local

    def start(frame, event, arg):  # type: ignore[no-untyped-def]
        frame.f_trace_opcodes = True
        return local

    def on(*_: object) -> None:
        if mode != "calls":
            sys.settrace(start)
        else:
            profile.enable()

    def off(*_: object) -> None:
        if mode != "calls":
            sys.settrace(None)
            rows = [[f, line, name, n] for (f, line, name), n in counts.items()]
        else:
            profile.disable()
            profile.create_stats()
            stats = profile.stats  # type: ignore[attr-defined]
            rows = [[f, line, name, v[1]] for (f, line, name), v in stats.items()]
        pathlib.Path(out).write_text(json.dumps(rows))

    signal.signal(signal.SIGUSR1, on)
    signal.signal(signal.SIGUSR2, off)
    sys.argv = ["fleetgate", *argv]
    runpy.run_module("fleetgate.cli", run_name="__main__")


def profile_tree(  # type: ignore[type-arg]
    src: str, mode: str, warm: int, n: int, connections: int, work: pathlib.Path, np: int
) -> list[list]:
    fp = _free_port()
    cfg = work / "fg.yaml"
    cfg.write_text(
        f"gateway: {{host: 127.0.0.1, port: {fp}, health_checks: false}}\n"
        "ops: {access_log: false}\n"
        "deployments:\n  - model: bench\n    routing: {policy: round_robin}\n"
        f'    replicas: [{{name: nginx, url: "http://127.0.0.1:{np}"}}]\n'
    )
    out = work / "counts.json"
    out.unlink(missing_ok=True)
    env = {**os.environ, "PYTHONPATH": src}
    cmd = [sys.executable, __file__, "--serve-traced", mode, str(out), "serve", "--config", str(cfg)]
    with open(work / "fg.log", "wb") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait(fp, "/readyz", proc)
        _send(fp, warm, connections)
        proc.send_signal(signal.SIGUSR1)
        time.sleep(0.3)
        _send(fp, n, connections)
        proc.send_signal(signal.SIGUSR2)
        for _ in range(300):
            if out.exists() and out.stat().st_size:
                break
            time.sleep(0.1)
        time.sleep(0.5)
        return json.loads(out.read_text())  # type: ignore[no-any-return]
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--serve-traced":
        serve_traced(sys.argv[2], sys.argv[3], sys.argv[4:])
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trees", nargs="+", help="source directories (PYTHONPATH per run)")
    ap.add_argument("--mode", choices=["opcodes", "lines", "calls"], default="opcodes")
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument(
        "--connections", type=int, default=1, help="concurrent connections (4: the callgrind bench's mix)"
    )
    ap.add_argument("--top", type=int, default=40, help="functions to show (largest differences first)")
    ap.add_argument("--json", help="write the per-request figures per function here")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="fg-profile.") as tmp:
        work = pathlib.Path(tmp)
        np = _free_port()
        conf = (ROOT / "bench/nginx/canned-sse.conf.template").read_text()
        (work / "nginx.conf").write_text(conf.replace("__DIR__", tmp).replace("__PORT__", str(np)))
        nginx = subprocess.Popen(["nginx", "-c", str(work / "nginx.conf"), "-p", tmp])
        try:
            _wait(np, "/health")
            per: list[dict[tuple[str, str], float]] = []
            for src in args.trees:
                rows = profile_tree(src, args.mode, args.warmup, args.requests, args.connections, work, np)
                funcs: dict[tuple[str, str], float] = collections.defaultdict(float)
                for f, line, name, n in rows:
                    where = f"{_short(f)}:{line}:{name}" if args.mode == "lines" else f"{_short(f)}:{name}"
                    funcs[(_where(f), where)] += n / args.requests
                per.append(funcs)
        finally:
            nginx.terminate()
            nginx.wait(10)
    _report(args, per)


def _report(args: argparse.Namespace, per: list[dict[tuple[str, str], float]]) -> None:
    names = [pathlib.PurePath(t).parent.name or t for t in args.trees]
    unit = "calls" if args.mode == "calls" else "opcodes"
    print(
        f"{unit} per streamed request ({args.requests} requests after {args.warmup} warm-up, "
        f"{args.connections} connection(s))"
    )
    print("| package | " + " | ".join(names) + " |")
    print("|---" * (len(names) + 1) + "|")
    pkgs: dict[str, list[float]] = collections.defaultdict(lambda: [0.0] * len(per))
    for i, funcs in enumerate(per):
        for (pkg, _), v in funcs.items():
            pkgs[pkg][i] += v
    for pkg, vs in sorted(pkgs.items(), key=lambda kv: -max(kv[1])):
        if max(vs) >= 1:
            print(f"| {pkg} | " + " | ".join(f"{v:,.1f}" for v in vs) + " |")
    print("| **total** | " + " | ".join(f"**{sum(f.values()):,.1f}**" for f in per) + " |")
    keys = set().union(*per)
    spread = sorted(keys, key=lambda k: -(max(f.get(k, 0) for f in per) - min(f.get(k, 0) for f in per)))
    print(f"\n{unit} per request by function, largest differences first")
    print("| function | " + " | ".join(names) + " |")
    print("|---" * (len(names) + 1) + "|")
    for k in spread[: args.top]:
        print(f"| {k[1]} | " + " | ".join(f"{f.get(k, 0):,.1f}" for f in per) + " |")
    if args.json:
        pathlib.Path(args.json).write_text(
            json.dumps([{f"{k[0]} {k[1]}": v for k, v in f.items()} for f in per], indent=0)
        )


if __name__ == "__main__":
    main()
