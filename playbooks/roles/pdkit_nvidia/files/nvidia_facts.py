"""Print what the NVIDIA driver reports on this host as JSON (pdkit_nvidia's probe).

{"ok": bool, "error": str, "gpus": [{"index", "name", "driver_version", "persistence_mode"}],
 "driver_version": str, "driver_branch": str, "cuda_version": str, "nvswitches": int}

Read-only; never fails: a missing driver is reported with ok=false and the error text.
"""

import json
import re
import subprocess

FIELDS = ("index", "name", "driver_version", "persistence_mode")


def run(argv):
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return 127, "", str(exc)
    return done.returncode, done.stdout, done.stderr


def main():
    facts = {"ok": False, "error": "", "gpus": [], "driver_version": "", "driver_branch": "",
             "cuda_version": "", "nvswitches": 0}
    rc, out, err = run(["nvidia-smi", "--query-gpu=" + ",".join(FIELDS), "--format=csv,noheader"])
    if rc != 0:
        facts["error"] = (err or out).strip() or f"nvidia-smi exited with {rc}"
        print(json.dumps(facts))
        return
    for line in out.splitlines():
        values = [v.strip() for v in line.split(",")]
        if len(values) == len(FIELDS):
            gpu = dict(zip(FIELDS, values))
            gpu["index"] = int(gpu["index"])
            facts["gpus"].append(gpu)
    facts["ok"] = True
    if facts["gpus"]:
        facts["driver_version"] = facts["gpus"][0]["driver_version"]
        facts["driver_branch"] = facts["driver_version"].split(".")[0]
    rc, out, _ = run(["nvidia-smi"])
    match = re.search(r"CUDA Version:\s*([0-9.]+)", out)
    facts["cuda_version"] = match.group(1) if match else ""
    # NVSwitches are NVIDIA PCI devices of class 0680 ("other bridge").
    rc, out, _ = run(["lspci", "-n", "-d", "10de:"])
    facts["nvswitches"] = sum(1 for line in out.splitlines() if " 0680: " in line)
    print(json.dumps(facts))


main()
