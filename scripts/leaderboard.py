#!/usr/bin/env python3
"""Aggregate make leaderboard's runs into leaderboard.md and SVG charts.

Usage: leaderboard.py RUNS_DIR DOC_DIR. Reads RUNS_DIR/PROFILE/CELL/x1.0 and
x1.3 (and RUNS_DIR/PROFILE/synth/sN/x*, one generated trace per seed), each
an `inferrail compare` output with results.json, and RUNS_DIR/capacity/W.
"""
import glob
import json
import os
import statistics
import sys

OURS = "cost_model"
PEERS = ["aibrix", "dynamo", "llmd", "preble", "sglang"]
ORDER = ["w1", "w2", "w3", "w4", "w5", "w6", "w7", "mooncake", "synth"]


def load(runs):
    cells = {}  # (profile, cell, rate) -> policy -> [summary per seed]
    for path in sorted(glob.glob(os.path.join(runs, "*", "**", "results.json"), recursive=True)):
        rel = os.path.relpath(path, runs).split(os.sep)
        if rel[0] == "capacity":
            continue
        profile, rate = rel[0].replace("-at-", "@"), rel[-2]
        cell = rel[1]
        for s in json.load(open(path)):
            cells.setdefault((profile, cell, rate), {}).setdefault(s["policy"], []).append(s)
    return cells


def stat(xs):
    return statistics.fmean(xs), min(xs), max(xs)


def row_stats(sums):
    p99 = [s["ttft_ms"]["p99"] for s in sums]
    return {
        "p50": statistics.fmean(s["ttft_ms"]["p50"] for s in sums),
        "p99": stat(p99),
        "hit": statistics.fmean(s["hit_rate"] for s in sums),
        "slo": statistics.fmean(s["slo_attainment"] for s in sums),
        "failed": sum(s["failed"] + s.get("rejected_total", 0) for s in sums),
        "seeds": len(sums),
        "rate": statistics.fmean(s["rate_rps"] for s in sums),
        "requests": sum(s["requests"] for s in sums),
    }


def verdict(rows):
    """How the default policy's TTFT p99 stands against the best peer's."""
    if OURS not in rows:
        return "n/a", None
    peers = [p for p in rows if p in PEERS]
    if not peers:
        return "n/a", None
    best = min(peers, key=lambda p: rows[p]["p99"][0])
    ours, theirs = rows[OURS]["p99"], rows[best]["p99"]
    spread = max(ours[2] - ours[1], theirs[2] - theirs[1])
    if ours[0] <= theirs[0]:
        return "best", best
    if ours[0] - theirs[0] <= spread:
        return "within seed spread", best
    return "**behind**", best


def svg_heatmap(stats, path):
    """cost_model's TTFT p99 over the best peer's, per cell: green at or
    below 1, red above."""
    profiles = sorted({k[0] for k in stats}, key=lambda p: (p != "default", p))
    cols = [(c, r) for c in ORDER for r in ("x1.0", "x1.3") if any(k[1] == c and k[2] == r for k in stats)]
    cw, ch, left, top = 62, 26, 170, 40
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{left + cw * len(cols) + 10}" height="{top + ch * len(profiles) + 40}" font-family="sans-serif" font-size="11">']
    out.append(f'<text x="4" y="14" font-size="13">cost_model TTFT p99 / best peer TTFT p99 (mean over seeds; at most 1.00 is a win)</text>')
    for j, (c, r) in enumerate(cols):
        out.append(f'<text x="{left + j * cw + 4}" y="{top - 6}">{c} {r[1:]}</text>')
    for i, p in enumerate(profiles):
        out.append(f'<text x="4" y="{top + i * ch + 17}">{p}</text>')
        for j, (c, r) in enumerate(cols):
            rs = stats.get((p, c, r))
            if not rs or OURS not in rs:
                continue
            peers = [k for k in rs if k in PEERS]
            if not peers:
                continue
            ratio = rs[OURS]["p99"][0] / max(min(rs[k]["p99"][0] for k in peers), 1e-9)
            g = max(0, min(1, (ratio - 0.8) / 0.4))
            color = f"rgb({int(60 + 190 * g)},{int(190 - 130 * g)},90)"
            out.append(f'<rect x="{left + j * cw}" y="{top + i * ch}" width="{cw - 2}" height="{ch - 2}" fill="{color}"/>')
            out.append(f'<text x="{left + j * cw + 12}" y="{top + i * ch + 17}" fill="white">{ratio:.2f}</text>')
    out.append("</svg>")
    open(path, "w").write("\n".join(out) + "\n")


def capacity(runs):
    """Replicas each policy needs per workload, from capacity.json."""
    out = {}
    for path in sorted(glob.glob(os.path.join(runs, "capacity", "*", "capacity.json"))):
        d = json.load(open(path))
        best = {}
        for p in d["policies"]:
            at = next((pt for pt in p["points"] if pt["replicas"] == p["replicas"]), None)
            # An answer whose runs the steady-state check doubts is marked.
            best[p["policy"]] = f'{p["replicas"]}{" ⚠" if at and at["unsteady_seeds"] else ""}'
        if d.get("duration_s"):
            run = f'{d["duration_s"]:g} s of arrivals'
        else:
            run = f'{d.get("requests", 0)} requests'
        out[d["workload"]] = (best, d["rate_rps"], f'{run}, {d.get("warmup_s", 0):g} s warm-up')
    return out


def main(runs, doc):
    cells = load(runs)
    stats = {k: {p: row_stats(v) for p, v in rows.items()} for k, rows in cells.items()}
    os.makedirs(doc, exist_ok=True)
    svg_heatmap(stats, os.path.join(doc, "p99_vs_best_peer.svg"))
    lines = ["# Leaderboard", "",
             "Generated by `make leaderboard` (scripts/leaderboard.sh); do not edit by hand. Every policy on every "
             "workload and trace, at each engine profile, each cell's default rate (x1.0) and 1.3 times it, over "
             "several seeds (synthetic workloads: one request stream per seed; the Mooncake trace: a different random "
             "90% of it per seed; the generated trace: one `trace synth` trace per seed). Traces run on 16 replicas, "
             "workloads on the default 4. TTFT in ms; p99 is the mean over seeds with the range across seeds; hit is "
             "the prefix-cache hit rate; SLO is the share of requests within the SLO; failed counts failed and "
             "rejected requests over all seeds.", "",
             "![cost_model against the best peer](p99_vs_best_peer.svg)", "",
             "## The default policy against the best peer", "",
             "Verdict: `best` when cost_model's mean TTFT p99 is at most the best peer's (aibrix, dynamo, llmd, "
             "preble, sglang), `within seed spread` when the gap is at most the larger range across seeds of the two, "
             "else `behind`.", "",
             "| profile | cell | rate | req/s | cost_model p99 | best peer | its p99 | verdict |",
             "|---|---|---|---|---|---|---|---|"]
    keys = sorted(cells, key=lambda k: (k[0] != "default", k[0], ORDER.index(k[1]) if k[1] in ORDER else 99, k[2]))
    tally = {}
    for k in keys:
        rows = stats[k]
        v, best = verdict(rows)
        tally[v] = tally.get(v, 0) + 1
        if best is None:
            continue
        o, b = rows[OURS]["p99"], rows[best]["p99"]
        lines.append(f"| {k[0]} | {k[1]} | {k[2]} | {rows[OURS]['rate']:.2f} | {o[0]:.0f} ({o[1]:.0f}-{o[2]:.0f}) | {best} | {b[0]:.0f} ({b[1]:.0f}-{b[2]:.0f}) | {v} |")
    lines += ["", "Cells: " + ", ".join(f"{n} {v.strip('*')}" for v, n in sorted(tally.items())) + ".", ""]
    cap = capacity(runs)
    if cap:
        pols = sorted({p for c, _, _ in cap.values() for p in c})
        lines += ["## Capacity (default profile)", "",
                  "The fewest replicas whose TTFT and TPOT p99 (medians over the seeds) meet the SLO with every request "
                  "completed (`inferrail capacity`; 0 when none up to its --max-replicas does). Each search runs long "
                  "enough for the steady-state check to pass at its answers; ⚠ marks an answer some seed's run at that "
                  "size still looks too short for (see the search's report).", "",
                  "| workload | req/s | run | " + " | ".join(pols) + " |",
                  "|---|---|---|" + "---|" * len(pols)]
        for w, (best, rate, run) in sorted(cap.items()):
            lines.append(f"| {w} | {rate:.2f} | {run} | " + " | ".join(str(best.get(p, "-")) for p in pols) + " |")
        lines.append("")
    lines += ["## Every cell", ""]
    for k in keys:
        rows = stats[k]
        any_row = next(iter(rows.values()))
        lines += [f"### {k[0]}, {k[1]}, {k[2]} ({any_row['rate']:.2f} req/s, {any_row['seeds']} seeds)", "",
                  "| policy | TTFT p50 | TTFT p99 (range) | hit | SLO | failed |", "|---|---|---|---|---|---|"]
        for p in sorted(rows, key=lambda p: rows[p]["p99"][0]):
            r = rows[p]
            lines.append(f"| {p} | {r['p50']:.0f} | {r['p99'][0]:.0f} ({r['p99'][1]:.0f}-{r['p99'][2]:.0f}) | {r['hit']:.3f} | {r['slo']:.3f} | {r['failed']} |")
        lines.append("")
    open(os.path.join(doc, "leaderboard.md"), "w").write("\n".join(lines))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
