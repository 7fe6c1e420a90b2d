"""INT8 KV quantization (capacity, dequant and swap charges) and the KV lending ledger."""
import pytest
from hypothesis import given, settings, strategies as st

from costmodels import BatchShape, build_costmodel, get_gpu, get_model
from costmodels.errors import UserError
from sim.scenario.config import scenario_from_dict
from sim.kv.lending import LoanLedger
from sim.kv.quant import quantize_kv
from sim.kv.paged import KVCacheManager
from sim.engine.request import DONE, RUNNING, Request
from sim.scenario.build import build_simulation


def _cm():
    return build_costmodel({"kind": "linear"}, get_model("llama-2-7b"), get_gpu("a100-80gb"))


def test_int8_doubles_tokens_in_the_same_bytes():
    m = KVCacheManager(1000, block_size=10, swap_capacity_tokens=500)
    quantize_kv(m, 8)
    assert (m.capacity_tokens, m.total_blocks, m.swap_total_blocks, m.kv_bits) == (2000, 200, 100, 8)
    with pytest.raises(UserError, match="before any KV"):
        r = Request(0, 0, 10, 1)
        m2 = KVCacheManager(100, 10)
        m2.reserve(r, 10)
        quantize_kv(m2, 8)
    with pytest.raises(UserError, match="allowed: 4, 8, 16"):
        quantize_kv(KVCacheManager(100, 10), 3)


def test_dequantization_and_halved_swaps_are_charged():
    cm = _cm()
    kv = cm.kv_bytes_per_token
    plain = BatchShape(decode_context=[1000] * 8)
    quant = BatchShape(decode_context=[1000] * 8, dequant_tokens=8000, kv_bits=8)
    extra = cm.batch_time(quant) - cm.batch_time(plain)
    assert extra == pytest.approx(cm.dequant_time(8000)) and extra > 0
    s16 = cm.batch_time(BatchShape(decode_context=[10], swap_out_tokens=10000)) - cm.batch_time(plain) * 0
    s8 = cm.batch_time(BatchShape(decode_context=[10], swap_out_tokens=10000, kv_bits=8))
    base = cm.batch_time(BatchShape(decode_context=[10]))
    assert (s8 - base) == pytest.approx(cm.swap_time(5000))
    assert (s16 - base) == pytest.approx(cm.swap_time(10000))


def test_hidden_swap_costs_only_what_compute_does_not_cover():
    cm = _cm()
    base = BatchShape(decode_context=[500] * 64)
    t = cm.batch_time(base)
    small = BatchShape(decode_context=[500] * 64, swap_hidden_tokens=10)
    assert cm.batch_time(small) == pytest.approx(t)                    # fully hidden
    big = BatchShape(decode_context=[500] * 64, swap_hidden_tokens=200000)
    assert cm.batch_time(big) == pytest.approx(cm.swap_time(200000))   # compute hides inside the copy


def test_engine_charges_dequant_for_every_cached_token_read():
    raw = {"memory": {"M": 4096, "block_size": 16, "kv_quant_bits": 8},
           "policy": {"name": "vllm"}, "workload": {"kind": "offline", "num_requests": 4, "prompt": 64, "output": 4}}
    sim = build_simulation(scenario_from_dict(raw))
    assert sim.memory.capacity_tokens == 8192
    seen = []
    orig = sim.costmodel.batch_time
    sim.costmodel.batch_time = lambda s: (seen.append((s.dequant_tokens, sum(s.decode_context))), orig(s))[1]
    sim.run()
    assert seen[0][0] == 0                                   # first prefill reads no cached KV
    assert all(d == ctx for d, ctx in seen[1:])              # each decode step dequantizes what it reads
    raw["memory"]["kv_dtype"] = "int8"
    with pytest.raises(UserError, match="not both"):
        build_simulation(scenario_from_dict(raw))


def _running(i, cached, blocks):
    r = Request(i, 0, cached, 100)
    r.state, r.cached, r.blocks = RUNNING, cached, blocks
    return r


def test_loan_moves_blocks_and_returns_them_to_the_lender():
    m = KVCacheManager(1000, block_size=10)
    host, guest = _running(1, 20, 0), _running(2, 30, 0)
    m.reserve(host, 120)
    m.reserve(guest, 30)
    ledger = LoanLedger(m)
    assert ledger.lendable_blocks(host) == 12 - 3
    assert not ledger.lend(host, guest, 10)                  # more than the unwritten part
    assert ledger.lend(host, guest, 5)
    assert (host.blocks, guest.blocks, m.free_blocks) == (7, 8, 85)
    m.free(guest)                                            # engine frees a finished borrower...
    guest.state = DONE
    assert ledger.settle(guest, lambda r: r.state == RUNNING) == 5   # ...and the loan goes back to the host
    assert (host.blocks, m.free_blocks) == (12, 88)      # the guest's own 3 blocks go to the pool


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 5), st.integers(1, 4), st.booleans()), max_size=30))
def test_ledger_never_double_counts_blocks(ops):
    """Random lend / finish sequences: Σ held blocks + free == total; written KV always stays in owned blocks."""
    m = KVCacheManager(4000, block_size=8)
    reqs = [_running(i, 8 * (i + 1), 0) for i in range(6)]
    for r in reqs:
        m.reserve(r, r.cached + 200)
    ledger = LoanLedger(m)
    alive = lambda r: r.state == RUNNING  # noqa: E731
    for a, b, n, finish in ops:
        lender, borrower = reqs[a], reqs[b]
        if finish:
            if borrower.state == RUNNING:
                m.free(borrower)
                borrower.state = DONE
                ledger.settle(borrower, alive)
        elif a != b and alive(lender) and alive(borrower):
            ledger.lend(lender, borrower, n)
        held = sum(r.blocks for r in reqs if r.state == RUNNING)
        assert held + m.free_blocks == m.total_blocks
        for r in reqs:
            if r.state == RUNNING:
                assert r.blocks * m.block_size >= r.cached
            else:
                assert r.blocks == 0
        for loan in ledger.by_borrower.values():
            assert loan.borrower.state == RUNNING and loan.borrower.blocks >= loan.blocks
