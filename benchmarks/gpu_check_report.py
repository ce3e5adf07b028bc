"""The GPU check's report in Markdown (``gpu_check.md``), from the same dict as its JSON."""

from __future__ import annotations

TITLES = {"device": "Device", "kernels": "Fused kernels against their plain twins",
          "pytest": "pytest -m gpu", "base": "The base update",
          "big": "The big preset's largest batch", "multi30k": "Multi30k, small preset"}


def markdown(report: dict) -> str:
    lines = [f"# GPU check, {report['generated']}, commit {report['commit']}", "",
             f"`{report['command']}` ({report.get('elapsed_s', 0):.0f} s of a "
             f"{report['budget_s']:.0f} s budget)."]
    if report["smoke"]:
        lines.append("Smoke run (`--smoke`): tiny sizes; the figures measure nothing.")
    if report["sections"].get("device", {}).get("cupy_double"):
        lines.append("On the CuPy double: launches are counts, every other figure is meaningless.")
    for name, section in report["sections"].items():
        lines += ["", f"## {TITLES[name]}", ""]
        status = section.get("status")
        if status not in ("ok", None):
            why = section.get("error") or section.get("why") or "see below"
            lines.append(f"**{status}**: {why}")
            lines.append("")
        lines += RENDER[name](section) if status in ("ok", "error") else []
        lines += ["", f"*{section['seconds']} s*"]
    return "\n".join(lines) + "\n"


def device_lines(s: dict) -> list[str]:
    if "gpu" not in s:
        return []
    return [f"- GPU: {s['gpu']}, {s['memory_gib']} GiB, compute capability "
            f"{s['compute_capability']}; default precision {s['default_precision']}",
            f"- CUDA: driver {s['driver_cuda']}, runtime {s['runtime_cuda']}",
            f"- CuPy {s['cupy']}, NumPy {s['numpy']}, PyTorch {s['pytorch']}"
            + (f" ({s['pytorch_cuda']})" if "pytorch_cuda" in s else "")
            + f", Python {s['python']}"]


def kernels_lines(s: dict) -> list[str]:
    if "rows" not in s:
        return []
    lines = [f"Every kernel equal to its twin: **{'yes' if s['all_equal'] else 'NO'}** "
             f"(`python -m minitfm.kernelcheck`)", "",
             "| case | worst output | largest relative difference | tolerance | |",
             "|---|---|---|---|---|"]
    lines += [f"| {r['case']} | {r['output']} | {r['error']:.2e} | {r['tolerance']:.0e} | "
              f"{'ok' if r['ok'] else 'DIFFERS'} |" for r in s["rows"] if "case" in r]
    missed = [r["kernel"] for r in s["rows"] if "kernel" in r and not r["ok"]]
    ran = [r for r in s["rows"] if "kernel" in r]
    lines += ["", f"{len(ran) - len(missed)} of {len(ran)} kernels ran"
              + (f"; not run by any case: {', '.join(missed)}" if missed else "") + "."]
    return lines


def pytest_lines(s: dict) -> list[str]:
    if "collected" not in s:
        return []
    lines = [f"`{s['command']}`: {s['collected']} collected; {s['passed']} passed, "
             f"{s['failed']} failed, {s['skipped']} skipped, {s['errors']} errors; "
             f"tests started within {s['budget_s']:.0f} s"]
    for failure in s["failures"]:
        lines.append(f"- FAILED `{failure['test']}`: {failure['message']}")
    if s["interrupted"]:
        lines.append(f"- stopped while running (over the budget): "
                     f"{', '.join(f'`{t}`' for t in s['interrupted'])}")
    if s["left_out_for_time"]:
        shown = ", ".join(f"`{t}`" for t in s["left_out_for_time"][:20])
        more = len(s["left_out_for_time"]) - 20
        lines.append(f"- left out for time ({len(s['left_out_for_time'])}): {shown}"
                     + (f" and {more} more" if more > 0 else ""))
    return lines


def figure(value, spec: str, none: str = "-") -> str:
    return none if value is None else format(value, spec)


def base_lines(s: dict) -> list[str]:
    if "rows" not in s:
        return []
    peaks = ", ".join(f"{k} {v:.1f}" for k, v in s["peaks"]["tflops"].items())
    lines = [f"Batch {s['batch']} ({s['target_tokens']:,} target tokens), "
             f"{s['gflop_per_update']:.0f} GFLOP per update, of which "
             f"{s['batched_fp32_share']:.1%} in batched products (attention), which CuPy runs "
             f"in float32 under TF32 too. Dense peaks (TFLOP/s): {peaks} "
             f"({s['peaks']['source']}); AMP is measured against fp16.", "",
             "| contender | precision | first step s | step s | target tok/s | TFLOP/s | "
             "of peak | peak memory GiB | launches/update |",
             "|---|---|---|---|---|---|---|---|---|"]
    for row in s["rows"]:
        if row["status"] != "ok" or "step_s" not in row:
            why = row.get("error") or row.get("why") or row["status"]
            lines.append(f"| {row['contender']} | {row['precision']} | {row['status']}: {why} "
                         f"| | | | | | |")
            continue
        lines.append(
            f"| {row['contender']} | {row['precision']} | {row['first_step_s']:.3f} | "
            f"{row['step_s']:.3f} | {row['target_tokens_per_s']:,.0f} | {row['tflops']:.2f} | "
            f"{figure(row['fraction_of_peak'], '.1%')} | "
            f"{figure(row.get('peak_memory_gib'), '.2f')} | "
            f"{figure(row.get('launches_per_update'), ',')} |")
    counted = {r.get("launches_counted_by") for r in s["rows"]} - {None}
    lines += ["", f"Launches: {'; '.join(sorted(counted))}." if counted else ""]
    return lines


def big_lines(s: dict) -> list[str]:
    if "probes" not in s:
        return []
    probes = ", ".join(f"{p['max_tokens']:,} {'fits' if p['fits'] else 'out of memory'}"
                       for p in s["probes"])
    best = s["largest_fit"]
    return [f"Largest --max-tokens that trains: **{figure(best, ',', 'none')}** "
            f"(sentences of {s['sentence_length']} tokens, {s['parameters']:,} parameters; "
            f"smallest failure {figure(s['smallest_failure'], ',', 'none')}; search stopped "
            f"for {s['stopped_for'] or 'resolution'}).", f"Probes: {probes}."]


def multi30k_lines(s: dict) -> list[str]:
    lines = [f"`{s['command']}` (exit {s['returncode']})"] if "command" in s else []
    if "first_line" in s:
        lines.append(f"First line: `{s['first_line']}`")
    if "valid_bleu" in s:
        lines.append(f"Greedy validation BLEU **{s['valid_bleu']:.2f}** after {s['steps']} "
                     f"updates ({s['training_minutes']:.1f} min), "
                     f"{s['tokens_per_s']:,.0f} target tokens/s")
    if s.get("stderr_tail"):
        lines += ["", "```", s["stderr_tail"], "```"]
    return lines


RENDER = {"device": device_lines, "kernels": kernels_lines, "pytest": pytest_lines, "base": base_lines, "big": big_lines,
          "multi30k": multi30k_lines}
