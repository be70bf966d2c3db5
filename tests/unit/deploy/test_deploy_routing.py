"""pdkit up's side of the router's worker API: join, drain and look, against pdkit's real load
balancer (in-process, fake workers) and smg's answer shapes."""

from __future__ import annotations

import asyncio
import stat

import pytest

from kit.deploy.routing import RouterAdmin, admin_key, parse_workers
from kit.errors import DeployError
from tests.support.fake_worker import FakeWorker
from tests.support.lb_cluster import run, running_cluster

KEYS = {"PDKIT_LB_API_KEY": "client-key", "PDKIT_LB_ADMIN_KEY": "admin-key"}


def test_a_worker_joins_is_routed_to_and_leaves_after_its_request_finished():
    async def scenario():
        async with running_cluster(1, 1, env=KEYS) as c:
            extra = FakeWorker("decode", c.ledger)
            await extra.start()
            try:
                async with RouterAdmin("pdkit", c.url, "admin-key", drain_timeout=10) as admin:
                    await admin.add(extra.url, "decode", None)
                    await admin.add(extra.url, "decode", None)  # already there: no error
                    routed = await admin.wait_routed(extra.url, timeout=5)
                    assert routed.role == "decode" and routed.state == "healthy"

                    old = c.decode[0]
                    old.latency = 0.5
                    inflight = asyncio.ensure_future(
                        c.post("/generate", {"text": "x"}, key="client-key")
                    )
                    await c.wait_for(lambda: c.lb.pool.get(old.url).inflight == 1, what="busy")
                    drained = await admin.remove(old.url)
                    assert drained.clean and drained.seconds > 0.2
                    assert (await inflight)[0] == 200  # it finished on the drained worker
                    assert old.url not in await admin.workers()
                    again = await admin.remove(old.url)  # gone already: a clean no-op
                    assert again.clean and again.seconds == 0
            finally:
                await extra.stop()

    run(scenario())


def test_the_drain_timeout_is_pdkits_not_the_lbs_drain_grace():
    """`--drain-timeout` 0.3 s against an lb started with `--drain-grace 60`: the worker leaves
    after 0.3 s, and pdkit is told one request was still on it."""

    async def scenario():
        async with running_cluster(1, 1, args=["--drain-grace", "60"], env=KEYS) as c:
            old = c.decode[0]
            old.latency = 2.0
            busy = [asyncio.ensure_future(c.post("/generate", {"text": "x"}, key="client-key"))]
            await c.wait_for(lambda: c.lb.pool.get(old.url).inflight >= 1, what="busy")
            async with RouterAdmin("pdkit", c.url, "admin-key", drain_timeout=0.3) as admin:
                drained = await admin.remove(old.url)
            assert not drained.clean and drained.left == 1 and drained.seconds < 1.5
            for task in busy:
                task.cancel()

    run(scenario())


def test_a_wrong_admin_key_says_how_to_fix_it():
    async def scenario():
        async with running_cluster(1, 1, env=KEYS) as c:
            admin = RouterAdmin("pdkit", c.url, "stale", drain_timeout=5)
            async with admin:
                with pytest.raises(DeployError, match=r"HTTP 401.*run `pdkit up` once more"):
                    await admin.workers()

    run(scenario())


def test_a_worker_the_router_never_routes_to_times_out_with_its_state():
    async def scenario():
        async with running_cluster(1, 1, env=KEYS) as c:
            admin = RouterAdmin("pdkit", c.url, "admin-key", drain_timeout=5)
            async with admin:
                await admin.add("http://127.0.0.1:9", "decode", None)
                with pytest.raises(DeployError, match=r"does not route to .* \(it is pending\)"):
                    await admin.wait_routed("http://127.0.0.1:9", timeout=0.5)

    run(scenario())


def test_smg_workers_are_read_by_url_with_their_id():
    body = {
        "workers": [
            {"id": "u1", "url": "http://a:1/", "worker_type": "prefill", "is_healthy": True},
            {"id": "u2", "url": "http://b:2", "worker_type": "decode", "is_healthy": False},
            {"id": "u3", "url": "http://c:3", "worker_type": "decode", "status": "draining"},
        ]
    }
    workers = parse_workers("smg", body)
    assert workers["http://a:1"].routed and workers["http://a:1"].ident == "u1"
    assert workers["http://b:2"].state == "pending" and not workers["http://b:2"].routed
    assert workers["http://c:3"].state == "draining"  # removed, its requests still running
    assert parse_workers("smg", {"error": "x"}) == {}


def test_the_admin_key_is_made_once_and_kept_private(tmp_path):
    key = admin_key(tmp_path)
    assert len(key) >= 32 and admin_key(tmp_path) == key
    assert stat.S_IMODE((tmp_path / "router-admin.key").stat().st_mode) == 0o600


def test_a_replaced_worker_is_returning_until_added_again_and_its_role_is_held():
    """What `pdkit restart` does to a role's only instance: out with `back_within`, a request
    for its role waits (the router's hold) instead of a 503, and `add` brings it back."""

    async def scenario():
        async with running_cluster(1, 1, args=["--hold-timeout", "10"], env=KEYS) as c:
            old = c.decode[0]
            async with RouterAdmin("pdkit", c.url, "admin-key", drain_timeout=10) as admin:
                drained = await admin.remove(old.url, back_within=60)
                assert drained.clean
                assert (await admin.workers())[old.url].state == "returning"
                held = asyncio.ensure_future(c.post("/generate", {"text": "x"}, key="client-key"))
                await c.wait_for(lambda: c.lb.metrics.held == 1, what="held")
                await admin.add(old.url, "decode", None)  # listed, but returning: added again
                await admin.wait_routed(old.url, timeout=5)
                assert (await held)[0] == 200

    run(scenario())
