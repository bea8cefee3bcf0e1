"""Trace loaders and workload generators for the fleet simulator.

Every loader returns a :class:`Trace`: requests sorted by arrival time (seconds from the trace start), with
token lengths and, where the format has them, prefix block ids (Mooncake ``hash_ids``: two requests share KV
exactly as far as their leading ids agree). Formats:

* ``azure``: Azure LLM inference CSV (``TIMESTAMP, ContextTokens, GeneratedTokens``), no prefixes.
* ``mooncake``: Mooncake JSONL (``timestamp`` ms, ``input_length``, ``output_length``, ``hash_ids`` of
  512-token
  blocks).
* ``servegen``: ServeGen per-tenant rate tables (``t_s, total_rps, active_clients, client_<id>...``, one row
  per window). Rates are turned into arrivals by :func:`gamma_renewal_arrivals` (see there: why not
  Poisson)
  and lengths come from a :class:`LengthSource`.
* ``synthetic``: :func:`synthetic_trace` (gamma-renewal arrivals, lognormal lengths, shared-prefix groups).

Scaling: ``time_scale`` multiplies every timestamp (2.0 = the same requests over twice the time);
``rate_scale`` X replays at X times the rate: for recorded traces it divides timestamps by X, for rate tables
it multiplies the
rates (so the horizon stays the same and the generator draws X times the requests).

Randomness is always a seeded ``numpy.random.Generator`` passed in or built from ``seed``; nothing global.
"""

from __future__ import annotations

import csv
import json
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal, Protocol

import numpy as np

TraceFormat = Literal["auto", "azure", "mooncake", "servegen", "synthetic"]
FORMATS: tuple[str, ...] = ("auto", "azure", "mooncake", "servegen", "synthetic")
MOONCAKE_BLOCK_TOKENS = 512


def default_traces_dir() -> Path:
    """Where the shared real traces live: ``$FLEETGATE_TRACES_DIR`` or ``../shared/traces`` from the repo."""
    env = os.environ.get("FLEETGATE_TRACES_DIR")
    if env:
        return Path(env)
    repo = Path(__file__).resolve().parents[3]
    return (repo / ".." / "shared" / "traces").resolve()


class TraceFormatError(ValueError):
    """A trace file that cannot be parsed as the requested format."""


@dataclass(slots=True)
class TraceRequest:
    """One request of a workload: when it arrives and how long it is (tokens). ``token_ids``: the engine's
    own token ids of the prompt, where a replay knows them (the llama-server engine model matches token
    prefixes with them; the router sees ``hash_ids`` only)."""

    arrival_s: float
    input_tokens: int
    output_tokens: int
    tenant: str = "default"
    hash_ids: tuple[int, ...] = ()
    block_tokens: int = MOONCAKE_BLOCK_TOKENS
    session: str | None = None
    token_ids: tuple[int, ...] = ()


@dataclass(slots=True)
class Trace:
    """A replayable workload: requests sorted by ``arrival_s`` (seconds from the trace start)."""

    name: str
    requests: list[TraceRequest]
    source_format: str
    meta: dict[str, object] = field(default_factory=dict)

    @property
    def duration_s(self) -> float:
        return self.requests[-1].arrival_s - self.requests[0].arrival_s if self.requests else 0.0

    def __len__(self) -> int:
        return len(self.requests)


# --------------------------------------------------------------------------------------------- length sources


class LengthSource(Protocol):
    """Draws (input_tokens, output_tokens) pairs for generated arrivals."""

    @property
    def name(self) -> str: ...

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """``n`` input and ``n`` output lengths (int64 arrays, each >= 1)."""
        ...


@dataclass(frozen=True, slots=True)
class LognormalLengths:
    """Independent lognormal input/output lengths fitted to a median and a 95th percentile.

    The default numbers are ServeGen's language m-large statistics (../shared/traces/README.md): input p50/p95
    601/2,404, output p50/p95 53/539. Clipped to ``[1, max_*]``.
    """

    input_p50: float = 601.0
    input_p95: float = 2404.0
    output_p50: float = 53.0
    output_p95: float = 539.0
    max_input: int = 32768
    max_output: int = 4096
    name: str = "lognormal"

    def _sigma(self, p50: float, p95: float) -> float:
        return max(1e-6, math.log(p95 / p50) / 1.6448536269514722)

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        inp = rng.lognormal(math.log(self.input_p50), self._sigma(self.input_p50, self.input_p95), n)
        out = rng.lognormal(math.log(self.output_p50), self._sigma(self.output_p50, self.output_p95), n)
        return (
            np.clip(np.rint(inp), 1, self.max_input).astype(np.int64),
            np.clip(np.rint(out), 1, self.max_output).astype(np.int64),
        )


@dataclass(frozen=True, slots=True)
class EmpiricalLengths:
    """Resamples (input, output) pairs of a recorded trace, keeping their joint distribution."""

    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    name: str = "empirical"

    @classmethod
    def from_trace(cls, trace: Trace) -> EmpiricalLengths:
        return cls(
            tuple(r.input_tokens for r in trace.requests),
            tuple(r.output_tokens for r in trace.requests),
            name=f"empirical:{trace.name}",
        )

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        idx = rng.integers(0, len(self.inputs), n)
        return (
            np.maximum(1, np.asarray(self.inputs, dtype=np.int64)[idx]),
            np.maximum(1, np.asarray(self.outputs, dtype=np.int64)[idx]),
        )


def length_source(spec: str | None, traces_dir: Path | None = None) -> LengthSource:
    """A length source by name: ``servegen`` (lognormal fit, default), ``azure``, ``mooncake`` or a path."""
    if spec in (None, "", "servegen", "lognormal"):
        return LognormalLengths()
    base = traces_dir or default_traces_dir()
    if spec == "azure":
        return EmpiricalLengths.from_trace(
            load_azure(base / "azure-2023" / "AzureLLMInferenceTrace_conv.csv")
        )
    if spec == "mooncake":
        return EmpiricalLengths.from_trace(load_mooncake(base / "mooncake" / "conversation_trace.jsonl"))
    path = Path(spec)
    if not path.exists():
        raise TraceFormatError(f"unknown length source {spec!r} (servegen, azure, mooncake or a trace path)")
    return EmpiricalLengths.from_trace(load_trace(path))


# ------------------------------------------------------------------------------------------ recorded traces


def detect_format(path: Path) -> str:
    """Guess a trace format from its first line."""
    with open(path, encoding="utf-8") as fh:
        first = fh.readline().strip()
    if first.startswith("{"):
        return "mooncake"
    header = [h.strip() for h in first.split(",")]
    if header[:1] == ["TIMESTAMP"]:
        return "azure"
    if header[:2] == ["t_s", "total_rps"]:
        return "servegen"
    raise TraceFormatError(f"{path}: cannot tell the trace format from its first line {first[:80]!r}")


def _parse_azure_time(text: str) -> float:
    # "2023-11-16 18:15:46.6805900": seven fractional digits, more than fromisoformat takes everywhere.
    text = text.strip()
    main, _, frac = text.partition(".")
    base = datetime.strptime(main, "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC).timestamp()
    return base + (float("0." + frac) if frac else 0.0)


def load_azure(path: Path) -> Trace:
    """Azure LLM inference trace CSV."""
    reqs: list[TraceRequest] = []
    with open(path, encoding="utf-8", newline="") as fh:
        reader = csv.reader(fh)
        header = [h.strip() for h in next(reader)]
        try:
            it, ic, ig = (
                header.index("TIMESTAMP"),
                header.index("ContextTokens"),
                header.index("GeneratedTokens"),
            )
        except ValueError as exc:
            raise TraceFormatError(f"{path}: expected TIMESTAMP, ContextTokens, GeneratedTokens") from exc
        for row in reader:
            if not row:
                continue
            reqs.append(TraceRequest(_parse_azure_time(row[it]), int(row[ic]), int(row[ig]), block_tokens=16))
    reqs.sort(key=lambda r: r.arrival_s)
    t0 = reqs[0].arrival_s if reqs else 0.0
    for r in reqs:
        r.arrival_s -= t0
    return Trace(Path(path).stem, reqs, "azure")


def load_mooncake(path: Path) -> Trace:
    """Mooncake JSONL trace (timestamps in ms, 512-token prefix block ids)."""
    reqs: list[TraceRequest] = []
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            line = line.strip()
            if not line:
                continue
            try:
                obj = json.loads(line)
                reqs.append(
                    TraceRequest(
                        float(obj["timestamp"]) / 1000.0,
                        int(obj["input_length"]),
                        int(obj["output_length"]),
                        hash_ids=tuple(int(h) for h in obj.get("hash_ids", ())),
                        block_tokens=MOONCAKE_BLOCK_TOKENS,
                    )
                )
            except (KeyError, ValueError, TypeError) as exc:
                raise TraceFormatError(f"{path}:{lineno}: not a Mooncake trace line ({exc})") from exc
    reqs.sort(key=lambda r: r.arrival_s)
    t0 = reqs[0].arrival_s if reqs else 0.0
    for r in reqs:
        r.arrival_s -= t0
    return Trace(Path(path).stem, reqs, "mooncake")


# --------------------------------------------------------------------------------------------- rate tables


@dataclass(slots=True)
class RateTable:
    """ServeGen per-tenant rates: ``rates[tenant][i]`` req/s during ``[t_s[i], t_s[i] + window_s)``."""

    t_s: np.ndarray
    window_s: float
    rates: dict[str, np.ndarray]
    name: str = "rates"

    @property
    def duration_s(self) -> float:
        return float(self.t_s[-1] - self.t_s[0] + self.window_s) if len(self.t_s) else 0.0

    def total(self) -> np.ndarray:
        """Summed req/s per window over all tenants."""
        return np.sum(np.stack(list(self.rates.values())), axis=0) if self.rates else np.zeros(len(self.t_s))

    def tenants_by_volume(self) -> list[str]:
        """Tenant ids, largest request volume first (ties by name, so the order is stable)."""
        return sorted(self.rates, key=lambda k: (-float(self.rates[k].sum()), k))

    def select(self, tenant: str | None) -> RateTable:
        """Only one tenant's column (``client_7`` or ``7``), or everything when ``tenant`` is None."""
        if tenant is None:
            return self
        key = tenant if tenant in self.rates else f"client_{tenant}"
        if key not in self.rates:
            raise TraceFormatError(f"no tenant {tenant!r} in {self.name} (e.g. {next(iter(self.rates), '')})")
        return RateTable(self.t_s, self.window_s, {key: self.rates[key]}, f"{self.name}:{key}")

    def slice(self, start_s: float = 0.0, duration_s: float | None = None) -> RateTable:
        """Windows overlapping ``[start_s, start_s + duration_s)``, re-based to start at 0."""
        t = self.t_s - self.t_s[0]
        end = math.inf if duration_s is None else start_s + duration_s
        keep = (t + self.window_s > start_s) & (t < end)
        return RateTable(
            t[keep] - start_s, self.window_s, {k: v[keep] for k, v in self.rates.items()}, self.name
        )


def load_rate_table(path: Path) -> RateTable:
    """ServeGen rate table CSV (``t_s, total_rps, active_clients, client_<id>...``)."""
    with open(path, encoding="utf-8", newline="") as fh:
        reader = csv.reader(fh)
        header = [h.strip() for h in next(reader)]
        if header[:2] != ["t_s", "total_rps"]:
            raise TraceFormatError(f"{path}: expected a ServeGen rate table (t_s, total_rps, ...)")
        rows = [[float(x) if x else 0.0 for x in row] for row in reader if row]
    data = np.asarray(rows, dtype=np.float64)
    clients = [i for i, h in enumerate(header) if h.startswith("client_")]
    t_s = data[:, 0] - data[0, 0]
    window = float(np.median(np.diff(t_s))) if len(t_s) > 1 else 600.0
    return RateTable(t_s, window, {header[i]: data[:, i].copy() for i in clients}, Path(path).stem)


def tenant_cv(tenant: str, median_cv: float = 1.2, sigma: float = 0.35, seed: int = 0) -> float:
    """A tenant's inter-arrival coefficient of variation: lognormal around ``median_cv``, fixed per tenant.

    Derived from a stable hash of the tenant id and ``seed`` (not Python's salted ``hash``), so every run and
    every mode gives the tenant the same burstiness.
    """
    import zlib

    u = (zlib.crc32(f"{seed}:{tenant}".encode()) + 0.5) / 2**32
    # inverse normal CDF via numpy-free rational approximation is overkill: use erfinv through math.
    z = math.sqrt(2.0) * _erfinv(2.0 * u - 1.0)
    return float(min(8.0, max(0.5, median_cv * math.exp(sigma * z))))


def _erfinv(y: float) -> float:
    # Winitzki's approximation, refined by two Newton steps (plenty for drawing a per-tenant CV).
    a = 0.147
    ln = math.log(max(1e-300, 1.0 - y * y))
    t = 2.0 / (math.pi * a) + ln / 2.0
    x = math.copysign(math.sqrt(math.sqrt(t * t - ln / a) - t), y)
    for _ in range(2):
        err = math.erf(x) - y
        x -= err / (2.0 / math.sqrt(math.pi) * math.exp(-x * x))
    return x


def gamma_renewal_arrivals(
    t_s: np.ndarray, window_s: float, rates: np.ndarray, cv: float, rng: np.random.Generator
) -> np.ndarray:
    """Arrival times of a gamma-renewal process whose rate follows a piecewise-constant table.

    Why: ServeGen measured inter-arrival CVs well above 1 (median ~1.2) inside 10-minute windows, so Poisson
    arrivals (CV 1) understate bursts. We draw unit-mean gamma inter-arrivals with shape ``1/cv**2`` in
    "operational time" (the cumulative expected count Lambda(t)) and map them back through Lambda^-1, which
    keeps the burstiness across rate changes and gives nothing in windows of rate 0.
    """
    if len(t_s) == 0:
        return np.zeros(0)
    edges = np.append(t_s, t_s[-1] + window_s)
    cum = np.concatenate([[0.0], np.cumsum(np.maximum(rates, 0.0) * np.diff(edges))])
    total = float(cum[-1])
    if total <= 0:
        return np.zeros(0)
    shape = 1.0 / (cv * cv)
    # Start at a stationary point: a first gap drawn uniformly within a gap (equilibrium renewal, approx.).
    out: list[np.ndarray] = []
    pos = -float(rng.gamma(shape, 1.0 / shape)) * float(rng.random())
    while pos < total:
        n = int((total - pos) * 1.05 + 10 + 5 * math.sqrt(max(total - pos, 1.0)) * cv)
        gaps = rng.gamma(shape, 1.0 / shape, n)
        pts = pos + np.cumsum(gaps)
        pos = float(pts[-1])
        out.append(pts)
    ops = np.concatenate(out)
    ops = ops[(ops >= 0) & (ops < total)]
    # Invert the piecewise-linear Lambda; windows of zero rate have flat Lambda, np.interp picks their end.
    return np.interp(ops, cum, edges)


def generate_from_rates(
    table: RateTable,
    lengths: LengthSource,
    *,
    seed: int = 0,
    rate_scale: float = 1.0,
    median_cv: float = 1.2,
    max_requests: int | None = None,
) -> Trace:
    """Requests of every tenant of a rate table (gamma-renewal arrivals, lengths from ``lengths``)."""
    rng = np.random.default_rng(seed)
    times: list[np.ndarray] = []
    tenants: list[np.ndarray] = []
    names = sorted(table.rates)
    for idx, name in enumerate(names):
        arr = gamma_renewal_arrivals(
            table.t_s,
            table.window_s,
            table.rates[name] * rate_scale,
            tenant_cv(name, median_cv, seed=seed),
            rng,
        )
        times.append(arr)
        tenants.append(np.full(len(arr), idx, dtype=np.int32))
    if not times:
        return Trace(table.name, [], "servegen")
    t = np.concatenate(times)
    who = np.concatenate(tenants)
    order = np.argsort(t, kind="stable")
    t, who = t[order], who[order]
    if max_requests is not None:
        t, who = t[:max_requests], who[:max_requests]
    inp, out = lengths.sample(len(t), rng)
    reqs = [
        TraceRequest(float(a), int(i), int(o), tenant=names[w], block_tokens=16)
        for a, i, o, w in zip(t.tolist(), inp.tolist(), out.tolist(), who.tolist(), strict=True)
    ]
    meta: dict[str, object] = {"median_cv": median_cv, "lengths": lengths.name, "horizon_s": table.duration_s}
    return Trace(table.name, reqs, "servegen", meta)


# --------------------------------------------------------------------------------------------- synthetic


def synthetic_trace(
    n_requests: int,
    rate_rps: float,
    *,
    seed: int = 0,
    cv: float = 1.0,
    lengths: LengthSource | None = None,
    prefix_groups: int = 0,
    prefix_blocks: int = 4,
    block_tokens: int = 512,
    tenants: int = 1,
) -> Trace:
    """Stationary synthetic workload: gamma-renewal arrivals at ``rate_rps`` (CV ``cv``; 1 = Poisson).

    With ``prefix_groups > 0`` every request starts with one of that many shared prefixes of ``prefix_blocks``
    blocks (chosen Zipf-like, like system prompts) followed by its own unique blocks, so prefix caches matter.
    """
    rng = np.random.default_rng(seed)
    src = lengths or LognormalLengths()
    shape = 1.0 / (cv * cv)
    gaps = rng.gamma(shape, 1.0 / (shape * rate_rps), n_requests)
    t = np.cumsum(gaps) - gaps[0]
    inp, out = src.sample(n_requests, rng)
    groups = (
        np.minimum(rng.zipf(1.3, n_requests), prefix_groups) - 1
        if prefix_groups > 0
        else np.zeros(n_requests)
    ).astype(np.int64)
    who = rng.integers(0, max(1, tenants), n_requests)
    reqs: list[TraceRequest] = []
    next_id = prefix_groups * prefix_blocks
    for a, i, o, g, w in zip(
        t.tolist(), inp.tolist(), out.tolist(), groups.tolist(), who.tolist(), strict=True
    ):
        nblocks = -(-i // block_tokens)
        if prefix_groups > 0:
            shared = min(prefix_blocks, nblocks)
            ids = list(range(g * prefix_blocks, g * prefix_blocks + shared))
            ids.extend(range(next_id, next_id + nblocks - shared))
            next_id += nblocks - shared
        else:
            ids = []
        reqs.append(TraceRequest(a, i, o, tenant=f"t{w}", hash_ids=tuple(ids), block_tokens=block_tokens))
    return Trace(f"synthetic-{n_requests}", reqs, "synthetic", {"rate_rps": rate_rps, "cv": cv})


# --------------------------------------------------------------------------------------------- entry point


def scale_trace(trace: Trace, *, time_scale: float = 1.0, rate_scale: float = 1.0) -> Trace:
    """Timestamps multiplied by ``time_scale / rate_scale`` (recorded traces)."""
    if time_scale <= 0 or rate_scale <= 0:
        raise ValueError("time_scale and rate_scale must be > 0")
    f = time_scale / rate_scale
    if f == 1.0:
        return trace
    return Trace(
        trace.name,
        [replace(r, arrival_s=r.arrival_s * f) for r in trace.requests],
        trace.source_format,
        {**trace.meta, "time_factor": f},
    )


def load_trace(
    path: Path | str,
    fmt: str = "auto",
    *,
    seed: int = 0,
    time_scale: float = 1.0,
    rate_scale: float = 1.0,
    tenant: str | None = None,
    lengths: str | LengthSource | None = None,
    start_s: float = 0.0,
    duration_s: float | None = None,
    max_requests: int | None = None,
) -> Trace:
    """Load any supported trace into requests (rate tables are expanded into arrivals with ``seed``)."""
    p = Path(path)
    if fmt == "synthetic" or str(path).startswith("synthetic:"):
        return _synthetic_from_spec(str(path), seed)
    if not p.exists():
        raise FileNotFoundError(f"trace not found: {p}")
    kind = detect_format(p) if fmt == "auto" else fmt
    if kind == "servegen":
        table = load_rate_table(p).select(tenant).slice(start_s, duration_s)
        if time_scale != 1.0:
            table = RateTable(table.t_s * time_scale, table.window_s * time_scale, table.rates, table.name)
        src = lengths if lengths is not None and not isinstance(lengths, str) else length_source(lengths)
        return generate_from_rates(table, src, seed=seed, rate_scale=rate_scale, max_requests=max_requests)
    if kind == "azure":
        trace = load_azure(p)
    elif kind == "mooncake":
        trace = load_mooncake(p)
    else:
        raise TraceFormatError(f"unknown trace format {kind!r}; one of {', '.join(FORMATS)}")
    if tenant is not None:
        trace.requests = [r for r in trace.requests if r.tenant == tenant]
    if start_s > 0 or duration_s is not None:
        end = math.inf if duration_s is None else start_s + duration_s
        trace.requests = [
            replace(r, arrival_s=r.arrival_s - start_s)
            for r in trace.requests
            if start_s <= r.arrival_s < end
        ]
    if max_requests is not None:
        trace.requests = trace.requests[:max_requests]
    return scale_trace(trace, time_scale=time_scale, rate_scale=rate_scale)


def _synthetic_from_spec(spec: str, seed: int) -> Trace:
    """``synthetic:n=1000,rate=20,cv=1.2,groups=50,blocks=4``."""
    params: dict[str, float] = {"n": 1000, "rate": 10.0, "cv": 1.0, "groups": 0, "blocks": 4}
    body = spec.partition(":")[2]
    for part in filter(None, body.split(",")):
        key, _, value = part.partition("=")
        if key.strip() not in params:
            raise TraceFormatError(f"unknown synthetic parameter {key!r} (n, rate, cv, groups, blocks)")
        params[key.strip()] = float(value)
    return synthetic_trace(
        int(params["n"]),
        params["rate"],
        seed=seed,
        cv=params["cv"],
        prefix_groups=int(params["groups"]),
        prefix_blocks=int(params["blocks"]),
    )


def iter_lengths(trace: Trace) -> Iterable[tuple[int, int]]:
    """(input, output) pairs, for quick statistics."""
    return ((r.input_tokens, r.output_tokens) for r in trace.requests)


def interarrival_cv(times: Sequence[float]) -> float:
    """Coefficient of variation of the gaps between sorted arrival times."""
    gaps = np.diff(np.asarray(times, dtype=np.float64))
    return float(gaps.std() / gaps.mean()) if len(gaps) > 1 and gaps.mean() > 0 else 0.0
