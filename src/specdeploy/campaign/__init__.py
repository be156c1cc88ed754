"""Campaigns: a matrix of server configurations x benchmark cells, run in order and resumable."""
