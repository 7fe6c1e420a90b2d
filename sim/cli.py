"""The `servesim` command: run scenarios, list policies; other packages plug in their own subcommands."""
from __future__ import annotations

import argparse
import importlib
import math
import sys
import textwrap

from costmodels.errors import UserError
from sim.scenario.extensions import load_extensions

# Modules that add subcommands: each has `register(subparsers)` and sets `func` on its parsers.
PLUGINS: list[str] = [
    "study.trace_tools",
    "study.sweep",
    "study.capacity",
    "study.plots",
    "costmodels.cli",
    "solver.cli",
    "study.findings.report",
    "study.regress",
    "study.validate",
    "study.plan",
]



MAX_REPLICA_LINES = 40    # the terminal shows the busiest replicas of a larger cluster; replicas.csv has all

def _fmt(v):
    if isinstance(v, float):
        if math.isnan(v):
            return "-"
        return f"{v:.4g}"
    return str(v)


SUMMARY_KEYS = ("requests", "completed", "infeasible", "makespan_s", "tps", "request_throughput", "ttft_mean",
                "ttft_p99", "tpot_mean", "tbt_p99_p99", "e2e_mean", "evictions", "swaps", "batch_size_mean",
                "running_mean", "kv_util_mean", "kv_util_max", "slo_attainment", "goodput_rps", "iterations",
                "replicas", "gpus", "gpu_seconds", "goodput_rps_per_gpu", "load_imbalance", "kv_transfer_s_mean",
                "kv_transfer_share", "handoff_wait_s_mean", "prefix_hit_rate", "autoscale_ups", "autoscale_downs",
                "replicas_held_mean", "replicas_held_max", "gpu_hours", "cost_usd",
                "usd_per_million_tokens", "energy_j", "joules_per_token", "power_w_mean", "costmodel_kind", "costmodel_file",
                "overheads", "kv_capacity_tokens", "wall_s")


MECHANISM_PREFIXES = ("spec_", "radix_", "policy_sglang_", "session_", "lora_", "prefix_disk_")   # speculative decoding; SGLang radix cache, scheduler


def print_summary(summary: dict, title: str = "", file=None) -> None:
    file = file or sys.stdout
    if title:
        print(title, file=file)
    from sim.metrics.glossary import unit
    keys = [k for k in SUMMARY_KEYS if k in summary] + sorted(k for k in summary if k.startswith("slo_attainment_"))
    keys += [k for k in summary if k.startswith(MECHANISM_PREFIXES)]      # the engine mechanisms that fired
    w = max(len(k) for k in keys)
    for k in keys:
        v = summary[k]
        if k.startswith("slo_attainment") or k == "goodput_rps":
            text = "no SLO set" if isinstance(v, float) and math.isnan(v) else _fmt(v)
        else:
            text = _fmt(v)
        u = "" if isinstance(v, str) else unit(k)       # a name or a path carries no unit
        print(f"  {k:<{w}}  {text:<10}" + (f" {u}" if u and text not in ("-", "no SLO set") else ""), file=file)
    print("  (column meanings: docs/reference/glossary.md)", file=file)


def cmd_run(args) -> int:
    from sim.scenario.config import load_scenario
    from sim.cluster.runner import run_scenario
    scn = load_scenario(args.scenario, args.set)
    if args.workers is not None and scn.cluster:
        from sim.cluster.decompose import parse_workers
        w = args.workers.strip()
        scn.cluster["workers"] = parse_workers(int(w) if w.lstrip("-").isdigit() else w, "--workers")
    if args.out:                    # a bad place to write fails now, not after the run
        from sim.paths import output_dir
        output_dir(args.out, create=False)
    if args.trace_out:
        from sim.paths import output_file
        output_file(args.trace_out, "--trace-out")
    from study.progress import attach_run_progress
    from sim.scenario.basis import run_basis
    res = run_scenario(scn, observe=lambda sim: attach_run_progress(sim, enabled=args.progress))
    res.summary.update(run_basis(_replica_scenarios(scn), res.capacity_tokens))   # what the figures rest on
    if res.meta["infeasible_ids"]:
        ids = res.meta["infeasible_ids"]
        why = "; ".join(f"{n} x {reason}" for reason, n in res.meta["infeasible_reasons"].items())
        print(f"warning: {len(ids)} of {res.summary['requests']} request(s) were not run: {why}", file=sys.stderr)
    if res.summary["truncated"]:
        print(f"warning: run truncated at sim.max_iterations={scn.sim.max_iterations}; "
              f"{res.summary['completed']}/{res.summary['requests']} requests completed", file=sys.stderr)
    print_summary(res.summary, f"{scn.name}: policy={scn.policy.get('name')} M={res.capacity_tokens} tokens")
    hint = overload_hint(res, args.scenario, (scn.workload or {}).get("rate"))
    if hint:
        print(hint, file=sys.stderr)
    print(f"  {res.meta['memory_text']}")
    if "replicas" in res.tables:                # a cluster: one line per replica (the busiest, when many)
        cols = ["replica", "pool", "gpu", "gpus", "routed", "completed", "utilization", "ttft_p99", "kv_util_mean"]
        per = res.tables["replicas"]
        shown = per if len(per) <= MAX_REPLICA_LINES else per.nlargest(MAX_REPLICA_LINES, "routed").sort_index()
        from sim.metrics.units import with_units
        print(with_units(shown[cols]).to_string(index=False, float_format=lambda v: f"{v:.3g}"))
        if len(shown) < len(per):
            idle = int((per["routed"] == 0).sum())
            print(f"  ... {len(per) - len(shown)} more replicas not shown ({idle} of all {len(per)} got no request); "
                  "every one is in replicas.csv with --out")
    if args.out:
        paths = res.write(args.out, args.format)
        print(f"wrote {', '.join(str(p) for p in paths)}")
    if args.trace_out:
        from study.trace_export import write_trace
        n = write_trace(res, args.trace_out)
        note = "" if len(res.iterations) else " (no iterations: sim.record_iterations is off)"
        print(f"wrote {args.trace_out}: {n} trace events{note}; open it in https://ui.perfetto.dev")
    return 0


def overload_hint(res, scenario: str, rate=None) -> str:
    """A line when SLO attainment is low because requests arrive faster than the replicas serve them (the queue
    grows for the whole run), which no scheduler setting cures: more replicas or GPUs do."""
    s, req = res.summary, res.requests
    att = s.get("slo_attainment", float("nan"))
    if not (att == att and att < 0.5) or len(req) < 20:
        return ""
    arr = req["arrival_s"].to_numpy(float)
    span = float(arr.max() - arr.min())
    served = s.get("request_throughput", float("nan"))
    if span <= 0 or not served == served:
        return ""
    offered = (len(arr) - 1) / span
    if served >= 0.8 * offered:
        return ""
    return (f"hint: overloaded: requests arrive at {offered:.3g} req/s but are served at {served:.3g} req/s, so the "
            f"queue grows all run (mean queueing {s.get('queueing_mean', float('nan')):.3g} s) and attainment is "
            f"{att:.3g}; add replicas or GPUs (servesim plan {scenario} --rate {rate or float(f'{offered:.3g}'):g} finds how many)")


def _replica_scenarios(scn) -> list:
    """The scenario each group of replicas runs (the scenario itself without a cluster section)."""
    if not scn.cluster:
        return [scn]
    from sim.cluster.cluster import parse_cluster, replica_scenario
    return [replica_scenario(scn, over) for _, _, over in parse_cluster(scn.cluster).groups]


def cmd_policies(args) -> int:
    from policies import POLICIES
    from policies.knobs import families, knob_rows
    from policies.vllm_names import SECTION_ALIASES, policy_knob_alias
    if args.knobs:
        return _print_knobs(args.knobs)
    w = max(len(n) for n in POLICIES)
    for name, (_, _, summary) in sorted(POLICIES.items()):
        print(f"{name:<{w}}  {summary}")
    print("\nknobs of each family, vLLM's name in brackets (servesim policies --knobs NAME: defaults and meanings):")
    for cls, names in families():
        alias = policy_knob_alias(cls)
        knobs = [r["knob"] + (f" [{alias[r['knob']]}]" if r["knob"] in alias and alias[r["knob"]] != r["knob"]
                              else "") for r in knob_rows(names[0])]
        print(textwrap.fill(f"{cls.__name__} ({', '.join(names)}): {', '.join(knobs) or 'none'}", width=118,
                            initial_indent="  ", subsequent_indent="      "))
    _print_section_aliases(SECTION_ALIASES)
    return 0


def _print_section_aliases(aliases) -> None:
    print(textwrap.fill("vLLM's names of scenario fields (in their section or at the top level): "
                        + ", ".join(f"{a} -> {s}.{f}" for a, (s, f) in aliases.items()), width=118,
                        subsequent_indent="  "))


def _print_knobs(name: str) -> int:
    """One policy's knobs: name, vLLM's name, default (the preset's value), meaning."""
    from policies import POLICIES
    from policies.knobs import knob_rows
    from policies.vllm_names import SECTION_ALIASES
    rows = knob_rows(name)
    print(f"{name}: {POLICIES[name][2]}")
    table = [("knob", "vLLM name", "default", "meaning")]
    table += [(r["knob"], r["vllm_name"] or "-", repr(r["default"]) if isinstance(r["default"], str) else
               str(r["default"]), r["meaning"] or "-") for r in rows]
    widths = [max(len(t[i]) for t in table) for i in range(3)]
    for t in table:
        print("  " + "  ".join(f"{t[i]:<{widths[i]}}" for i in range(3)) + "  " + t[3])
    print("set a knob as policy.KNOB (scenario YAML, --set, sweep grids); its vLLM name works there and at the top "
          "level")
    _print_section_aliases(SECTION_ALIASES)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="servesim", description="Discrete-event simulator of LLM inference serving.")
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run one scenario and print its summary")
    r.add_argument("scenario", help="scenario YAML file")
    r.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override any scenario field, e.g. --set policy.name=sarathi --set memory.M=100000")
    r.add_argument("--out", help="directory for requests/iterations/summary tables")
    r.add_argument("--format", choices=("csv", "parquet"), default="csv")
    r.add_argument("--trace-out", metavar="FILE.json",
                   help="also write a Chrome/Perfetto trace: iterations, requests and KV use per replica")
    r.add_argument("--workers", metavar="N|auto",
                   help="a cluster whose router reads no replica state (round_robin, random) runs its replicas in N "
                        "worker processes, the same tables (cluster.workers; default auto: one per CPU from "
                        "50,000 requests); a one-replica scenario ignores it")
    r.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="progress bar of completed requests with ETA (default: on when stderr is a terminal)")
    r.set_defaults(func=cmd_run)
    pl = sub.add_parser("policies", help="list the named policies, one line each, and each family's knobs")
    pl.add_argument("--knobs", metavar="NAME", help="one policy's knobs: name, vLLM's name, default, meaning")
    pl.set_defaults(func=cmd_policies)
    for mod in PLUGINS:
        importlib.import_module(mod).register(sub)
    from sim.options import check_numeric_options
    check_numeric_options(p)             # every int/float option: finite, in range, one line when not
    return p


def main(argv=None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        load_extensions()          # SERVESIM_EXTENSIONS: user policies, workloads, GPUs, models
        from sim.scenario.extensions import REPLACEMENTS
        for note in REPLACEMENTS:
            print(f"servesim: note: {note}", file=sys.stderr)
        return args.func(args)
    except UserError as e:
        return _fail(str(e))
    except BrokenPipeError:        # `servesim ... | head`: the reader left; nothing more to say
        _silence_stdout()
        return 0
    except UnicodeDecodeError as e:
        return _fail(f"an input is not UTF-8 text ({e.reason} at byte {e.start}); save it as UTF-8")
    except OSError as e:           # files: missing, unreadable, unwritable, a directory where a file belongs
        where = f"{e.filename}: " if e.filename else ""
        return _fail(f"{where}{e.strerror or e}")
    except KeyboardInterrupt:
        print("servesim: interrupted", file=sys.stderr)
        return 130


def _fail(message: str) -> int:
    print(f"servesim: error: {' '.join(message.split())}", file=sys.stderr)
    return 2


def _silence_stdout() -> None:
    """After a broken pipe, point stdout at /dev/null so the interpreter's final flush does not raise again."""
    import os
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


if __name__ == "__main__":
    sys.exit(main())
