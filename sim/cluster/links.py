"""KV-transfer links between disaggregated prefill and decode replicas: bandwidth and latency per link kind.

Round datasheet numbers, one direction, per GPU (each GPU of a tensor-parallel group sends its own KV shard over
its own link, so a group of tp GPUs moves tp times as fast): NVLink (A100 NVLink 3: 300 GB/s each way),
InfiniBand NDR/HDR (400/200 Gb/s), Ethernet 100/25 Gb/s (DistServe's and EconoServe's cross-node setting is
100 Gb/s), PCIe 4.0 x16 (about 25 GB/s usable). Latencies are per transfer, not per byte."""
from __future__ import annotations

from dataclasses import dataclass

from costmodels.errors import UserError

LINKS = {  # name: (bytes/s, seconds)
    "nvlink": (300e9, 3e-6),
    "infiniband-ndr": (50e9, 5e-6),
    "infiniband-hdr": (25e9, 5e-6),
    "ethernet-100g": (12.5e9, 20e-6),
    "ethernet-25g": (3.125e9, 30e-6),
    "pcie": (25e9, 10e-6),
}


@dataclass(frozen=True)
class Link:
    bandwidth: float      # bytes/s per GPU, one direction
    latency: float        # seconds per transfer
    name: str = "custom"

    def transfer_s(self, nbytes: float, gpus: int = 1) -> float:
        """Time to move `nbytes` spread over `gpus` parallel links (bytes ÷ bandwidth + latency)."""
        return nbytes / (self.bandwidth * max(1, gpus)) + self.latency


def build_link(spec, where: str = "cluster.disaggregation.link") -> Link:
    """{kind: NAME} (a preset, optionally overridden) or {bandwidth_gbps: B, latency_us: L}."""
    if spec is None:
        spec = {"kind": "ethernet-100g"}
    if isinstance(spec, str):
        spec = {"kind": spec}
    if not isinstance(spec, dict):
        raise UserError(f"{where}: expected a link kind or a mapping, got {spec!r}")
    bad = set(spec) - {"kind", "bandwidth_gbps", "latency_us"}
    if bad:
        raise UserError(f"{where}: unknown key(s) {', '.join(sorted(bad))}; allowed: kind, bandwidth_gbps, latency_us")
    name = spec.get("kind", "custom")
    if name != "custom" and name not in LINKS:
        raise UserError(f"{where}.kind: unknown link {name!r}; allowed: {', '.join(LINKS)} (or give bandwidth_gbps "
                        "and latency_us)")
    bw, lat = LINKS.get(name, (None, 0.0))
    if "bandwidth_gbps" in spec:
        g = spec["bandwidth_gbps"]
        if isinstance(g, bool) or not isinstance(g, (int, float)) or not g > 0:
            raise UserError(f"{where}.bandwidth_gbps: must be a number > 0 (Gbit/s), got {g!r}")
        bw = g * 1e9 / 8
    if bw is None:
        raise UserError(f"{where}: give kind ({', '.join(LINKS)}) or bandwidth_gbps")
    if "latency_us" in spec:
        v = spec["latency_us"]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 0:
            raise UserError(f"{where}.latency_us: must be a number >= 0, got {v!r}")
        lat = v * 1e-6
    return Link(float(bw), float(lat), name)
