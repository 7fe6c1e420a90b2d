"""Optimal schedules (InferMax CSP) as upper bounds: formulation, backends, warm starts, replay."""
