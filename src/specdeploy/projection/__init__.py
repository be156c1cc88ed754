"""Projection from a measured campaign: a step cost model per mode, acceptance per budget, other hardware."""
