"""Prompt and SFT datasets, and the arithmetic task generator."""
