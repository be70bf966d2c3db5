"""Once, by hand (not in the suite, not a `make` target): a runtime role switch on the real
SGLang 0.5.23 on this machine's CPU, decode -> prefill and back, under light load.

    .venv/bin/python -m benchmarks.role_switch_real [--keep]

Deploys topologies/local-sglang.yaml as 1 prefill + 2 decodes with enable-pd-role-switch
(`pdkit up`: real servers, minutes on 2 cores), sends one streamed chat request at a time
through the router for the whole run, moves decode-1 to prefill and back with
`kit.autoscale.apply.RoleSwitcher` (drain, POST /pd_role_switch, gate, re-add), and prints
each stage's seconds, the requests sent and how many failed. `pdkit down` at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import yaml
from openai import OpenAI

from kit.autoscale.apply import RoleSwitcher
from kit.autoscale.decide import Split
from kit.hosts.context import DeployContext
from kit.plan.resolve import resolve
from tests.support.real_sglang import sglang_python, tiny_model, write_topology

REPO = Path(__file__).resolve().parents[1]


def pdkit(*args: str, timeout: float = 1200) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PDKIT_STATE_DIR"}
    return subprocess.run(
        [sys.executable, "-c", "from kit.cli import main; main()", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=timeout,
        check=False,
    )


class Load:
    """One streamed chat request at a time through the router until stopped."""

    def __init__(self, url: str, model: str) -> None:
        self.client = OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=120)
        self.model = model
        self.sent = 0
        self.failed: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            self.sent += 1
            try:
                stream = self.client.chat.completions.create(
                    model=self.model,
                    messages=[{"role": "user", "content": f"Count to ten ({self.sent})."}],
                    max_tokens=16,
                    stream=True,
                )
                for _ in stream:
                    pass
            except Exception as exc:
                self.failed.append(f"request {self.sent}: {exc}")
            time.sleep(0.3)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--keep", action="store_true", help="leave the deployment running")
    options = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="pdkit-role-switch-"))
    model = tiny_model(REPO / ".pdkit" / "models" / "tiny-llama")
    name = f"rs-{uuid.uuid4().hex[:6]}"
    topology, data = write_topology(folder, name, model, sglang_python())
    data["decode"]["count"] = 2
    data.setdefault("defaults", {}).setdefault("args", {})["enable-pd-role-switch"] = True
    data["autoscale"] = {}
    topology.write_text(yaml.safe_dump(data, sort_keys=False))
    began = time.monotonic()
    up = pdkit("up", str(topology), "--no-gate")
    up_s = time.monotonic() - began
    print(f"pdkit up (1P2D, real SGLang on CPU): rc {up.returncode} in {up_s:.0f} s")
    if up.returncode != 0:
        print(up.stdout[-4000:], up.stderr[-4000:])
        pdkit("down", str(topology))
        return 1
    result: dict[str, object] = {"up_s": round(up_s, 1)}
    try:
        plan = resolve(topology)
        ctx = DeployContext.build(plan, topology)
        load = Load(plan.router.url, plan.model.served_name)
        load.thread.start()
        time.sleep(5)
        switcher = RoleSwitcher(ctx)
        for label, current, target in (
            ("decode -> prefill", Split(1, 2), Split(2, 1)),
            ("prefill -> decode", Split(2, 1), Split(1, 2)),
        ):
            started = time.monotonic()
            try:
                moved = switcher.move(current, target)
                lines = [m.line() for m in moved]
            except Exception as exc:
                lines = [f"FAILED: {exc}"]
            took = time.monotonic() - started
            print(f"{label}: {took:.2f} s: " + "; ".join(lines))
            result[label] = {"seconds": round(took, 2), "stages": lines}
            time.sleep(5)
        load.stop.set()
        load.thread.join(180)
        print(f"requests: {load.sent} sent, {len(load.failed)} failed")
        for failure in load.failed[:10]:
            print(f"  {failure}")
        result |= {"sent": load.sent, "failed": len(load.failed), "failures": load.failed[:10]}
        status = pdkit("status", str(topology), "--timeout", "15")
        print(status.stdout[-3000:])
    finally:
        out = folder / "result.json"
        out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"result: {out}")
        if not options.keep:
            pdkit("down", str(topology), timeout=300)
    return 0


if __name__ == "__main__":
    sys.exit(main())
