"""A TCP proxy that adds a fixed one-way delay in both directions (user-space stand-in for netem).

    python scripts/delay_proxy.py --listen 10.77.0.101:31400 --target 127.0.0.1:31400 --delay-ms 25

Every chunk read from one side is written to the other side `delay` later; reading goes on
meanwhile, so the delay is a pipeline (propagation), not a throughput cap: a connection through it
sees RTT + 2 x delay. Used by scripts/wan_emulation.py where the kernel lacks `tc netem`; one proxy
sits in front of each node's gRPC port, so every gRPC connection gets the delay exactly once.
At most MAX_BUFFERED chunks wait per direction, so a slow receiver pushes back on the sender
instead of the proxy buffering without bound.

scripts/delay_proxy.c is the same proxy in C (same flags and behaviour); `command` picks it where a
C compiler can build it (into build/, once), since a Python proxy per node costs the emulated swarm
CPU that a real WAN's latency does not (eight of them ~0.27 CPU-s per 8-peer round on 2 cores).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NATIVE_SOURCE = ROOT / "scripts" / "delay_proxy.c"
NATIVE_BINARY = ROOT / "build" / "delay_proxy"
CHUNK = 64 << 10
MAX_BUFFERED = 64  # chunks per direction: 4 MiB, more than 100 Mbit/s x 50 ms (625 KB) in flight


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay_s: float) -> None:
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(maxsize=MAX_BUFFERED)

    async def read_side() -> None:
        try:
            while data := await reader.read(CHUNK):
                await queue.put((loop.time() + delay_s, data))
        except (ConnectionError, OSError):
            pass
        await queue.put((loop.time() + delay_s, b""))

    async def write_side() -> None:
        try:
            while True:
                due, data = await queue.get()
                wait = due - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                if not data:
                    if writer.can_write_eof():
                        writer.write_eof()
                    return
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass

    await asyncio.gather(read_side(), write_side())


async def serve(listen: tuple[str, int], target: tuple[str, int], delay_s: float) -> None:
    async def handle(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        try:
            server_reader, server_writer = await asyncio.open_connection(*target)
        except OSError:
            client_writer.close()
            return
        try:
            await asyncio.gather(_pump(client_reader, server_writer, delay_s), _pump(server_reader, client_writer, delay_s))
        finally:
            for w in (client_writer, server_writer):
                w.close()

    server = await asyncio.start_server(handle, *listen)
    print(f"delay proxy {listen[0]}:{listen[1]} -> {target[0]}:{target[1]} (+{delay_s * 1000:.0f} ms each way)", flush=True)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    async with server:
        await stop.wait()


def native_binary(source: Path = NATIVE_SOURCE, binary: Path = NATIVE_BINARY) -> Path | None:
    """The C proxy, compiled from `source` if it is missing or older than it; None (with the reason
    on stderr) where no C compiler is found or the build fails."""
    if binary.exists() and binary.stat().st_mtime >= source.stat().st_mtime:
        return binary
    compiler = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if compiler is None:
        print("delay_proxy: no C compiler (cc, gcc, clang) found: using the Python proxy", file=sys.stderr)
        return None
    binary.parent.mkdir(parents=True, exist_ok=True)
    built = subprocess.run([compiler, "-O2", "-o", str(binary), str(source)], capture_output=True, text=True)
    if built.returncode != 0:
        print(f"delay_proxy: building {source.name} failed, using the Python proxy:\n{built.stderr}", file=sys.stderr)
        return None
    return binary


def command(listen: str, target: str, delay_ms: float, *, native: bool = True) -> list[str]:
    """The argv of a delay proxy from `listen` to `target` adding `delay_ms` each way: the C one
    where `native` and it builds, else this Python one."""
    flags = ["--listen", listen, "--target", target, "--delay-ms", f"{delay_ms:g}"]
    binary = native_binary() if native else None
    return [str(binary), *flags] if binary is not None else [sys.executable, str(Path(__file__).resolve()), *flags]


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r}: use HOST:PORT")
    return host, int(port)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--listen", type=_address, required=True, metavar="HOST:PORT")
    parser.add_argument("--target", type=_address, required=True, metavar="HOST:PORT")
    parser.add_argument("--delay-ms", type=float, required=True, help="one-way delay added in each direction")
    args = parser.parse_args(argv)
    if args.delay_ms < 0:
        parser.error("--delay-ms must be >= 0")
    asyncio.run(serve(args.listen, args.target, args.delay_ms / 1000))
    return 0


if __name__ == "__main__":
    sys.exit(main())
