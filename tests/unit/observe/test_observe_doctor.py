"""The doctor's matrix against fake PD workers on real sockets: every pair gets its request with
its own room, DP ranks are covered, failures keep the workers' words and get their cause from the
logs, hung workers cost one health timeout, and pairs stay within their per-worker cap."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest
import yaml
from aiohttp import web

from kit.observe.doctor import (
    DoctorOptions,
    Instance,
    _health,
    explain,
    rooms_for,
    run_matrix,
)
from kit.observe.doctor_tokens import Answer
from kit.observe.doctor_view import KvCost, failure_lines, kv_cost, matrix_to_json, token_line
from kit.observe.probe import Prober
from kit.plan.resolve import resolve
from tests.support.ports import free_block

SLOW = 60.0


@dataclass
class Fake:
    """One fake worker: what it answers and what it was asked."""

    role: str
    answer: str = "ok"  # ok | error | hang
    output_ids: list[int] = field(default_factory=lambda: [5, 6, 7])
    by_bootstrap_port: dict[int, list[int]] = field(default_factory=dict)  # other answers
    healthy: bool = True
    bodies: list[dict] = field(default_factory=list)
    transfers: int = 0
    in_flight: int = 0
    most_in_flight: int = 0

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/health", self.health)
        app.router.add_post("/generate", self.generate)
        app.router.add_get("/metrics", self.metrics)
        return app

    async def health(self, request: web.Request) -> web.Response:
        if not self.healthy:
            await asyncio.sleep(SLOW)
        return web.Response(text="")

    async def generate(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.bodies.append(body)
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(0.05)
            if self.answer == "hang":
                await asyncio.sleep(SLOW)
            if self.answer == "error":
                message = (
                    f"Decode transfer failed for request rank=0 req.rid={body['rid']!r} "
                    f"req.bootstrap_room={body['bootstrap_room']} with exception "
                    f"KVTransferError(bootstrap_room={body['bootstrap_room']}): Failed to send "
                    f"kv chunk of {body['bootstrap_room']} to 10.0.0.2:37233"
                )
                return web.json_response({"error": {"message": message, "code": 500}}, status=500)
            if self.role == "prefill":
                self.transfers += 1
            ids = self.by_bootstrap_port.get(body.get("bootstrap_port", 0), self.output_ids)
            text = " ".join(f"w{i}" for i in ids)
            reply = {"text": text, "output_ids": ids, "meta_info": {}}
            return web.json_response(reply)
        finally:
            self.in_flight -= 1

    async def metrics(self, request: web.Request) -> web.Response:
        n = self.transfers
        lines = []
        for name, value in (("kv_transfer_latency_ms", 4.0), ("kv_transfer_speed_gb_s", 20.0)):
            lines += [
                f"# TYPE sglang:{name} histogram",
                f'sglang:{name}_bucket{{le="+Inf"}} {n}',
                f"sglang:{name}_count {n}",
                f"sglang:{name}_sum {n * value}",
            ]
        return web.Response(text="\n".join(lines) + "\n")


@asynccontextmanager
async def cluster(
    tmp_path: Path, prefills: list[Fake], decodes: list[Fake], **roles: dict
) -> AsyncIterator[Path]:
    """A sim topology whose workers are the fakes, served on their Plan ports."""
    width = max(len(prefills), len(decodes))
    p_port, d_port, b_port = free_block(width), free_block(width), free_block(width)
    data = {
        "name": "fake",
        "engine": "sim",
        "model": {"path": "meta-llama/Llama-3.1-8B-Instruct"},
        "hosts": [{"name": "h", "address": "127.0.0.1", "connection": "local", "gpus": 64}],
        "prefill": {"count": len(prefills), "port": p_port, "bootstrap_port": b_port},
        "decode": {"count": len(decodes), "port": d_port},
        "transfer": {"backend": "mooncake_tcp"},
        "router": {"port": free_block(1), "bind": "127.0.0.1"},
    }
    for role, extra in roles.items():
        data[role].update(extra)
    path = tmp_path / "fake.yaml"
    path.write_text(yaml.safe_dump(data))
    runners = []
    ports = [p_port + i for i in range(len(prefills))] + [d_port + i for i in range(len(decodes))]
    for fake, port in zip([*prefills, *decodes], ports, strict=True):
        runner = web.AppRunner(fake.app(), shutdown_timeout=0.1)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        runners.append(runner)
    try:
        yield path
    finally:
        for runner in runners:
            await runner.cleanup()


def test_every_pair_moves_kv_with_its_own_room_and_the_prefills_figures(tmp_path):
    async def go() -> None:
        prefills, decodes = [Fake("prefill"), Fake("prefill")], [Fake("decode")]
        async with cluster(tmp_path, prefills, decodes) as topology:
            matrix = await run_matrix(resolve(topology), DoctorOptions(timeout_s=5))
        assert matrix.ok
        assert [(p.prefill, p.decode, p.state) for p in matrix.pairs] == [
            ("prefill-0", "decode-0", "ok"),
            ("prefill-1", "decode-0", "ok"),
        ]
        pair = matrix.pair("prefill-1", "decode-0")
        assert pair.ttft_ms is not None and pair.ttft_ms >= 50
        assert pair.answer is not None and pair.answer.output_ids == (5, 6, 7)
        # The same prompt to every pair: their tokens are compared.
        assert len({b["text"] for b in decodes[0].bodies}) == 1
        assert pair.transfer is not None
        assert (pair.transfer.latency_ms, pair.transfer.speed_gb_s, pair.transfer.count) == (
            4.0,
            20.0,
            1,
        )
        # Each prefill got one request, the decode both, with the same body per pair.
        sent = decodes[0].bodies
        assert len(sent) == 2 and len({b["bootstrap_room"] for b in sent}) == 2
        for fake in prefills:
            (body,) = fake.bodies
            assert body in sent
            params = body["sampling_params"]
            assert params == {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}
            assert body["bootstrap_host"] == "127.0.0.1" and "routed_dp_rank" not in body
        assert {b["bootstrap_port"] for b in sent} == {
            w.bootstrap_port for w in resolve(topology).workers if w.bootstrap_port
        }
        report = matrix_to_json(matrix, kv_cost(resolve(topology), matrix, 2048))
        assert report["ok"] is True
        assert report["kv_cost"]["bytes_per_token"] == 131072  # Llama-3.1-8B, 16-bit KV
        assert report["kv_cost"]["transfer_ms"] == pytest.approx(2048 * 131072 / 20e9 * 1000)

    asyncio.run(go())


def test_every_dp_rank_of_both_instances_is_probed(tmp_path):
    async def go() -> None:
        prefill, decode = Fake("prefill"), Fake("decode")
        async with cluster(
            tmp_path,
            [prefill],
            [decode],
            prefill={"tp": 2, "dp": 2, "dp_attention": True},
            decode={"tp": 4, "dp": 4, "dp_attention": True},
        ) as topology:
            matrix = await run_matrix(resolve(topology), DoctorOptions(timeout_s=5))
        assert matrix.ok
        rooms = [b["bootstrap_room"] for b in prefill.bodies]
        assert sorted(r % 2 for r in rooms) == [0, 0, 1, 1]  # both prefill DP ranks
        assert sorted(b["routed_dp_rank"] for b in decode.bodies) == [0, 1, 2, 3]
        assert all("routed_dp_rank" not in b for b in prefill.bodies)

    asyncio.run(go())


def test_a_failed_pair_keeps_the_workers_words_and_gets_its_cause_from_the_logs(tmp_path):
    async def go() -> None:
        prefills, decodes = [Fake("prefill")], [Fake("decode", answer="error"), Fake("decode")]
        async with cluster(tmp_path, prefills, decodes) as topology:
            matrix = await run_matrix(resolve(topology), DoctorOptions(timeout_s=5))
        assert not matrix.ok
        failed = matrix.pair("prefill-0", "decode-0")
        assert failed.state == "failed"
        assert "decode-0 answered HTTP 500: Decode transfer failed" in failed.symptom
        assert matrix.pair("prefill-0", "decode-1").ok

        logs = {
            "prefill-0": [
                "E1130 20:37:11.860163 25683 transfer_metadata_plugin.cpp:1030] "
                "SocketHandShakePlugin: connect()10.0.0.2:16000: Connection refused [111]"
            ],
            "decode-0": ["[2026-05-12 10:02:10] INFO Decode batch."],
        }
        explained = explain(matrix, lambda process: logs.get(process, []))
        pair = explained.pair("prefill-0", "decode-0")
        assert [m.signature.name for m in pair.causes] == ["rpc_refused", "transfer_failed"]
        assert pair.causes[0].where == "prefill-0"
        text = "\n".join(failure_lines(explained))
        assert "prefill-0 x decode-0: failed:" in text
        assert "cause (rpc_refused)" in text and "To fix: open TCP 15000-17000" in text

        unknown = explain(matrix, lambda process: ["ERROR nobody has seen this one"])
        assert unknown.pair("prefill-0", "decode-0").causes  # the answer itself names a cause
        quiet = replace(matrix, pairs=tuple(replace(p, messages=()) for p in matrix.pairs))
        silent = explain(quiet, lambda process: [f"[x] ERROR {process} saw something odd"])
        evidence = silent.pair("prefill-0", "decode-0").evidence
        assert "prefill-0: [x] ERROR prefill-0 saw something odd" in evidence

    asyncio.run(go())


def test_a_hung_decode_fails_its_pairs_after_one_health_timeout(tmp_path):
    async def go() -> None:
        prefills = [Fake("prefill"), Fake("prefill")]
        decodes = [Fake("decode", healthy=False, answer="hang")]
        async with cluster(tmp_path, prefills, decodes) as topology:
            options = DoctorOptions(timeout_s=30, health_timeout_s=0.5)
            matrix = await asyncio.wait_for(run_matrix(resolve(topology), options), 10)
        assert [p.state for p in matrix.pairs] == ["failed", "failed"]
        assert all("decode-0 does not answer /health" in p.symptom for p in matrix.pairs)
        assert decodes[0].bodies == []  # not probed

    asyncio.run(go())


def test_transfers_that_hang_time_out_and_the_workers_other_pairs_are_skipped(tmp_path):
    async def go() -> None:
        prefills = [Fake("prefill", answer="hang")]
        decodes = [Fake("decode"), Fake("decode"), Fake("decode")]
        async with cluster(tmp_path, prefills, decodes) as topology:
            options = DoctorOptions(timeout_s=0.5, give_up_after=2)
            matrix = await asyncio.wait_for(run_matrix(resolve(topology), options), 10)
        states = sorted(p.state for p in matrix.pairs)
        assert states == ["skipped", "timeout", "timeout"]
        (skipped,) = [p for p in matrix.pairs if p.state == "skipped"]
        assert "2 pairs with prefill-0 timed out" in skipped.symptom

    asyncio.run(go())


def test_pairs_stay_within_their_per_worker_cap(tmp_path):
    async def go() -> None:
        prefills = [Fake("prefill") for _ in range(3)]
        decodes = [Fake("decode") for _ in range(2)]
        async with cluster(tmp_path, prefills, decodes) as topology:
            one = await run_matrix(resolve(topology), DoctorOptions(timeout_s=5, parallel=1))
            assert one.ok
            assert max(f.most_in_flight for f in (*prefills, *decodes)) == 1
            two = await run_matrix(resolve(topology), DoctorOptions(timeout_s=5, parallel=2))
        assert two.ok
        assert decodes[0].most_in_flight == 2

    asyncio.run(go())


def test_json_names_every_pair_and_its_state(tmp_path):
    async def go() -> dict:
        async with cluster(tmp_path, [Fake("prefill")], [Fake("decode", answer="error")]) as t:
            matrix = await run_matrix(resolve(t), DoctorOptions(timeout_s=5))
        return matrix_to_json(explain(matrix, lambda process: []), None)

    report = json.loads(json.dumps(asyncio.run(go())))
    (pair,) = report["pairs"]
    assert (pair["prefill"], pair["decode"], pair["state"]) == ("prefill-0", "decode-0", "failed")
    assert pair["causes"][0]["name"] == "transfer_failed"
    assert report["ok"] is False


def test_the_kv_cost_is_the_pd_surveys_arithmetic():
    """OPT-175B: 4.5 MB per token; 2048 tokens over 8 ranks at 64 GB/s each: about 18 ms."""
    cost = KvCost("OPT-175B", 4.5e6, 2048, 64.0, 8, ttft_ms=400.0)
    assert cost.transfer_ms == pytest.approx(18.0)
    assert cost.line() == (
        "KV cost: OPT-175B: 4.5 MB per token (16-bit KV); 2048 input tokens = 9.22 GB, at the "
        "measured 64 GB/s per rank x 8 rank(s): 18.0 ms, 4% of the TTFT objective (400 ms)"
    )


def test_pairs_that_disagree_without_a_majority_all_fail_and_ask_for_a_reference(tmp_path):
    async def go() -> None:
        prefills = [Fake("prefill")]
        decodes = [Fake("decode", output_ids=[5, 6, 7]), Fake("decode", output_ids=[5, 9, 9])]
        async with cluster(tmp_path, prefills, decodes) as topology:
            matrix = await run_matrix(resolve(topology), DoctorOptions(timeout_s=5))
        assert [p.state for p in matrix.pairs] == ["wrong", "wrong"]
        pair = matrix.pair("prefill-0", "decode-1")
        assert "the pairs disagree and none has a majority (1 vs 1 of 2 pairs)" in pair.symptom
        assert "gave [5, 9, 9] 'w5 w9 w9'" in pair.symptom and "--reference URL" in pair.symptom
        assert matrix.expected is not None and matrix.expected.answer is None

    asyncio.run(go())


def test_the_majority_names_the_wrong_pair_and_the_worker_behind_it(tmp_path):
    async def go() -> None:
        prefills = [Fake("prefill") for _ in range(3)]
        decodes = [Fake("decode", output_ids=[5, 6, 7])]
        async with cluster(tmp_path, prefills, decodes) as topology:
            plan = resolve(topology)
            # prefill-2's pairs answer other tokens (as KV written into the wrong pages would).
            (port,) = [w.bootstrap_port for w in plan.workers if w.instance_name == "prefill-2"]
            assert port is not None
            decodes[0].by_bootstrap_port[port] = [5, 6, 8]
            matrix = await run_matrix(plan, DoctorOptions(timeout_s=5))
        assert [p.state for p in matrix.pairs] == ["ok", "ok", "wrong"]
        pair = matrix.pair("prefill-2", "decode-0")
        assert pair.symptom.startswith(
            "gave other tokens than the majority (2 of 3 pairs), from token 2: [5, 6, 8]"
        )
        assert "against [5, 6, 7] 'w5 w6 w7'" in pair.symptom
        text = "\n".join(failure_lines(matrix))
        assert "prefill-2 x decode-0: wrong: gave other tokens" in text
        assert "--disaggregation-enable-kv-checksum" in text
        report = matrix_to_json(matrix, None)
        assert report["tokens"]["expected_ids"] == [5, 6, 7]
        assert report["tokens"]["agree"] == 2 and report["ok"] is False

    asyncio.run(go())


def test_a_reference_decides_even_a_single_pair(tmp_path):
    async def go() -> None:
        reference = Fake("reference", output_ids=[1, 2, 3])
        runner = web.AppRunner(reference.app(), shutdown_timeout=0.1)
        await runner.setup()
        port = free_block(1)
        await web.TCPSite(runner, "127.0.0.1", port).start()
        try:
            async with cluster(tmp_path, [Fake("prefill")], [Fake("decode")]) as topology:
                options = DoctorOptions(timeout_s=5, reference_url=f"http://127.0.0.1:{port}/")
                matrix = await run_matrix(resolve(topology), options)
                missing = DoctorOptions(timeout_s=5, reference_url=f"http://127.0.0.1:{port}9")
                unreachable = await run_matrix(resolve(topology), missing)
        finally:
            await runner.cleanup()
        (pair,) = matrix.pairs
        assert pair.state == "wrong"
        assert "gave other tokens than the reference, from token 0" in pair.symptom
        (body,) = reference.bodies
        assert "bootstrap_room" not in body and body["sampling_params"]["temperature"] == 0
        assert not unreachable.ok and "the reference" in unreachable.reference_error
        assert unreachable.pairs[0].ok  # the pair itself is fine

    asyncio.run(go())


def test_an_instance_whose_other_node_does_not_answer_health_is_not_probed():
    async def healthy(request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def go() -> dict[str, str]:
        app = web.Application()
        app.router.add_get("/health", healthy)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        with socket.socket() as sock:  # a port nobody listens on
            sock.bind(("127.0.0.1", 0))
            closed = f"http://127.0.0.1:{sock.getsockname()[1]}"
        whole = Instance("prefill-0", "prefill", url, "127.0.0.1", 8998, 1, ("prefill-0",))
        split = Instance(
            "decode-0",
            "decode",
            url,
            "127.0.0.1",
            None,
            1,
            ("decode-0-node0", "decode-0-node1"),
            nodes=(("decode-0-node1", closed),),
        )
        try:
            async with Prober(2) as prober:
                return await _health(prober, (whole, split), 2)
        finally:
            await runner.cleanup()

    down = asyncio.run(go())
    assert list(down) == ["decode-0"]
    assert down["decode-0"].startswith("decode-0's node decode-0-node1 does not answer /health (")


def test_probes_started_at_once_never_share_a_bootstrap_room():
    """An autoscale move gates its instances at once against the same prefill: SGLang refuses
    a room it already holds, so two probes must never pick the same one, even in the same
    millisecond; each still walks every prefill DP rank."""
    rooms = [room for _ in range(2000) for room, _ in rooms_for(2, 1, 0)]
    assert len(set(rooms)) == len(rooms)
    plan = rooms_for(4, 2, 3)
    assert sorted(room % 4 for room, _ in plan) == [0, 1, 2, 3]
    assert [rank for _, rank in plan] == [0, 1, 0, 1]


def test_an_answer_known_beforehand_decides_a_single_pair(tmp_path):
    # `pdkit upgrade`: the deployment's answer before the upgrade, not the pairs' majority.
    async def go() -> None:
        async with cluster(tmp_path, [Fake("prefill")], [Fake("decode")]) as topology:
            plan = resolve(topology)
            want = DoctorOptions(timeout_s=5, expected=Answer((5, 6, 7), "w5 w6 w7"))
            right = await run_matrix(plan, want)
            other = Answer((5, 6, 8), "w5 w6 w8")
            before = "the answer before the upgrade"
            wrong = await run_matrix(
                plan, DoctorOptions(timeout_s=5, expected=other, expected_source=before)
            )
        assert right.ok
        (pair,) = wrong.pairs
        assert pair.state == "wrong"
        assert pair.symptom.startswith(
            "gave other tokens than the answer before the upgrade, from token 2"
        )
        assert token_line(right).startswith("tokens: 1 of 1 pair(s) agree with the expected")

    asyncio.run(go())
