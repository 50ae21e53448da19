"""kvsim speed: wall time and simulated events per second for 1,000 / 10,000 / 100,000 requests, and a
streamed record (JSON Lines) of 1,000,000 requests with its time and peak memory.

The workload is multi-turn conversations with shared system prompts
(`kvsim.synthetic`), costs from analytic GPT counts, and a system whose device
budget is small enough that states are offloaded, reloaded and dropped. The
target is 100,000 requests in under 30 s on one CPU core, with cost growing no
worse than n log n. Generating the workload and writing the record are timed
separately from the simulation (the record is serialized up to 10,000 requests;
at 100,000 it is over a gigabyte of JSON). The streamed sizes simulate a StreamedComputations document
(`kvsim.synthetic.arriving`, `kvsim.analytic.analytic_stream`): the same conversations, made one request
at a time and never held, in a process each, so that each peak RSS (`resource.getrusage`) is its own;
wall and CPU time cover making the requests (three times: head, computation lines, run), simulating and
writing the record, which goes to a temporary directory (--record-dir) and is removed. Targets there:
under 5 minutes and 2 GiB for 1,000,000 requests.

    python bench/kvsim.py [--sizes 1000 10000 100000] [--streamed 1000000] [--policy serialized|continuous_batching]
    python bench/kvsim.py --sizes --streamed 100000 1000000   # only the streamed record
    python bench/kvsim.py --why-batch    # both policies on a workload that saturates serialized service
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# Run as a script, this file's folder comes first on sys.path and `kvsim` would name this file.
_HERE, _ROOT = Path(__file__).resolve().parent, Path(__file__).resolve().parent.parent
sys.path[:] = [str(_ROOT), *(p for p in sys.path if Path(p or ".").resolve() != _HERE)]

from bench.result import BenchRun, add_results_argument  # noqa: E402
from jgpt.foundation.identity import write_atomically  # noqa: E402
from kvsim import parse_system, record_chunks, simulate  # noqa: E402
from kvsim.analytic import AnalyticModel, analytic_computations, analytic_stream  # noqa: E402
from kvsim.record_lines import pulled, write_lines  # noqa: E402
from kvsim.synthetic import ConversationMix, arriving, conversations  # noqa: E402

MODEL = AnalyticModel(layers=4, width=128, ffn=512, vocabulary=260, precision_bytes=4)
TARGET_S = 30.0
RECORD_LIMIT = 10_000
STREAMED_TARGET_S, STREAMED_TARGET_BYTES = 300.0, 2 * 2**30


def system(policy: str) -> dict:
    return {
        "max_requests": 1_000_000,
        "max_new_tokens_cap": 64,
        "scheduling": {"max_active_requests": 8, "policy": policy},
        # About 50 states of a few hundred positions fit on the device, four times that on the host.
        "kv_cache": {"device_kv_bytes": 16 * 2**20, "host_kv_bytes": 64 * 2**20},
        "transfer": {"link_bytes_per_us": 10_000, "link_latency_us": 5},
        "compute_service": {"compute_flops_per_us": 1e7, "memory_bytes_per_us": 1e6},
    }


def why_batch() -> dict:
    """Conversations arriving fast enough to saturate serialized service, under both policies: the figures."""
    items = conversations(2_000, seed=0, mix=ConversationMix(mean_gap_us=60, think_us=(500, 2_000)))
    computations = analytic_computations(MODEL, items, "why batch")
    print("2,000 requests, a conversation every 60 us on average; virtual microseconds")
    print(
        f"{'policy':<20} {'busy':>6} {'end':>8} {'TTFT p50':>9} {'p99':>7} {'per token p50':>14} {'e2e p50':>8} {'p99':>7}"
    )
    figures = {}
    for policy in ("serialized", "continuous_batching"):
        config = system(policy)
        config["scheduling"]["max_active_requests"] = 16
        config["kv_cache"] = {"device_kv_bytes": 64 * 2**20, "host_kv_bytes": 256 * 2**20}
        totals = simulate(parse_system(config), computations).outcomes["totals"]
        latency = totals["latency_us"]
        print(
            f"{policy:<20} {totals['compute_busy_fraction']:>6.1%} {totals['end_us']:>8} "
            f"{latency['ttft']['p50']:>9} {latency['ttft']['p99']:>7} {latency['tpot']['p50']:>14} "
            f"{latency['e2e']['p50']:>8} {latency['e2e']['p99']:>7}"
        )
        figures[policy] = {
            "compute_busy_fraction": totals["compute_busy_fraction"], "last_event_us": totals["end_us"],
            "ttft_p50_us": latency["ttft"]["p50"], "ttft_p99_us": latency["ttft"]["p99"],
            "tpot_p50_us": latency["tpot"]["p50"], "e2e_p50_us": latency["e2e"]["p50"],
            "e2e_p99_us": latency["e2e"]["p99"],
        }  # fmt: skip
    return {"2,000 requests, a conversation every 60 us on average, 16 active (virtual time)": figures}


def streamed_one(size: int, policy: str, record_dir: str | None, keep: bool) -> None:
    """One streamed run in this process: prints its figures as JSON for `streamed` to tabulate."""
    start, cpu = time.perf_counter(), time.process_time()
    computations = analytic_stream(MODEL, lambda: arriving(size, seed=0), "bench")
    with tempfile.TemporaryDirectory(dir=record_dir) as directory:
        path = (Path(record_dir) if keep and record_dir else Path(directory)) / f"record-{size}.jsonl"
        done = []
        write_atomically(
            path, pulled(lambda write: done.append(write_lines(write, parse_system(system(policy)), computations)))
        )
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
        size_bytes = path.stat().st_size
    totals = done[0].outcomes["totals"]
    print(json.dumps({
        "wall_s": wall, "cpu_s": cpu, "events": totals["events"], "lines": done[0].lines, "bytes": size_bytes,
        "peak_rss_bytes": peak_rss_bytes(),
    }))  # fmt: skip


def peak_rss_bytes() -> int:
    """This process's own peak resident set. Linux carries ru_maxrss across fork and exec, so a streamed run
    started after the in-memory sizes reported as its own the peak of the parent that had held 100,000 requests;
    VmHWM belongs to this process's memory alone."""
    try:
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM:"))
    except (OSError, StopIteration):  # not Linux: the only figure there is
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def streamed(sizes: list[int], policy: str, record_dir: str | None, keep: bool) -> dict:
    """Each size's streamed run in a process of its own: the figures, per size."""
    print(
        f"\nstreamed record (JSON Lines) of a streamed document, one process per size; targets "
        f"{STREAMED_TARGET_S:.0f} s and {STREAMED_TARGET_BYTES / 2**30:.0f} GiB at 1,000,000 requests"
    )
    print(f"{'requests':>9} {'events':>11} {'wall s':>8} {'cpu s':>8} {'record GB':>10} {'peak RSS MiB':>13}  verdict")
    rows = {}
    for size in sizes:
        command = [sys.executable, __file__, "--streamed-one", str(size), "--policy", policy]
        if record_dir:
            Path(record_dir).mkdir(parents=True, exist_ok=True)  # the directory --record-dir names, made if new
            command += ["--record-dir", record_dir]
        command += ["--keep"] if keep else []
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode:
            raise SystemExit(f"the streamed run of {size} requests failed:\n{done.stderr.strip()[-2000:]}")
        figures = json.loads(done.stdout)
        met = figures["wall_s"] < STREAMED_TARGET_S and figures["peak_rss_bytes"] < STREAMED_TARGET_BYTES
        print(f"{size:>9} {figures['events']:>11} {figures['wall_s']:>8.1f} {figures['cpu_s']:>8.1f} "
              f"{figures['bytes'] / 1e9:>10.2f} {figures['peak_rss_bytes'] / 2**20:>13.0f}  "
              f"{'meets' if met else 'misses'} the targets")  # fmt: skip
        rows[f"{size:,} requests"] = {
            "events_count": figures["events"], "lines_count": figures["lines"], "wall_s": figures["wall_s"],
            "cpu_s": figures["cpu_s"], "record_gb": figures["bytes"] / 1e9,
            "peak_rss_mib": figures["peak_rss_bytes"] / 2**20, "meets_targets": met,
        }  # fmt: skip
    return {f"streamed record, policy {policy} (targets {STREAMED_TARGET_S:.0f} s and 2 GiB at 1,000,000)": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="*", default=[1_000, 10_000, 100_000])
    parser.add_argument(
        "--streamed",
        type=int,
        nargs="*",
        default=[1_000_000],
        metavar="N",
        help="requests of the streamed-record runs (none: skip them)",
    )
    parser.add_argument("--streamed-one", type=int, help=argparse.SUPPRESS)
    parser.add_argument(
        "--record-dir",
        help="where the streamed records are written, then removed (default: the "
        "system's temporary directory; 1,000,000 requests take some 7.8 GB)",
    )
    parser.add_argument(
        "--keep", action="store_true", help="keep each streamed record, as DIR/record-N.jsonl (for `kvsim replay`)"
    )
    parser.add_argument("--policy", default="serialized", choices=["serialized", "continuous_batching"])
    parser.add_argument("--why-batch", action="store_true", help="instead: both policies on a saturating workload")
    add_results_argument(parser)
    args = parser.parse_args()
    if args.streamed_one:
        return streamed_one(args.streamed_one, args.policy, args.record_dir, args.keep)
    if args.keep and not args.record_dir:
        parser.error("--keep needs --record-dir")
    if args.why_batch:
        run = BenchRun.start(
            "kvsim-why-batch",
            "Why engines batch: 2,000 conversation turns that saturate serialized "
            "service, simulated under both scheduling policies.",
        )
        run.write(why_batch(), args.results)
        return
    run = BenchRun.start("kvsim" if args.sizes else "kvsim-streamed", __doc__)
    figures = in_memory(args.sizes, args.policy) if args.sizes else {}
    if args.streamed:
        figures |= streamed(args.streamed, args.policy, args.record_dir, args.keep)
    run.write(figures, args.results)


def in_memory(sizes: list[int], policy: str) -> dict:
    """Each size simulated in this process: the figures, per size."""
    config = parse_system(system(policy))
    print(f"kvsim bench: policy {policy}, model {MODEL}")
    print(
        f"{'requests':>9} {'events':>10} {'generate s':>11} {'simulate s':>11} {'cpu s':>7} {'events/s':>10} "
        f"{'record s':>9} {'record MB':>10}  hits dev/host, offloads, reloads, drops"
    )
    timings, rows = [], {}
    for size in sizes:
        start = time.perf_counter()
        computations = analytic_computations(MODEL, conversations(size, seed=0), "bench")
        generated, cpu = time.perf_counter(), time.process_time()
        run = simulate(config, computations)
        simulated, cpu = time.perf_counter(), time.process_time() - cpu
        elapsed = simulated - generated
        events = len(run.result.events)
        timings.append((size, elapsed, cpu))
        record, record_s, record_mb = f"{'-':>9} {'-':>10}", None, None
        if size <= RECORD_LIMIT:
            size_bytes = sum(map(len, record_chunks(run)))
            record_s, record_mb = time.perf_counter() - simulated, size_bytes / 1e6
            record = f"{record_s:>9.2f} {record_mb:>10.1f}"
        t = run.outcomes["totals"]
        print(
            f"{size:>9} {events:>10} {generated - start:>11.2f} {elapsed:>11.2f} {cpu:>7.2f} {events / elapsed:>10.0f} {record}  "
            f"{t['hits_device']}/{t['hits_host']}, {t['offloads']}, {t['reloads']}, {t['drops']}"
        )
        rows[f"{size:,} requests"] = {
            "events_count": events, "generate_s": generated - start, "simulate_wall_s": elapsed,
            "simulate_cpu_s": cpu, "events_per_s": events / elapsed, "record_s": record_s, "record_mb": record_mb,
        }  # fmt: skip
    for (n0, t0, c0), (n1, t1, c1) in zip(timings, timings[1:], strict=False):
        nlogn = (n1 * math.log(n1)) / (n0 * math.log(n0))
        print(f"growth {n0} -> {n1}: wall x{t1 / t0:.1f}, cpu x{c1 / c0:.1f}; n log n x{nlogn:.1f}, n x{n1 / n0:.0f}")
    largest, seconds, cpu = timings[-1]
    verdict = "meets" if seconds < TARGET_S else "misses"
    print(
        f"{largest} requests simulated in {seconds:.1f} s wall ({cpu:.1f} s CPU): {verdict} the {TARGET_S:.0f} s target"
    )
    if cpu < 0.8 * seconds:
        print(
            "note: CPU time well below wall time means other processes shared this core; CPU time is the fairer figure"
        )
    return {f"in memory, policy {policy}": rows}


if __name__ == "__main__":
    main()
