"""The rows ``merge_throughput`` reports (:mod:`bench.merge`): per table, its change events/s over
the batches and over the whole run with maintenance's OPTIMIZE included, its files and a delta-rs
read after the run; the ratios between tables measured on the same batches; every batch."""

from __future__ import annotations

import json
from typing import Any

from bench.harness import Outcome, Row, median


def _stats(runs: list[dict[str, Any]], key: str) -> tuple[float, float, float]:
    values = [float(r[key]) for r in runs]
    return min(values), median(values), max(values)


def outcome_of(report: dict[str, Any], batches: int) -> Outcome:
    rows: list[Row] = []
    results = report["results"]
    for result in results:
        lo, mid, hi = _stats(result["runs"], "upserts_per_second")
        s_lo, s_mid, s_hi = _stats(result["runs"], "seconds")
        last = result["runs"][-1]
        how = (f"DV added {last['dv_added']}, " if result["deletion_vectors"] else "") + (
            f"files +{last['files_added']}/-{last['files_removed']}, "
            f"{last['bytes_added'] / 1e6:,.0f} MB written, scan {last['scan_ms'] / 1000:.1f} s, "
            f"rewrite {last['rewrite_ms'] / 1000:.1f} s (last batch)"
        )
        rows.append(
            Row(
                "merge_throughput",
                f"{result['variant']}: change events/s min / median / max",
                f"{lo:,.0f} / {mid:,.0f} / {hi:,.0f}",
                f"{batches} batches of {s_lo:.1f} / {s_mid:.1f} / {s_hi:.1f} s; {how}; "
                f"initial load {result['load_seconds']} s",
            )
        )
        rows.append(_overall(result))
    rows += _ratios(results)
    extra = _every_batch(results)
    return Outcome(rows, report, extra)


def overall_rate(result: dict[str, Any]) -> float:
    """Change events per second over every batch, maintenance's OPTIMIZE time included."""
    events = sum(result.get("events_per_batch", result["batch"]) for _ in result["runs"])
    seconds = sum(float(r["seconds"]) for r in result["runs"])
    seconds += sum(float(o["seconds"]) for o in result.get("optimizations", []))
    return events / seconds


def _overall(result: dict[str, Any]) -> Row:
    optimize = result.get("optimizations", [])
    read = result.get("delta_rs_read") or {}
    reader = (
        f"delta-rs full read {read['seconds']:.1f} s ({read['rows']:,} rows)"
        if "seconds" in read
        else f"delta-rs read failed: {read.get('error', 'not measured')}"
    )
    return Row(
        "merge_throughput",
        f"{result['variant']}: change events/s over all batches, OPTIMIZE included",
        f"{overall_rate(result):,.0f}",
        f"{len(optimize)} OPTIMIZE, {sum(float(o['seconds']) for o in optimize):.1f} s; "
        f"after the run: {result['files_after']} files, {reader}",
    )


def _median_seconds(result: dict[str, Any]) -> float:
    return median([float(r["seconds"]) for r in result["runs"]])


#: Issue 25's MERGE targets: change events/s into a current table of at least this many keys, by
#: shape (OPTIMIZE on its schedule included); and history against current on the same batches.
MERGE_TARGET_KEYS = 10_000_000
MERGE_TARGETS = {"uniform": 30_000.0, "recent": 50_000.0}
HISTORY_RATIO_TARGET = 0.35


def history_pairs(results: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(history, current) results measured on the same batches: same keys, batch, shape, changes
    per key, deletion vectors and confs."""
    same = ("keys", "batch", "shape", "changes_per_key", "deletion_vectors", "conf")
    pairs = []
    for history in (r for r in results if r["table"] == "history"):
        current = next(
            (r for r in results
             if r["table"] == "current" and all(r.get(k) == history.get(k) for k in same)),
            None,
        )  # fmt: skip
        if current is not None:
            pairs.append((history, current))
    return pairs


def _ratios(results: list[dict[str, Any]]) -> list[Row]:
    rows = []
    by = {
        (r["keys"], r["batch"], r["deletion_vectors"], json.dumps(r["conf"]), r.get("table")): r
        for r in results
    }
    for (keys, batch, dv, conf, table), result in by.items():
        if dv and (keys, batch, False, conf, table) in by:
            plain = by[(keys, batch, False, conf, table)]
            rows.append(
                Row(
                    "merge_throughput",
                    f"DV / no DV, {table}, {keys:,} keys, batch {batch:,}"
                    + (f", {conf}" if conf != "{}" else ""),
                    f"{_median_seconds(plain) / _median_seconds(result):.2f}x upserts/s",
                    "median batch times",
                )
            )
    for history, current in history_pairs(results):
        rows.append(
            Row(
                "merge_throughput",
                f"history / current, {history['keys']:,} keys, batch {history['batch']:,}, "
                f"{history.get('shape')}, {history.get('changes_per_key')} changes/key, "
                f"{'DV' if history['deletion_vectors'] else 'no DV'}",
                f"{overall_rate(history) / overall_rate(current):.2f}x change events/s",
                "the same batches, OPTIMIZE included; issue 25's target: "
                f">= {HISTORY_RATIO_TARGET}x",
            )
        )
    sizes = sorted({r["keys"] for r in results})
    for (keys, batch, dv, conf, table), result in by.items():
        if keys == sizes[0] or (sizes[0], batch, dv, conf, table) not in by:
            continue
        small = by[(sizes[0], batch, dv, conf, table)]
        rows.append(
            Row(
                "merge_throughput",
                f"{table} batch time {keys:,} / {sizes[0]:,} keys, batch {batch:,}, "
                f"{'DV' if dv else 'no DV'}",
                f"{_median_seconds(result) / _median_seconds(small):.2f}x",
                f"table {keys / sizes[0]:.0f}x larger; median batch times",
            )
        )
    return rows


def _every_batch(results: list[dict[str, Any]]) -> str:
    lines = [
        "| table | batch | seconds | upserts/s | updated | inserted | files +/- | DVs | MB written | scan s | rewrite s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for result in results:
        for r in result["runs"]:
            lines.append(
                f"| {result['variant']} | {r['batch']} | {r['seconds']:.1f} | "
                f"{r['upserts_per_second']:,.0f} | {r['updated']:,} | {r['inserted']:,} | "
                f"{r['files_added']}/{r['files_removed']} | {r['dv_added']} | "
                f"{r['bytes_added'] / 1e6:,.0f} | {r['scan_ms'] / 1000:.1f} | {r['rewrite_ms'] / 1000:.1f} |"
            )
    return "\n".join(lines)


def targets(results: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """(target, measured, verdict) for issue 25's MERGE and history targets this run measured."""
    rows: list[tuple[str, str, str]] = []
    for r in results:
        goal = MERGE_TARGETS.get(r.get("shape", "uniform"))
        if r["table"] != "current" or r["keys"] < MERGE_TARGET_KEYS or goal is None:
            continue
        rate = overall_rate(r)
        rows.append((
            f"MERGE >= {goal:,.0f} change events/s into a {r['keys']:,}-key current table, "
            f"{r.get('shape', 'uniform')} updates, batches of {r['batch']:,} change events, "
            "OPTIMIZE included",
            f"{rate:,.0f}/s", "met" if rate >= goal else "**not met**",
        ))  # fmt: skip
    for history, current in history_pairs(results):
        ratio = overall_rate(history) / overall_rate(current)
        rows.append((
            f"history >= {HISTORY_RATIO_TARGET}x the current MERGE's change events/s, same "
            f"batches ({history['keys']:,} keys)",
            f"{ratio:.2f}x", "met" if ratio >= HISTORY_RATIO_TARGET else "**not met**",
        ))  # fmt: skip
    return rows
