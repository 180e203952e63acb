"""What a client's usage says it did not compute, from the engines' own counts."""

from __future__ import annotations

from typing import Any

from boomerang.router.apis.usage import answer_cached, engine_cached, retained_prompt, rewrite

D_PARAMS = {"do_remote_decode": True, "remote_block_ids": [[1, 2]], "remote_num_tokens": 130}


def test_each_api_s_engine_count_is_read_where_vllm_puts_it() -> None:
    details = {"prompt_tokens": 100, "prompt_tokens_details": {"cached_tokens": 64}}
    assert engine_cached("chat", details) == 64
    assert engine_cached("chat", {"prompt_tokens": 100}) == 0  # vLLM leaves out a zero
    assert engine_cached("chat", None) is None
    responses = {"input_tokens": 100, "input_tokens_details": {"cached_tokens": 32}}
    assert engine_cached("responses", responses) == 32
    assert engine_cached("responses", {"input_tokens": 100}) is None
    assert engine_cached("messages", {"input_tokens": 9, "cache_read_input_tokens": 8}) == 8
    assert engine_cached("messages", {"input_tokens": 9}) is None  # no plugin: unknown
    assert answer_cached("chat", {"usage": details}) == 64


def test_chat_reports_p_s_count_not_d_s() -> None:
    d_answer: dict[str, Any] = {
        "usage": {"prompt_tokens": 100, "prompt_tokens_details": {"cached_tokens": 100}}
    }
    assert rewrite("chat", d_answer, 64, None)
    assert d_answer["usage"]["prompt_tokens_details"] == {"cached_tokens": 64}
    chunk: dict[str, Any] = {"choices": [], "usage": {"prompt_tokens": 100}}
    assert rewrite("chat", chunk, 0, None)
    assert chunk["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}


def test_responses_report_it_in_the_final_response_object() -> None:
    event: dict[str, Any] = {
        "type": "response.completed",
        "response": {"usage": {"input_tokens": 100, "input_tokens_details": {"cached_tokens": 9}}},
    }
    assert rewrite("responses", event, 96, None)
    assert event["response"]["usage"]["input_tokens_details"] == {"cached_tokens": 96}
    assert not rewrite("responses", {"response": {"usage": None}}, 96, None)


def test_messages_split_the_prompt_into_read_created_and_the_rest() -> None:
    answer: dict[str, Any] = {"usage": {"input_tokens": 120, "output_tokens": 11}}
    assert rewrite("messages", answer, 64, D_PARAMS)
    assert answer["usage"] == {
        "input_tokens": 0,
        "output_tokens": 11,
        "cache_read_input_tokens": 64,
        "cache_creation_input_tokens": 56,  # D keeps all 120 prompt tokens: 56 more than read
    }
    start: dict[str, Any] = {"message": {"usage": {"input_tokens": 120, "output_tokens": 0}}}
    assert rewrite("messages", start, 64, None)  # D's params come later: nothing created yet
    assert start["message"]["usage"]["input_tokens"] == 56


def test_own_keeps_the_engine_s_usage_and_unknown_leaves_it() -> None:
    chat: dict[str, Any] = {"usage": {"prompt_tokens": 10}}
    assert not rewrite("chat", chat, "own", None) and chat == {"usage": {"prompt_tokens": 10}}
    held = {"usage": {"input_tokens": 20, "cache_read_input_tokens": 100}}  # a 120-token prompt
    assert rewrite("messages", held, "own", D_PARAMS)
    assert held["usage"]["cache_creation_input_tokens"] == 20
    plain: dict[str, Any] = {"usage": {"input_tokens": 120}}
    assert not rewrite("messages", plain, "own", D_PARAMS)  # the engine said nothing
    assert not rewrite("chat", {"usage": {"prompt_tokens": 10}}, "unknown", None)


def test_a_count_never_exceeds_the_prompt() -> None:
    answer: dict[str, Any] = {"usage": {"prompt_tokens": 10}}
    rewrite("chat", answer, 64, None)
    assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] == 10


def test_only_what_d_keeps_of_the_prompt_counts_as_retained() -> None:
    assert retained_prompt(D_PARAMS, 120) == 120
    assert retained_prompt(D_PARAMS, 200) == 130
    assert retained_prompt(None, 120) == 0
    assert retained_prompt({"do_remote_decode": False, "remote_num_tokens": 9}, 120) == 0


def test_p_s_own_count_says_when_its_pull_failed() -> None:
    from boomerang.router.apis.usage import pull_failed

    assert not pull_failed(1000, 1000, 128)  # it took all it was sent to pull
    assert not pull_failed(900, 1000, 128)  # within a block: its last, partial one computed
    assert pull_failed(0, 1000, 128)  # it recomputed everything
    assert pull_failed(256, 1000, 128)  # its own prefix cache held a little of it
    assert not pull_failed(None, 1000, 128)  # P does not say: nothing to tell
