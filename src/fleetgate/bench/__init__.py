"""fleetgate.bench"""
