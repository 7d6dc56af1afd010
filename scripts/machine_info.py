"""What a benchmark ran on: CPU model, cores, load, library versions, the exact command.

Shared by the measurement scripts so every benchmarks/*.md states its machine the same way.
The machine is shared with other work, so the load average before and after a measurement is
part of the result, not an afterthought.

Two halves, kept apart so a report is a pure function of its JSON: the run that measures calls
`machine_facts()` (and `load_average()`, `command_line()`) and stores what they return in its JSON;
the report prints those stored facts with `machine_lines()`, never the machine it runs on, and
says "not recorded" where a JSON kept from an older run lacks them.
"""

from __future__ import annotations

import os
import platform
import shlex
import subprocess
import sys


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        return platform.processor() or "unknown"
    for line in out.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def load_average() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} / {five:.2f} / {fifteen:.2f}"


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in ("torch", "hivemind", "grpc"):
        try:
            module = __import__(name)
            out[name] = getattr(module, "__version__", "?")
        except ImportError:
            out[name] = "not installed"
    return out


def command_line() -> str:
    return " ".join(shlex.quote(a) for a in [".venv/bin/python", *sys.argv])


NOT_RECORDED = "not recorded"


def machine_facts() -> dict:
    """This machine, as the run that measures on it stores it in its JSON: CPU model, cores,
    kernel and the library versions (the shape `machine_lines` reads)."""
    return {"cpu": cpu_model(), "cores": os.cpu_count(), "os": f"{platform.system()} {platform.release()}",
            "versions": versions()}


def machine_lines(facts: dict | None, load_before: str | None, load_after: str | None) -> list[str]:
    """Markdown bullet lines describing the machine and the measurement conditions, from the
    `machine_facts()` a run stored in its JSON; whatever it lacks is printed as not recorded."""
    load = f"- load average (1/5/15 min) before: {load_before or NOT_RECORDED}; after: {load_after or NOT_RECORDED}"
    if not facts:
        return [f"- machine: {NOT_RECORDED} in this JSON", load]
    v = facts.get("versions") or {}
    return [
        f"- CPU: {facts.get('cpu', NOT_RECORDED)}, {facts.get('cores', NOT_RECORDED)} cores visible (shared with other jobs)",
        load,
        f"- {facts.get('os', 'OS ' + NOT_RECORDED)}, Python {v.get('python', NOT_RECORDED)}, torch {v.get('torch', NOT_RECORDED)}, "
        f"hivemind {v.get('hivemind', NOT_RECORDED)}, grpcio {v.get('grpc', NOT_RECORDED)}",
    ]


NOTES_MARK = "<!-- notes -->"


def write_keeping_notes(path, text: str) -> None:
    """Write a generated markdown file, keeping whatever a person wrote below NOTES_MARK."""
    from pathlib import Path

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    existing = path.read_text() if path.exists() else ""
    notes = existing.split(NOTES_MARK, 1)[1] if NOTES_MARK in existing else "\n"
    path.write_text(text.rstrip("\n") + "\n\n" + NOTES_MARK + notes)
