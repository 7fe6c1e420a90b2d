"""What the solver optimises: the requests, the limits C/P/M/R_max, the switches, and the linear batch-time terms."""
from __future__ import annotations

from dataclasses import dataclass, field

from costmodels.errors import UserError
from costmodels.linear import LinearCostModel

OBJECTIVES = ("makespan", "sum_completion", "mean_ttft")
BACKENDS = ("auto", "serial", "search", "highs", "gurobi", "cpsat")


@dataclass
class SolverOptions:
    """Knobs of the CSP (spec infermax §4) and of the solve; every field has a default."""
    C: int = 4096                      # max tokens per batch
    P: int = 4096                      # max prefill tokens per batch
    p_counts_decode_tokens: bool = False  # spec A3: False = CSP (5) (prefill tokens only); True = heuristics' reading
    R_max: int = 0                     # max running size (requests holding KV during a batch); 0 = unlimited
    hybrid: bool = True                # prefill and decode requests may share a batch
    chunked: bool = True               # a prompt may be split across batches
    evictions: bool = True             # False = eviction-free optimum (e ≡ 0)
    objective: str = "makespan"        # makespan | sum_completion | mean_ttft
    goal_factor: float = 0.0           # > 0: feasibility "is there a schedule with latency <= goal_factor × best preset?"
    horizon: int = 0                   # batch slots J; 0 = the most iterations any preset needed
    backend: str = "auto"              # auto (skeleton QPs, exact search, then a MILP) | serial | search | highs |
    #                                    gurobi | cpsat
    time_limit_s: float = 60.0
    mip_gap: float = 1e-6
    threads: int = 1
    presets: list = field(default_factory=lambda: ["vllm", "vllm-ef", "sarathi", "sarathi-ef", "sarathi-p=c",
                                                   "sarathi-p=c-ef", "vllm-hy", "sarathi-nocp"])
    warm_start: bool = True
    exact_square_max: int = 64         # HiGHS: prompts up to this length get every integer secant of c² up front
    token_cuts: int = 4000             # add token-indexed KV cuts when Σ_i O_i × J is at most this (0 = never)
    heuristic_effort: float = 0.05     # HiGHS mip_heuristic_effort (its default); more finds better schedules sooner
    cut_rounds: int = 8                # HiGHS: re-solves that add the secant of each violated c² (exactness loop)
    node_limit: int = 0                # > 0: a budget that is the same on any machine: branch-and-bound nodes per
    #                                    HiGHS solve, states the exact search expands, QPs the skeleton search
    #                                    solves (0 = none; time_limit_s still applies)

    def validate(self, where: str = "solver") -> None:
        if self.objective not in OBJECTIVES:
            raise UserError(f"{where}.objective: {self.objective!r} is not allowed; allowed: {', '.join(OBJECTIVES)}")
        if self.backend not in BACKENDS:
            raise UserError(f"{where}.backend: {self.backend!r} is not allowed; allowed: {', '.join(BACKENDS)}")
        for k in ("C", "P", "R_max", "horizon", "threads", "cut_rounds", "token_cuts", "node_limit"):
            v = getattr(self, k)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise UserError(f"{where}.{k}: must be a non-negative integer, got {v!r}")
        if self.C == 0:
            raise UserError(f"{where}.C: must be a positive number of tokens per batch")
        if self.time_limit_s <= 0:
            raise UserError(f"{where}.time_limit_s: must be > 0 seconds, got {self.time_limit_s}")
        if not 0 <= self.mip_gap < 1:
            raise UserError(f"{where}.mip_gap: must be in [0, 1), got {self.mip_gap}")
        if self.goal_factor < 0:
            raise UserError(f"{where}.goal_factor: must be >= 0, got {self.goal_factor}")


@dataclass(frozen=True)
class BatchTimeTerms:
    """T(batch) in ms = tok·N + base·𝟙[non-empty] + sq·Σ_prefill c² + pbase·𝟙[prefill] + kv·K + dbase·𝟙[decode].

    These are exactly LinearCostModel.time_from_sums with the 'paper' feature set (spec §3.1): the solver and the
    replay both use the same model object, so their latencies agree to rounding."""
    tok: float
    base: float
    sq: float
    pbase: float
    kv: float
    dbase: float

    @classmethod
    def from_model(cls, cm: LinearCostModel) -> "BatchTimeTerms":
        k = cm._k
        return cls(tok=1e3 * (k["a_o"] + k["step_a"]), base=1e3 * (k["b_o"] + k["step_b"] + cm.overhead_s),
                   sq=1e3 * k["a_p"], pbase=1e3 * k["b_p"], kv=1e3 * k["a_d"], dbase=1e3 * k["b_d"])


def paper_cost_model(cm) -> LinearCostModel:
    """The 'paper' feature set of a linear model (Σc², KV reads, biases), which the MILP can express exactly."""
    if not isinstance(cm, LinearCostModel):
        raise UserError(f"costmodel.kind: the optimal-schedule solver needs the linear cost model, got {cm.kind!r}")
    if cm.features == "paper":
        return cm
    return LinearCostModel(dict(cm.coefficients), layers=cm.layers, features="paper", overhead_s=cm.overhead_s,
                           model=cm.model, gpu=cm.gpu, tp=cm.tp, provenance=cm.provenance)


@dataclass
class SolverInstance:
    """Requests (prompt I0, output O, arrival) plus the KV budget M, the options, and the cost model."""
    prompt: list
    output: list
    arrival: list
    M: int
    options: SolverOptions
    costmodel: LinearCostModel

    def __post_init__(self):
        self.costmodel = paper_cost_model(self.costmodel)
        self.terms = BatchTimeTerms.from_model(self.costmodel)
        self.options.validate()
        n = len(self.prompt)
        if n == 0:
            raise UserError("workload: the solver needs at least one request")
        if not (len(self.output) == len(self.arrival) == n):
            raise UserError("workload: prompt, output and arrival lists differ in length")
        for i in range(n):
            if self.prompt[i] < 1 or self.output[i] < 1:
                raise UserError(f"workload: row {i}: prompt and output must be >= 1 tokens")
            if self.peak(i) > self.M:
                raise UserError(f"workload: row {i}: prompt+output-1 = {self.peak(i)} tokens exceed M = {self.M}; "
                                f"no schedule can complete it")
            if self.arrival[i] < 0:
                raise UserError(f"workload: row {i}: arrival_s must be >= 0")

    @property
    def n(self) -> int:
        return len(self.prompt)

    @property
    def online(self) -> bool:
        return any(a > 0 for a in self.arrival)

    def peak(self, i: int) -> int:
        """U_i = I0 + O − 1: the most KV a request ever holds (the last token is never cached)."""
        return self.prompt[i] + self.output[i] - 1

    @property
    def P_eff(self) -> int:
        return min(self.options.P or self.options.C, self.options.C)

    @property
    def R_eff(self) -> int:
        return self.options.R_max or self.n
