"""The gateway's single entry point for images: ``await pipeline.process_body(body, model)``.

Finds OpenAI image content parts (``{"type": "image_url", "image_url": {"url": ...}}``, also the plain-string
and ``input_image`` spellings), gets each image's bytes (``data:`` URL payloads are base64-decoded in the
worker; http(s) URLs are fetched under ``UrlFetcher``'s limits), processes them in the worker pool, and
returns a new body whose image URLs are the re-encoded data URLs, plus the image tokens the deployment's
vision encoder will produce (patch geometry, ``core.units.image_tokens_for``) for the MU estimate. Bad
images raise ``InvalidRequestError`` (400) naming the offending part. Text-only bodies never reach here.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fleetgate.config import ImageTargetConfig, MultimodalConfig
from fleetgate.core.errors import InvalidRequestError
from fleetgate.core.units import image_tokens_for
from fleetgate.multimodal.cpu import CpuBudget, PoolSizing, describe, pool_sizing, read_cpu_budget
from fleetgate.multimodal.fetch import AddressPolicy, UrlFetcher
from fleetgate.multimodal.image import ImageError, ImageResult, ImageSpec, process_naive
from fleetgate.multimodal.pool import WorkerCrashedError, WorkerPool

log = logging.getLogger("fleetgate.multimodal")

IMAGE_PART_TYPES = ("image_url", "input_image")


@dataclass(frozen=True, slots=True)
class _Job:
    message: int
    part: int
    url: str
    param: str


def has_image_parts(body: Mapping[str, Any]) -> bool:
    """Cheap check: does any chat message carry an image part?"""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return False
    for message in messages:
        content = message.get("content") if isinstance(message, Mapping) else None
        if isinstance(content, list):
            for part in content:
                if isinstance(part, Mapping) and part.get("type") in IMAGE_PART_TYPES:
                    return True
    return False


def _part_url(part: Mapping[str, Any], param: str) -> str:
    value = part.get("image_url")
    if isinstance(value, Mapping):
        value = value.get("url")
        param = f"{param}.image_url.url"
    else:
        param = f"{param}.image_url"
    if not isinstance(value, str) or not value:
        raise InvalidRequestError(
            f"'{param}' must be a non-empty string (a data: or http(s) URL)", param=param
        )
    return value


def split_data_url(url: str) -> tuple[str, str]:
    """``data:image/png;base64,AAAA`` -> (``image/png``, ``AAAA``); only base64 data URLs carry images."""
    head, sep, payload = url.partition(",")
    if not sep:
        raise ImageError("data URL has no ',' separating its header from the data")
    meta = head[len("data:") :].split(";")
    if "base64" not in (m.strip().lower() for m in meta[1:]):
        raise ImageError("data URLs of images must be base64-encoded (data:image/...;base64,...)")
    mime = meta[0].strip().lower()
    if mime and not mime.startswith("image/") and mime != "application/octet-stream":
        raise ImageError(f"data URL media type {mime!r} is not an image")
    return mime, payload


class ImagePipeline:
    """Images in requests -> validated, resized, re-encoded images and their token cost."""

    def __init__(
        self,
        config: MultimodalConfig,
        *,
        budget: CpuBudget | None = None,
        pool: WorkerPool | None = None,
        fetcher: UrlFetcher | None = None,
    ) -> None:
        self.config = config
        self.budget = budget if budget is not None else read_cpu_budget()
        self.sizing: PoolSizing = pool_sizing(self.budget, config.workers)
        self.pool = pool
        if self.pool is None and config.mode == "pool":
            self.pool = WorkerPool(
                self.sizing.workers,
                threads_per_worker=self.sizing.threads_per_worker,
                task_timeout_s=config.task_timeout_s,
                memory_mb=config.worker_memory_mb,
                nice=config.worker_nice,
            )
        self.fetcher = fetcher
        if self.fetcher is None and config.fetch_urls:
            policy = AddressPolicy.from_lists(
                config.url_allow, config.url_deny, allow_private=config.allow_private_networks
            )
            self.fetcher = UrlFetcher(
                policy,
                max_bytes=config.max_image_bytes,
                timeout_s=config.fetch_timeout_s,
                max_redirects=config.fetch_max_redirects,
            )
        self._specs: dict[str, ImageSpec] = {}
        #: image workers one tenant may use at once (default: half of them, at least one)
        self.tenant_concurrency = config.tenant_image_concurrency or max(1, self.sizing.workers // 2)
        self._tenant_gates: dict[str, asyncio.Semaphore] = {}
        self.images_processed = 0
        self.images_rejected = 0
        log.info("image pipeline: mode=%s %s", config.mode, dict(describe(self.budget, self.sizing)))

    # -- lifecycle ----------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the workers now (otherwise the first image request starts them)."""
        if self.pool is not None:
            await self.pool.start()

    async def close(self) -> None:
        if self.pool is not None:
            await self.pool.close()
        if self.fetcher is not None:
            await self.fetcher.close()

    # -- per request --------------------------------------------------------------------------------------

    def target(self, model: str | None) -> ImageTargetConfig:
        if model is not None and model in self.config.per_model:
            return self.config.per_model[model]
        return self.config.target

    def spec(self, model: str | None) -> ImageSpec:
        key = model if model is not None and model in self.config.per_model else ""
        spec = self._specs.get(key)
        if spec is None:
            target = self.target(model)
            spec = ImageSpec(
                max_edge=target.max_edge,
                output_format=target.output_format,
                jpeg_quality=target.jpeg_quality,
                max_pixels=self.config.max_pixels,
                max_bytes=self.config.max_image_bytes,
                allowed_formats=tuple(f.upper() for f in self.config.allowed_formats),
                backend=self.config.backend,
            )
            self._specs[key] = spec
        return spec

    def image_tokens(self, result: ImageResult, model: str | None) -> int:
        t = self.target(model)
        return image_tokens_for(
            result.width,
            result.height,
            patch_size=t.patch_size,
            merge_size=t.merge_size,
            fixed_tokens=t.fixed_tokens,
            extra_tokens=t.extra_tokens,
        )

    def max_image_tokens(self, model: str | None) -> int:
        """Image tokens of the largest image the deployment can get (resized to ``max_edge`` square): the
        estimate admission budgets before any image is fetched or decoded; settlement uses the real count."""
        edge = self.target(model).max_edge
        largest = ImageResult(data_url="", width=edge, height=edge, source_format="", source_width=edge,
                              source_height=edge)  # fmt: skip
        return self.image_tokens(largest, model)

    async def process_body(
        self, body: Mapping[str, Any], model: str | None = None, tenant: str = ""
    ) -> tuple[dict[str, Any], int]:
        """A copy of ``body`` with every image part processed, and the request's total image tokens.

        A tenant's images take at most ``tenant_image_concurrency`` workers at once (the others wait in
        line), so one tenant's flood of large images cannot take every worker from the others.
        """
        gate = self._tenant_gate(tenant)
        async with gate:
            return await self._process_body(body, model)

    def _tenant_gate(self, tenant: str) -> asyncio.Semaphore:
        gate = self._tenant_gates.get(tenant)
        if gate is None:
            if len(self._tenant_gates) > 4096:  # forget idle tenants' gates (bounded map)
                for name in [n for n, g in self._tenant_gates.items() if not g.locked()][:2048]:
                    del self._tenant_gates[name]
            gate = self._tenant_gates[tenant] = asyncio.Semaphore(self.tenant_concurrency)
        return gate

    async def _process_body(
        self, body: Mapping[str, Any], model: str | None = None
    ) -> tuple[dict[str, Any], int]:
        if self.config.mode == "off":
            return dict(body), 0
        messages = body.get("messages")
        if not isinstance(messages, list):
            return dict(body), 0
        jobs: list[_Job] = []
        for i, message in enumerate(messages):
            content = message.get("content") if isinstance(message, Mapping) else None
            if not isinstance(content, list):
                continue
            for j, part in enumerate(content):
                if isinstance(part, Mapping) and part.get("type") in IMAGE_PART_TYPES:
                    param = f"messages[{i}].content[{j}]"
                    jobs.append(_Job(i, j, _part_url(part, param), param))
        if not jobs:
            return dict(body), 0
        limit = self.config.max_images_per_request
        if len(jobs) > limit:
            raise InvalidRequestError(
                f"the request has {len(jobs)} images; at most {limit} are allowed", param="messages"
            )
        spec = self.spec(model)
        results = await self._run_all(jobs, spec)
        new_messages = list(messages)
        tokens = 0
        for job, result in zip(jobs, results, strict=True):
            message = new_messages[job.message]
            if message is messages[job.message]:  # copy each touched message and its content once
                message = {**message, "content": list(message["content"])}
                new_messages[job.message] = message
            part = message["content"][job.part]
            value = part.get("image_url")
            if isinstance(value, Mapping):
                new_value: Any = {**value, "url": result.data_url}
            else:
                new_value = result.data_url
            message["content"][job.part] = {**part, "image_url": new_value}
            tokens += self.image_tokens(result, model)
        self.images_processed += len(jobs)
        return {**body, "messages": new_messages}, tokens

    async def _run_all(self, jobs: list[_Job], spec: ImageSpec) -> list[ImageResult]:
        if len(jobs) == 1:
            return [await self._one(jobs[0], spec)]
        tasks: list[asyncio.Task[ImageResult]] = []
        try:
            async with asyncio.TaskGroup() as group:
                tasks = [group.create_task(self._one(job, spec)) for job in jobs]
        except* InvalidRequestError as eg:
            raise eg.exceptions[0] from None
        return [t.result() for t in tasks]

    async def _one(self, job: _Job, spec: ImageSpec) -> ImageResult:
        try:
            payload = await self._payload(job.url)
            if self.config.mode == "naive":
                return process_naive(payload, spec)  # deliberately on the event loop: the baseline
            assert self.pool is not None
            result: ImageResult = await self.pool.run("image", payload, spec)
            return result
        except ImageError as exc:
            self.images_rejected += 1
            raise InvalidRequestError(
                f"Invalid image in '{job.param}': {exc}", param=job.param, code="invalid_image"
            ) from None
        except WorkerCrashedError as exc:
            self.images_rejected += 1
            raise InvalidRequestError(
                f"Could not process the image in '{job.param}': {exc}",
                param=job.param,
                code="image_processing_failed",
            ) from None

    async def _payload(self, url: str) -> bytes | str:
        scheme = url[:8].lower()
        if scheme.startswith("data:"):
            _, payload = split_data_url(url)
            return payload  # base64 text: decoded in the worker
        if scheme.startswith(("http://", "https://")):
            if self.fetcher is None:
                raise ImageError("image URLs are not fetched by this gateway; send a data: URL")
            return await self.fetcher.fetch(url)
        raise ImageError("image URL must be a data: URL or an http(s) URL")


def build_pipeline(config: MultimodalConfig) -> ImagePipeline | None:
    """The pipeline for a config (``None`` when multimodal preprocessing is off)."""
    if config.mode == "off":
        return None
    return ImagePipeline(config)
