"""Print what the NVIDIA driver reports on this host as JSON (pdkit_nvidia's probe).

{"ok": bool, "error": str, "gpus": [{"index", "name", "driver_version", "persistence_mode"}],
 "driver_version": str, "driver_branch": str, "cuda_version": str, "nvswitches": int,
 "ibgda": {"stream_mem_ops": bool, "peer_mapping_override": bool}}

`ibgda` reads the loaded driver's options (PROC/driver/nvidia/params; PROC is the first
argument, default /proc): DeepEP's IBGDA needs NVreg_EnableStreamMemOPs=1 and
NVreg_RegistryDwords="PeerMappingOverride=1;".

Read-only; never fails: a missing driver is reported with ok=false and the error text.
"""

import json
import re
import subprocess
import sys

FIELDS = ("index", "name", "driver_version", "persistence_mode")


def run(argv):
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return 127, "", str(exc)
    return done.returncode, done.stdout, done.stderr


def ibgda(proc):
    try:
        with open(proc + "/driver/nvidia/params", encoding="utf-8") as params:
            text = params.read()
    except OSError:
        text = ""
    return {
        "stream_mem_ops": re.search(r"^EnableStreamMemOPs:\s*1\s*$", text, re.M) is not None,
        "peer_mapping_override": re.search(r"PeerMappingOverride\s*=\s*1", text) is not None,
    }


def main():
    facts = {"ok": False, "error": "", "gpus": [], "driver_version": "", "driver_branch": "",
             "cuda_version": "", "nvswitches": 0,
             "ibgda": ibgda(sys.argv[1] if len(sys.argv) > 1 else "/proc")}
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
