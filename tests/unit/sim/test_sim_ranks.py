"""The link between the node ranks of a multi-node sim instance, in-process over real sockets."""

from __future__ import annotations

import asyncio

import pytest

from kit.sim.engine import StartupError
from kit.sim.ranks import RankError, RankServer, join_rank0
from tests.support.ports import free_port


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 20))


def test_rank0_waits_for_every_rank_and_a_lost_one_ends_the_instance():
    async def main():
        addr = f"127.0.0.1:{free_port()}"
        stop = asyncio.Event()
        server = RankServer(addr, nnodes=3)
        # A follower that starts first keeps trying until rank 0 listens.
        early = asyncio.ensure_future(join_rank0(addr, 1, 3, stop))
        await asyncio.sleep(0.7)
        await server.start()
        first = await early
        all_joined = asyncio.ensure_future(server.wait_all())
        await asyncio.sleep(0.2)
        assert not all_joined.done()  # rank 2 is still missing
        second = await join_rank0(addr, 2, 3, stop)
        await all_joined
        assert server.joined == (0, 1, 2)

        await second.close()  # node rank 2 dies
        what = await server.wait_lost()
        assert "node rank 2 of 3 is gone" in what
        # Rank 0 fails as a whole: the other follower loses it too, and no rank can join it.
        assert "node rank 0 at" in await first.wait_lost()
        assert await join_rank0_once(addr, 2, 3) is None
        await server.close()

    run(main())


async def join_rank0_once(addr, rank, nnodes):
    """One join attempt: stop as soon as the first attempt failed."""
    stop = asyncio.Event()
    task = asyncio.ensure_future(join_rank0(addr, rank, nnodes, stop))
    await asyncio.sleep(0.2)
    stop.set()
    return await task


def test_a_rank_lost_before_all_joined_fails_the_wait():
    async def main():
        addr = f"127.0.0.1:{free_port()}"
        server = RankServer(addr, nnodes=3)
        await server.start()
        link = await join_rank0(addr, 1, 3, asyncio.Event())
        await link.close()
        with pytest.raises(RankError, match="node rank 1 of 3 is gone"):
            await server.wait_all()
        await server.close()

    run(main())


@pytest.mark.parametrize(
    "rank, nnodes, needle",
    [(1, 4, "node rank 0 runs --nnodes 2, node rank 1 --nnodes 4"), (0, 2, "not a follower")],
)
def test_ranks_that_disagree_are_refused_with_the_fix(rank, nnodes, needle):
    async def main():
        addr = f"127.0.0.1:{free_port()}"
        server = RankServer(addr, nnodes=2)
        await server.start()
        with pytest.raises(StartupError, match=needle) as refused:
            await join_rank0(addr, rank, nnodes, asyncio.Event())
        assert "own --node-rank" in str(refused.value)
        await server.close()

    run(main())


def test_a_rank_that_is_still_joined_is_retried_until_its_old_link_is_gone():
    async def main():
        addr = f"127.0.0.1:{free_port()}"
        server = RankServer(addr, nnodes=3)
        await server.start()
        old = await join_rank0(addr, 1, 3, asyncio.Event())
        again = asyncio.ensure_future(join_rank0(addr, 1, 3, asyncio.Event()))
        await asyncio.sleep(0.3)
        assert not again.done()  # refused for now, not given up
        await old.close()
        # Rank 0 lost rank 1: it is going away and takes nobody (it dies, as SGLang's does).
        await server.wait_lost()
        await asyncio.sleep(0.3)
        assert not again.done()
        again.cancel()
        await server.close()

    run(main())


def test_rank0_reports_the_flag_when_its_port_is_taken():
    async def main():
        addr = f"127.0.0.1:{free_port()}"
        holder = RankServer(addr, nnodes=2)
        await holder.start()
        with pytest.raises(StartupError, match=r"\(--dist-init-addr\)"):
            await RankServer(addr, nnodes=2).start()
        await holder.close()

    run(main())


def test_a_stopped_rank0_tells_its_followers_to_exit_and_a_killed_one_does_not():
    async def main():
        for shutdown, expected in ((True, None), (False, "Connection closed by peer")):
            addr = f"127.0.0.1:{free_port()}"
            server = RankServer(addr, nnodes=2)
            await server.start()
            link = await join_rank0(addr, 1, 2, asyncio.Event())
            await server.wait_all()
            await server.close(shutdown=shutdown)
            what = await link.wait_lost()
            assert what == expected or (expected and expected in what)
            await link.close()

    run(main())
