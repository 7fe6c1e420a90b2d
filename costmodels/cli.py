"""`servesim calibrate` (fit a cost model to profiles) and `servesim profile` (run the GPU/CPU profiler harness)."""
from __future__ import annotations

import sys

from costmodels.errors import UserError


def register(sub) -> None:
    c = sub.add_parser("calibrate", help="fit a cost model to kernel-timing profiles and report held-out error")
    c.add_argument("profiles", nargs="+", help="harness CSV(s), Vidur mlp.csv/attention*.csv, or a Vidur folder")
    c.add_argument("--model", required=True, help="model name in the catalog (e.g. llama-2-7b)")
    c.add_argument("--gpu", required=True, help="GPU name in the catalog (e.g. a100-80gb)")
    c.add_argument("--kind", choices=("linear", "roofline", "profiled"), default="profiled")
    c.add_argument("--tp", type=int, default=None,
                   help="use only this tensor-parallel degree's rows of Vidur files (default: every degree present)")
    c.add_argument("--test-frac", type=float, default=0.25, help="fraction of configurations held out")
    c.add_argument("--seed", type=int, default=0, help="seed of the held-out split")
    c.add_argument("--stat", default="median", choices=("median", "mean", "min"), help="Vidur statistic to use")
    c.add_argument("-o", "--out", help="write the fitted model YAML here (default: profiles/<gpu>/<model>-<kind>.yaml)")
    c.add_argument("--allow-eager", action="store_true",
                   help="fit operator rows timed eager on a GPU (refused by default: they model PyTorch's dispatch)")
    c.set_defaults(func=cmd_calibrate)

    m = sub.add_parser("model", help="model catalog tools: `servesim model import CONFIG.json` prints a catalog entry")
    msub = m.add_subparsers(dest="model_command", required=True)
    imp = msub.add_parser("import", help="read a local Hugging Face config.json (nothing is downloaded) and print "
                                         "its catalog entry and memory facts")
    imp.add_argument("config", help="config.json, or the model folder holding it")
    imp.add_argument("--name", help="catalog name (default: the folder's name)")
    imp.add_argument("--dtype", help="weight precision override (fp16, bf16, fp8, int8)")
    imp.set_defaults(func=cmd_model_import)

    p = sub.add_parser("profile", help="time a model's operators on this machine and write a profile CSV")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--model", default="llama-2-7b", help="model name in the catalog (random weights, no downloads)")
    p.add_argument("--out", help="CSV to write (required unless --from)")
    p.add_argument("--tp", type=int, default=1, help="profile one tensor-parallel shard of this degree")
    p.add_argument("--max-tokens", type=int, default=None, help="largest token count / context (default by device)")
    p.add_argument("--repeats", type=int, default=None, help="timed repeats per point (median kept)")
    p.add_argument("--backend", choices=("auto", "torch", "numpy"), default="auto",
                   help="numpy runs on CPU without PyTorch; auto picks torch when installed")
    p.add_argument("--quick", action="store_true", help="a small grid (CI, smoke tests)")
    p.add_argument("--iterations", type=int, default=12,
                   help="mixed batches also timed as whole iterations, for validation (tp 1; 0 = none)")
    p.add_argument("--collectives", action="store_true",
                   help="time all-reduce instead (torch.distributed: NCCL on cuda, gloo on cpu) and write Vidur's "
                        "all_reduce.csv; fit it with python -m costmodels.collectives on the folder above")
    p.add_argument("--gpus", default="2,4,8", help="GPU counts for --collectives (at most the visible ones)")
    p.add_argument("--kernels", choices=("engine", "eager"), default="engine",
                   help="engine: FlashAttention varlen, fused RMSNorm/rotary/SiLU-and-mul where available (default); "
                        "eager: the first harness's unfused PyTorch with padded attention, to measure the gap")
    p.add_argument("--timing", choices=("graph", "eager"), default="graph",
                   help="graph: each operator as a CUDA graph of many calls, replayed (default); eager: CUDA events "
                        "around one Python call")
    p.add_argument("--dtype", choices=("fp16", "bf16", "fp8"), default=None,
                   help="weights and activations (default: the model's); fp8: GEMMs through torch._scaled_mm (Hopper)")
    p.add_argument("--attention", default=None,
                   help="force one attention implementation (vllm-flash-varlen, flash-attn-varlen, torch-flash-varlen, "
                        "sdpa-per-request, sdpa-padded)")
    p.add_argument("--check", action="store_true",
                   help="compare every operator family with the shipped cost model for the GPU and print the ratios "
                        "(flagged beyond ±25%%, eager timing, padded attention)")
    p.add_argument("--from", dest="check_from", nargs="+", metavar="CSV",
                   help="with --check: check these profiles instead of profiling")
    p.add_argument("--gpu", help="with --check: catalog GPU to compare with (default: from the rows' device_name)")
    p.set_defaults(func=cmd_profile)


def cmd_calibrate(args) -> int:
    from costmodels import get_gpu, get_model
    from costmodels.calibrate import calibrate, format_errors
    from costmodels.linear import default_profile_path
    model, gpu = get_model(args.model, "--model"), get_gpu(args.gpu, "--gpu")
    # (1.5 and a negative seed were numpy tracebacks; 0 or less held out one row per operator anyway)
    if not 0 < args.test_frac < 1:
        raise UserError(f"--test-frac: must be in (0, 1) (the share of configurations held out), "
                        f"got {args.test_frac:g}")
    if args.seed < 0:
        raise UserError(f"--seed: must be >= 0, got {args.seed}")
    if args.tp is not None and args.tp < 1:
        raise UserError(f"--tp: must be >= 1 (a tensor-parallel degree), got {args.tp}")
    cm, errs, errs_x = calibrate(args.profiles, model, gpu, args.kind, tp=args.tp, test_frac=args.test_frac,
                                 seed=args.seed, stat=args.stat, allow_eager=args.allow_eager)
    out = args.out or default_profile_path(gpu.name, model.name, args.kind)
    cm.save(out)
    print(f"{args.kind} model for {model.name} on {gpu.name}; held-out error, {args.test_frac:.0%} of the profile "
          f"held out in contiguous blocks (seed {args.seed}):")
    print(format_errors(errs))
    if len(errs_x):
        print("fitted on up to 1,024 tokens, tested above (extrapolation):")
        print(format_errors(errs_x))
    print(f"wrote {out}")
    return 0


def cmd_model_import(args) -> int:
    from costmodels.catalog import GiB, load_model_config, spec_as_python, with_dtype
    spec = load_model_config(args.config, args.name)
    if args.dtype:
        spec = with_dtype(spec, args.dtype)
    print(spec_as_python(spec))
    moe = (f"; MoE: {spec.experts} experts, {spec.experts_per_token} per token, expert FFN {spec.expert_ffn}"
           f"{f', shared {spec.shared_expert_ffn}' if spec.shared_expert_ffn else ''}, {spec.moe_layer_count()} "
           f"MoE layers" if spec.is_moe else "")
    print(f"# {spec.params() / 1e9:.2f}B parameters, weights {spec.weight_bytes() / GiB:.2f} GiB ({spec.dtype}); "
          f"KV {spec.kv_bytes_per_token() / 1024:.1f} KiB per token; head_dim {spec.head_dim}, "
          f"{spec.kv_heads} KV heads{moe}")
    print(f"# use it: model: {{config: {args.config}}} in a scenario, or add the line to costmodels/catalog.py MODELS")
    return 0


def cmd_profile(args) -> int:
    from profiles.harness import run_collectives, run_profile
    if args.check_from:
        if not args.check:
            raise UserError("--from: only with --check (profiles to check instead of profiling)")
        return _check(args.check_from, args.gpu)
    if not args.out:
        raise UserError("profile: --out CSV is required (or --check --from CSV... to check existing profiles)")
    if args.attention is not None:
        from profiles.engine_ops import ATTENTION_ORDER
        if args.attention not in ATTENTION_ORDER:
            raise UserError(f"--attention: {args.attention!r} is not one of {', '.join(ATTENTION_ORDER)}")
    if args.collectives:
        try:
            gpus = [int(g) for g in args.gpus.split(",")]
        except ValueError:
            raise UserError(f"--gpus: expected comma-separated GPU counts, got {args.gpus!r}") from None
        if any(g < 2 for g in gpus):
            raise UserError(f"--gpus: an all-reduce needs at least 2 GPUs, got {args.gpus!r}")
        n = run_collectives(args.out, gpus, device=args.device, repeats=20 if args.repeats is None else args.repeats)
    else:
        n = run_profile(args.model, args.device, args.out, tp=args.tp, max_tokens=args.max_tokens,
                        repeats=args.repeats, backend=args.backend, quick=args.quick, log=sys.stderr,
                        iterations=args.iterations, kernels=args.kernels, timing=args.timing, dtype=args.dtype,
                        attention=args.attention)
    print(f"wrote {n} rows to {args.out}")
    if args.check and not args.collectives:
        return _check([args.out], args.gpu)
    return 0


def _check(paths, gpu) -> int:
    from costmodels.profile_check import check_profile, format_check
    from costmodels.profile_data import read_profiles
    table = read_profiles(paths)
    if gpu is None and set(table["device"] if "device" in table else []) <= {"cpu"}:
        raise UserError("profile --check: these rows were timed on a CPU; name the GPU model to compare with (--gpu)")
    print(f"profile check: measured / shipped model, per operator family ({', '.join(map(str, paths))})")
    print(format_check(check_profile(table, gpu)))
    return 0
