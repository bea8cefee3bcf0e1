"""Model units (MU): the one currency of fleetgate.

A request's cost in MU is the share of one replica it consumes, scaled so that one replica serves
``capacity_mu_per_min`` MU per minute at saturation (default 100)::

    cost_MU = capacity_mu_per_min * replica_seconds_consumed / 60

and replica seconds are modelled linearly in the request's shape (coefficients fitted per model, hardware and
engine flags by ``fleetgate calibrate`` or from published measurements)::

    cost_MU = gamma
            + alpha * (uncached_input + cache_discount * cached_input)
            + delta * uncached_input * input / LONG_INPUT_SCALE  # prefill attention; only if needed
            + beta  * output
            + epsilon * output * (input + output/2) / LONG_INPUT_SCALE  # decode over a long context
            + image_mu_per_token * image_tokens

``input`` counts text prompt tokens; image tokens are charged separately (``image_tokens_for`` derives them
from the model's patch geometry). Rate limits, reservations, router load and autoscaling all count in MU, so
the same numbers mean the same thing everywhere. Pure: no clocks, no I/O (profile files are read by
``fleetgate.profiles``, outside core).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from fleetgate.core.types import RequestInfo, Usage

#: Scale of the long-context terms (``delta``, ``epsilon``): token products are divided by it.
LONG_INPUT_SCALE = 1_000_000.0
#: Output length assumed when neither ``max_tokens`` nor any history is known.
DEFAULT_OUTPUT_TOKENS = 256


def image_tokens_for(
    width: int,
    height: int,
    *,
    patch_size: int = 14,
    merge_size: int = 1,
    fixed_tokens: int | None = None,
    min_tokens: int = 1,
    max_tokens: int | None = None,
    extra_tokens: int = 0,
) -> int:
    """Image tokens a vision encoder produces for a ``width`` x ``height`` image.

    Patch geometry: ``ceil(w/p) * ceil(h/p)`` patches, merged ``merge_size`` x ``merge_size`` into one token
    (Qwen2-VL: ``patch_size=14, merge_size=2``); models that resize every image to one grid (LLaVA-1.5: 576)
    pass ``fixed_tokens``. ``extra_tokens`` covers begin/end markers.
    """
    if width <= 0 or height <= 0:
        raise ValueError("image width and height must be positive")
    if fixed_tokens is not None:
        tokens = fixed_tokens
    else:
        if patch_size <= 0 or merge_size <= 0:
            raise ValueError("patch_size and merge_size must be positive")
        cell = patch_size * merge_size
        tokens = math.ceil(width / cell) * math.ceil(height / cell)
    tokens = max(tokens, min_tokens)
    if max_tokens is not None:
        tokens = min(tokens, max_tokens)
    return tokens + extra_tokens


@dataclass(frozen=True)
class CostProfile:
    """Cost coefficients for one (model, hardware, engine flags), in MU.

    ``alpha``/``beta`` are MU per input/output token, ``gamma`` MU per request, ``delta`` and ``epsilon``
    the long-context coefficients (prefill and decode attention, see the module docstring; 0 unless the
    calibration data asked for them), ``image_mu_per_token`` MU per image token (``None``: same as alpha,
    i.e. image tokens prefill like text), ``cache_discount`` the fraction of alpha a prefix-cached input token
    costs. ``perf`` carries engine performance numbers for the simulator (seconds per prefill token, decode
    step time vs batch, max batch); ``fit`` carries calibration quality. Neither enters the cost.
    """

    name: str = "default"
    alpha: float = 0.0
    beta: float = 0.0
    gamma: float = 0.0
    capacity_mu_per_min: float = 100.0
    delta: float = 0.0
    epsilon: float = 0.0
    image_mu_per_token: float | None = None
    cache_discount: float = 0.1
    default_output_tokens: int = DEFAULT_OUTPUT_TOKENS
    model: str = ""
    hardware: str = ""
    engine: str = ""
    perf: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)
    fit: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        coefficients = {
            "alpha": self.alpha,
            "beta": self.beta,
            "gamma": self.gamma,
            "delta": self.delta,
            "epsilon": self.epsilon,
        }
        for key, value in coefficients.items():
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"cost coefficient {key} must be finite and >= 0, got {value!r}")
        if not (self.capacity_mu_per_min > 0 and math.isfinite(self.capacity_mu_per_min)):
            raise ValueError("capacity_mu_per_min must be positive")
        if self.image_mu_per_token is not None and self.image_mu_per_token < 0:
            raise ValueError("image_mu_per_token must be >= 0")
        if not 0.0 <= self.cache_discount <= 1.0:
            raise ValueError("cache_discount must be in [0, 1]")
        if self.default_output_tokens < 0:
            raise ValueError("default_output_tokens must be >= 0")

    # -- cost -------------------------------------------------------------------------------------------

    @property
    def image_rate(self) -> float:
        """MU per image token (alpha unless the profile says otherwise)."""
        return self.alpha if self.image_mu_per_token is None else self.image_mu_per_token

    def cost(
        self, input_tokens: int, output_tokens: float, *, cached_tokens: int = 0, image_tokens: int = 0
    ) -> float:
        """MU for a request of this exact shape (the formula both estimate and settle use)."""
        # (branches instead of max/min/int calls: this runs several times per request, in the gateway and
        # the simulator; the arithmetic, and so every result, is the same)
        inp = input_tokens if type(input_tokens) is int else int(input_tokens)
        if inp < 0:
            inp = 0
        if cached_tokens:
            cached = cached_tokens if type(cached_tokens) is int else int(cached_tokens)
            cached = 0 if cached < 0 else inp if cached > inp else cached
        else:
            cached = 0
        uncached = inp - cached
        out = float(output_tokens)
        if out < 0.0:
            out = 0.0
        # gamma + alpha.. + delta.. + beta.. + epsilon.. + image rate.., summed left to right; a term that is
        # exactly 0 (delta and epsilon are unless calibrated; most requests have no image) is skipped, which
        # leaves every sum bit for bit as it was (the partial sums are never negative)
        total = self.gamma + self.alpha * (uncached + self.cache_discount * cached)
        if self.delta:
            total += self.delta * uncached * inp / LONG_INPUT_SCALE
        total += self.beta * out
        if self.epsilon:
            total += self.epsilon * out * (inp + out / 2.0) / LONG_INPUT_SCALE
        if image_tokens:
            images = image_tokens if type(image_tokens) is int else int(image_tokens)
            if images > 0:
                total += (self.alpha if self.image_mu_per_token is None else self.image_mu_per_token) * images
        return total

    def expected_output_tokens(
        self, max_output_tokens: int | None, observed_output_p90: float | None
    ) -> float:
        """Output length to budget for: min(max_tokens, tenant's observed p90), whichever are known."""
        if max_output_tokens is None:
            if observed_output_p90 is None:
                return float(self.default_output_tokens)
            least = float(observed_output_p90)
        else:
            least = float(max_output_tokens)
            if observed_output_p90 is not None and float(observed_output_p90) < least:
                least = float(observed_output_p90)
        return 0.0 if least < 0.0 else least

    def estimate(
        self,
        input_tokens: int,
        max_output_tokens: int | None,
        *,
        cached_tokens: int = 0,
        image_tokens: int = 0,
        observed_output_p90: float | None = None,
    ) -> float:
        """MU to reserve before the request runs (see ``expected_output_tokens``)."""
        out = self.expected_output_tokens(max_output_tokens, observed_output_p90)
        return self.cost(input_tokens, out, cached_tokens=cached_tokens, image_tokens=image_tokens)

    def estimate_request(
        self, request: RequestInfo, history: OutputHistory | None = None, *, cached_tokens: int = 0
    ) -> float:
        """``estimate`` for a ``RequestInfo``, with the output budget capped by the tenant's observed p90."""
        p90 = history.p90(request.tenant) if history is not None else None
        return self.estimate(
            request.input_tokens,
            request.max_output_tokens,
            cached_tokens=cached_tokens,
            image_tokens=request.image_tokens,
            observed_output_p90=p90,
        )

    def settle(self, usage: Usage) -> float:
        """The real MU cost once the engine reports its token counts.

        Engines (vLLM, the simulated engine) count image tokens inside ``prompt_tokens``; they are charged
        once, at the image rate, so they come out of the text input here.
        """
        text = usage.prompt_tokens - usage.image_tokens
        return self.cost(
            0 if text < 0 else text,  # (``max(..., 0)``: once per request)
            usage.completion_tokens,
            cached_tokens=usage.cached_tokens,
            image_tokens=usage.image_tokens,
        )

    # -- conversions ------------------------------------------------------------------------------------

    def replica_seconds(self, mu: float) -> float:
        """Replica seconds that ``mu`` model units stand for."""
        return mu * 60.0 / self.capacity_mu_per_min

    def mu_for_seconds(self, replica_seconds: float) -> float:
        """Model units that ``replica_seconds`` of one replica stand for."""
        return replica_seconds * self.capacity_mu_per_min / 60.0

    def with_capacity(self, capacity_mu_per_min: float) -> CostProfile:
        """The same physical profile renormalised to another MU/min per replica (coefficients rescale)."""
        k = capacity_mu_per_min / self.capacity_mu_per_min
        return replace(
            self,
            alpha=self.alpha * k,
            beta=self.beta * k,
            gamma=self.gamma * k,
            delta=self.delta * k,
            epsilon=self.epsilon * k,
            image_mu_per_token=None if self.image_mu_per_token is None else self.image_mu_per_token * k,
            capacity_mu_per_min=capacity_mu_per_min,
        )

    def saturated_requests_per_min(self, mean_cost_mu: float) -> float:
        """Requests per minute one saturated replica completes when each costs ``mean_cost_mu`` on average."""
        return self.capacity_mu_per_min / mean_cost_mu if mean_cost_mu > 0 else math.inf

    # -- (de)serialisation ------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (``from_dict`` reads it back)."""
        data = asdict(self)
        data["perf"] = dict(self.perf)
        data["fit"] = dict(self.fit)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CostProfile:
        """Build from a profile JSON object; unknown top-level keys are ignored (raw measurements etc.)."""
        known = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in known}
        for key in ("alpha", "beta", "gamma", "delta", "epsilon", "capacity_mu_per_min", "cache_discount"):
            if key in kwargs:
                kwargs[key] = float(kwargs[key])
        if "default_output_tokens" in kwargs:
            kwargs["default_output_tokens"] = int(kwargs["default_output_tokens"])
        if kwargs.get("image_mu_per_token") is not None:
            kwargs["image_mu_per_token"] = float(kwargs["image_mu_per_token"])
        for key in ("perf", "fit"):
            kwargs[key] = dict(kwargs.get(key) or {})
        return cls(**kwargs)


#: A generic profile for a small model on one replica when nothing was calibrated: a request with 1000 input
#: and 200 output tokens costs ~3.1 MU, so one replica serves ~32 such requests per minute.
DEFAULT_PROFILE = CostProfile(
    name="default",
    alpha=0.001,
    beta=0.01,
    gamma=0.05,
    capacity_mu_per_min=100.0,
    model="generic",
)


class OutputHistory:
    """Per-tenant record of observed output lengths (bounded), for the p90 used by ``estimate``.

    Keeps the last ``window`` completions per tenant and at most ``max_tenants`` tenants (the least recently
    updated is forgotten). Pure and synchronous.
    """

    def __init__(self, window: int = 256, min_samples: int = 8, max_tenants: int = 100_000) -> None:
        if window <= 0 or min_samples <= 0 or max_tenants <= 0:
            raise ValueError("window, min_samples and max_tenants must be positive")
        self.window = window
        self.min_samples = min(min_samples, window)
        self.max_tenants = max_tenants
        self._data: dict[str, deque[int]] = {}

    def observe(self, tenant: str, output_tokens: int) -> None:
        """Record one completed request's output length."""
        buf = self._data.pop(tenant, None)
        if buf is None:
            buf = deque(maxlen=self.window)
            if len(self._data) >= self.max_tenants:
                del self._data[next(iter(self._data))]
        buf.append(max(int(output_tokens), 0))
        self._data[tenant] = buf  # re-insert: dict order = least recently updated first

    def p90(self, tenant: str) -> float | None:
        """The tenant's 90th-percentile output length, or ``None`` until ``min_samples`` were seen."""
        return self.quantile(tenant, 0.9)

    def quantile(self, tenant: str, q: float) -> float | None:
        """Nearest-rank quantile of the tenant's recent output lengths (``None`` when too few)."""
        buf = self._data.get(tenant)
        if buf is None or len(buf) < self.min_samples:
            return None
        values = sorted(buf)
        rank = max(math.ceil(q * len(values)), 1)
        return float(values[rank - 1])

    def count(self, tenant: str) -> int:
        """How many observations are held for ``tenant``."""
        buf = self._data.get(tenant)
        return 0 if buf is None else len(buf)

    def __len__(self) -> int:
        return len(self._data)
