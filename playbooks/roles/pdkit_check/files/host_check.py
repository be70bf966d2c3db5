"""Print, as JSON, what `pdkit provision --check` verifies on this host (pdkit_check's probe).

The argument is a base64 JSON spec: {"candidates": [interpreters to try for 3.11+],
"python": the interpreter pdkit's processes run with, "distributions": [names whose installed
version to read with it], "executables": [names to find in its bin/ or on PATH],
"ports": [[first, last], ...], "nvcc": bool}. Prints {"os", "interpreter", "gcc", "nvcc",
"python", "executables", "listening", "memlock"}; `listening` holds the TCP listeners on the
spec's ports with the process holding each (pid, command, and the PDKIT_DEPLOYMENT /
PDKIT_PROCESS of its environment, readable as root); `memlock` this session's locked-memory
limit (soft, hard; -1: unlimited) and whether it may be raised to unlimited, as a worker's
launch script does with `ulimit -l unlimited` (a hard limit of unlimited, or CAP_SYS_RESOURCE).

Read-only; never fails: what is missing is reported empty.
"""

import base64
import json
import os
import platform
import re
import resource
import shutil
import subprocess
import sys

INTERPRETER = (
    "import json, os, sys, sysconfig; "
    "print(json.dumps({'version': '%d.%d.%d' % sys.version_info[:3], "
    "'headers': os.path.exists(os.path.join(sysconfig.get_paths()['include'], 'Python.h'))}))"
)
DISTRIBUTIONS = (
    "import json, sys\n"
    "from importlib import metadata\n"
    "out = {}\n"
    "for name in sys.argv[1:]:\n"
    "    try:\n"
    "        out[name] = metadata.version(name)\n"
    "    except metadata.PackageNotFoundError:\n"
    "        out[name] = None\n"
    "print(json.dumps(out))\n"
)


def run(argv):
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return 127, ""
    return done.returncode, done.stdout


def os_release():
    fields = {}
    try:
        with open("/etc/os-release", encoding="utf-8") as release:
            for line in release:
                name, sep, value = line.strip().partition("=")
                if sep:
                    fields[name] = value.strip('"')
    except OSError:
        pass
    try:
        glibc = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError):
        glibc = ""
    return {
        "pretty_name": fields.get("PRETTY_NAME", ""),
        "id": fields.get("ID", ""),
        "version_id": fields.get("VERSION_ID", ""),
        "system": platform.system(),
        "machine": platform.machine(),
        "glibc": glibc.split(" ")[-1] if glibc.startswith("glibc") else "",
        "apt": shutil.which("apt-get") is not None,
    }


def interpreter(candidates):
    """The first candidate that is Python 3.11 or newer, with whether Python.h is there."""
    tried = []
    for candidate in candidates:
        path = shutil.which(candidate)
        if path is None:
            continue
        rc, out = run([path, "-c", INTERPRETER])
        if rc != 0:
            continue
        found = json.loads(out)
        tried.append("%s %s" % (path, found["version"]))
        if tuple(int(p) for p in found["version"].split(".")[:2]) >= (3, 11):
            found["path"] = path
            return found, tried
    return None, tried


def tool_version(path, *args):
    rc, out = run([path, *args])
    match = re.search(r"(\d+\.\d+(\.\d+)?)", out.split("release", 1)[-1] if "release" in out else out)
    return match.group(1) if rc == 0 and match else ""


def nvcc():
    for path in (shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"):
        if path and os.access(path, os.X_OK):
            return {"path": path, "version": tool_version(path, "--version")}
    return None


def python_env(python, distributions, executables):
    out = {"path": python, "exists": os.access(python, os.X_OK), "version": "",
           "distributions": {}, "executables": {}}
    if out["exists"]:
        rc, text = run([python, "-c", INTERPRETER])
        if rc == 0:
            out["version"] = json.loads(text)["version"]
        rc, text = run([python, "-c", DISTRIBUTIONS, *distributions])
        if rc == 0:
            out["distributions"] = json.loads(text)
    search = os.path.dirname(python) + os.pathsep + os.environ.get("PATH", "")
    for name in executables:
        out["executables"][name] = shutil.which(name, path=search) or ""
    return out


def listeners():
    """{inode: (address, port)} of the TCP sockets in LISTEN state (this network namespace)."""
    found = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table, encoding="ascii") as lines:
                next(lines, None)
                for line in lines:
                    fields = line.split()
                    if len(fields) > 9 and fields[3] == "0A":
                        address, port = fields[1].rsplit(":", 1)
                        found[fields[9]] = (address, int(port, 16))
        except OSError:
            pass
    return found


def holders(inodes):
    """{inode: pid} for the sockets among `inodes` that a readable process holds."""
    out = {}
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            fds = os.listdir("/proc/%s/fd" % pid)
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink("/proc/%s/fd/%s" % (pid, fd))
            except OSError:
                continue
            if target.startswith("socket:[") and target[8:-1] in inodes:
                out[target[8:-1]] = int(pid)
    return out


def describe(pid):
    info = {"pid": pid, "command": "", "deployment": "", "process": ""}
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as cmdline:
            info["command"] = cmdline.read().replace(b"\0", b" ").decode(errors="replace").strip()[:200]
        with open("/proc/%d/environ" % pid, "rb") as environ:
            for entry in environ.read().split(b"\0"):
                name, _, value = entry.decode(errors="replace").partition("=")
                if name == "PDKIT_DEPLOYMENT":
                    info["deployment"] = value
                elif name == "PDKIT_PROCESS":
                    info["process"] = value
    except OSError:
        pass
    return info


def listening(ranges):
    wanted = {i: (a, p) for i, (a, p) in listeners().items()
              if any(first <= p <= last for first, last in ranges)}
    pids = holders(set(wanted))
    out = []
    for inode, (_, port) in sorted(wanted.items(), key=lambda item: item[1][1]):
        entry = {"port": port}
        entry.update(describe(pids[inode]) if inode in pids else
                     {"pid": None, "command": "", "deployment": "", "process": ""})
        if entry not in out:
            out.append(entry)
    return out


def memlock():
    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    try:
        # This probe's own limit only: what `ulimit -l unlimited` in a launch script would get.
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        raisable = True
    except (ValueError, OSError):
        raisable = False

    def shown(limit):
        return -1 if limit == resource.RLIM_INFINITY else limit

    return {"soft": shown(soft), "hard": shown(hard), "raisable": raisable}


def main():
    spec = json.loads(base64.b64decode(sys.argv[1]).decode()) if len(sys.argv) > 1 else {}
    found, tried = interpreter(spec.get("candidates", ["python3"]))
    gcc = shutil.which("gcc")
    print(json.dumps({
        "os": os_release(),
        "interpreter": found,
        "interpreters_tried": tried,
        "gcc": {"path": gcc, "version": tool_version(gcc, "-dumpfullversion")} if gcc else None,
        "nvcc": nvcc() if spec.get("nvcc") else None,
        "python": python_env(spec.get("python") or sys.executable,
                             spec.get("distributions", []), spec.get("executables", [])),
        "listening": listening(spec.get("ports", [])),
        "memlock": memlock(),
    }))


main()
