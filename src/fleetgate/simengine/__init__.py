"""fleetgate.simengine"""
