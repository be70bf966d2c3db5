"""Log tails and following, on local files."""

from __future__ import annotations

import os

from kit.hosts.inventory import DeployHost
from kit.hosts.logs import LogFile, follow, matching_lines, show_logs, ssh_argv, tail_lines
from kit.topology.layout import HostLayout
from kit.topology.plan_types import HostPlan


def host(root, connection="local", user="root"):
    plan = HostPlan(
        name="h",
        address="10.0.0.9",
        connection=connection,
        ssh_user=user,
        ssh_port=2222,
        ssh_key="/k",
        gpus=1,
        gpu_type=None,
        service_manager="supervisord",
        root=str(root),
        rdma_devices=(),
    )
    return DeployHost(plan=plan, layout=HostLayout("d", str(root)), python="/p")


def log_file(process: str, h: DeployHost) -> LogFile:
    return LogFile(process, h, h.layout.log_file(process))


def test_tail_reads_only_the_end_of_a_large_file(tmp_path):
    path = tmp_path / "big.log"
    path.write_text("".join(f"line {i}\n" for i in range(100_000)))
    assert tail_lines(str(path), 3) == ["line 99997", "line 99998", "line 99999"]
    assert tail_lines(str(tmp_path / "missing.log"), 3) == []


def test_show_logs_prefixes_lines_when_there_are_several(tmp_path):
    h = host(tmp_path)
    logs = [log_file("prefill-0", h), log_file("router", h)]
    os.makedirs(h.layout.log_dir)
    for log in logs:
        with open(log.path, "w") as handle:
            handle.write(f"{log.process} up\n")
    out, notes = [], []
    show_logs(logs, out.append, notes.append, lines=5)
    assert out == ["prefill-0 | prefill-0 up", "router    | router up"]
    out.clear()
    show_logs([log_file("decode-0", h)], out.append, notes.append, lines=5)
    assert out == []
    assert "no log yet" in notes[0]


def test_follow_prints_new_lines_and_survives_rotation(tmp_path):
    h = host(tmp_path)
    os.makedirs(h.layout.log_dir)
    log = log_file("decode-0", h)
    with open(log.path, "w") as handle:
        handle.write("old\n")
    seen: list[str] = []
    steps = iter(range(100))

    def stop() -> bool:
        step = next(steps)
        if step == 1:
            with open(log.path, "a") as handle:
                handle.write("new 1\npartial")
        elif step == 2:
            with open(log.path, "a") as handle:
                handle.write(" line\n")
        elif step == 3:
            os.rename(log.path, log.path + ".1")
            with open(log.path, "w") as handle:
                handle.write("after rotation\n")
        return step >= 5

    follow([log], lambda process, line: seen.append(line), stop, interval=0)
    assert seen == ["new 1", "partial line", "after rotation"]


def test_remote_logs_are_read_over_ssh_with_sudo_when_needed():
    argv = ssh_argv(host("/", connection="ssh", user="ops"), ["tail", "-n", "5", "/var/log/x"])
    assert argv == [
        "ssh",
        "-o",
        "BatchMode=yes",
        "-p",
        "2222",
        "-i",
        "/k",
        "ops@10.0.0.9",
        "sudo -n tail -n 5 /var/log/x",
    ]


def test_matching_lines_finds_every_line_with_a_needle_in_file_order(tmp_path):
    h = host(tmp_path)
    log = log_file("decode-0", h)
    os.makedirs(os.path.dirname(log.path))
    lines = [f"line {i} room {i % 7}" for i in range(50_000)]
    lines[123] += " 9223372036854775807"
    with open(log.path, "w") as out:
        out.write("\n".join(lines))  # the last line has no newline
    assert matching_lines(log, ["9223372036854775807"]) == [lines[123]]
    assert matching_lines(log, ["line 49999 ", "line 3 "]) == [lines[3], lines[49999]]
    assert matching_lines(log, ["nowhere"]) == []
    assert matching_lines(log_file("prefill-0", h), ["x"]) == []  # no log yet
