#!/usr/bin/python3
"""Wait until a vLLM instance answers /health with 200, or give up early.

    vllm-wait-healthy UNIT URL TIMEOUT_SECONDS

Exit 0 when healthy; 3 when systemd restarted the unit since the wait began (a crash loop that
Restart=on-failure would hide) or the unit failed; 4 on timeout. Prints one line saying which,
with the seconds waited. Installed by the vllm role; standard library only.
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
        if int(state.get("NRestarts", "0") or 0) > restarts or state.get("ActiveState") == "failed":
            print(f"gave up after {waited:.1f} s: {unit} is crash-looping or failed ({state})")
            return 3
        if waited > timeout:
            print(f"timed out after {waited:.1f} s: {unit} {state}")
            return 4
        time.sleep(1)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], float(sys.argv[3])))
