"""Keys, bad bodies, and the /workers admin API through a real load balancer."""

from __future__ import annotations

import asyncio

import openai
import pytest

from tests.support.fake_worker import MODEL, FakeWorker
from tests.support.lb_cluster import run, running_cluster

KEYS = {"PDKIT_LB_API_KEY": "client-key", "PDKIT_LB_ADMIN_KEY": "admin-key"}


def test_inference_and_info_routes_need_the_api_key():
    async def scenario():
        async with running_cluster(1, 1, env=KEYS) as c:
            for key in (None, "wrong", "admin-key"):
                status, body, headers = await c.post("/generate", {"text": "x"}, key=key)
                assert status == 401 and headers["WWW-Authenticate"] == "Bearer"
                assert "Authorization: Bearer" in body["error"]["message"]
                status, _, _ = await c.get("/v1/models", key=key)
                assert status == 401
            assert c.all_requests() == []
            status, _, _ = await c.post("/generate", {"text": "x"}, key="client-key")
            assert status == 200
            for path in ("/health", "/readiness", "/metrics"):
                status, _, _ = await c.get(path)
                assert status == 200

    run(scenario())


def test_workers_get_the_worker_key_never_the_client_key():
    async def scenario():
        env = {**KEYS, "PDKIT_LB_WORKER_API_KEY": "worker-key"}
        async with running_cluster(1, 1, env=env) as c:
            status, _, _ = await c.post("/generate", {"text": "x"}, key="client-key")
            assert status == 200
            for worker in (*c.prefill, *c.decode):
                assert worker.auth and set(worker.auth) == {"Bearer worker-key"}

    run(scenario())


def test_openai_client_with_a_wrong_key_gets_authentication_error():
    async def scenario():
        async with running_cluster(1, 1, env=KEYS) as c:
            client = openai.AsyncOpenAI(base_url=c.url + "/v1", api_key="nope", max_retries=0)
            try:
                with pytest.raises(openai.AuthenticationError):
                    await client.chat.completions.create(
                        model=MODEL, messages=[{"role": "user", "content": "x"}]
                    )
            finally:
                await client.close()

    run(scenario())


@pytest.mark.parametrize(
    ("data", "status", "needle"),
    [
        (b"{nope", 400, "not valid JSON"),
        (b'"just a string"', 400, "JSON object"),
        (b'{"messages": "hi"}', 400, "'messages'"),
        (b'{"messages": [{"role": "user", "content": "x"}], "stream": 1}', 400, "'stream'"),
        (
            b'{"messages": [{"role": "user", "content": "' + b"x" * 3000 + b'"}]}',
            413,
            "larger than",
        ),
    ],
)
def test_bad_bodies_are_refused_before_any_worker_sees_them(data, status, needle):
    async def scenario():
        async with running_cluster(1, 1, args=["--max-body-mb", "0.002"]) as c:
            got, body, _ = await c.post("/v1/chat/completions", data=data)
            assert got == status and needle in body["error"]["message"]
            assert body["error"]["code"] == status
            assert c.all_requests() == []

    run(scenario())


def test_workers_admin_is_off_without_an_admin_key():
    async def scenario():
        async with running_cluster(1, 1) as c:
            status, body, _ = await c.get("/workers", key="anything")
            assert status == 403 and "PDKIT_LB_ADMIN_KEY" in body["error"]["message"]

    run(scenario())


def test_workers_list_add_and_remove_with_drain():
    async def scenario():
        async with running_cluster(1, 1, env=KEYS) as c:
            status, _, _ = await c.get("/workers", key="client-key")
            assert status == 401
            status, body, _ = await c.get("/workers", key="admin-key")
            assert status == 200 and [w["state"] for w in body["workers"]] == ["healthy"] * 2
            extra = FakeWorker("decode", c.ledger)
            await extra.start()
            try:
                status, body, _ = await c.post(
                    "/workers", {"url": extra.url, "role": "decode"}, key="admin-key"
                )
                assert status == 201 and body["worker"]["state"] == "pending"
                status, _, _ = await c.post(
                    "/workers", {"url": extra.url, "role": "decode"}, key="admin-key"
                )
                assert status == 409
                added = c.lb.pool.get(extra.url)
                await c.wait_for(lambda: added.routable, what="new worker healthy")
                # drain the original decode while a request is in flight on it
                old = c.decode[0]
                old.latency = 0.3
                c.lb.policies["decode"] = _Always(old.url)
                inflight = asyncio.create_task(c.post("/generate", {"text": "x"}, key="client-key"))
                await c.wait_for(lambda: c.lb.pool.get(old.url).inflight == 1, what="in flight")
                status, removed = await c.delete(
                    "/workers", {"url": old.url, "wait": "true"}, key="admin-key"
                )
                assert status == 200 and removed == {
                    "removed": old.url,
                    "drained": True,
                    "inflight_left": 0,
                }
                status, _, _ = await inflight
                assert status == 200
                assert c.lb.pool.get(old.url) is None
                c.lb.policies["decode"] = _Always(extra.url)
                status, _, _ = await c.post("/generate", {"text": "x"}, key="client-key")
                assert status == 200 and extra.requests
                status, _ = await c.delete("/workers", {"url": old.url}, key="admin-key")
                assert status == 404
            finally:
                await extra.stop()

    run(scenario())


def test_a_removal_drains_for_its_own_grace_not_the_lbs():
    """`pdkit up --drain-timeout` reaches the lb as ?grace=: a drain shorter than the request
    on the worker removes it with the request counted as left; a bad grace is a 400."""

    async def scenario():
        async with running_cluster(1, 2, args=["--drain-grace", "60"], env=KEYS) as c:
            old = c.decode[0]
            old.latency = 3.0
            c.lb.policies["decode"] = _Always(old.url)
            inflight = asyncio.create_task(c.post("/generate", {"text": "x"}, key="client-key"))
            await c.wait_for(lambda: c.lb.pool.get(old.url).inflight == 1, what="in flight")
            for bad in ("-1", "soon", "1e9"):
                status, body = await c.delete(
                    "/workers", {"url": old.url, "grace": bad}, key="admin-key"
                )
                assert status == 400 and body["error"]["param"] == "grace", body
            assert c.lb.pool.get(old.url).routable
            began = asyncio.get_running_loop().time()
            status, removed = await c.delete(
                "/workers", {"url": old.url, "wait": "true", "grace": "0.2"}, key="admin-key"
            )
            assert status == 200 and removed == {
                "removed": old.url,
                "drained": False,
                "inflight_left": 1,
            }
            assert asyncio.get_running_loop().time() - began < 2.5  # not the lb's 60 s
            assert c.lb.pool.get(old.url) is None
            inflight.cancel()

    run(scenario())


def test_a_worker_removed_to_come_back_holds_its_roles_requests_until_added_again():
    """`pdkit restart` of the only decode: removed with ?back_within= it stays listed as
    returning, a request for its role is held (not refused: no 503 "no decode worker is
    configured"), and adding its URL again serves that request; one not added again within
    `back_within` s is removed, and then the role's requests are refused at once."""

    async def scenario():
        async with running_cluster(1, 1, args=["--hold-timeout", "10"], env=KEYS) as c:
            old = c.decode[0]
            for bad in ("-1", "later"):
                status, body = await c.delete(
                    "/workers", {"url": old.url, "back_within": bad}, key="admin-key"
                )
                assert status == 400 and body["error"]["param"] == "back_within", body
            status, removed = await c.delete(
                "/workers", {"url": old.url, "wait": "true", "back_within": "30"}, key="admin-key"
            )
            assert status == 200 and removed["back_within"] == 30 and removed["drained"]
            status, body, _ = await c.get("/workers", key="admin-key")
            listed = {w["url"]: w for w in body["workers"]}
            assert listed[old.url]["state"] == "returning"
            assert "expected back within 30 s" in listed[old.url]["reason"]
            held = asyncio.create_task(c.post("/generate", {"text": "x"}, key="client-key"))
            await c.wait_for(lambda: c.lb.metrics.held == 1, what="the request held")
            await asyncio.sleep(0.3)  # not probed back in while returning
            assert not held.done() and not c.lb.pool.get(old.url).routable
            status, body, _ = await c.post(
                "/workers", {"url": old.url, "role": "decode"}, key="admin-key"
            )
            assert status == 201 and body["worker"]["state"] == "pending"
            status, _, _ = await held
            assert status == 200 and c.lb.metrics.held == 0

            status, _ = await c.delete(
                "/workers", {"url": old.url, "wait": "true", "back_within": "0.3"}, key="admin-key"
            )
            assert status == 200
            await c.wait_for(lambda: c.lb.pool.get(old.url) is None, what="removed at expiry")
            status, body, _ = await c.post("/generate", {"text": "x"}, key="client-key")
            assert status == 503 and "no decode worker is configured" in str(body)

    run(scenario())


@pytest.mark.parametrize(
    "payload",
    [
        {"url": "nope", "role": "decode"},
        {"url": "http://h:1", "role": "router"},
        {"url": "http://h:1", "role": "decode", "bootstrap_port": 8998},
        {"url": "http://h:1", "role": "prefill", "bootstrap_port": "x"},
    ],
)
def test_adding_a_bad_worker_is_a_400(payload):
    async def scenario():
        async with running_cluster(1, 1, env=KEYS) as c:
            status, body, _ = await c.post("/workers", payload, key="admin-key")
            assert status == 400, body

    run(scenario())


def test_flush_cache_reports_each_worker():
    async def scenario():
        async with running_cluster(1, 1, env=KEYS) as c:
            status, body, _ = await c.post("/flush_cache", {}, key="admin-key")
            assert status == 200 and body["flushed"] and len(body["workers"]) == 2
            await c.decode[0].stop()
            status, body, _ = await c.post("/flush_cache", {}, key="admin-key")
            assert status == 502 and not body["flushed"]
            assert [w["ok"] for w in body["workers"]] == [True, False]

    run(scenario())


class _Always:
    """A test policy that always picks one URL."""

    name = "always"
    needs_key = False

    def __init__(self, url: str) -> None:
        self.url = url

    def choose(self, workers, key):
        return next(w for w in workers if w.url == self.url)
