"""A SwapSlices stream's ticket: the opener's signed word that the stream is its own, for this callee
and round (issue 24's trades; docs/sliced-exchange.md, "The all-gather riding the trades").

An update header is public (every manifest carries it), so anyone in the swarm can open a SwapSlices
stream under a partner's header. Its slices prove themselves against the header's Merkle root, so a
replayer can push nothing false; but the first stream under a partner's header in a round is the one
that carries the partner's aggregated slices to the callee and the callee's back. A replayer that
came first used to take that place: the real partner's results were then fetched after a wait, once
per partner and round, a slowdown any swarm member could cause for everyone. A ticket closes it: the
opener signs {run, round, from, to} with the key of its header, and only a stream whose ticket names
the callee, the round and the header's signer carries results. A ticket is sent only to its callee,
so only someone on the path (where TLS is the answer) could replay it.
"""

from __future__ import annotations

from protocol._generated import swarm_pb2
from protocol.envelope import UpdateHeader
from protocol.identity import Identity
from protocol.signing import SignatureError, open_signed, sign_body

SWAP_TICKET_TAG = "swarmloco/swap-ticket/v1"


def sign_swap_ticket(identity: Identity, *, run_id: str, round_: int, to: str) -> swarm_pb2.Signed:
    """Our ticket for the SwapSlices stream we open with peer `to` in round `round_`."""
    return sign_body(identity, SWAP_TICKET_TAG, {"run_id": run_id, "round": round_, "from": identity.peer_id, "to": to})


def ticket_holds(ticket: swarm_pb2.Signed | None, header: UpdateHeader, own_peer_id: str) -> bool:
    """Whether `ticket` makes a stream under `header` its signer's own stream with us: signed by the
    header's signer, for the header's run and round, naming us. False for no ticket, a bad
    signature, another signer, run, round or callee."""
    if ticket is None or not own_peer_id:
        return False
    try:
        fields, signer = open_signed(ticket, SWAP_TICKET_TAG)
    except SignatureError:
        return False
    return (signer == header.peer_id and fields.get("from") == header.peer_id and fields.get("to") == own_peer_id
            and fields.get("run_id") == header.run_id and fields.get("round") == header.round
            and type(fields.get("round")) is int)
