"""A run: its request, cast, reservation, composition, dispatch and record (pipeline.py)."""
