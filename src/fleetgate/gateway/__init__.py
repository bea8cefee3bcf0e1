"""fleetgate.gateway"""
