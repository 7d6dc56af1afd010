"""The coordinator's own spot checks stay within its byte budget (peer/exchange/spot_budget.py)."""

from __future__ import annotations

from peer.exchange.spot_budget import BUDGET_MODELS, SpotBudget
from protocol.accounting import ByteCounter

NUMEL = 10_000  # budget: 2 fp32 models = 80,000 bytes


def test_our_spot_check_runs_where_it_fits_and_is_skipped_where_it_would_not():
    ledger = ByteCounter("coordinator")
    budget = SpotBudget(ledger, NUMEL)
    assert budget.budget == BUDGET_MODELS * 4 * NUMEL == 80_000
    budget.applied(20_000)  # the last gather: 20 KB (fp16 results of 10k values)
    # 4 peers of 20 KB payloads, S = 4: a check fetches 3 inputs' slices = 15 KB; 10 KB of control so far
    ledger.add("peer-a", sent=6_000, received=4_000)
    assert budget.spot_checks(1, 1, [20_000] * 4, 4) == 1  # 10 + 20 + 15 KB <= 80 KB
    # 64 peers, S = 32: a check fetches 63 inputs' slices of 20 KB / 32 = 39.4 KB; with 25 KB of control it does not fit
    ledger.add("peer-b", sent=15_000)
    assert budget.spot_checks(1, 1, [20_000] * 64, 32) == 0  # 25 + 20 + 39.4 KB > 80 KB
    assert budget.skipped == 1
    budget.applied(20_000)  # a new round: its own count starts from here
    assert budget.spot_checks(2, 1, [20_000] * 64, 32) == 1  # 0 + 20 + 39.4 KB
    assert budget.spot_checks(2, 0, [20_000] * 64, 32) == 0  # none wanted, none drawn
    assert SpotBudget(None, NUMEL).spot_checks(2, 1, [10**9] * 64, 32) == 1  # no ledger: unbounded (as before)


def test_what_is_still_to_send_counts_against_the_budget():
    budget = SpotBudget(ByteCounter("coordinator"), NUMEL)
    budget.applied(20_000)
    assert budget.spot_checks(1, 1, [20_000] * 64, 32) == 1  # 0 + 20 + 39.4 KB <= 80 KB
    assert budget.spot_checks(1, 1, [20_000] * 64, 32, still_to_send=64 * 400) == 0  # + 25.6 KB of results to 64 peers
