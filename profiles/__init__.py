"""GPU profiler harness and the profiled timings / fitted coefficient files it produces."""
