"""A backend-neutral MILP: variables with bounds and types, sparse linear rows, a linear objective, c² links."""
from __future__ import annotations

INF = float("inf")


class MilpModel:
    """Built once by solver.formulation, then handed to any backend (HiGHS, Gurobi)."""

    def __init__(self):
        self.lb, self.ub, self.integer, self.obj, self.names = [], [], [], [], []
        self.index = {}                 # key -> column
        self.rows = []                  # (cols, coefs, lo, hi)
        self.squares = []               # (q_col, c_col, c_max): q >= c², the prefill attention term
        self.obj_offset = 0.0

    def var(self, key, lb=0.0, ub=INF, integer=False, cost=0.0) -> int:
        k = len(self.lb)
        self.lb.append(float(lb))
        self.ub.append(float(ub))
        self.integer.append(bool(integer))
        self.obj.append(float(cost))
        self.index[key] = k
        self.names.append("_".join(str(p) for p in key))
        return k

    def binary(self, key, cost=0.0) -> int:
        return self.var(key, 0, 1, True, cost)

    def row(self, terms, lo=-INF, hi=INF) -> None:
        """lo <= Σ coef·x <= hi, terms as [(col, coef), ...] (repeated columns are summed)."""
        acc = {}
        for col, coef in terms:
            acc[col] = acc.get(col, 0.0) + coef
        cols = [c for c, v in acc.items() if v != 0.0]
        self.rows.append((cols, [acc[c] for c in cols], float(lo), float(hi)))

    def le(self, terms, rhs):
        self.row(terms, hi=rhs)

    def ge(self, terms, rhs):
        self.row(terms, lo=rhs)

    def eq(self, terms, rhs):
        self.row(terms, lo=rhs, hi=rhs)

    def add_cost(self, col, coef) -> None:
        self.obj[col] += coef

    @property
    def num_vars(self) -> int:
        return len(self.lb)

    @property
    def num_int(self) -> int:
        return sum(self.integer)

    @property
    def num_rows(self) -> int:
        return len(self.rows)

    def size(self) -> dict:
        return {"variables": self.num_vars, "integer_variables": self.num_int, "constraints": self.num_rows,
                "nonzeros": sum(len(r[0]) for r in self.rows), "square_terms": len(self.squares)}

    def start_vector(self, values: dict) -> list:
        """A full column vector from {key: value}; keys the model lacks are ignored, missing columns get lb."""
        x = list(self.lb)
        for key, col in self.index.items():
            if key in values:
                x[col] = float(values[key])
        return x

    def violations(self, x, tol: float = 1e-6) -> list:
        """Rows and bounds that `x` breaks, as readable strings (for checking warm starts and extractions)."""
        bad = []
        for k, (lo, hi) in enumerate(zip(self.lb, self.ub)):
            if x[k] < lo - tol or x[k] > hi + tol:
                bad.append(f"bound {self.names[k]}={x[k]} not in [{lo}, {hi}]")
        for cols, coefs, lo, hi in self.rows:
            act = sum(x[c] * v for c, v in zip(cols, coefs))
            if act < lo - tol * max(1, abs(lo)) or act > hi + tol * max(1, abs(hi)):
                bad.append(" ".join(f"{v:+g}*{self.names[c]}({x[c]:g})" for c, v in zip(cols, coefs))
                           + f" = {act:g} not in [{lo:g}, {hi:g}]")
        return bad
