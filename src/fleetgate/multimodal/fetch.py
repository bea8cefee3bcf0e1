"""Fetch http(s) image URLs with size, time and address limits (no SSRF into the cluster).

Every hop (the URL and each redirect) is checked twice: the host name against the allow/deny lists, and
every address it resolves to against the address policy, inside the resolver aiohttp connects with, so the
address checked is the address connected to (no DNS-rebinding window). Private, loopback, link-local,
multicast and reserved addresses are refused unless ``allow_private_networks`` is set or the allow list
names them; cloud metadata endpoints are refused unless the allow list names them exactly. A non-empty
allow list means only the hosts/addresses on it are fetched.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urljoin, urlsplit

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver

from fleetgate.multimodal.image import ImageError

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

#: Instance-metadata services (AWS/GCP/Azure/OpenStack, AWS IPv6, Alibaba): never by accident.
METADATA_ADDRESSES: frozenset[IPAddress] = frozenset(
    ipaddress.ip_address(a) for a in ("169.254.169.254", "fd00:ec2::254", "100.100.100.200", "169.254.170.2")
)
METADATA_HOSTS = frozenset({"metadata", "metadata.google.internal", "metadata.goog", "instance-data"})


_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_IPV4_COMPATIBLE = ipaddress.ip_network("::/96")


def embedded_ipv4(ip: IPAddress) -> IPAddress:
    """The IPv4 address an IPv6 transition address reaches (mapped ``::ffff:a.b.c.d``, NAT64
    ``64:ff9b::a.b.c.d``, 6to4 ``2002:aabb:ccdd::``, IPv4-compatible ``::a.b.c.d``), else ``ip`` itself:
    the policy judges where the packets end up, not how the address is spelled."""
    if not isinstance(ip, ipaddress.IPv6Address):
        return ip
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip in _NAT64 or (ip in _IPV4_COMPATIBLE and int(ip) > 1):  # (:: and ::1 are themselves)
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return ip


@dataclass(frozen=True)
class AddressPolicy:
    """Which hosts and addresses image URLs may point at."""

    allow_hosts: frozenset[str] = frozenset()
    allow_nets: tuple[IPNetwork, ...] = ()
    deny_hosts: frozenset[str] = frozenset()
    deny_nets: tuple[IPNetwork, ...] = ()
    allow_private: bool = False

    @classmethod
    def from_lists(
        cls, allow: Iterable[str] = (), deny: Iterable[str] = (), *, allow_private: bool = False
    ) -> AddressPolicy:
        """Entries are IPs, CIDRs, host names, or ``.example.com`` / ``*.example.com`` suffixes."""
        ah, an = _split_entries(allow)
        dh, dn = _split_entries(deny)
        return cls(ah, an, dh, dn, allow_private)

    @property
    def allow_list_active(self) -> bool:
        return bool(self.allow_hosts or self.allow_nets)

    def check_host(self, host: str) -> None:
        """Raise ``ImageError`` when the host name itself is refused."""
        host = host.lower().rstrip(".")
        if _host_in(host, self.deny_hosts):
            raise ImageError(f"image URL host {host!r} is on the deny list")
        if self.is_metadata_host(host) and not _host_in(host, self.allow_hosts):
            raise ImageError(f"image URL host {host!r} is a cloud metadata endpoint")

    @staticmethod
    def is_metadata_host(host: str) -> bool:
        return host.lower().rstrip(".") in METADATA_HOSTS

    def check_address(self, address: IPAddress | str, host: str | None = None) -> None:
        """Raise ``ImageError`` unless ``address`` (which ``host`` resolved to) may be fetched."""
        ip = embedded_ipv4(ipaddress.ip_address(address) if isinstance(address, str) else address)
        name = (host or str(ip)).lower().rstrip(".")
        if any(ip in net for net in self.deny_nets):
            raise ImageError(f"image URL address {ip} is on the deny list")
        explicitly = any(ip in net for net in self.allow_nets) or (
            host is not None and _host_in(name, self.allow_hosts)
        )
        if ip in METADATA_ADDRESSES and not any(
            ip in net and net.num_addresses == 1 for net in self.allow_nets
        ):
            raise ImageError(f"image URL address {ip} is a cloud metadata endpoint")
        if self.allow_list_active and not explicitly:
            raise ImageError(f"image URL host {name!r} ({ip}) is not on the allow list")
        if explicitly:
            return
        if not ip.is_global and not self.allow_private:
            raise ImageError(
                f"image URL address {ip} is private, loopback, link-local or reserved; not fetched"
            )
        if ip.is_multicast or ip.is_unspecified:
            raise ImageError(f"image URL address {ip} cannot be fetched")


def _split_entries(entries: Iterable[str]) -> tuple[frozenset[str], tuple[IPNetwork, ...]]:
    hosts: set[str] = set()
    nets: list[IPNetwork] = []
    for raw in entries:
        entry = raw.strip().lower()
        if not entry:
            continue
        try:
            nets.append(ipaddress.ip_network(entry.strip("[]"), strict=False))
        except ValueError:
            hosts.add(entry[1:] if entry.startswith("*.") else entry)
    return frozenset(hosts), tuple(nets)


def _host_in(host: str, names: frozenset[str]) -> bool:
    """Exact match, or a ``.suffix`` entry matching the host or any of its subdomains."""
    host = host.lower().rstrip(".")
    if host in names:
        return True
    return any(n.startswith(".") and (host.endswith(n) or host == n[1:]) for n in names)


class _CheckedResolver(AbstractResolver):
    """Resolves with aiohttp's default resolver, then drops every address the policy refuses."""

    def __init__(self, policy: AddressPolicy) -> None:
        self.policy = policy
        self._inner = DefaultResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        try:
            results = await self._inner.resolve(host, port, family)
        except OSError as exc:
            raise ImageError(f"image URL host {host!r} does not resolve: {exc}") from exc
        allowed = []
        reason: ImageError | None = None
        for result in results:
            try:
                self.policy.check_address(result["host"], host)
                allowed.append(result)
            except ImageError as exc:
                reason = exc
        if not allowed:
            raise reason or ImageError(f"image URL host {host!r} has no address")
        return allowed

    async def close(self) -> None:
        await self._inner.close()


class UrlFetcher:
    """Downloads image URLs within the limits. One aiohttp session, created on first use."""

    def __init__(
        self,
        policy: AddressPolicy,
        *,
        max_bytes: int,
        timeout_s: float,
        max_redirects: int = 3,
        schemes: Sequence[str] = ("http", "https"),
    ) -> None:
        self.policy = policy
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s
        self.max_redirects = max_redirects
        self.schemes = tuple(schemes)
        self._session: aiohttp.ClientSession | None = None

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(
                resolver=_CheckedResolver(self.policy), limit=64, ttl_dns_cache=None
            )
            self._session = aiohttp.ClientSession(connector=connector, trust_env=False, auto_decompress=True)
        return self._session

    def check_url(self, url: str) -> str:
        """Scheme and host checks that need no network; returns the host."""
        try:
            parts = urlsplit(url)
        except ValueError as exc:
            raise ImageError(f"image URL is malformed: {exc}") from exc
        if parts.scheme not in self.schemes:
            raise ImageError(f"image URL scheme {parts.scheme!r} is not supported (use data:, http or https)")
        host = parts.hostname
        if not host:
            raise ImageError("image URL has no host")
        if parts.username or parts.password:
            raise ImageError("image URLs with credentials are not fetched")
        self.policy.check_host(host)
        try:
            literal: IPAddress | None = ipaddress.ip_address(host)
        except ValueError:
            literal = None
        if literal is not None:  # aiohttp skips the resolver for IP literals: check here
            self.policy.check_address(literal, host)
        return host

    async def fetch(self, url: str) -> bytes:
        """The body of ``url`` (following up to ``max_redirects`` checked redirects); ``ImageError`` else."""
        try:
            async with asyncio.timeout(self.timeout_s):
                return await self._fetch(url)
        except TimeoutError as exc:
            raise ImageError(f"fetching the image URL took longer than {self.timeout_s:g} s") from exc
        except aiohttp.ClientError as exc:
            raise ImageError(f"fetching the image URL failed: {exc.__class__.__name__}: {exc}") from exc

    async def _fetch(self, url: str) -> bytes:
        session = self._get_session()
        current = url
        for _ in range(self.max_redirects + 1):
            self.check_url(current)
            async with session.get(current, allow_redirects=False) as response:
                if response.status in (301, 302, 303, 307, 308):
                    location = response.headers.get("Location")
                    if not location:
                        raise ImageError(f"image URL redirect (HTTP {response.status}) has no Location")
                    current = urljoin(current, location)
                    continue
                if response.status != 200:
                    raise ImageError(f"image URL answered HTTP {response.status}")
                length = response.content_length
                if length is not None and length > self.max_bytes:
                    raise ImageError(
                        f"image at URL is {length} bytes, more than the limit of {self.max_bytes}"
                    )
                return await _read_capped(response, self.max_bytes)
        raise ImageError(f"image URL redirected more than {self.max_redirects} times")

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


async def _read_capped(response: aiohttp.ClientResponse, limit: int) -> bytes:
    buf = bytearray()
    async for chunk in response.content.iter_chunked(64 * 1024):
        buf += chunk
        if len(buf) > limit:
            raise ImageError(f"image at URL is larger than the limit of {limit} bytes")
    return bytes(buf)


def describe_policy(policy: AddressPolicy) -> dict[str, Any]:
    """For logs."""
    return {
        "allow": sorted(policy.allow_hosts) + [str(n) for n in policy.allow_nets],
        "deny": sorted(policy.deny_hosts) + [str(n) for n in policy.deny_nets],
        "allow_private": policy.allow_private,
    }
