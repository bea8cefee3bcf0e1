"""fleetgate.engines"""
