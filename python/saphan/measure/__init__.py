"""Measuring a named base commit against head from inside the boundary (measure-base)."""
