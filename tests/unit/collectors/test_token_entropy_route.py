"""The TokenEntropy records carry the route the gateway named for the request (vllm_xargs.entroloop_route),
so the tap's entropy and the gateway's audit of one request land under the same route; without it,
the node's default."""

from __future__ import annotations

from entroloop.collectors.vllm.emit import TokenEntropyEmitter
from entroloop.collectors.vllm.ledger import ShippedChunk


def _chunk(request_id: str, index: int, final: bool) -> ShippedChunk:
    return ShippedChunk(request_id, "ab" * 16, [1.0, 2.0], index, 2 * index, final, [5, 6])


def test_every_chunk_carries_the_gateways_route_and_the_route_is_forgotten_with_the_request() -> None:
    shipped: list = []
    emitter = TokenEntropyEmitter(shipped.append, node_id="n1", model="m", route="default")
    emitter.routes["req-1"] = "support"
    emitter(_chunk("req-1", 0, final=False))
    emitter(_chunk("req-2", 0, final=True))
    emitter(_chunk("req-1", 1, final=True))
    assert [(r.request_id, r.route) for r in shipped] == [("req-1", "support"), ("req-2", "default"),
                                                           ("req-1", "support")]
    assert emitter.routes == {}, "a finished request's route must not stay in memory"


def test_a_chunk_the_contract_refuses_is_logged_and_counted_never_raised_into_the_engine(caplog) -> None:
    """A tap bug once shipped a surprisal of -1e-7 nats: TokenEntropy refuses negative values, and the
    ValueError went up through vLLM's update_state and stopped the engine."""
    shipped: list = []
    emitter = TokenEntropyEmitter(shipped.append, node_id="n1", model="m")
    bad = ShippedChunk("req-bad", "ab" * 16, [1.0, 2.0], 0, 0, True, [5, 6], surprisals=[0.5, -1e-7])
    emitter(bad)  # must not raise
    emitter(_chunk("req-ok", 0, final=True))
    assert [r.request_id for r in shipped] == ["req-ok"]
    assert (emitter.errors, emitter.emitted) == (1, 1)
    assert "dropped the record of request req-bad" in caplog.text
