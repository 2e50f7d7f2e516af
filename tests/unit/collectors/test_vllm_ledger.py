"""Row <-> request bookkeeping of the entropy tap, driven by fake batch updates (no vLLM, no torch).

The model: a simulated persistent batch where each request has a known entropy per token
(request k, token t -> k * 100 + t). Whatever the adds, removals, moves and swaps, every shipped
chunk must hold exactly its own request's values, in order.
"""

from __future__ import annotations

import random

import pytest
from entroloop.collectors.vllm.ledger import (
    AddedRow,
    MovedRow,
    RowLedger,
    credit,
    credit_sampling,
    credit_surprisals,
    needs_sampling_pass,
    sampled_token,
)
from hypothesis import given, settings
from hypothesis import strategies as st


def value_of(request_id: str, position: int) -> float:
    return int(request_id.removeprefix("r")) * 100 + position


def step(ledger: RowLedger, outputs: dict[str, list[int]], num_rows: int) -> None:
    """One engine step: reduce the logits rows, then each request samples one token (its id is
    the value's integer, so a chunk's ids can be checked against its values)."""
    snapshot = ledger.snapshot(num_rows)
    values = [0.0 if entry is None else value_of(entry[0].request_id, entry[1]) for entry in snapshot]
    credit(snapshot, values)
    for entry in snapshot:
        if entry is not None:
            outputs[entry[0].request_id].append(int(value_of(entry[0].request_id, entry[1])))


def test_removed_added_moved_keep_requests_apart() -> None:
    ledger = RowLedger()
    outputs = {f"r{k}": [] for k in range(4)}
    shipped = ledger.apply_update(
        [], [AddedRow(i, f"r{i}", output_token_ids=outputs[f"r{i}"]) for i in range(3)], []
    )
    assert shipped == []
    step(ledger, outputs, 3)
    step(ledger, outputs, 3)
    # r1 finishes, r3 arrives at the end (row 3), condense moves it into the hole (3 -> 1).
    shipped = ledger.apply_update(
        [1], [AddedRow(3, "r3", output_token_ids=outputs["r3"])], [MovedRow(3, 1, swap=False)]
    )
    assert [(c.request_id, c.values) for c in shipped] == [("r1", [100.0, 101.0])]
    step(ledger, outputs, 3)
    # An add onto an occupied row evicts (ships) the occupant instead of mixing the two.
    shipped = ledger.apply_update([], [AddedRow(2, "r9", output_token_ids=[])], [])
    assert [(c.request_id, c.values) for c in shipped] == [("r2", [200.0, 201.0, 202.0])]
    by_id = {c.request_id: c.values for c in ledger.ship_all()}
    assert by_id == {"r0": [0.0, 1.0, 2.0], "r3": [300.0], "r9": []}


def test_swap_exchanges_rows() -> None:
    ledger = RowLedger()
    outputs = {"r1": [], "r2": []}
    ledger.apply_update([], [AddedRow(0, "r1", output_token_ids=outputs["r1"]),
                             AddedRow(1, "r2", output_token_ids=outputs["r2"])], [])
    step(ledger, outputs, 2)
    ledger.apply_update([], [], [MovedRow(0, 1, swap=True)])
    step(ledger, outputs, 2)
    chunks = {c.request_id: c.values for c in ledger.ship_all()}
    assert chunks == {"r1": [100.0, 101.0], "r2": [200.0, 201.0]}


def test_discarded_step_is_overwritten_by_position() -> None:
    """A partial-prefill step samples a token vLLM throws away: same position, value replaced."""
    ledger = RowLedger()
    output: list[int] = []
    ledger.apply_update([], [AddedRow(0, "r5", output_token_ids=output)], [])
    snap = ledger.snapshot(1)
    credit(snap, [9.0])  # discarded sample: output stays empty
    snap = ledger.snapshot(1)
    credit(snap, [1.0])
    output.append(3)
    snap = ledger.snapshot(1)
    credit(snap, [2.0])
    output.append(4)
    (chunk,) = ledger.apply_update([0], [], [])
    assert chunk.values == [1.0, 2.0]
    assert chunk.final and chunk.chunk_index == 0 and chunk.first_token_index == 0


def test_preempted_request_continues_with_next_chunk() -> None:
    ledger = RowLedger()
    output: list[int] = []
    ledger.apply_update([], [AddedRow(0, "r1", trace_id="t" * 32, output_token_ids=output)], [])
    for _ in range(3):
        credit(ledger.snapshot(1), [value_of("r1", len(output))])
        output.append(1)
    (first,) = ledger.apply_update([0], [], [])
    ledger.apply_update([], [AddedRow(4, "r1", output_token_ids=output)], [])
    for _ in range(2):
        credit(ledger.snapshot(5), [0, 0, 0, 0, value_of("r1", len(output))])
        output.append(1)
    (second,) = ledger.ship_all()
    assert (first.chunk_index, first.first_token_index, first.values) == (0, 0, [100.0, 101.0, 102.0])
    assert (second.chunk_index, second.first_token_index, second.values) == (1, 3, [103.0, 104.0])
    assert second.trace_id == "t" * 32  # one trace across chunks


def test_long_generations_ship_in_chunks() -> None:
    ledger = RowLedger(chunk_tokens=4)
    ledger.apply_update([], [AddedRow(0, "r2")], [])  # no output list: positions by count
    for t in range(10):
        credit(ledger.snapshot(1), [value_of("r2", t)])
    chunks = ledger.drain_long() + ledger.ship_all()
    assert [c.first_token_index for c in chunks] == [0, 4, 8]
    assert [c.final for c in chunks] == [False, False, True]
    assert sum((c.values for c in chunks), []) == [value_of("r2", t) for t in range(10)]


def test_chunks_carry_the_sampled_ids_only_when_the_runner_gives_them() -> None:
    ledger = RowLedger(chunk_tokens=4)
    outputs: dict[str, list[int]] = {"r1": [], "r2": []}
    ledger.apply_update([], [AddedRow(0, "r1", output_token_ids=outputs["r1"]), AddedRow(1, "r2")], [])
    for _ in range(6):
        step(ledger, outputs, 2)
    chunks = ledger.drain_long() + ledger.ship_all()
    by_id = {}
    for c in chunks:
        by_id.setdefault(c.request_id, []).append(c)
    assert [c.token_ids for c in by_id["r1"]] == [[100, 101, 102, 103], [104, 105]]
    assert all(c.token_ids is None for c in by_id["r2"])  # no output list (Model Runner V2): no ids


def test_placeholder_ids_are_not_shipped() -> None:
    """An asynchronous scheduler's not-yet-filled placeholder (-1) must not become a token hash."""
    ledger = RowLedger()
    outputs = [5, -1]
    ledger.apply_update([], [AddedRow(0, "r1", output_token_ids=outputs)], [])
    ledger.rows[0].values = [0.5, 0.6]
    (chunk,) = ledger.ship_all()
    assert chunk.values == [0.5, 0.6] and chunk.token_ids is None


def test_v2_slot_snapshot_skips_partial_prefill() -> None:
    ledger = RowLedger()
    ledger.apply_update([], [AddedRow(3, "r1"), AddedRow(0, "r2")], [])
    snap = ledger.snapshot_slots([0, 3], [-5, 0])  # r2 still prefilling, r1 samples token 0
    credit(snap, [99.0, 100.0])
    chunks = {c.request_id: c.values for c in ledger.ship_all()}
    assert chunks == {"r1": [100.0], "r2": []}


def test_non_finite_values_are_counted_not_shipped() -> None:
    ledger = RowLedger()
    ledger.apply_update([], [AddedRow(0, "r1")], [])
    credit(ledger.snapshot(1), [float("nan")])
    trace = ledger.rows[0]
    assert trace.non_finite == 1
    (chunk,) = ledger.ship_all()
    assert chunk.values == [0.0]


def test_chunk_tokens_must_be_positive() -> None:
    with pytest.raises(ValueError):
        RowLedger(chunk_tokens=0)


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=0, max_value=2**32 - 1))
def test_random_schedules_never_mix_requests(seed: int) -> None:
    """Simulate vLLM's persistent batch (condense = one-way moves, reorders = swaps) at random."""
    rng = random.Random(seed)
    ledger = RowLedger(chunk_tokens=rng.choice([3, 1000]))
    rows: list[str | None] = []
    outputs: dict[str, list[int]] = {}
    budget: dict[str, int] = {}
    shipped: dict[str, list] = {}
    next_id = 0
    for _ in range(rng.randint(1, 40)):
        removed, added, moved = [], [], []
        # Finish requests that reached their length.
        for i, rid in enumerate(rows):
            if rid is not None and len(outputs[rid]) >= budget[rid]:
                removed.append(i)
                rows[i] = None
        # Add new requests into holes first, then at the end.
        for _ in range(rng.randint(0, 3)):
            rid = f"r{next_id}"
            next_id += 1
            outputs[rid], budget[rid] = [], rng.randint(1, 12)
            index = rows.index(None) if None in rows else len(rows)
            if index == len(rows):
                rows.append(None)
            rows[index] = rid
            added.append(AddedRow(index, rid, output_token_ids=outputs[rid]))
        # Condense: move the last occupied rows into holes.
        while None in rows:
            hole = rows.index(None)
            last = max((i for i, r in enumerate(rows) if r is not None), default=-1)
            if last < hole:
                del rows[hole:]
                break
            rows[hole], rows[last] = rows[last], None
            moved.append(MovedRow(last, hole, swap=False))
        # Random swaps (attention backends reorder the batch).
        for _ in range(rng.randint(0, 2)):
            if len(rows) >= 2:
                a, b = rng.sample(range(len(rows)), 2)
                rows[a], rows[b] = rows[b], rows[a]
                moved.append(MovedRow(a, b, swap=True))
        for chunk in ledger.apply_update(removed, added, moved) + ledger.drain_long():
            shipped.setdefault(chunk.request_id, []).append(chunk)
        step(ledger, outputs, len(rows))
    for chunk in ledger.ship_all():
        shipped.setdefault(chunk.request_id, []).append(chunk)
    assert set(shipped) == set(outputs)
    for rid, chunks in shipped.items():
        values = sum((c.values for c in chunks), [])
        assert values == [value_of(rid, t) for t in range(len(outputs[rid]))], rid
        # The sampled ids travel with their values, read from vLLM's own output list.
        assert all(c.token_ids is not None and len(c.token_ids) == len(c.values) for c in chunks if c.values), rid
        assert sum((c.token_ids or [] for c in chunks), []) == [int(v) for v in values], rid
        assert [c.chunk_index for c in chunks] == list(range(len(chunks)))


def test_surprisals_ship_with_their_chunk_only_when_every_one_was_credited() -> None:
    """Surprisals arrive one step late, by position, like the entropies; a chunk carries them only
    when each of its tokens has one (a gap would misalign them), and long generations split them
    with the values."""
    ledger = RowLedger(chunk_tokens=4)
    outputs: dict[str, list[int]] = {"r1": [], "r2": []}
    ledger.apply_update([], [AddedRow(0, "r1", output_token_ids=outputs["r1"]),
                             AddedRow(1, "r2", output_token_ids=outputs["r2"])], [])
    pending = None
    for t in range(6):
        if pending is not None:  # the last step's tokens are sampled now: credit their surprisals
            owners = [entry for entry in pending if sampled_token(entry) is not None]
            if t != 3:  # one step's surprisal of r2 never arrives
                credit_surprisals(owners, [sampled_token(e) / 1000 for e in owners])
            else:
                credit_surprisals(owners[:1], [sampled_token(owners[0]) / 1000])
        pending = ledger.snapshot(2)
        step_values = [value_of(e[0].request_id, e[1]) for e in pending]
        credit(pending, step_values)
        for entry in pending:
            outputs[entry[0].request_id].append(int(value_of(entry[0].request_id, entry[1])))
    owners = [entry for entry in pending if sampled_token(entry) is not None]
    credit_surprisals(owners, [sampled_token(e) / 1000 for e in owners])
    chunks = ledger.drain_long() + ledger.ship_all()
    by_id: dict[str, list] = {}
    for c in chunks:
        by_id.setdefault(c.request_id, []).append(c)
    assert [c.surprisals for c in by_id["r1"]] == [[0.1, 0.101, 0.102, 0.103], [0.104, 0.105]]
    # r2's token at position 2 (step 2, credited at step 3) has none: its first chunk goes without
    assert [c.surprisals for c in by_id["r2"]] == [None, [0.204, 0.205]]
    assert [c.values for c in by_id["r2"]] == [[200, 201, 202, 203], [204, 205]]


def test_sampling_entropies_follow_each_requests_temperature() -> None:
    """T = 1: the entropies themselves, with no second pass; another temperature: what its own pass
    credits, split into chunks with the values; greedy (or below vLLM's epsilon) and unknown: none."""
    ledger = RowLedger(chunk_tokens=3)
    ledger.apply_update([], [AddedRow(0, "r1", temperature=1.0), AddedRow(1, "r2", temperature=2.0),
                             AddedRow(2, "r3", temperature=0.0), AddedRow(3, "r4", temperature=1e-7),
                             AddedRow(4, "r5")], [])
    for _ in range(5):
        snapshot = ledger.snapshot(5)
        credit(snapshot, [value_of(e[0].request_id, e[1]) for e in snapshot])
        assert [needs_sampling_pass(e) for e in snapshot] == [False, True, False, False, False]
        hot = [e for e in snapshot if needs_sampling_pass(e)]
        credit_sampling(hot, [value_of(e[0].request_id, e[1]) + 0.5 for e in hot])
    chunks = ledger.drain_long() + ledger.ship_all()
    by_id: dict[str, list] = {}
    for c in chunks:
        by_id.setdefault(c.request_id, []).append(c)
    assert [c.sampling_entropies for c in by_id["r1"]] == [c.values for c in by_id["r1"]] == [[100, 101, 102], [103, 104]]
    assert [c.sampling_entropies for c in by_id["r2"]] == [[200.5, 201.5, 202.5], [203.5, 204.5]]
    for greedy_or_unknown in ("r3", "r4", "r5"):
        assert [c.sampling_entropies for c in by_id[greedy_or_unknown]] == [None, None]


def test_a_token_is_known_only_once_sampled_and_never_as_a_placeholder() -> None:
    ledger = RowLedger()
    outputs: list[int] = []
    ledger.apply_update([], [AddedRow(0, "r1", output_token_ids=outputs), AddedRow(1, "r2")], [])
    entry, no_list = ledger.snapshot(2)
    assert sampled_token(entry) is None  # not sampled yet
    outputs.append(-1)
    assert sampled_token(entry) is None  # an asynchronous scheduler's placeholder
    outputs[0] = 42
    assert sampled_token(entry) == 42
    assert sampled_token(no_list) is None and sampled_token(None) is None
