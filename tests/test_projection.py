"""The projection's arithmetic against hand-computed cases: the step fit, tau between budgets, the MoE
expert count (DOMAIN.md's figures), and hardware scaling with its all-reduces."""

from __future__ import annotations

import math

import pytest

from specdeploy.errors import SpecdeployError
from specdeploy.projection.model import Cell, Experts, TauCurve, fit_steps
from specdeploy.projection.project import Projection
from specdeploy.projection.scaling import AllReduce, HardwareScale
from specdeploy.recipes.schema import HardwareProfile

BLOCK = 16


def synthetic_cells() -> list[Cell]:
    """Cells of a machine whose step is exactly 10 ms + 2 ms per request + 0.5 ms per verified token."""
    cells = []
    for budget, tau in ((4, 3.0), (32, 5.0)):
        for c in (1, 4):
            step = 10 + 2 * c + 0.5 * c * (budget + 1)
            cells.append(Cell("ddtree", budget, c, 1e3 * c * tau / step, tau, step / tau))
    for c in (1, 4):
        step = 10 + 2 * c + 0.5 * c
        cells.append(Cell("ar", None, c, 1e3 * c / step, 1.0, step))
    return cells


def test_the_fit_recovers_a_known_step_and_predicts_an_unmeasured_budget() -> None:
    projection = Projection(synthetic_cells(), BLOCK, None)
    fit = projection.models["ddtree"].effective
    assert fit.coefficients == pytest.approx({"fixed": 10, "per_row": 2, "per_token": 0.5})
    p = projection.predict("ddtree", 16, 2)
    # step = 10 + 2*2 + 0.5*2*17 = 31 ms; tau(16) = 3 + (5 - 3) * (log2 17 - log2 5) / (log2 33 - log2 5)
    tau = 3 + 2 * (4.087463 - 2.321928) / (5.044394 - 2.321928)
    assert p.step_ms == pytest.approx(31.0)
    assert p.tau == pytest.approx(tau, rel=1e-6) and not p.tau_measured
    assert p.output_tok_s == pytest.approx(1000 * 2 * tau / 31, rel=1e-6)  # 277.2 tok/s
    assert p.tpot_ms == pytest.approx(31 / tau, rel=1e-6)
    # tau linear in b would give 3 + 2 * 12/28: the interval spans both readings of the curve
    assert p.low == pytest.approx(1000 * 2 * min(tau, 3 + 24 / 28) / 31, rel=1e-6)
    assert p.high == pytest.approx(1000 * 2 * max(tau, 3 + 24 / 28) / 31, rel=1e-6)
    # AR: 10 + 2.5 c, so 4 requests take 20 ms per step: 200 tok/s
    assert projection.predict("ar", None, 4).output_tok_s == pytest.approx(200.0)


def test_fit_budgets_leave_the_other_budgets_out() -> None:
    projection = Projection(synthetic_cells(), BLOCK, None, fit_budgets=[4])
    assert sorted(projection.models["ddtree"].tau.by_budget) == [4]
    assert projection.models["ddtree"].effective.cells == 2
    # one budget: per-row cost folded into per-token: 10 + 2c + 2.5c = 10 + c*(2 + 2.5) -> per token 4.5/5 = 0.9
    assert projection.models["ddtree"].effective.coefficients == pytest.approx(
        {"fixed": 10, "per_row": 0, "per_token": 0.9}
    )
    assert any("cannot be told from" in note for note in projection.notes)


def test_tau_below_between_and_above_the_measured_budgets() -> None:
    curve = TauCurve()
    for tau in (2.5, 3.5):
        curve.add(8, tau)
    assert curve.at(8).estimate == 3.0 and (curve.at(8).low, curve.at(8).high) == (2.5, 3.5)
    # between tau(0) = 1 and tau(8) = 3: log2(5)/log2(9) of the way
    assert curve.at(4).estimate == pytest.approx(1 + 2 * math.log2(5) / math.log2(9))
    above = curve.at(64)
    assert above.estimate == 3.0 and above.high == pytest.approx(
        3 + 2 * (math.log2(65) - math.log2(9)) / math.log2(9)
    )


def test_expert_count_matches_domain_figures() -> None:
    kimi = Experts(routed=384, per_token=8)  # DOMAIN.md: 16 tokens touch 29% of the experts, 65 tokens 75%
    assert kimi.touched(16) / 384 == pytest.approx(0.29, abs=0.005)
    assert kimi.touched(65) / 384 == pytest.approx(0.75, abs=0.005)
    assert kimi.touched(1) == pytest.approx(8)


def test_too_few_cells_is_a_clear_error() -> None:
    with pytest.raises(SpecdeployError, match="cannot fit a step cost"):
        fit_steps("dflash", [(1, 16, 16.0, 20.0)])


def profile(name: str, hbm: float, tflops: float, link: float, latency_us: float) -> HardwareProfile:
    return HardwareProfile(
        name=name, description=name, engine="sglang", gpu_model=name, gpu_count=8, memory_mib=1000,
        compute_capability="9.0", interconnect="nvlink", hbm_gb_s=hbm, bf16_dense_tflops=tflops,
        interconnect_gb_s=link, allreduce_latency_us=latency_us,
    )  # fmt: skip


@pytest.mark.parametrize(("moe", "expected"), [(False, 5.62381), (True, 7.742857)])
def test_hardware_scaling_by_hand(moe: bool, expected: float) -> None:
    source = profile("slow", hbm=1000, tflops=100, link=50, latency_us=20)
    target = profile("fast", hbm=4000, tflops=800, link=500, latency_us=5)
    scale = HardwareScale(source, target, AllReduce(tp=8, layers=10, hidden=1000), moe=moe)
    # Source all-reduces: latency 10 layers x 2 x 20 us = 0.4 ms; 34 tokens x 1000 x 2 B = 68,000 B, a ring
    # sends 2*7/8 of it = 119,000 B per link: / 50 GB/s = 2.38 us, x 20 = 0.0476 ms. Target: 0.1 ms and
    # 0.00476 ms. Dense: (10 - 0.4) x 1/4 + 4 x 1/4 + (17 - 0.0476) x 1/8 + 0.1 + 0.00476 = 5.62381 ms;
    # MoE: the per-token term is memory-bound, x 1/4: 2.4 + 1 + 4.2381 + 0.10476 = 7.742857 ms.
    step, clamped = scale.step_ms({"fixed": 10.0, "per_row": 4.0, "per_token": 17.0}, tokens=34)
    assert step == pytest.approx(expected, rel=1e-5) and clamped == []
    lines = scale.assumptions()
    assert any("x 0.25 (HBM 1000 -> 4000 GB/s)" in line for line in lines)
    assert any(
        ("memory-bound, x 0.25" if moe else "x 0.125 (BF16 dense 100 -> 800") in line for line in lines
    )


def test_scaling_without_profile_figures_names_what_is_missing() -> None:
    bare = HardwareProfile(
        name="bare", description="", engine="sglang", gpu_model="x", gpu_count=8, memory_mib=1,
        compute_capability="9.0", interconnect="pcie",
    )  # fmt: skip
    with pytest.raises(SpecdeployError, match="lacks hbm_gb_s, bf16_dense_tflops, interconnect_gb_s"):
        HardwareScale(bare, bare, AllReduce(8, 10, 1000), moe=False)
