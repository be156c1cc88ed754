"""Experiments with the reference engine: questions cheap to answer on a laptop and dear on a GPU box."""
