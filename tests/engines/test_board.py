"""A pool's answer board (``engines.shared_context.board``): who computes which prompt, and what a peer that
dies or a board that fails leaves behind. Plain Python, threads for the peers (the real
engines sharing a board: tests/engines/test_shared_streams.py; through Ray: tests/flows/)."""

from __future__ import annotations

import threading
import time

import pytest

from engines.shared_context.board import AnswerBoard, Claims

pytestmark = pytest.mark.quick

KEYS = [f"k{i}" for i in range(6)]


def test_a_prompt_is_granted_to_its_first_claimant_again_to_it_and_never_once_published():
    board = AnswerBoard()
    assert board.claim(0, "a") and not board.claim(1, "a")
    assert board.claim(0, "a")  # the same owner again: a restarted actor playing its shard again
    board.publish("a", "A")
    assert not board.claim(0, "a") and not board.claim(1, "a")
    assert board.wait(["a", "b"], 0.01) == {"a": "A"}  # b: nobody published it within the timeout


def test_two_peers_start_far_apart_and_each_takes_only_what_the_other_has_not():
    board = AnswerBoard()
    first, second = Claims(board, 0, KEYS, 0 / 2), Claims(board, 1, KEYS, 1 / 2)
    q1, q2 = first.order(list(range(6))), second.order(list(range(6)))
    assert q1 == [0, 1, 2, 3, 4, 5] and q2 == [3, 4, 5, 0, 1, 2]
    taken = [first.take(q1), second.take(q2), first.take(q1), second.take(q2), first.take(q1), second.take(q2)]
    assert taken == [0, 3, 1, 4, 2, 5]
    assert first.take(q1) is None and q1 == [] and second.take(q2) is None
    assert first.mine == {0, 1, 2} and second.mine == {3, 4, 5}


def test_a_peer_waits_for_what_another_claimed_and_gets_it_as_soon_as_it_is_published():
    board = AnswerBoard()
    owner, reader = Claims(board, 0, KEYS[:2]), Claims(board, 1, KEYS[:2])
    queue = [0, 1]
    assert owner.take(queue) == 0 and owner.take(queue) == 1
    assert reader.take([0, 1]) is None

    def publish_later():
        time.sleep(0.2)
        owner.publish(0, "zero")
        owner.publish(1, "one")

    threading.Thread(target=publish_later).start()
    began = time.monotonic()
    assert reader.others() == {0: "zero", 1: "one"}
    assert time.monotonic() - began < 5


def test_claims_lost_with_a_restarted_board_are_computed_by_the_waiter_at_once():
    """The first actor (the board's host) died and came back with an empty board: a peer waiting
    for prompts claimed on the old board does not wait for them."""
    reader = Claims(AnswerBoard(), 1, KEYS[:2], wait_s=60)
    began = time.monotonic()
    assert reader.others() == {} and time.monotonic() - began < 1


def test_a_claim_whose_owner_died_is_computed_by_the_waiting_peer_after_the_timeout():
    board = AnswerBoard()
    assert Claims(board, 0, KEYS[:1]).take([0]) == 0  # claimed, never published: its owner is gone
    reader = Claims(board, 1, KEYS[:1], wait_s=0.05)
    assert reader.take([0]) is None and reader.others() == {}  # what is missing is the reader's to compute


class BrokenBoard:
    def claim(self, owner, key):
        raise ConnectionError("the board's actor died")

    def publish(self, key, found):
        raise ConnectionError("the board's actor died")

    def wait(self, keys, timeout):
        raise ConnectionError("the board's actor died")


def test_a_board_that_fails_is_dropped_and_the_engine_computes_everything_itself():
    claims = Claims(BrokenBoard(), 0, KEYS)
    queue = list(range(6))
    assert [claims.take(queue) for _ in range(6)] == list(range(6)) and claims.board is None
    claims.publish(0, "x")
    assert claims.others() == {}
