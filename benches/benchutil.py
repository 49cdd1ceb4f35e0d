"""Helpers shared by the benchmark scripts in benches/."""
import platform


def cpu_name():
    """The CPU model from /proc/cpuinfo, else platform.processor() (may be empty)."""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"
