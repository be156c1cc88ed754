"""benchmarks/auto_budget_cpu.py: the order its rounds start the servers in."""

from __future__ import annotations

import importlib.util
import statistics
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("auto_budget_cpu", ROOT / "benchmarks" / "auto_budget_cpu.py")
auto_budget_cpu = importlib.util.module_from_spec(spec)
spec.loader.exec_module(auto_budget_cpu)


def test_over_even_rounds_every_server_runs_as_often_early_as_late() -> None:
    names = list(auto_budget_cpu.SERVERS)
    for rounds in (2, 4, 6):
        orders = [auto_budget_cpu.round_order(names, r) for r in range(rounds)]
        for order in orders:
            assert sorted(order) == sorted(names)  # every server once a round
        for name in names:  # a steady drift favours none: each one's mean place is the middle
            assert statistics.mean(order.index(name) for order in orders) == (len(names) - 1) / 2
    assert auto_budget_cpu.round_order(names, 0) == names
