"""Listen on, or connect to, the ports a deployment's hosts must reach (pdkit's reachability
preflight, kit/hosts/reach.py), before anything of the deployment listens there.

Usage: reachprobe.py SPEC, SPEC a base64 JSON object:
  {"mode": "listen", "serve_s": S, "ports": [{"bind": ADDR, "port": N, "expect": K}, ...]}
      binds every port (a port something else already listens on is left to it: "in use"),
      prints {"listening": [{"bind", "port", "state"}]} at once, then accepts and closes
      connections until every port it bound got its K, or S seconds passed, or whoever started
      it is gone (it writes a newline every 0.2 s: a closed pipe ends it, so that a preflight
      that was stopped never holds a port a worker is about to bind).
  {"mode": "connect", "timeout_s": T, "targets": [{"address": ADDR, "port": N}, ...]}
      connects to every target at once and prints {"results": [{"address", "port", "state",
      "error"}]}: state ok, refused, timeout or unreachable.

Standard library only (any Python 3 on the host runs it); changes nothing on the host.
"""

import base64
import errno
import json
import select
import socket
import sys
import threading
import time


def listen(spec):
    bound, report = {}, []
    for entry in spec["ports"]:
        family = socket.AF_INET6 if ":" in entry["bind"] else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((entry["bind"], entry["port"]))
            sock.listen(64)
            sock.setblocking(False)
        except OSError as exc:
            sock.close()
            state = "in use" if exc.errno == errno.EADDRINUSE else "cannot bind: %s" % exc.strerror
            report.append({"bind": entry["bind"], "port": entry["port"], "state": state})
            continue
        bound[sock] = int(entry.get("expect", 1))
        report.append({"bind": entry["bind"], "port": entry["port"], "state": "listening"})
    print(json.dumps({"listening": report}), flush=True)
    deadline = time.monotonic() + float(spec.get("serve_s", 20))
    while bound and time.monotonic() < deadline:
        readable, _, _ = select.select(list(bound), [], [], 0.2)
        try:
            sys.stdout.write("\n")
            sys.stdout.flush()
        except OSError:
            break
        for sock in readable:
            try:
                conn, _ = sock.accept()
            except OSError:
                continue
            conn.close()
            bound[sock] -= 1
            if bound[sock] <= 0:
                del bound[sock]
                sock.close()
    for sock in bound:
        sock.close()


def attempt(target, timeout_s, out):
    started = time.monotonic()
    result = {"address": target["address"], "port": target["port"], "state": "ok", "error": ""}
    try:
        with socket.create_connection((target["address"], target["port"]), timeout=timeout_s):
            pass
    except socket.timeout:
        result.update(state="timeout", error="no answer within %gs" % timeout_s)
    except ConnectionRefusedError as exc:
        result.update(state="refused", error=exc.strerror or "connection refused")
    except OSError as exc:
        result.update(state="unreachable", error=exc.strerror or str(exc))
    result["ms"] = round((time.monotonic() - started) * 1000, 1)
    out.append(result)


def connect(spec):
    out = []
    threads = [
        threading.Thread(target=attempt, args=(t, float(spec.get("timeout_s", 3)), out))
        for t in spec["targets"]
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print(json.dumps({"results": out}), flush=True)


def main():
    spec = json.loads(base64.b64decode(sys.argv[1]).decode())
    {"listen": listen, "connect": connect}[spec["mode"]](spec)


main()
