"""A CPU-throttled straggler for scripts/chaos.py: a cgroup whose CPU quota is cut to a fraction
of one core, on whichever cgroup version this machine mounts (v2: `cpu.max` in a group under
/sys/fs/cgroup, where the cpu controller is enabled; v1: `cpu.cfs_quota_us` under
/sys/fs/cgroup/cpu). Needs root; `close()` moves what is left back to the root group and
removes the group."""

from __future__ import annotations

from pathlib import Path

PERIOD_US = 100_000
V2_ROOT, V1_ROOT = Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/cpu")


def cgroup_kind() -> str:
    """'v2', 'v1', or '' when neither has a writable cpu controller here."""
    controllers = V2_ROOT / "cgroup.controllers"
    if controllers.exists() and "cpu" in controllers.read_text().split():
        return "v2"
    if (V1_ROOT / "cpu.cfs_quota_us").exists():
        return "v1"
    return ""


class CpuThrottle:
    def __init__(self, name: str) -> None:
        self.kind = cgroup_kind()
        self.root = V2_ROOT if self.kind == "v2" else V1_ROOT
        self.path = self.root / name

    def limit(self, pids: list[int], fraction: float, *, shares: int | None = None, period_us: int = PERIOD_US) -> None:
        """Move `pids` into the group and cap it at `fraction` of one core (0 < fraction <= 1), i.e.
        fraction x `period_us` of CPU time in every period of `period_us`.
        `shares`: the group's CPU weight against the machine's other tasks (v1 cpu.shares, 1024 a
        default task's; v2 cpu.weight scaled to it), so that on a busy machine the cap, not the
        competition, sets its speed."""
        if not self.kind:
            raise RuntimeError("no cgroup cpu controller is mounted here (neither v2 cpu.max nor v1 cpu.cfs_quota_us): "
                               "the straggler cannot be throttled; mount one or run without the throttle")
        if not 0.0 < fraction <= 1.0:
            raise ValueError(f"throttle fraction {fraction}: give a share of one core in (0, 1]")
        self.path.mkdir(exist_ok=True)
        if not 1000 <= period_us <= 1_000_000:
            raise ValueError(f"cgroup period {period_us} us: the kernel takes 1000 to 1000000 us")
        quota = max(1000, int(period_us * fraction))
        if self.kind == "v2":
            (self.path / "cpu.max").write_text(f"{quota} {period_us}")
        else:
            (self.path / "cpu.cfs_period_us").write_text(str(period_us))
            (self.path / "cpu.cfs_quota_us").write_text(str(quota))
        if shares is not None:
            if self.kind == "v2":
                (self.path / "cpu.weight").write_text(str(max(1, min(10_000, shares * 100 // 1024))))
            else:
                (self.path / "cpu.shares").write_text(str(shares))
        for pid in pids:
            try:
                (self.path / "cgroup.procs").write_text(str(pid))
            except OSError:  # it exited meanwhile
                pass

    def lift(self) -> None:
        """No cap any more (the processes stay in the group until close)."""
        if self.path.exists():
            if self.kind == "v2":
                (self.path / "cpu.max").write_text(f"max {PERIOD_US}")
            else:
                (self.path / "cpu.cfs_quota_us").write_text("-1")

    def exists(self) -> bool:
        return self.path.exists()

    def close(self) -> None:
        if not self.path.exists():
            return
        try:
            self.lift()
            for pid in (self.path / "cgroup.procs").read_text().split():
                try:
                    (self.root / "cgroup.procs").write_text(pid)
                except OSError:
                    pass
            self.path.rmdir()
        except OSError:
            pass
