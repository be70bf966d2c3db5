"""The benchmark's printed report: the table per mode, pdkit's ratios against the other
routers, and the headroom of the fake workers (so a reader sees the router is the bottleneck)."""

from __future__ import annotations

import argparse

from benchmarks.lbbench.measure import Measured
from tests.support.fake_worker import Summary

# Added latencies smaller than this (s) are within the noise of a shared machine.
NOISE_FLOOR = 0.00005


def added(m: Measured, base: Measured | None, q: float, stream: bool) -> float:
    """Latency added over the direct path at percentile `q` (s): end to end for plain requests,
    time to the first chunk for streams (the whole stream is paced by the worker's tokens)."""
    if base is None:
        return float("nan")
    return m.latency.pct(q, first=stream) - base.latency.pct(q, first=stream)


def ratio_text(ours: float, theirs: float) -> str:
    if theirs < NOISE_FLOOR:
        return f"n/a (theirs {theirs * 1000:.3f} ms is within noise; ours {ours * 1000:.3f} ms)"
    return f"{max(ours, 0.0) / theirs:.2f}x theirs"


def report(
    results: dict[str, dict[bool, Measured]],
    notes: dict[str, str],
    policies: dict[str, str],
    args: argparse.Namespace,
    *,
    pinned: bool,
    fakes: Summary,
) -> None:
    direct = results.get("direct")
    print()
    print(
        f"pdkit lb bench: {args.prefills} prefill + {args.decodes} decode fake workers "
        f"(direct: one non-PD fake worker), {args.tokens} tokens per request (streams: one "
        f"event per token, {args.token_delay * 1000:g} ms apart)"
    )
    print(
        "router pinned alone to CPU 1; workers and load generator on CPU 0"
        if pinned
        else "nothing pinned (--no-pin or fewer than 2 CPUs): routers share CPUs with the load"
    )
    print(
        f"throughput: {args.concurrency} (streams {args.stream_concurrency}) clients, "
        f"{args.seconds:g} s per target and mode; latency: {args.latency_requests} requests "
        f"arriving at {args.latency_rate:g}/s (open loop); {args.rounds} interleaved rounds"
    )
    print("+ms = added over direct: end to end (non-streaming), time to first chunk (streaming)")
    print(
        "req/s is bounded by the CPU share the router got (cpu busy: other tenants of a shared "
        "machine take the rest);\nreq/cpu-s = requests per second of one whole core "
        "(1 / cpu ms/req), which that noise does not move"
    )
    for stream in (False, True):
        base = direct[stream] if direct else None
        print()
        print("streaming" if stream else "non-streaming")
        lat = "ttft" if stream else "e2e"
        print(
            f"  {'target':11} {'req/s':>8} {'x direct':>8} {lat + ' p50':>9} {lat + ' p99':>9} "
            f"{'+ms p50':>8} {'+ms p99':>8} {'cpu ms/req':>10} {'cpu busy':>8} "
            f"{'req/cpu-s':>9} {'errors':>6}  policies"
        )
        for name, modes in results.items():
            m = modes[stream]
            rate = m.throughput.rate
            ratio = rate / base.throughput.rate if base and base.throughput.rate else float("nan")
            is_direct = name == "direct"
            add50 = 0.0 if is_direct else added(m, base, 50, stream)
            add99 = 0.0 if is_direct else added(m, base, 99, stream)
            per_req = m.cpu_per_request
            cpu = f"{per_req * 1000:10.3f}" if per_req is not None else f"{'-':>10}"
            busy = (
                f"{m.cpu / m.throughput.seconds * 100:7.0f}%"
                if per_req is not None and m.throughput.seconds
                else f"{'-':>8}"
            )
            errors = m.throughput.errors + m.latency.errors
            capacity = f"{1 / per_req:9.0f}" if per_req else f"{'-':>9}"
            print(
                f"  {name:11} {rate:8.0f} {ratio:8.2f} {m.latency.pct(50, stream) * 1000:9.2f} "
                f"{m.latency.pct(99, stream) * 1000:9.2f} {add50 * 1000:8.2f} {add99 * 1000:8.2f} "
                f"{cpu} {busy} {capacity} {errors:6d}  {policies[name]}"
            )
    for name, note in notes.items():
        print(f"  {name}: {note}")
    headroom(results, fakes)
    processes_gain(results)
    pdkit = results.get("pdkit")
    if pdkit is None:
        return
    print()
    print("ratios (pdkit against the others, same run)")
    for stream in (False, True):
        kind = "streaming" if stream else "non-streaming"
        p = pdkit[stream]
        base = direct[stream] if direct else None
        for other in ("mini_lb", "smg"):
            if other not in results:
                continue
            o = results[other][stream]
            parts = [f"throughput x{p.throughput.rate / max(o.throughput.rate, 1e-9):.2f}"]
            if p.cpu_per_request and o.cpu_per_request:
                parts[0] += f" (x{o.cpu_per_request / p.cpu_per_request:.2f} per CPU-second)"
            if base is not None:
                ours, theirs = added(p, base, 99, stream), added(o, base, 99, stream)
                parts.append(f"added p99 {ratio_text(ours, theirs)}")
            print(f"  {kind:13} vs {other:7}: " + ", ".join(parts))
    if "smg" in results:
        against_smg(pdkit, results["smg"], direct)
    if "pdkit_nolog" in results:
        access_log_cost(pdkit, results["pdkit_nolog"])


def _verdict(ok: bool) -> str:
    return "met" if ok else "missed"


def against_smg(
    pdkit: dict[bool, Measured], smg: dict[bool, Measured], direct: dict[bool, Measured] | None
) -> None:
    """The four ratios issue #15 sets targets for, pdkit over smg in this run: throughput on
    one core (>= 1.0), added latency p50 and p99 (<= 1.0; time to first chunk for streams),
    CPU per request (<= 1.2)."""
    print()
    print("targets against smg (pdkit / smg, same run; each router pinned alone to one core)")
    for stream in (False, True):
        kind = "streaming" if stream else "non-streaming"
        p, o = pdkit[stream], smg[stream]
        rate = p.throughput.rate / max(o.throughput.rate, 1e-9)
        if p.cpu_per_request and o.cpu_per_request:
            cpu = p.cpu_per_request / o.cpu_per_request
            per_core = 1 / cpu
        else:
            cpu = per_core = float("nan")
        lat = "ttft" if stream else "e2e"
        print(f"  {kind}")
        print(
            f"    throughput      x{rate:.2f} req/s, x{per_core:.2f} per CPU-second "
            f"(target >= 1.0: {_verdict(min(rate, per_core) >= 1.0)})"
        )
        if direct is not None:
            base = direct[stream]
            for q in (50, 99):
                ours, theirs = added(p, base, q, stream), added(o, base, q, stream)
                ok = ours <= theirs or (theirs < NOISE_FLOOR and ours < NOISE_FLOOR)
                print(
                    f"    added {lat} p{q:<3}{ratio_text(ours, theirs):>20} "
                    f"({ours * 1000:.3f} vs {theirs * 1000:.3f} ms; target <= 1.0: {_verdict(ok)})"
                )
        print(f"    CPU per request x{cpu:.2f} (target <= 1.2: {_verdict(cpu <= 1.2)})")


def access_log_cost(pdkit: dict[bool, Measured], quiet: dict[bool, Measured]) -> None:
    """CPU per request with the access log (the default) against without it."""
    parts = []
    for stream in (False, True):
        on, off = pdkit[stream].cpu_per_request, quiet[stream].cpu_per_request
        if on and off:
            kind = "streaming" if stream else "non-streaming"
            parts.append(
                f"{kind} {on * 1000:.3f} vs {off * 1000:.3f} ms/req ({(on / off - 1):+.0%})"
            )
    if parts:
        print()
        print("access log (pdkit against pdkit --no-access-log): CPU " + ", ".join(parts))


def headroom(results: dict[str, dict[bool, Measured]], fakes: Summary) -> None:
    """What one core of the fake workers serves, against the fastest router's rate, and what the
    fake workers saw go wrong."""
    print()
    print("fake workers (tests.support.fake_worker, one process): requests one core of it serves")
    for stream in (False, True):
        kind = "streaming" if stream else "non-streaming"
        parts = []
        alone = results["direct"][stream].fake_cpu_per_request if "direct" in results else None
        if alone:
            parts.append(f"{1 / alone:.0f}/s direct")
        routers = [(name, modes[stream]) for name, modes in results.items() if name != "direct"]
        if routers:
            name, fastest = max(routers, key=lambda item: item[1].throughput.rate)
            per_request = fastest.fake_cpu_per_request
            if per_request:
                rate, seconds = fastest.throughput.rate, fastest.throughput.seconds
                parts.append(
                    f"{1 / per_request:.0f}/s routed (both legs); fastest router {name} "
                    f"{rate:.0f} req/s: headroom x{1 / per_request / rate:.1f} (busy: fake "
                    f"{fastest.fake_cpu / seconds:.0%}, load generator "
                    f"{fastest.loadgen_cpu / seconds:.0%} of a core)"
                )
        print(f"  {kind:13}: " + (", ".join(parts) or "not measured"))
    first = f", first: {fakes.problems[0]}" if fakes.problems else ""
    print(f"  PD protocol problems the fake workers saw: {fakes.problem_count}{first}")
    if fakes.not_found:
        asked = ", ".join(f"{path} ({n})" for path, n in sorted(fakes.not_found.items()))
        print(f"  asked for routes SGLang does not serve: {asked}")


def processes_gain(results: dict[str, dict[bool, Measured]]) -> None:
    """Two router processes against one on the same cores (both without the access log and
    unpinned), and against one pinned to one core, same run."""
    two = results.get("pdkit_x2")
    if two is None:
        return
    print()
    for base, what in (("pdkit_x1", "1 process, every CPU"), ("pdkit_nolog", "1, pinned")):
        one = results.get(base)
        if one is None:
            continue
        print(f"router processes: pdkit_x2 (2 processes, every CPU) / {base} ({what})")
        for stream in (False, True):
            kind = "streaming" if stream else "non-streaming"
            gain = two[stream].throughput.rate / max(one[stream].throughput.rate, 1e-9)
            print(f"  {kind:13}: requests/s x{gain:.2f} (target 1.7x)")
