"""What a benchmark ran on: CPU model, cores, load, library versions, the exact command.

Shared by the measurement scripts so every benchmarks/*.md states its machine the same way.
The machine is shared with other work, so the load average before and after a measurement is
part of the result, not an afterthought.
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


def machine_lines(load_before: str, load_after: str) -> list[str]:
    """Markdown bullet lines describing the machine and the measurement conditions."""
    v = versions()
    return [
        f"- CPU: {cpu_model()}, {os.cpu_count()} cores visible (shared with other jobs)",
        f"- load average (1/5/15 min) before: {load_before}; after: {load_after}",
        f"- {platform.system()} {platform.release()}, Python {v['python']}, torch {v['torch']}, "
        f"hivemind {v['hivemind']}, grpcio {v['grpc']}",
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
