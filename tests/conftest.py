"""Shared test configuration (kept minimal on purpose).

Integration fixtures that start real processes (simulated engines, gateways) live in
tests/integration/conftest.py; every server binds 127.0.0.1 on a free port.
"""
