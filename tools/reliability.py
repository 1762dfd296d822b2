#!/usr/bin/env python3
"""Issue 34's campaigns in one command, and their figures as a results file for PERFORMANCE.md.

    python tools/reliability.py --json bench/results/<machine>/reliability.json \\
        [--differential 7000] [--malformed 20000] [--cache 2000] [--rss 10000] [--seed S]

Runs, each in its own process, on the CPU:
  - differential: tests/test_fuzz_differential.py's three Hypothesis tests (dense functions and
    SDPA, varlen, KV cache) with FLASHATTN_FUZZ_EXAMPLES=N fresh random examples each, counted
    by Hypothesis' own statistics (--hypothesis-show-statistics: passing and failing examples);
  - malformed: tests/test_fuzz_malformed.py with FLASHATTN_FUZZ_MALFORMED_CALLS=N calls, each in
    a subprocess that must raise a clear error or return, never crash;
  - cache: tests/test_cache_integrity.py's N random cache scenarios at --seed, every byte outside
    the appended rows unchanged;
  - rss: tests/test_long_runs.py with FLASHATTN_LONG_RUN_CALLS=N calls of each public function,
    RSS growth after warm-up.
Each campaign's figure is recorded with its command and outcome (a failed campaign is recorded
as failed, with the tail of its output); the file's "meta" is the benchmark's (date, commit,
torch, machine, threads). `python bench/performance.py` puts it on the results page.
"""
import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

DIFFERENTIAL_TESTS = {  # test name in tests/test_fuzz_differential.py -> what it draws
    "test_dense_functions_match_the_float64_reference":
        "flash_attn_func, kv/qkv-packed, scaled_dot_product_attention",
    "test_varlen_functions_match_the_float64_reference":
        "flash_attn_varlen_func (plain, paged, seqused), varlen kv/qkv-packed",
    "test_kvcache_matches_the_float64_reference_and_appends_exactly":
        "flash_attn_with_kvcache (dense, paged, appends, rotary, num_splits)",
}
STATISTICS = re.compile(r"^(\S+::(\w+)):\s*$")
EXAMPLES = re.compile(r"(\d+) passing examples?, (\d+) failing examples?")
CACHE_LINE = re.compile(r"(\d+) cache scenarios \(seed (\d+)\): (\d+) entries changed")
TAIL_CHARS = 3000


def run(command, env_extra):
    """(exit status, stdout + stderr, seconds, the command as one would type it)."""
    # This checkout's flashattn first, whatever else is installed (a script's sys.path[0] is
    # its own folder, not the checkout).
    path = os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, PYTHONPATH=path, **env_extra)
    start = time.time()
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    typed = " ".join([*(f"{k}={v}" for k, v in env_extra.items()), shlex.join(command)])
    typed = typed.replace(sys.executable, "python")
    return proc.returncode, proc.stdout + proc.stderr, time.time() - start, typed


def differential(examples):
    command = [sys.executable, "-m", "pytest", "tests/test_fuzz_differential.py",
               "-p", "no:cacheprovider", "-q", "--hypothesis-show-statistics",
               "-k", " or ".join(DIFFERENTIAL_TESTS)]
    status, output, seconds, typed = run(command, {"FLASHATTN_FUZZ_EXAMPLES": str(examples)})
    rows, test = [], None
    for line in output.splitlines():
        if m := STATISTICS.match(line.strip()):
            test = m.group(2)
        elif test and (m := EXAMPLES.search(line)):
            rows.append(dict(test=test, draws=DIFFERENTIAL_TESTS.get(test, ""),
                             passing=int(m.group(1)), failing=int(m.group(2))))
            test = None
    found = {r["test"] for r in rows}
    missing = [t for t in DIFFERENTIAL_TESTS if t not in found]
    return dict(campaign="differential", command=typed, seconds=round(seconds, 1),
                passed=status == 0 and not missing,
                examples=sum(r["passing"] + r["failing"] for r in rows),
                mismatches=sum(r["failing"] for r in rows), tests=rows,
                **({} if status == 0 and not missing else {"output_tail": output[-TAIL_CHARS:]}))


def malformed(calls):
    command = [sys.executable, "-m", "pytest", "tests/test_fuzz_malformed.py",
               "-p", "no:cacheprovider", "-q"]
    status, output, seconds, typed = run(command, {"FLASHATTN_FUZZ_MALFORMED_CALLS": str(calls)})
    return dict(campaign="malformed", command=typed, seconds=round(seconds, 1),
                passed=status == 0, calls=calls,
                **({} if status == 0 else {"output_tail": output[-TAIL_CHARS:]}))


def cache(scenarios, seed):
    command = [sys.executable, "tests/test_cache_integrity.py", str(scenarios), str(seed)]
    status, output, seconds, typed = run(command, {})
    m = CACHE_LINE.search(output)
    passed = status == 0 and m is not None and int(m.group(1)) == scenarios
    return dict(campaign="cache", command=typed, seconds=round(seconds, 1), passed=passed,
                scenarios=scenarios, seed=seed,
                entries_changed=int(m.group(3)) if m else None,
                **({} if passed else {"output_tail": output[-TAIL_CHARS:]}))


def rss(calls):
    command = [sys.executable, "-m", "pytest", "tests/test_long_runs.py",
               "-p", "no:cacheprovider", "-q", "-s", "-k", "rss"]
    status, output, seconds, typed = run(command, {"FLASHATTN_LONG_RUN_CALLS": str(calls)})
    functions = [json.loads(line) for line in output.splitlines()
                 if line.startswith("{") and '"growth"' in line]
    return dict(campaign="rss", command=typed, seconds=round(seconds, 1),
                passed=status == 0 and bool(functions), calls=calls,
                functions=[dict(function=f["function"], growth_bytes=f["growth"])
                           for f in functions],
                max_growth_bytes=max((f["growth"] for f in functions), default=None),
                **({} if status == 0 else {"output_tail": output[-TAIL_CHARS:]}))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", required=True, help="the results file to write")
    parser.add_argument("--differential", type=int, default=7000,
                        help="examples per differential test (three tests)")
    parser.add_argument("--malformed", type=int, default=20000, help="malformed calls")
    parser.add_argument("--cache", type=int, default=2000, help="cache scenarios")
    parser.add_argument("--rss", type=int, default=10000, help="calls per public function")
    parser.add_argument("--seed", type=int, default=int(time.time()) % 100000,
                        help="the cache scenarios' seed (default: from the clock)")
    args = parser.parse_args(argv)

    import torch
    from flashattn.bench import measure, report

    campaigns = []
    for name, step in (("differential", lambda: differential(args.differential)),
                       ("malformed", lambda: malformed(args.malformed)),
                       ("cache", lambda: cache(args.cache, args.seed)),
                       ("rss", lambda: rss(args.rss))):
        if getattr(args, name) > 0:
            print(f"reliability: {name} ...", file=sys.stderr, flush=True)
            campaigns.append(step())
            print(f"reliability: {name}: {'passed' if campaigns[-1]['passed'] else 'FAILED'} "
                  f"in {campaigns[-1]['seconds']} s", file=sys.stderr, flush=True)
    argv_used = sys.argv[1:] if argv is None else argv
    meta = report.meta([], torch.device("cpu"), measure.CpuProbe(), {})
    meta["command"] = shlex.join(["python", "tools/reliability.py", *argv_used])
    summary = {"passed": all(c["passed"] for c in campaigns)}
    report.write(args.json, "reliability", meta, summary, campaigns)
    print(f"reliability: wrote {args.json}", file=sys.stderr)
    return 0 if summary["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
