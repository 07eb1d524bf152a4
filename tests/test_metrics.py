"""Metrics that compare policies: gap closed, and paired margins over seeds."""

from __future__ import annotations

import math

import numpy as np
import pytest

from marconi.sim.metrics import gap_closed, paired_margin, t95
from tests.helpers import make_summary


def test_t95_matches_published_quantiles_and_the_normal_limit() -> None:
    # Student's t two-sided 95% quantiles as printed in statistical tables (3 decimals)
    for df, printed in ((1, 12.706), (2, 4.303), (9, 2.262), (30, 2.042), (40, 2.021),
                        (60, 2.000), (120, 1.980)):
        assert t95(df) == pytest.approx(printed, abs=5e-4)
    assert t95(10**6) == pytest.approx(1.959964, abs=1e-5)
    with pytest.raises(ValueError, match="degrees of freedom"):
        t95(0)


def test_paired_margin_by_hand() -> None:
    a, b = [26.0, 27.0, 25.5, 26.5], [25.0, 27.5, 25.0, 25.5]
    m = paired_margin(a, b)
    diff = np.array(a) - np.array(b)  # 1.0, -0.5, 0.5, 1.0
    half = 3.182446 * diff.std(ddof=1) / math.sqrt(4)  # t(0.975, 3 df), 6 decimals
    assert m.mean == pytest.approx(0.5)
    assert (m.low, m.high) == pytest.approx((0.5 - half, 0.5 + half), abs=1e-6)
    assert m.runs == 4
    assert m.low < 0 < m.high  # four seeds cannot tell these two apart
    assert str(m) == f"+0.50 [{0.5 - half:+.2f}, {0.5 + half:+.2f}]"


def test_paired_margin_pairs_runs_rather_than_pooling() -> None:
    # the seeds move both policies a lot, but a beats b by 0.1 on every one of them
    b = np.array([20.0, 30.0, 25.0, 35.0, 22.0])
    m = paired_margin(b + 0.1, b)
    assert m.low == pytest.approx(0.1) and m.high == pytest.approx(0.1)


def test_paired_margin_rejects_unpaired_input() -> None:
    with pytest.raises(ValueError, match="equal-length"):
        paired_margin([1.0, 2.0], [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match=">= 2 runs"):
        paired_margin([1.0], [2.0])


def test_gap_closed() -> None:
    assert gap_closed(30.0, 20.0, 60.0) == pytest.approx(0.25)
    assert gap_closed(10.0, 20.0, 60.0) == pytest.approx(-0.25)
    assert gap_closed(30.0, 20.0, 20.0) is None


def test_seed_comparison_needs_every_system_on_every_seed() -> None:
    from marconi.report.seeds import SeedComparison

    comparison = SeedComparison(["a", "b"])
    for seed, (x, y) in enumerate([(0.20, 0.25), (0.30, 0.33)]):
        comparison.add(seed, make_summary(system="a", flops_saved_rate=x, token_hit_rate=x))
        if seed == 0:
            comparison.add(seed, make_summary(system="b", flops_saved_rate=y, token_hit_rate=y))
    with pytest.raises(ValueError, match="same >= 2 seeds"):
        comparison.table()
    with pytest.raises(ValueError, match="not one of"):
        comparison.add(1, make_summary(system="c", flops_saved_rate=0.1))
    comparison.add(1, make_summary(system="b", flops_saved_rate=0.33, token_hit_rate=0.33))
    assert "+4.00 [" in comparison.table()  # b - a: +5 and +3 points
