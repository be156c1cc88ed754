"""Tiny models for tests, CI and laptops: random target/drafter pairs and the trained zoo."""
