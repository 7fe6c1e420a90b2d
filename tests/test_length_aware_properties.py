"""Random workloads × EconoServe/ALISE variants × FP16/INT8 KV: memory and lending invariants at every step,
every request completes with exactly its output tokens."""
from hypothesis import HealthCheck, given, settings, strategies as st

from costmodels import get_gpu, get_model
from costmodels.linear import LinearCostModel, default_profile_path
from policies import build_policy
from sim.engine import Simulation
from sim.kv.quant import quantize_kv
from sim.kv.paged import KVCacheManager
from sim.engine.request import Request
from tests.kv_invariants import instrument

_CM = LinearCostModel.load(default_profile_path("a100-80gb", "llama-2-7b"), model=get_model("llama-2-7b"),
                           gpu=get_gpu("a100-80gb"))
POLICIES = ["econoserve", "econoserve-d", "alise", "alise-defer", "alise-recompute"]

# (prompt, output, arrival, predicted/true ratio)
workloads = st.lists(st.tuples(st.integers(1, 200), st.integers(1, 80), st.floats(0, 1.0),
                               st.sampled_from([0.3, 0.8, 1.0, 1.5, 3.0])), min_size=1, max_size=30)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs=workloads, M=st.sampled_from([320, 640, 2048]), bits=st.sampled_from([16, 8]))
def test_invariants(specs, M, bits):
    for name in POLICIES:
        reqs = [Request(i, a, p, o, predicted_output_tokens=max(1, round(o * k)))
                for i, (p, o, a, k) in enumerate(specs)]
        mem = KVCacheManager(M, 16, swap_capacity_tokens=10 * M)
        if bits == 8:
            quantize_kv(mem, 8)
        policy = build_policy({"name": name, "tfs_tokens": 256} if name.startswith("econo") else {"name": name})
        sim = Simulation(reqs, policy, _CM, mem)
        instrument(sim)
        res = sim.run()
        req = res.requests
        done = req[req.status == "done"]
        assert set(req.status) <= {"done", "infeasible"}, name
        assert (done.generated_tokens == done.output_tokens).all(), name
        assert (res.iterations.kv_alloc_tokens <= res.capacity_tokens).all(), name
        if name.startswith("econo"):
            assert not policy.ledger.by_borrower, name
