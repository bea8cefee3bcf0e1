"""A TEST Kubernetes API server: aiohttp on 127.0.0.1 (or a test namespace's address), test code only.

No real cluster can run on these machines, so this server implements, with the real API's semantics, the
part of Kubernetes fleetgate talks to, and runs the pods as REAL local engine processes
(``fleetgate engine sim --port 0``):

* one global ``resourceVersion`` counter; every write bumps it and stamps the object;
* list (``metadata.resourceVersion`` of the collection) and watch (``?watch=1&resourceVersion=RV
  &allowWatchBookmarks=true&timeoutSeconds=T``): newline-delimited JSON events ADDED / MODIFIED / DELETED,
  BOOKMARK (an object of the watched kind with only ``metadata.resourceVersion``) every
  ``bookmark_interval_s``; events after RV are replayed from history; a RV older than the compacted history
  (:meth:`FakeCluster.compact`) gets, as the watch cache does, HTTP 200 and one ERROR event carrying a
  ``Status`` with ``code: 410``, reason ``Expired`` (or, with ``expired_as_http``, an HTTP 410 with that
  Status, the form a watch served without the cache takes); no RV (or "0") starts with synthetic ADDED events;
* ``labelSelector`` equality terms (``a=b,c=d``);
* EndpointSlices (``discovery.k8s.io/v1``) labelled ``kubernetes.io/service-name``; each pod gets its own
  slice, because each local engine has its own port and the EndpointSlice controller groups endpoints by
  port set. Conditions as the controller sets them: ``serving`` = the pod's readiness probe passes,
  ``terminating`` = the pod has a deletionTimestamp, ``ready`` = serving and not terminating;
* the Deployment ``scale`` subresource (GET, PATCH with ``application/merge-patch+json``; other patch types
  415, a negative count 422) driving a ReplicaSet-like controller: missing pods are created (an engine
  process is started), extra pods deleted in the ReplicaSet's order: not-ready before ready, then lowest
  ``controller.kubernetes.io/pod-deletion-cost``, then newest;
* pods: list/watch, GET, PATCH (merge patch, e.g. the deletion-cost annotation), DELETE (the pod becomes
  terminating for its grace period, the process gets SIGTERM then SIGKILL, and the controller replaces it);
* ``coordination.k8s.io/v1`` Leases: create (409 AlreadyExists), get, replace with optimistic concurrency
  (409 Conflict when ``metadata.resourceVersion`` is not the stored one);
* fault injection: :meth:`FakeCluster.throttle` makes the next N requests ``429`` with ``Retry-After``;
  :meth:`ApiServer.stop_http` / :meth:`ApiServer.start_http` take the listener away and back on the same
  port while the cluster (controller, pods) keeps running, as when the control plane is unreachable.

It is a model, not Kubernetes: no auth, admission, field selectors, strategic merge or server-side apply.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import itertools
import os
import re
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from fleetgate.providers.local.process import die_with_parent

SERVICE_NAME_LABEL = "kubernetes.io/service-name"
MANAGED_BY = "endpointslice.kubernetes.io/managed-by"
DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
READY_LINE = re.compile(rb"ready on (https?://\S+)")

Obj = dict[str, Any]


def status_obj(code: int, reason: str, message: str) -> Obj:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


def status_response(
    code: int, reason: str, message: str, headers: dict[str, str] | None = None
) -> web.Response:
    return web.Response(
        status=code,
        body=orjson.dumps(status_obj(code, reason, message)),
        content_type="application/json",
        headers=headers,
    )


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def selector_matches(selector: str | None, labels: dict[str, str]) -> bool:
    for term in filter(None, (selector or "").split(",")):
        key, _, value = term.partition("=")
        if labels.get(key.strip()) != value.strip().lstrip("="):
            return False
    return True


@dataclass(eq=False)
class _Watch:
    resource: str
    namespace: str
    selector: str | None
    queue: asyncio.Queue[Obj | None] = field(default_factory=asyncio.Queue)


@dataclass
class Pod:
    """Controller-side state of one pod: its engine process and readiness."""

    name: str
    proc: asyncio.subprocess.Process | None = None
    port: int | None = None
    serving: bool = False
    terminating: bool = False
    drain_task: asyncio.Task[None] | None = None


class FakeCluster:
    """Object store, watch fan-out and the controllers (ReplicaSet, EndpointSlice, readiness probes)."""

    def __init__(
        self,
        *,
        namespace: str = "llm",
        deployment: str = "engine",
        service: str = "engine",
        port_name: str = "http",
        replicas: int = 1,
        engine_command: list[str] | None = None,
        bookmark_interval_s: float = 1.0,
        termination_grace_s: float = 0.5,
        probe_interval_s: float = 0.2,
        pod_ip: str = "127.0.0.1",
    ) -> None:
        self.namespace = namespace
        self.deployment = deployment
        self.service = service
        self.port_name = port_name
        self.engine_command = engine_command or [
            sys.executable, "-m", "fleetgate.cli", "engine", "sim", "--port", "0", "--model", "m",
        ]  # fmt: skip
        self.bookmark_interval_s = bookmark_interval_s
        self.termination_grace_s = termination_grace_s
        self.probe_interval_s = probe_interval_s
        self.pod_ip = pod_ip  # where the engines listen (they must be started with --host pod_ip)
        self.rv = 0
        self.compacted_rv = 0
        self.store: dict[tuple[str, str, str], Obj] = {}
        self.history: list[tuple[int, str, str, str, Obj]] = []  # rv, resource, ns, type, object
        self.watches: set[_Watch] = set()
        self.pods: dict[str, Pod] = {}
        self.deleted_pods: list[str] = []
        self.throttled = 0
        self.token: str | None = None  # when set, requests without ``Authorization: Bearer <token>`` get 401
        self.tokens: set[str] = set()  # more accepted tokens (one per gateway, to tell callers apart)
        self.calls: list[tuple[float, str, str, str]] = []  # monotonic time, caller's token, method, path
        self.partitioned: set[str] = set()  # callers whose new requests get no answer (a black-holed link)
        self.expired_as_http = False  # 410 for a stale watch: an ERROR event (watch cache) or an HTTP 410
        self.retry_after_s = 1
        self.requests: list[tuple[float, str, str, int]] = []  # monotonic time, method, path, status
        self._names = itertools.count(1)
        self._task: asyncio.Task[None] | None = None
        self._session: aiohttp.ClientSession | None = None
        self._put("deployments", {
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": deployment, "namespace": namespace},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": deployment}}},
        })  # fmt: skip

    # -- store ---------------------------------------------------------------------------------------------

    def _put(self, resource: str, obj: Obj, event: str | None = None) -> Obj:
        meta = obj["metadata"]
        key = (resource, meta.get("namespace", self.namespace), meta["name"])
        typ = event or ("MODIFIED" if key in self.store else "ADDED")
        self.rv += 1
        meta["resourceVersion"] = str(self.rv)
        if typ == "DELETED":
            self.store.pop(key, None)
        else:
            self.store[key] = obj
        snap = copy.deepcopy(obj)
        self.history.append((self.rv, resource, key[1], typ, snap))
        for w in list(self.watches):
            if w.resource == resource and w.namespace == key[1] and self._match(w.selector, snap):
                w.queue.put_nowait({"type": typ, "object": snap})
        return obj

    def _delete(self, resource: str, name: str) -> None:
        obj = self.store.get((resource, self.namespace, name))
        if obj is not None:
            self._put(resource, obj, "DELETED")

    @staticmethod
    def _match(selector: str | None, obj: Obj) -> bool:
        return selector_matches(selector, obj["metadata"].get("labels") or {})

    def get(self, resource: str, name: str) -> Obj | None:
        return self.store.get((resource, self.namespace, name))

    def items(self, resource: str, selector: str | None = None) -> list[Obj]:
        return [
            o
            for (res, _ns, _n), o in sorted(self.store.items())
            if res == resource and self._match(selector, o)
        ]

    def compact(self) -> None:
        """Drop the event history: every resourceVersion issued so far is now too old to watch from."""
        self.compacted_rv = self.rv
        self.history.clear()

    def scale(self, replicas: int) -> None:
        """Change the Deployment's desired replicas from inside the cluster (as ``kubectl scale`` would)."""
        dep = self.get("deployments", self.deployment)
        assert dep is not None
        dep["spec"]["replicas"] = replicas
        self._put("deployments", dep)

    def throttle(self, requests: int, retry_after_s: int = 1) -> None:
        """The next ``requests`` API calls get ``429 Too Many Requests`` with ``Retry-After``."""
        self.throttled = requests
        self.retry_after_s = retry_after_s

    # -- controllers ---------------------------------------------------------------------------------------

    @property
    def desired(self) -> int:
        dep = self.get("deployments", self.deployment)
        assert dep is not None
        return int(dep["spec"].get("replicas") or 0)

    def ready_urls(self) -> list[str]:
        return sorted(
            f"http://{self.pod_ip}:{p.port}" for p in self.pods.values() if p.serving and not p.terminating
        )

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1.0))
        self._task = asyncio.create_task(self._control_loop())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for pod in list(self.pods.values()):
            if pod.drain_task is not None:
                pod.drain_task.cancel()
            await self._kill(pod, grace_s=0.0)
        for w in list(self.watches):
            w.queue.put_nowait(None)
        if self._session is not None:
            await self._session.close()

    async def _control_loop(self) -> None:
        while True:
            self._reconcile()
            await asyncio.gather(*(self._probe(p) for p in list(self.pods.values())))
            await asyncio.sleep(self.probe_interval_s)

    def _reconcile(self) -> None:
        active = [p for p in self.pods.values() if not p.terminating]
        for _ in range(self.desired - len(active)):
            self._create_pod()
        extra = len(active) - self.desired
        if extra > 0:
            for pod in sorted(active, key=self._deletion_rank)[:extra]:
                self.delete_pod(pod.name)

    def _deletion_rank(self, pod: Pod) -> tuple[int, int, int]:
        obj = self.get("pods", pod.name) or {"metadata": {}}
        ann = obj["metadata"].get("annotations") or {}
        try:
            cost = int(ann.get(DELETION_COST, "0"))
        except ValueError:
            cost = 0
        created = int(pod.name.rsplit("-", 1)[1])  # names count up: a higher number is a newer pod
        return (1 if pod.serving else 0, cost, -created)

    def _create_pod(self) -> None:
        n = next(self._names)
        name = f"{self.deployment}-{n:05d}"
        self.pods[name] = Pod(name)
        self._put("pods", {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": self.namespace, "uid": f"uid-{n}",
                         "labels": {"app": self.deployment}},
            "spec": {"containers": [{"name": "engine", "ports": [{"name": self.port_name}]}]},
            "status": {"phase": "Pending", "conditions": [{"type": "Ready", "status": "False"}]},
        })  # fmt: skip
        self.pods[name].drain_task = asyncio.create_task(self._run_pod(self.pods[name]))

    async def _run_pod(self, pod: Pod) -> None:
        proc = await asyncio.create_subprocess_exec(
            *self.engine_command,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=die_with_parent,  # no engine outlives a killed test run
        )
        pod.proc = proc
        assert proc.stdout is not None
        while pod.port is None:
            line = await proc.stdout.readline()
            if not line:
                return
            match = READY_LINE.search(line)
            if match:
                pod.port = int(match.group(1).rsplit(b":", 1)[1].rstrip(b"/"))
        obj = self.get("pods", pod.name)
        if obj is not None and not pod.terminating:
            obj["status"] = merge_patch(obj["status"], {"phase": "Running", "podIP": self.pod_ip})
            self._put("pods", obj)
            self._sync_slice(pod)
        while await proc.stdout.read(65536):  # keep the pipe drained
            pass

    async def _probe(self, pod: Pod) -> None:
        if pod.port is None or self._session is None:
            return
        ok = False
        if pod.proc is not None and pod.proc.returncode is None:
            try:
                async with self._session.get(f"http://{self.pod_ip}:{pod.port}/health") as resp:
                    ok = resp.status == 200
            except (aiohttp.ClientError, TimeoutError):
                ok = False
        if ok != pod.serving and pod.name in self.pods:
            pod.serving = ok
            obj = self.get("pods", pod.name)
            if obj is not None:
                cond = [{"type": "Ready", "status": "True" if ok else "False"}]
                obj["status"] = merge_patch(obj["status"], {"conditions": cond})
                self._put("pods", obj)
            self._sync_slice(pod)

    def _slice_name(self, pod: Pod) -> str:
        return f"{self.service}-{pod.name.rsplit('-', 1)[1]}"

    def _sync_slice(self, pod: Pod) -> None:
        if pod.port is None:
            return
        obj = self.get("endpointslices", self._slice_name(pod)) or {
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": self._slice_name(pod), "namespace": self.namespace,
                         "labels": {SERVICE_NAME_LABEL: self.service,
                                    MANAGED_BY: "endpointslice-controller.k8s.io"}},
            "addressType": "IPv4",
        }  # fmt: skip
        obj["ports"] = [{"name": self.port_name, "port": pod.port, "protocol": "TCP"}]
        obj["endpoints"] = [{
            "addresses": [self.pod_ip],
            "conditions": {"ready": pod.serving and not pod.terminating, "serving": pod.serving,
                           "terminating": pod.terminating},
            "targetRef": {"kind": "Pod", "namespace": self.namespace, "name": pod.name},
        }]  # fmt: skip
        self._put("endpointslices", obj)

    def delete_pod(self, name: str, grace_s: float | None = None) -> bool:
        pod = self.pods.get(name)
        obj = self.get("pods", name)
        if pod is None or obj is None:
            return False
        if pod.terminating:
            return True
        pod.terminating = True
        self.deleted_pods.append(name)
        obj["metadata"]["deletionTimestamp"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self._put("pods", obj)
        self._sync_slice(pod)
        if pod.drain_task is not None:
            pod.drain_task.cancel()
        grace = self.termination_grace_s if grace_s is None else grace_s
        pod.drain_task = asyncio.create_task(self._terminate(pod, grace))
        return True

    async def _terminate(self, pod: Pod, grace_s: float) -> None:
        await asyncio.sleep(grace_s)
        await self._kill(pod, grace_s=2.0)
        self.pods.pop(pod.name, None)
        if pod.port is not None:
            self._delete("endpointslices", self._slice_name(pod))
        self._delete("pods", pod.name)

    @staticmethod
    async def _kill(pod: Pod, grace_s: float) -> None:
        proc = pod.proc
        if proc is None or proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM if grace_s > 0 else signal.SIGKILL)
        try:
            await asyncio.wait_for(proc.wait(), grace_s or 5.0)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()

    async def wait_for(self, cond: Callable[[], bool], limit_s: float = 30.0) -> None:
        deadline = time.monotonic() + limit_s
        while not cond():
            if time.monotonic() > deadline:
                raise TimeoutError("condition not reached")
            await asyncio.sleep(0.05)


class ApiServer:
    """The HTTP face of a :class:`FakeCluster` on 127.0.0.1; can go away and come back on the same port."""

    def __init__(self, cluster: FakeCluster, host: str = "127.0.0.1") -> None:
        self.cluster = cluster
        self.host = host
        self.port = 0
        self._runner: web.AppRunner | None = None
        app = web.Application(middlewares=[self._middleware])
        ns = "/namespaces/{ns}"
        app.router.add_get(
            f"/apis/discovery.k8s.io/v1{ns}/endpointslices", self._collection("endpointslices")
        )
        app.router.add_get(f"/api/v1{ns}/pods", self._collection("pods"))
        app.router.add_get(f"/api/v1{ns}/pods/{{name}}", self._get_pod)
        app.router.add_patch(f"/api/v1{ns}/pods/{{name}}", self._patch_pod)
        app.router.add_delete(f"/api/v1{ns}/pods/{{name}}", self._delete_pod)
        app.router.add_get(f"/apis/apps/v1{ns}/deployments/{{name}}", self._get_deployment)
        app.router.add_get(f"/apis/apps/v1{ns}/deployments/{{name}}/scale", self._get_scale)
        app.router.add_patch(f"/apis/apps/v1{ns}/deployments/{{name}}/scale", self._patch_scale)
        leases = f"/apis/coordination.k8s.io/v1{ns}/leases"
        app.router.add_get(leases, self._collection("leases"))
        app.router.add_post(leases, self._create_lease)
        app.router.add_get(leases + "/{name}", self._get_lease)
        app.router.add_put(leases + "/{name}", self._replace_lease)
        app.on_shutdown.append(self._end_watches)
        self.app = app

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start_http(self) -> None:
        self._runner = web.AppRunner(self.app, shutdown_timeout=0.5, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, reuse_address=True)
        await site.start()
        self.port = self._runner.addresses[0][1]

    async def stop_http(self) -> None:
        """The API server becomes unreachable (open watches are cut); the cluster keeps running."""
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _end_watches(self, _app: web.Application) -> None:
        for w in list(self.cluster.watches):
            w.queue.put_nowait(None)

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        c = self.cluster
        if c.throttled > 0:
            c.throttled -= 1
            c.requests.append((time.monotonic(), request.method, request.path_qs, 429))
            return status_response(
                429, "TooManyRequests", "Too many requests, please try again later.",
                headers={"Retry-After": str(c.retry_after_s)},
            )  # fmt: skip
        bearer = request.headers.get("Authorization", "").removeprefix("Bearer ")
        c.calls.append((time.monotonic(), bearer, request.method, request.path))
        if bearer in c.partitioned:
            await asyncio.sleep(3600)  # until the caller gives up (its timeout) or the server stops
        if c.token is not None and bearer != c.token and bearer not in c.tokens:
            c.requests.append((time.monotonic(), request.method, request.path_qs, 401))
            return status_response(401, "Unauthorized", "Unauthorized")
        c.requests.append((time.monotonic(), request.method, request.path_qs, 200))
        if request.match_info.get("ns", c.namespace) != c.namespace:
            return status_response(404, "NotFound", "namespace not found")
        resp: web.StreamResponse = await handler(request)
        return resp

    @staticmethod
    async def _patch_body(request: web.Request) -> Any:
        if request.content_type != "application/merge-patch+json":
            raise web.HTTPUnsupportedMediaType(
                body=orjson.dumps(status_obj(415, "UnsupportedMediaType", "only merge patch is modelled")),
                content_type="application/json",
            )
        return orjson.loads(await request.read())

    # -- list / watch --------------------------------------------------------------------------------------

    def _collection(self, resource: str) -> Callable[[web.Request], Any]:
        async def handler(request: web.Request) -> web.StreamResponse:
            selector = request.query.get("labelSelector")
            if request.query.get("watch") in ("1", "true"):
                return await self._watch(request, resource, selector)
            kind = {"endpointslices": "EndpointSliceList", "pods": "PodList", "leases": "LeaseList"}[resource]
            return web.json_response(
                {"kind": kind, "apiVersion": "v1", "metadata": {"resourceVersion": str(self.cluster.rv)},
                 "items": self.cluster.items(resource, selector)},
                dumps=lambda o: orjson.dumps(o).decode(),
            )  # fmt: skip

        return handler

    async def _watch(self, request: web.Request, resource: str, selector: str | None) -> web.StreamResponse:
        c = self.cluster
        rv_param = request.query.get("resourceVersion", "")
        bookmarks = request.query.get("allowWatchBookmarks") in ("1", "true")
        timeout_s = float(request.query.get("timeoutSeconds") or 1800)
        kind = {"endpointslices": "EndpointSlice", "pods": "Pod", "leases": "Lease"}[resource]
        api = {"endpointslices": "discovery.k8s.io/v1", "pods": "v1", "leases": "coordination.k8s.io/v1"}
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        resp.enable_chunked_encoding()
        stale = rv_param not in ("", "0") and int(rv_param) < c.compacted_rv
        if stale and c.expired_as_http:
            msg = f"too old resource version: {rv_param} ({c.compacted_rv})"
            return status_response(410, "Expired", msg)
        await resp.prepare(request)

        async def send(event: Obj) -> None:
            await resp.write(orjson.dumps(event) + b"\n")

        if stale:
            msg = f"too old resource version: {rv_param} ({c.compacted_rv})"
            await send({"type": "ERROR", "object": status_obj(410, "Expired", msg)})
            return resp
        # Register and take the backlog in one synchronous step: nothing can be missed between them.
        w = _Watch(resource, c.namespace, selector)
        if rv_param in ("", "0"):
            backlog = [{"type": "ADDED", "object": copy.deepcopy(o)} for o in c.items(resource, selector)]
        else:
            start = int(rv_param)
            backlog = [
                {"type": typ, "object": copy.deepcopy(obj)}
                for rv, res, ns, typ, obj in c.history
                if rv > start and res == resource and ns == c.namespace and c._match(selector, obj)
            ]
        c.watches.add(w)
        deadline = time.monotonic() + timeout_s
        try:
            for event in backlog:
                await send(event)
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                wait = min(left, c.bookmark_interval_s) if bookmarks else left
                try:
                    event = await asyncio.wait_for(w.queue.get(), wait)
                except TimeoutError:
                    if bookmarks and time.monotonic() < deadline:
                        bm = {
                            "kind": kind,
                            "apiVersion": api[resource],
                            "metadata": {"resourceVersion": str(c.rv)},
                        }
                        await send({"type": "BOOKMARK", "object": bm})
                    continue
                if event is None:
                    break
                await send(event)
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            c.watches.discard(w)
        return resp

    # -- pods ----------------------------------------------------------------------------------------------

    def _pod(self, request: web.Request) -> Obj:
        obj = self.cluster.get("pods", request.match_info["name"])
        if obj is None:
            raise web.HTTPNotFound(
                body=orjson.dumps(
                    status_obj(404, "NotFound", f'pods "{request.match_info["name"]}" not found')
                ),
                content_type="application/json",
            )
        return obj

    async def _get_pod(self, request: web.Request) -> web.Response:
        return web.json_response(self._pod(request))

    async def _patch_pod(self, request: web.Request) -> web.Response:
        obj = self._pod(request)
        patch = await self._patch_body(request)
        merged = merge_patch(obj, patch)
        merged["metadata"]["name"] = obj["metadata"]["name"]
        obj.clear()
        obj.update(merged)
        return web.json_response(self.cluster._put("pods", obj))

    async def _delete_pod(self, request: web.Request) -> web.Response:
        obj = self._pod(request)
        grace: float | None = None
        if request.can_read_body:
            body = orjson.loads(await request.read() or b"{}")
            if body.get("gracePeriodSeconds") is not None:
                grace = float(body["gracePeriodSeconds"])
        self.cluster.delete_pod(obj["metadata"]["name"], grace)
        return web.json_response(obj)

    # -- deployments / scale -------------------------------------------------------------------------------

    def _deployment(self, request: web.Request) -> Obj:
        obj = self.cluster.get("deployments", request.match_info["name"])
        if obj is None:
            raise web.HTTPNotFound(
                body=orjson.dumps(status_obj(404, "NotFound", "deployment not found")),
                content_type="application/json",
            )
        return obj

    def _scale(self, dep: Obj) -> Obj:
        live = sum(1 for p in self.cluster.pods.values() if not p.terminating)
        meta = dep["metadata"]
        return {
            "kind": "Scale", "apiVersion": "autoscaling/v1",
            "metadata": {"name": meta["name"], "namespace": meta["namespace"],
                         "resourceVersion": meta["resourceVersion"]},
            "spec": {"replicas": dep["spec"]["replicas"]},
            "status": {"replicas": live, "selector": f"app={meta['name']}"},
        }  # fmt: skip

    async def _get_deployment(self, request: web.Request) -> web.Response:
        return web.json_response(self._deployment(request))

    async def _get_scale(self, request: web.Request) -> web.Response:
        return web.json_response(self._scale(self._deployment(request)))

    async def _patch_scale(self, request: web.Request) -> web.Response:
        dep = self._deployment(request)
        patched = merge_patch(self._scale(dep), await self._patch_body(request))
        replicas = (patched.get("spec") or {}).get("replicas")
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
            return status_response(422, "Invalid", f"spec.replicas: Invalid value: {replicas!r}")
        dep["spec"]["replicas"] = replicas
        self.cluster._put("deployments", dep)
        return web.json_response(self._scale(dep))

    # -- leases --------------------------------------------------------------------------------------------

    async def _create_lease(self, request: web.Request) -> web.Response:
        body = orjson.loads(await request.read())
        name = body["metadata"]["name"]
        if self.cluster.get("leases", name) is not None:
            return status_response(
                409, "AlreadyExists", f'leases.coordination.k8s.io "{name}" already exists'
            )
        body["metadata"]["namespace"] = self.cluster.namespace
        return web.json_response(self.cluster._put("leases", body), status=201)

    async def _get_lease(self, request: web.Request) -> web.Response:
        obj = self.cluster.get("leases", request.match_info["name"])
        if obj is None:
            return status_response(404, "NotFound", "lease not found")
        return web.json_response(obj)

    async def _replace_lease(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        obj = self.cluster.get("leases", name)
        body = orjson.loads(await request.read())
        if obj is None:
            return status_response(404, "NotFound", "lease not found")
        if body.get("metadata", {}).get("resourceVersion") != obj["metadata"]["resourceVersion"]:
            return status_response(
                409, "Conflict",
                f'Operation cannot be fulfilled on leases.coordination.k8s.io "{name}": the object has been '
                "modified; please apply your changes to the latest version and try again",
            )  # fmt: skip
        body["metadata"]["namespace"] = self.cluster.namespace
        return web.json_response(self.cluster._put("leases", body))
