"""Tools built on runs: sweeps and executors, capacity search, SLO regression, plots, trace tools, paper findings."""
