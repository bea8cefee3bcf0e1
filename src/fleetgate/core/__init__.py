"""Sans-IO core: pure decisions from explicit inputs.

Nothing in this package may import asyncio, aiohttp, socket, time or random: time and randomness come in
as arguments so that the live gateway and the simulator run exactly the same code (a unit test enforces it).
"""
