"""Seeded workload generators for the simulator (generators, not downloads; issue 20)."""
