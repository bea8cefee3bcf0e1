"""Leader or spill: stay with the replica that holds the prompt unless another would be much faster.

The *leader* is the replica expected to hold the longest prefix of the prompt (with ``sticky_cache``; ties go
to the faster one), or, when none holds ``sticky_min_blocks`` blocks, the fastest replica of the key's
affinity subset (ring order breaks ties). It wins unless the fastest candidate overall would be much faster:

    leader_ttft > factor * best_ttft + slack   ->   the fastest takes it (a *spill*)

with ``spill_factor`` / ``spill_slack_s`` when the leader holds part of the prompt, and the tighter
``spill_factor_new`` / ``spill_slack_new_s`` when nothing of it is cached anywhere (the subset then only keeps
keys apart; the cache leader will find the next turn wherever this one goes). With ``spill_max_wait_s`` a
cache leader holding a share ``s`` of the prompt spills only onto a replica whose queued prefill ends
within ``spill_max_wait_s / s`` seconds (a leader holding only a short shared template spills as before):
a spill re-prefills the context the leader holds (and moves the session's next turns with it), which costs
nothing on idle capacity but, when every replica has a queue, is work every later request waits behind
(measured on agentic sessions: docs/benchmarks.md, "Session 5"). Inputs are TTFT estimates in seconds
(``scorers.ttft``), so this picker belongs to the ``fleetgate`` policy.

With ``spill_max_reprefill_s`` a cache leader is also kept when the spill would re-prefill more than that
many seconds of its context (the blocks it holds beyond what the fastest candidate holds, at the fastest's
rate as the TTFT estimate reads it) onto a replica with prefill queued: a session is spilled while its
context is small and not once it is large (onto a replica with nothing queued it spills as before).
"""

from __future__ import annotations

import math
from typing import TypeVar

from pydantic import Field

from fleetgate.core.plugins import PluginParams
from fleetgate.core.routing.pipeline import StageBase

C = TypeVar("C")


class LeaderSpillParams(PluginParams):
    """When the leader (cache holder or affinity subset) gives way to a faster replica."""

    spill_factor: float = Field(
        default=1.5, ge=1.0, description="Spill when leader TTFT > factor x best + slack."
    )
    spill_slack_s: float = Field(default=0.5, ge=0, description="The slack of `spill_factor` (seconds).")
    spill_factor_new: float = Field(
        default=1.05, ge=1.0, description="`spill_factor` when nothing of the prompt is cached anywhere."
    )
    spill_slack_new_s: float = Field(
        default=0.0, ge=0, description="The slack of `spill_factor_new` (seconds)."
    )
    sticky_cache: bool = Field(default=True, description="The replica holding most of the prompt leads.")
    sticky_min_blocks: int = Field(default=1, description="Cached blocks that make a replica the leader.")
    spill_max_wait_s: float | None = Field(
        default=None,
        ge=0,
        description="A cache leader holding a share s of the prompt spills only to a replica whose queued "
        "prefill ends within this many seconds / s (none: no bound). A spill re-prefills the cached "
        "context: free on idle capacity, paid by every later request under load.",
    )
    spill_max_reprefill_s: float | None = Field(
        default=None,
        ge=0,
        description="A cache leader spills onto a replica with prefill queued only when the context it holds "
        "beyond that replica would take at most this many seconds to prefill there (none: no bound).",
    )


class LeaderSpillPicker(StageBase):
    """The leader-or-spill rule (see the module docstring); counts its spills."""

    name = "leader_spill"

    def __init__(self, params: LeaderSpillParams) -> None:
        self.params = params
        self.spill_factor = params.spill_factor
        self.spill_slack_s = params.spill_slack_s
        self.spill_factor_new = params.spill_factor_new
        self.spill_slack_new_s = params.spill_slack_new_s
        self.sticky_cache = params.sticky_cache
        self.sticky_min_blocks = params.sticky_min_blocks
        self.spill_max_wait_s = math.inf if params.spill_max_wait_s is None else params.spill_max_wait_s
        self.spill_max_reprefill_s = (
            math.inf if params.spill_max_reprefill_s is None else params.spill_max_reprefill_s
        )
        self.spills = 0

    def choose(
        self,
        sub: C | None,
        sub_t: float,
        deep: C | None,
        deep_d: int,
        deep_t: float,
        best: C,
        best_t: float,
        best_wait: float = 0.0,
        deep_share: float = 1.0,
        move_s: float = 0.0,
    ) -> tuple[C, float, str]:
        """``(candidate, ttft, reason)`` from the subset's fastest (``sub``, ``None`` for none), the deepest
        cache holder (``deep``, ``None`` for none, holding ``deep_d`` blocks) and the fastest overall
        (``best``, with ``best_wait`` seconds of prefill queued ahead of it; ``deep_share``: the share of the
        prompt the cache holder holds; ``move_s``: seconds of prefill the spill would add, the context the
        holder has beyond ``best``). Candidates are whatever the caller names them by."""
        stay = False
        if deep is not None and deep_d >= self.sticky_min_blocks:
            sub, sub_t = deep, deep_t  # the replica expected to hold the most of the prompt leads
            factor, slack_s = self.spill_factor, self.spill_slack_s
            stay = best_wait * deep_share > self.spill_max_wait_s or (
                best_wait > 0.0 and move_s > self.spill_max_reprefill_s
            )
        else:
            factor, slack_s = self.spill_factor_new, self.spill_slack_new_s
        if sub is not None and (stay or sub_t <= factor * best_t + slack_s):
            return sub, sub_t, "fleetgate:affinity"
        self.spills += 1
        return best, best_t, "fleetgate:spill"
