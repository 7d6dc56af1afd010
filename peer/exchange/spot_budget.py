"""The coordinator's own spot checks, within its byte budget (issue 24: the coordinator moves at
most about 2 fp32 models' worth per round).

A sliced round costs the coordinator its control (commitments in, one manifest out to every peer,
the owners' signed results in and out: O(n) a peer) and the gather of θ_{r+1}'s aggregated slices
(A, about one model at fp16 results); a spot check of its own adds one slice's n − 1 inputs,
(n − 1)·P/S, which at 64 peers of fp16 payloads and S = 32 is one more fp32 model. So in the
rounds where it draws a spot check, the coordinator measured ~2.4 models at 64 peers
(benchmarks/scale.md). `SpotBudget` runs our draw only when what the ledger shows since the last
applied round, plus the gather, plus the check, fits in BUDGET_MODELS; otherwise the check is
skipped that round and said so in the log. Peers' spot checks are unaffected: each honest peer
still checks with p = min(1, coverage·S/(n·k)), so the swarm still recomputes each slice about
`coverage` times per round (the coordinator was one checker among n + 1: its share is 1/(n + 1),
and it is only dropped where n is large). Small swarms fit the budget and are unchanged.
"""

from __future__ import annotations

import logging

from protocol.accounting import ByteCounter

log = logging.getLogger("swarmloco.coordinator")

BUDGET_MODELS = 2.0  # fp32 models' worth a round


class SpotBudget:
    def __init__(self, ledger: ByteCounter | None, numel: int) -> None:
        self.ledger = ledger
        self.budget = BUDGET_MODELS * 4 * numel
        self.gathered = 4 * numel  # the last round's gathered result bytes (an fp32 model before the first)
        self._mark = self._moved()
        self.skipped = 0  # rounds whose own spot check did not fit

    def _moved(self) -> int:
        if self.ledger is None:
            return 0
        total = self.ledger.total()
        return total.sent + total.received

    def spot_checks(self, round_: int, wanted: int, payload_bytes: list[int], num_slices: int, *, still_to_send: int = 0) -> int:
        """How many of our `wanted` spot checks this round may draw (wanted, or 0 when they do
        not fit). payload_bytes: each manifest entry's payload size; still_to_send: the control
        this round will still move after the decision (the final results every peer fetches)."""
        if wanted <= 0 or self.ledger is None:
            return wanted
        check = wanted * max(0, sum(payload_bytes) - min(payload_bytes, default=0)) / max(1, num_slices)  # n − 1 inputs each
        spent = self._moved() - self._mark + still_to_send
        if spent + self.gathered + check <= self.budget:
            return wanted
        self.skipped += 1
        log.info("round %d: no spot check of our own this round: %.0f KB moved so far or still to send + %.0f KB to gather + %.0f KB for the check "
                 "> %.0f KB (%.1f fp32 models); the peers' spot checks cover it", round_, spent / 1e3, self.gathered / 1e3,
                 check / 1e3, self.budget / 1e3, BUDGET_MODELS)
        return 0

    def applied(self, gathered_bytes: int) -> None:
        """A round was applied: the next round's count starts here."""
        if gathered_bytes > 0:
            self.gathered = gathered_bytes
        self._mark = self._moved()
