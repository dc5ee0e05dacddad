"""How a composed command reaches a machine: locally (this build), or over SSH."""
