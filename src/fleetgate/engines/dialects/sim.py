"""fleetgate's simulated engine (``fleetgate engine sim``): vLLM's metric names and priority semantics, and
it always honours ``priority`` (no flag needed)."""

from dataclasses import replace

from fleetgate.engines.dialects.base import PriorityField
from fleetgate.engines.dialects.vllm import VLLM

SIM = replace(VLLM, name="sim", priority=PriorityField(needs_flag=False))
