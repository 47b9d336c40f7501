"""Tiny models built offline for tests and demos."""
