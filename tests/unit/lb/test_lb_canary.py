"""The token canary (kit.lb.canary): its verdict on one round's answers, and a real load balancer
taking out the decode whose tokens went wrong, then back when they are right again."""

from __future__ import annotations

from kit.lb.canary import judge
from kit.token_check import Answer
from tests.support.lb_cluster import run, running_cluster

RIGHT = Answer((5, 6, 7), " a b c")
WRONG = Answer((5, 9, 9), " a x x")
P, P2 = "http://p0", "http://p1"
D0, D1, D2 = "http://d0", "http://d1", "http://d2"


def test_the_decode_all_of_whose_pairs_disagree_with_the_majority_is_the_culprit():
    verdict = judge({(P, D0): RIGHT, (P, D1): RIGHT, (P, D2): WRONG}, {}, None)
    assert verdict.states == {(P, D0): "ok", (P, D1): "ok", (P, D2): "wrong"}
    assert list(verdict.culprits) == [D2]
    assert "other tokens than the majority (2 of 3 pairs)" in verdict.culprits[D2]
    assert "from token 1" in verdict.culprits[D2]
    assert verdict.avoid == frozenset() and verdict.unanimous is None


def test_the_prefill_all_of_whose_pairs_disagree_is_the_culprit_not_the_decodes():
    answers = {(P, D0): RIGHT, (P, D1): RIGHT, (P2, D0): WRONG, (P2, D1): WRONG}
    # 2 vs 2: no majority; the answer all pairs gave before decides.
    verdict = judge(answers, {}, RIGHT)
    assert list(verdict.culprits) == [P2]
    assert "the answer every pair gave before" in verdict.culprits[P2]


def test_a_wrong_pair_no_single_worker_explains_is_avoided():
    answers = {(P, D0): RIGHT, (P, D1): WRONG, (P2, D0): RIGHT, (P2, D1): RIGHT}
    verdict = judge(answers, {}, None)
    assert verdict.culprits == {} and verdict.avoid == {(P, D1)}


def test_with_no_majority_and_nothing_earlier_no_worker_is_blamed():
    verdict = judge({(P, D0): RIGHT, (P, D1): WRONG}, {}, None)
    assert verdict.states == {(P, D0): "wrong", (P, D1): "wrong"}
    assert verdict.culprits == {} and verdict.avoid == frozenset()


def test_a_pair_that_does_not_answer_is_failed_and_blames_no_one():
    verdict = judge({(P, D0): RIGHT, (P, D1): RIGHT}, {(P, D2): "no answer"}, None)
    assert verdict.states[(P, D2)] == "failed" and verdict.culprits == {}
    assert verdict.unanimous is None  # a round with a failure sets no baseline
    assert judge({(P, D0): RIGHT, (P, D1): RIGHT}, {}, None).unanimous == RIGHT


def test_the_router_takes_out_the_decode_whose_tokens_went_wrong_until_they_are_right():
    async def scenario():
        async with running_cluster(1, 3, args=["--canary-interval", "0.1"]) as c:
            canary = c.lb.canary
            assert canary is not None
            await c.wait_for(lambda: canary.rounds >= 1, what="a first round")
            assert all(w.routable for w in c.lb.pool)
            bad = c.decode[2]
            bad.corrupt = True
            worker = c.lb.pool.get(bad.url)
            await c.wait_for(lambda: not worker.routable, what="the corrupt decode out")
            assert worker.reason_kind == "canary" and "other tokens than" in worker.reason
            _, metrics, _ = await c.get("/metrics")
            text = metrics.decode()
            wrong = f'pdkit_lb_canary_pair{{decode="{bad.url}",prefill="{c.prefill[0].url}"'
            assert wrong + ',state="wrong"} 1.0' in text
            assert 'pdkit_lb_worker_out{reason="canary"' in text
            # Its /health passes, and still no user request goes there.
            for _ in range(6):
                status, _, _ = await c.post("/generate", {"text": "user"})
                assert status == 200
            assert not [b for _, b in bad.requests if b.get("text") == "user"]
            # The canary's requests are none of the users': not counted, not in the access log.
            assert c.lb.metrics.received == 6
            assert (
                sum(n for (route, _), n in c.lb.metrics.requests.items() if route == "/generate")
                == 6
            )
            bad.corrupt = False
            await c.wait_for(lambda: worker.routable, what="the decode back")

    run(scenario())


def test_an_interval_of_zero_turns_the_canary_off():
    async def scenario():
        async with running_cluster(1, 2, args=["--canary-interval", "0"]) as c:
            assert c.lb.canary is None
            _, metrics, _ = await c.get("/metrics")
            assert b"pdkit_lb_canary" not in metrics

    run(scenario())
