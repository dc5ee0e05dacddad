"""Batches: many tasks cast on the fleet as seats free up (docs/fleet.md)."""
