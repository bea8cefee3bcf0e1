"""``RequestInfo.of``, ``ReplicaSnapshot.of``, ``Usage.of``: the hot path's constructors of the frozen types.

They fill a plain class with the same slots and then give the object its real class; the object must be the
one the dataclass's ``__init__`` builds from the same values (type, fields, equality, hash, repr, pickling,
``replace``) and stay frozen. Each takes every field, in field order, so a field added to the dataclass
without its ``of`` parameter fails here instead of leaving a slot empty.
"""

from __future__ import annotations

import dataclasses
import inspect
import pickle
from typing import Any

import pytest

from fleetgate.core.types import HealthState, Priority, ReplicaSnapshot, RequestInfo, Usage

#: Values different from every default, one per field (so a field written into the wrong slot shows).
SAMPLES: dict[type, dict[str, Any]] = {
    RequestInfo: {
        "request_id": "r-1",
        "model": "m",
        "tenant": "acme",
        "input_tokens": 123,
        "max_output_tokens": 456,
        "estimated_output_tokens": 78,
        "cost_mu": 9.25,
        "stream": True,
        "priority": Priority.BATCH,
        "session_key": "s",
        "prefix_hashes": (11, 22, 33),
        "prefix_block_tokens": 64,
        "image_tokens": 5,
        "arrival_s": 1.5,
        "bound_mu": 12.5,
    },
    ReplicaSnapshot: {
        "name": "r0",
        "url": "http://127.0.0.1:1",
        "health": HealthState.SUSPECT,
        "draining": True,
        "inflight_requests": 3,
        "inflight_mu": 4.5,
        "capacity_mu_per_min": 250.0,
        "engine_waiting": 2,
        "engine_running": 6,
        "engine_kv_usage": 0.75,
        "engine_prefix_hit_rate": 0.25,
        "consecutive_failures": 1,
        "ejected_until_s": 8.0,
        "learned_prefill_tokens_per_s": 900.0,
        "learned_decode_s_per_token": 0.02,
    },
    Usage: {"prompt_tokens": 10, "completion_tokens": 20, "cached_tokens": 4, "image_tokens": 2},
}


@pytest.mark.parametrize("cls", list(SAMPLES), ids=lambda c: c.__name__)
def test_of_takes_every_field_in_order(cls: type) -> None:
    names = [f.name for f in dataclasses.fields(cls)]
    assert list(inspect.signature(cls.of).parameters) == names  # type: ignore[attr-defined]
    assert list(SAMPLES[cls]) == names


@pytest.mark.parametrize("cls", list(SAMPLES), ids=lambda c: c.__name__)
def test_of_builds_the_dataclass_own_object(cls: type) -> None:
    values = SAMPLES[cls]
    ref = cls(**values)
    for fast in (cls.of(**values), cls.of(*values.values())):  # type: ignore[attr-defined]
        assert type(fast) is cls
        assert dataclasses.is_dataclass(fast)
        assert dataclasses.asdict(fast) == dataclasses.asdict(ref) == values
        assert fast == ref and hash(fast) == hash(ref) and repr(fast) == repr(ref)
        assert pickle.loads(pickle.dumps(fast)) == ref
        name = next(iter(values))
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(fast, name, values[name])
        with pytest.raises(dataclasses.FrozenInstanceError):
            delattr(fast, name)
        assert dataclasses.replace(fast, **{name: values[name]}) == ref
    required = {f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING}
    defaults = cls(**{k: v for k, v in values.items() if k in required})
    assert cls.of(**dataclasses.asdict(defaults)) == defaults  # type: ignore[attr-defined]
    assert cls.of(**values) != defaults  # type: ignore[attr-defined]


def test_of_objects_keep_their_properties() -> None:
    snap = ReplicaSnapshot.of(**SAMPLES[ReplicaSnapshot])
    assert snap.routable is False  # draining
    assert ReplicaSnapshot.of(**{**SAMPLES[ReplicaSnapshot], "draining": False}).routable is True
    assert Usage.of(**SAMPLES[Usage]).total_tokens == 30
