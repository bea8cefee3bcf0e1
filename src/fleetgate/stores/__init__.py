"""fleetgate.stores"""
