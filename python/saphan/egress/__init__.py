"""Egress policies: a run's network cut, its per-run door, and the door's credential routes."""
