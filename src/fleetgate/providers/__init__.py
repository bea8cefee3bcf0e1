"""fleetgate.providers"""
