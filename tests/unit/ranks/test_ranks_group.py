"""The rank group's agents (kit/ranks) in one event loop, each rank a real `sleep` process: a
follower starts nothing before its leader says, a killed rank restarts the whole group with
rank 0 first, and a stopped leader leaves no rank running."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

from kit.lb.processes import pid_running
from kit.ranks.group import Follower, GroupSettings, Leader
from tests.support.ports import free_port

SLEEP = ["sleep", "600"]


def settings(port: int, rank: int) -> GroupSettings:
    return GroupSettings(
        leader=f"127.0.0.1:{port}",
        node_rank=rank,
        nnodes=2,
        restart_delay_s=0.1,
        stop_timeout_s=5,
    )


async def until(condition: Callable[[], bool], timeout: float = 60) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(0.05)


def pid(member: Leader | Follower) -> int | None:
    process = member.rank.process
    return process.pid if process is not None and process.returncode is None else None


def alive(number: int) -> bool:
    return pid_running(number)


def run_group(body: Callable[[Leader, Follower, Callable[[], Awaitable[None]]], Awaitable[None]]):
    """Run `body` with a leader and a follower on a free port; both stopped at the end."""

    async def main() -> None:
        port = free_port()
        leader = Leader(settings(port, 0), SLEEP)
        follower = Follower(settings(port, 1), SLEEP)
        stop_leader, stop_follower = asyncio.Event(), asyncio.Event()
        follower_task = asyncio.ensure_future(follower.serve(stop_follower))
        leader_task: asyncio.Future[None] | None = None

        async def start_leader() -> None:
            nonlocal leader_task
            leader_task = asyncio.ensure_future(leader.serve(stop_leader))

        try:
            await body(leader, follower, start_leader)
        finally:
            stop_leader.set()
            stop_follower.set()
            await asyncio.gather(follower_task, *([leader_task] if leader_task else []))

    asyncio.run(main())


def test_a_follower_starts_its_rank_only_once_its_leader_starts_the_group():
    async def body(leader, follower, start_leader):
        await asyncio.sleep(1.5)  # the follower retries its leader meanwhile
        assert pid(follower) is None
        await start_leader()
        await until(lambda: pid(leader) is not None and pid(follower) is not None)
        assert leader.generation == 1

    run_group(body)


def test_a_killed_rank_restarts_every_rank_of_the_group():
    async def body(leader, follower, start_leader):
        await start_leader()
        await until(lambda: pid(leader) is not None and pid(follower) is not None)
        first = (pid(leader), pid(follower))
        os.kill(first[1], signal.SIGKILL)  # a rank above 0 dies
        await until(lambda: leader.generation == 2 and pid(follower) not in (None, first[1]))
        await until(lambda: pid(leader) is not None)
        assert pid(leader) != first[0] and not alive(first[0])  # rank 0 was restarted too
        second = (pid(leader), pid(follower))
        os.kill(second[0], signal.SIGKILL)  # and rank 0 dies
        await until(lambda: leader.generation == 3 and pid(follower) not in (None, second[1]))
        assert not alive(second[1])

    run_group(body)


def test_the_log_names_a_follower_whose_rank_ended_just_after_rank_0(caplog):
    """SGLang kills rank 0's process tree once a peer's link breaks, so rank 0's exit can reach
    the leader before the follower's report of the rank that died: the log names both."""
    caplog.set_level(logging.WARNING, logger="kit.ranks")

    async def body(leader, follower, start_leader):
        await start_leader()
        await until(lambda: pid(leader) is not None and pid(follower) is not None)
        rank_1 = pid(follower)
        os.kill(pid(leader), signal.SIGKILL)
        await asyncio.sleep(0.1)
        os.kill(rank_1, signal.SIGKILL)
        await until(lambda: leader.generation == 2)

    run_group(body)
    ends = [r.getMessage() for r in caplog.records if "generation 1 ends" in r.getMessage()]
    assert ends == [
        "generation 1 ends: node rank 1's process exited with -9; node rank 0's process exited "
        "with -9; stopping every rank"
    ], ends


def test_a_stopped_leader_leaves_no_rank_running_and_the_follower_waits():
    async def body(leader, follower, start_leader):
        stop = asyncio.Event()
        task = asyncio.ensure_future(leader.serve(stop))
        await until(lambda: pid(leader) is not None and pid(follower) is not None)
        ranks = (pid(leader), pid(follower))
        stop.set()
        await task
        await until(lambda: pid(follower) is None)
        assert not any(alive(number) for number in ranks if number is not None)

    run_group(body)


def _children(number: int) -> list[int]:
    return [int(c) for c in Path(f"/proc/{number}/task/{number}/children").read_text().split()]


def test_a_killed_follower_agent_takes_its_rank_along_and_the_group_restarts_when_it_is_back():
    """SIGKILL of a follower's agent (`python -m kit.ranks`): its rank dies with it, the leader
    stops rank 0, and starts the group again once a new agent for the rank joins."""

    async def main() -> None:
        port = free_port()
        leader = Leader(settings(port, 0), SLEEP)
        stop = asyncio.Event()
        task = asyncio.ensure_future(leader.serve(stop))
        argv = [sys.executable, "-m", "kit.ranks", "--leader", f"127.0.0.1:{port}"]
        argv += ["--node-rank", "1", "--nnodes", "2", "--", *SLEEP]
        agents = []
        try:
            agents.append(subprocess.Popen(argv, stderr=subprocess.DEVNULL))
            await until(lambda: leader.generation == 1 and bool(_children(agents[0].pid)))
            (rank1,) = _children(agents[0].pid)
            rank0 = pid(leader)
            assert rank0 is not None
            agents[0].kill()
            await until(lambda: not alive(rank1) and not alive(rank0))
            assert pid(leader) is None  # no rank 0 without its group
            agents.append(subprocess.Popen(argv, stderr=subprocess.DEVNULL))
            await until(lambda: leader.generation == 2 and bool(_children(agents[1].pid)))
        finally:
            stop.set()
            await task
            for agent in agents:
                agent.terminate()
                agent.wait(10)

    asyncio.run(main())
