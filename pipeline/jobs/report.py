"""Human-readable output of the subcommands (the --json forms are the dicts themselves).

Every name that came from a config is printed through `printable`: a name holding terminal
control characters (a colour, a cursor move, a fake "verified" line) is shown escaped.
"""

from __future__ import annotations

import json
import unicodedata
from typing import Any

from pipeline.config.eligibility import Verdict
from pipeline.core.model import ModelGeometry
from pipeline.core.topology import Topology


def printable(text: object, *, keep_lines: bool = False) -> str:
    """`text` with every control or format character escaped (newlines kept if asked)."""

    def shown(c: str) -> str:
        if unicodedata.category(c)[0] != "C" or (keep_lines and c == "\n"):
            return c
        return c.encode("unicode_escape").decode("ascii")

    return "".join(shown(c) for c in str(text))


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")


def verdict_text(verdict: Verdict, model: ModelGeometry, topology: Topology) -> str:
    state = "ACTIVE" if verdict.active else "INACTIVE"
    lines = [
        f"strategy {printable(verdict.strategy)}: {state} for {printable(model.name)} on "
        f"{printable(topology.label)} (attention-TP {topology.attn_tp_size})",
        f"effective strategy: {printable(verdict.effective_strategy)}",
    ]
    if verdict.rules:
        lines.append("rules:")
        width = max(len(r.name) for r in verdict.rules)
        lines += [
            f"  {'ok  ' if r.passed else 'FAIL'} {r.name:<{width}}  {r.message}"
            for r in verdict.rules
        ]
    else:
        lines.append("rules: none (always active)")
    lines += ["notes:", *(f"  - {printable(n)}" for n in verdict.notes)] if verdict.notes else []
    return "\n".join(lines)


def _stages(lists: dict[str, list[str]]) -> str:
    return " | ".join(f"{name}: {' -> '.join(items) or '-'}" for name, items in lists.items())


def plan_text(result: dict[str, Any]) -> str:
    lines = [
        f"strategy {printable(result['strategy'])} "
        f"({'active' if result['active'] else 'inactive'}), "
        f"effective: {printable(result['effective_strategy'])}",
        f"{printable(result['model'])} ({result['bytes_per_token']} B/token) on "
        f"{printable(result['topology_label'])} "
        f"(attention-TP {result['attn_tp_size']}), {result['num_tokens']} tokens "
        f"{result['placement']}",
        f"backup stages  {_stages(result['stages']['backup'])}",
        f"load stages    {_stages(result['stages']['load'])}",
        *(
            [f"L3 stages      {_stages(result['stages']['l3'])}"]
            if any("l3_hit_pages" in r for r in result["ranks"])
            else []
        ),
        "",
        f"{'rank':>4} {'backup D2H':>11} {'load H2D':>11} {'bcast send':>11} {'bcast recv':>11}"
        f" {'backup ops':>10} {'load ops':>9} {'host tokens':>12} {'host pool':>11}"
        f" {'dev staging':>11}",
    ]
    for r in result["ranks"]:
        lines.append(
            f"{r['rank']:>4} {human_bytes(r['d2h_bytes']):>11} {human_bytes(r['h2d_bytes']):>11}"
            f" {human_bytes(r['broadcast_send_bytes']):>11}"
            f" {human_bytes(r['broadcast_recv_bytes']):>11}"
            f" {sum(r['backup_ops'].values()):>10} {sum(r['load_ops'].values()):>9}"
            f" {r['host_capacity_tokens']:>12} {human_bytes(r['host_pool_bytes']):>11}"
            f" {human_bytes(r['device_staging_bytes']):>11}"
        )
    lines += [f"rank {r['rank']} {l3_text(r)}" for r in result["ranks"] if "l3_hit_pages" in r]
    lines += [f"note: {printable(n)}" for n in result["notes"]]
    return "\n".join(lines)


def l3_text(r: dict[str, Any]) -> str:
    """A rank's L3 bytes and hit pages (its row has them where a store is attached)."""
    return (
        f"L3: wrote {human_bytes(r['l3_write_bytes'])}"
        + (f" (sent {human_bytes(r['l3_send_bytes'])} to the writer)" if r["l3_send_bytes"] else "")
        + f", read {human_bytes(r['l3_read_bytes'])}, {r['l3_hit_pages']} pages hit"
    )


def run_text(result: dict[str, Any]) -> str:
    lines = [
        f"strategy {printable(result['strategy'])} -> "
        f"{printable(result['effective_strategy'])}, {printable(result['model'])} "
        f"on {printable(result['topology_label'])} ({result['device']})",
        *(f"note: {printable(n)}" for n in result["notes"]),
    ]
    for r in result["ranks"]:
        stages = ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in r["stage_seconds"].items())
        lines += [
            f"rank {r['rank']}: D2H {human_bytes(r['d2h_bytes'])}, H2D "
            f"{human_bytes(r['h2d_bytes'])}, broadcast sent "
            f"{human_bytes(r['broadcast_send_bytes'])} / received "
            f"{human_bytes(r['broadcast_recv_bytes'])}",
            f"  host capacity {r['host_capacity_tokens']} tokens in "
            f"{human_bytes(r['host_pool_bytes'])}; {r['ops']} ops {r['ops_by_kind']}",
            f"  backup {r['gbps']['backup']:.2f} GB/s, load {r['gbps']['load']:.2f} GB/s; "
            f"stages: {stages}",
            *([f"  {l3_text(r)}, {r['l3_fallbacks']} fallbacks"] if "l3_hit_pages" in r else []),
            f"  verified: {'bit-exact' if r['verified'] else 'MISMATCH ' + r['mismatch']}",
        ]
    lines.append(
        f"verified: {'bit-exact' if result['verified'] else 'FAILED'} "
        f"({len(result['ranks'])} ranks)"
    )
    return "\n".join(lines)


def ordering_text(result: dict[str, Any]) -> str:
    lines = [
        f"ordering model: {printable(result['effective_strategy'])} load of "
        f"{result['layers']} layers "
        f"({result['broadcasts']} broadcasts) on {result['ranks']} ranks, then a forward with "
        "one all-reduce per layer",
    ]
    for design, finding in result["designs"].items():
        verdict = "DEADLOCK" if finding["deadlock"] else "safe"
        mark = "  <- configured" if design == result["configured"] else ""
        lines.append(f"  {design:<15} {verdict:<9} ({finding['states']} states){mark}")
        lines += [f"      {w}" for w in finding["witness"]]
    return "\n".join(lines + notes_lines(result))


def notes_lines(result: dict[str, Any]) -> list[str]:
    """The verdict's notes (the links priced with, what strategy=auto picked, a fallback)."""
    return [f"note: {printable(n)}" for n in result.get("notes", [])]


def simulate_text(result: dict[str, Any]) -> str:
    lines = [
        f"simulate: {result['ranks']} ranks, predicate {result['predicate']}",
        f"{'seed':>4} {'reduces off':>11} {'reduces on':>10} {'skipped':>7} {'forced':>6} "
        f"{'poll ms off':>11} {'poll ms on':>10}  ranks agree  on == off",
    ]
    for r in result["runs"]:
        agree = "yes" if r["ranks_agree"] else "NO"
        same = "yes" if r["skip_on_equals_off"] else "NO"
        lines.append(
            f"{r['seed']:>4} {r['reduces_off']:>11} {r['reduces_on']:>10} {r['skipped']:>7} "
            f"{r['forced']:>6} {r['poll_ms_off']:>11.3f} {r['poll_ms_on']:>10.3f}  "
            f"{agree:>11}  {same:>8}"
        )
    lines.append("ok" if result["ok"] else "FAILED")
    return "\n".join(lines + notes_lines(result))


def soak_text(result: dict[str, Any]) -> str:
    lines = [
        f"soak: {result['cycles']} rounds of {printable(result['strategy'])}, memory read "
        f"after {result['warmup_cycles']}, halfway and at the end",
        f"{'rank':>4} {'RSS warm MB':>12} {'RSS end MB':>11} {'growth MB':>10} "
        f"{'2nd half MB':>12}  bit-exact",
    ]
    lines += [
        f"{r['rank']:>4} {r['rss_warm_mb']:>12.1f} {r['rss_end_mb']:>11.1f} "
        f"{r['rss_growth_mb']:>10.2f} {r['rss_late_growth_mb']:>12.2f}  "
        f"{'yes' if r['verified'] else 'NO'}"
        for r in result["ranks"]
    ]
    flat = "flat" if result["flat"] else "GROWS"
    most = result["max_rss_growth_mb"]
    lines.append(f"{flat} (at most {most:g} MB per rank, {most / 2:g} of it in the 2nd half)")
    for rank, metrics in enumerate(result["metrics"]):
        moved = ", ".join(f"{k} {human_bytes(v)}" for k, v in metrics["bytes"].items())
        waits = ", ".join(
            f"{op} {t['mean_ms']:.3f} ms x{t['count']}" for op, t in metrics["latency"].items()
        )
        l3 = ", ".join(f"{k} {v}" for k, v in metrics["l3"].items())
        lines.append(f"rank {rank} metrics: moved {moved}; mean latency {waits}")
        if any(metrics["l3"].values()):
            lines.append(f"rank {rank} L3: {l3}")
    return "\n".join(lines + notes_lines(result))


def validate_text(result: dict[str, Any]) -> str:
    lines = [f"checked {counted(len(result['checked']), 'config')}"]
    for e in result["errors"]:
        where = f"{e['file']}:{e['line']}" if e["line"] is not None else e["file"]
        lines.append(printable(f"error: {where}: {e['message']}" if where else e["message"]))
    for w in result["warnings"]:
        where = f"{w['file']}:{w['line']}: " if w["line"] is not None else f"{w['file']}: "
        lines.append(printable(f"warning: {where if w['file'] else ''}{w['message']}"))
    lines.append("valid" if result["valid"] else counted(len(result["errors"]), "error"))
    return "\n".join(lines)


def counted(n: int, thing: str) -> str:
    return f"{n} {thing}" + ("" if n == 1 else "s")


def write_trace(path: str, ranks: list[dict[str, Any]]) -> None:
    """Every rank's ops as JSON lines, each tagged with its rank (taken out of the report)."""
    with open(path, "x") as f:  # never over a file that is already there
        for r in ranks:
            for op in r.pop("trace"):
                f.write(json.dumps({"rank": r["rank"], **op}) + "\n")
