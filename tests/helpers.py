"""Test helpers: a unit-time cost model and a recorder that captures each batch's composition."""
from costmodels.base import CostModel
from policies import build_policy
from sim.engine import Simulation
from sim.kv.paged import KVCacheManager
from sim.engine.request import Request


class TokenCost(CostModel):
    """Hand-computable batch time: `per_prefill_token`·prefill tokens + `decode_step` if any decode, else 0."""

    def __init__(self, per_prefill_token=0.0, decode_step=0.0, per_batch=1.0):
        super().__init__()
        self.per_prefill_token, self.decode_step, self.per_batch = per_prefill_token, decode_step, per_batch

    def compute_time(self, shape):
        return (self.per_batch + self.per_prefill_token * sum(shape.prefill_tokens)
                + (self.decode_step if shape.decode_context else 0.0))


def make_requests(specs, arrival=0.0):
    """specs: list of (prompt, output) or (prompt, output, arrival)."""
    out = []
    for i, s in enumerate(specs):
        a = s[2] if len(s) > 2 else arrival
        out.append(Request(i, a, s[0], s[1]))
    return out


def run_recorded(policy_spec, specs, M, block_size=1, cost=None, **memkw):
    """Run a tiny workload; return (sim result, list of batches as [(id, tokens), ...])."""
    policy = build_policy(policy_spec)
    batches = []
    inner = policy.schedule

    def schedule(view):
        b = inner(view)
        if b.reqs:
            batches.append([(r.id, c) for r, c in zip(b.reqs, b.tokens)])
        return b

    policy.schedule = schedule
    # The plain loop: fast-forward skips schedule() calls (tests/test_fastforward.py proves the tables equal).
    sim = Simulation(make_requests(specs), policy, cost or TokenCost(), KVCacheManager(M, block_size, **memkw),
                     fast_forward=False)
    return sim.run(), batches
