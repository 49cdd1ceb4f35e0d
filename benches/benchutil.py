"""Helpers shared by the benchmark scripts in benches/."""
import platform
import subprocess
import time


def cpu_name():
    """The CPU model from /proc/cpuinfo, else platform.processor() (may be empty)."""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def vm_hwm_kb(pid):
    """A process's peak resident set (VmHWM, KiB), 0 once it is gone. Not getrusage: on Linux
    a child's ru_maxrss includes the parent's RSS at fork, which is not the child's."""
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def run_with_peak(cmd, poll=0.01):
    """Runs cmd (stdout discarded); returns (returncode, seconds, peak RSS bytes of that
    process read from its VmHWM every `poll` seconds, the tail of its stderr)."""
    t0 = time.perf_counter()
    child = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak = 0
    while child.poll() is None:
        peak = max(peak, vm_hwm_kb(child.pid))
        time.sleep(poll)
    dt = time.perf_counter() - t0
    err = child.stderr.read().decode(errors="replace")[-2000:]
    return child.returncode, dt, peak * 1024, err
