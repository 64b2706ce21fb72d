"""The index benchmark's verdicts and its closing table (benchmarks/stack/index.py).

Target (issue 18): `ivy index` through the stack at >= 90 % of the engine's in-process tokens/s on the same
documents; and the exactly-once checks: the full run's output, and the killed-then-resumed run's, hold every
input id once (none missing, none twice).
"""

from __future__ import annotations

from typing import Any

TARGET_SHARE = 0.9


def verdicts(result: dict[str, Any]) -> dict[str, Any]:
    inproc = (result.get("inprocess") or {}).get("tokens_per_s")
    stack = ((result.get("stack") or {}).get("summary") or {}).get("tokens_per_s")
    ratio = stack / inproc if stack and inproc else None
    kill = result.get("kill_resume")
    checks = [(result.get("stack") or {}).get("check", {}).get("ok")]
    if kill is not None:
        checks.append(bool(kill["check"]["ok"] and kill["kill"].get("killed") and kill["resume"]["exit_code"] == 0))
    return {"stack_over_inprocess": None if ratio is None else round(ratio, 4), "target": f">= {TARGET_SHARE:g}",
            "target_met": None if ratio is None else ratio >= TARGET_SHARE, "checks_ok": all(checks)}


def table(result: dict[str, Any], model: str) -> str:
    inproc, run = result.get("inprocess") or {}, result.get("stack") or {}
    summary = run.get("summary") or {}
    docs = inproc.get("documents") or summary.get("documents") or 0
    lines = [f"index {model}: {docs:,} documents, {inproc.get('tokens', 0) / 1e6:.2f} M tokens"
             + (f" ({result['scaled_note']})" if result.get("scaled_note") else "")]
    lines.append(f"{'path':22s} {'docs/s':>9s} {'k tok/s':>9s} {'wall s':>8s}")
    if inproc:
        lines.append(f"{'in-process engine':22s} {inproc['documents_per_s']:9,.0f} {inproc['tokens_per_s'] / 1e3:9.1f} "
                     f"{inproc['seconds']:8.1f}")
    if summary:
        lines.append(f"{'ivy index -> ivy up':22s} {summary['documents_per_s']:9,.0f} "
                     f"{summary['tokens_per_s'] / 1e3:9.1f} {summary['wall_s']:8.1f}")
    else:
        lines.append(f"{'ivy index -> ivy up':22s} FAILED (exit {run.get('exit_code')})")
    v = verdicts(result)
    ratio = v["stack_over_inprocess"]
    met = "n/a" if v["target_met"] is None else "MET" if v["target_met"] else "MISSED"
    lines.append(f"target: ivy index tokens/s >= 90 % of in-process: {'n/a' if ratio is None else f'{ratio:.1%}'} {met}")
    check = run.get("check")
    if check:
        lines.append(f"full run: {_check(check)}")
    kill = result.get("kill_resume")
    if kill:
        k = kill["kill"]
        lines.append(f"kill/resume: {kill['documents']:,} documents in {kill['shards']} shards, SIGKILL "
                     f"{'after ' + str(k.get('shards_at_kill')) + ' committed' if k.get('killed') else 'MISSED (it finished first)'}"
                     f", resume exit {kill['resume']['exit_code']}: {_check(kill['check'])}")
    return "\n".join(lines)


def _check(check: dict[str, Any]) -> str:
    verdict = "every id once OK" if check["ok"] else "FAILED"
    return (f"{verdict} ({check['rows']:,} rows + {check['rejected']} rejected of {check['expected']:,}; "
            f"{check['missing']} missing, {check['twice']} twice, {check['unexpected']} unexpected)")
