#!/usr/bin/python3
"""Wait until a vLLM instance answers /health with 200, or give up early.

    vllm-wait-healthy UNIT URL TIMEOUT_SECONDS

Exit 0 when healthy; 3 when the release crashed: systemd restarted the unit since the wait began (the
unit restarts on any exit, so a crash shows as a restart) or the unit failed or stopped; 4 when it is
still starting at the timeout (a slow start, not a crash). Prints one line saying which, with the
seconds waited. Installed by the vllm role; standard library only.
"""
import subprocess
import sys
import time
import urllib.error
import urllib.request


def unit_state(unit):
    out = subprocess.run(
        ["systemctl", "show", unit, "--property=ActiveState,SubState,NRestarts,Result"],
        capture_output=True, text=True, check=False,
    ).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def healthy(url):
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def main(unit, url, timeout):
    start = time.monotonic()
    restarts = int(unit_state(unit).get("NRestarts", "0") or 0)
    while True:
        waited = time.monotonic() - start
        if healthy(url):
            print(f"healthy after {waited:.1f} s")
            return 0
        state = unit_state(unit)
        crashes = int(state.get("NRestarts", "0") or 0) - restarts
        if crashes > 0 or state.get("ActiveState") in ("failed", "inactive"):
            print(f"crashed during start: gave up after {waited:.1f} s, {unit} exited and was restarted "
                  f"{max(crashes, 0)} time(s) since the wait began ({state})")
            return 3
        if waited > timeout:
            print(f"still starting after {waited:.1f} s (a slow start, not a crash: raise vllm_health_timeout "
                  f"if this release needs longer): {unit} {state}")
            return 4
        time.sleep(1)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], float(sys.argv[3])))
