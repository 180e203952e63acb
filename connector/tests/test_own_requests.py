"""D announces to its NIXL worker the requests whose blocks it kept (the continue-path leak)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from boomerang.connector.plugin import own_requests


class FakeScheduler:
    """vLLM 0.32's pull scheduler as far as the fix reads it."""

    def __init__(self, delayed: bool) -> None:
        self._reqs_in_batch: set[str] = set()
        self.delayed = delayed

    def request_finished(self, request: Any, block_ids: Any) -> tuple[bool, dict[str, Any]]:
        return self.delayed, {"remote_request_id": request.request_id}


def test_a_request_whose_blocks_are_kept_is_announced_and_the_answer_is_unchanged() -> None:
    wrapped = own_requests.wrap_request_finished(FakeScheduler.request_finished)
    sched = FakeScheduler(delayed=True)
    answer = wrapped(sched, SimpleNamespace(request_id="r1"), [[1, 2]])
    assert answer == (True, {"remote_request_id": "r1"})
    assert sched._reqs_in_batch == {"r1"}


def test_a_request_freed_at_once_is_not_announced() -> None:
    wrapped = own_requests.wrap_request_finished(FakeScheduler.request_finished)
    sched = FakeScheduler(delayed=False)
    wrapped(sched, SimpleNamespace(request_id="r2"), [[]])
    assert sched._reqs_in_batch == set()


def test_without_vllm_nothing_is_patched() -> None:
    try:
        import vllm  # noqa: F401
    except ImportError:
        assert own_requests.apply() is False
