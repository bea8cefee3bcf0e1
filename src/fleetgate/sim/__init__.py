"""fleetgate.sim"""
