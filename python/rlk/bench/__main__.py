"""``python -m rlk.bench {e2e,arm}``: the paired P/P vs R/R benchmark (see rlk.bench.e2e)."""

import argparse
import sys


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m rlk.bench")
    sub = p.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("e2e", help="paired benchmark: alternate native/strict arms in separate processes")
    e.add_argument("--out", required=True)
    e.add_argument("--reps", type=int, default=3)
    e.add_argument("--steps", type=int, default=3, help="measured steps per process (+1 warm-up)")
    e.add_argument("--config", default="qwen3-8b")
    e.add_argument("--layers", type=int, default=4)
    e.add_argument("--sequences", type=int, default=32)
    e.add_argument("--prompt-range", type=int, nargs=2, default=(128, 512))
    e.add_argument("--response-range", type=int, nargs=2, default=(64, 256))
    e.add_argument("--max-batch", type=int, default=32)
    e.add_argument("--device", default=None, help="cuda (default when available) or cpu (smoke runs)")
    e.add_argument("--rollout-graphs", choices=("auto", "on", "off"), default="auto",
                   help="decode steps as CUDA graphs per batch bucket, same policy for both arms "
                        "(auto: on for CUDA, the engines' decode mode)")
    e.add_argument("--step-logp", action=argparse.BooleanOptionalAction, default=True,
                   help="rollout: forced-token logp inside the padded decode steps / graphs (both arms; "
                        "default on, --no-step-logp for one eager LM-head launch per step)")
    e.add_argument("--profile", action="store_true", help="also run a separate profiled pass (attribution)")
    a = sub.add_parser("arm", help="internal: one arm in this process")
    a.add_argument("--route", choices=("native", "strict"), required=True)
    a.add_argument("--steps", type=int, default=3)
    a.add_argument("--spec", required=True)
    a.add_argument("--json", required=True)
    args = p.parse_args(argv)
    from rlk.bench import e2e  # run_e2e picks the default device

    return e2e.run_e2e(args) if args.cmd == "e2e" else e2e.run_arm(args)


if __name__ == "__main__":
    sys.exit(main())
