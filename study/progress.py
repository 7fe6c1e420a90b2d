"""Progress bars with ETA (tqdm) for sweeps and for long single runs; silent when not wanted."""
from __future__ import annotations

import sys


class _NoBar:
    def update(self, n=1):
        pass

    def set_postfix(self, *a, **k):
        pass

    def close(self):
        pass


def progress_bar(total: int, desc: str = "", unit: str = "it", initial: int = 0, enabled: bool | None = None):
    """A tqdm bar on stderr; `enabled=None` shows it only when stderr is a terminal."""
    if enabled is None:
        enabled = sys.stderr.isatty()
    if not enabled:
        return _NoBar()
    from tqdm import tqdm
    return tqdm(total=total, initial=initial, desc=desc, unit=unit, file=sys.stderr, dynamic_ncols=True,
                smoothing=0.1)


def attach_run_progress(sim, enabled: bool | None = None, every: int = 64):
    """Show completed requests of one Simulation as it runs, by wrapping its policy's on_commit hook.

    The wrapper only reads `sim.completed`, so the run is unchanged; it refreshes every `every` iterations."""
    bar = progress_bar(len(sim.requests), desc="requests", unit="req", enabled=enabled)
    if isinstance(bar, _NoBar):
        return bar
    policy = sim.policy
    inner = policy.on_commit
    seen = [0, 0]

    def on_commit(view, batch, batch_time_s):
        inner(view, batch, batch_time_s)
        seen[1] += 1
        if seen[1] % every == 0 or sim.completed == len(sim.requests):
            bar.update(sim.completed - seen[0])
            seen[0] = sim.completed

    policy.on_commit = on_commit
    return bar
