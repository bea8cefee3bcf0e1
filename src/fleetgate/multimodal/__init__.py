"""fleetgate.multimodal"""
