"""Measure one GPU's board power at idle and under loads of known compute and memory utilisation (for the energy
model's coefficients in profiles/gpu-economics.yaml). Needs torch and nvidia-smi; writes JSON to argv[1]."""
from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

PEAK_BF16 = {"H100": 989.4e12, "H200": 989.4e12, "A100": 312e12}
PEAK_HBM = {"H100": 3350e9, "H200": 4800e9, "A100": 2039e9}


def smi(fields: str) -> str:
    return subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
                          capture_output=True, text=True, check=True).stdout.strip()


class PowerSampler:
    """Polls power.draw every 50 ms in a thread; mean over the window between start() and stop()."""

    def __init__(self):
        self.samples, self.on = [], False

    def _loop(self):
        while self.on:
            try:
                self.samples.append(float(smi("power.draw").splitlines()[0]))
            except Exception:
                pass
            time.sleep(0.05)

    def run(self, seconds, work=None):
        self.samples, self.on = [], True
        th = threading.Thread(target=self._loop, daemon=True)
        th.start()
        t0, reps = time.perf_counter(), 0
        while time.perf_counter() - t0 < seconds:
            if work is not None:
                work()
                reps += 1
            else:
                time.sleep(0.05)
        self.on = False
        th.join()
        s = sorted(self.samples)
        tail = s[len(s) // 4:]                    # drop the ramp-up quarter
        return sum(tail) / max(1, len(tail)), reps, len(s)


def main():
    out = {"smi": smi("name,power.draw,power.limit,power.default_limit,power.max_limit,power.min_limit,clocks.sm")}
    name = out["smi"].split(",")[0]
    key = next((k for k in PEAK_BF16 if k in name), "H100")
    sampler = PowerSampler()
    out["idle_w"], _, out["idle_samples"] = sampler.run(6.0)
    try:
        import torch
    except ImportError:
        out["torch"] = None
        print(json.dumps(out, indent=1))
        json.dump(out, open(sys.argv[1], "w"), indent=1)
        return
    out["torch"] = torch.__version__
    dev = "cuda"
    phases = []

    def gemm_phase(m, n, k, label, seconds=8.0):
        a = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        b = torch.randn(k, n, device=dev, dtype=torch.bfloat16)
        for _ in range(3):
            a @ b
        torch.cuda.synchronize()
        inner = 20

        def work():
            for _ in range(inner):
                a @ b
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        w, reps, ns = sampler.run(seconds, work)
        dt = time.perf_counter() - t0
        calls = reps * inner
        flops = 2.0 * m * n * k * calls / dt
        nbytes = 2.0 * (m * k + k * n + m * n) * calls / dt
        phases.append({"phase": label, "power_w": w, "samples": ns, "mfu": flops / PEAK_BF16[key],
                       "mbu": nbytes / PEAK_HBM[key]})

    def copy_phase(gib, label, seconds=8.0):
        n = int(gib * 2 ** 30 // 2)
        x = torch.empty(n, device=dev, dtype=torch.bfloat16)
        y = torch.empty_like(x)
        inner = 10

        def work():
            for _ in range(inner):
                y.copy_(x)
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        w, reps, ns = sampler.run(seconds, work)
        dt = time.perf_counter() - t0
        nbytes = 2.0 * n * 2 * reps * inner / dt
        phases.append({"phase": label, "power_w": w, "samples": ns, "mfu": 0.0, "mbu": nbytes / PEAK_HBM[key]})

    gemm_phase(8192, 8192, 8192, "gemm-8192")
    gemm_phase(2048, 2048, 2048, "gemm-2048")
    gemm_phase(16, 8192, 8192, "gemv-like m=16 (decode)")
    gemm_phase(256, 8192, 8192, "gemm m=256")
    copy_phase(2.0, "copy 2 GiB")
    out["phases"] = phases
    out["idle_after_w"], _, _ = sampler.run(5.0)
    print(json.dumps(out, indent=1))
    json.dump(out, open(sys.argv[1], "w"), indent=1)


if __name__ == "__main__":
    main()
