"""Responses and Messages answers that tell the router what D holds: its params and token ids.

Why: the router files D's handle with the hashes of the exact token ids D holds (the prompt's
and the output's) and verifies the next prompt against them. vLLM's chat endpoint returns
them on request (`return_token_ids`); its Responses and Anthropic Messages endpoints (vLLM
0.32) return none, and a streamed Messages answer drops D's `kv_transfer_params` too (its
converter rebuilds Anthropic events from the chat stream and keeps none of the extras). So, for
requests that carry `kv_transfer_params` (only the router sends them: it strips clients'):

- Responses: the response object, JSON or inside the final `response.completed` event (both
  come from `responses_full_generator`), gets top-level `prompt_token_ids` and `token_ids`
  from the request's final output. vLLM already puts D's params there.
- Messages: the chat request it converts to asks for token ids; the JSON answer gets
  `prompt_token_ids` and `token_ids`, and the streamed `message_delta` event (the one with
  the stop reason) gets those and `kv_transfer_params`, collected from the chat stream.
- Messages usage (every request, not only the router's: it is the engine's own count): vLLM's
  converter drops what the chat answer says of cached prompt tokens
  (`usage.prompt_tokens_details.cached_tokens`, with `--enable-prompt-tokens-details`); the
  answer's and `message_delta`'s Anthropic `usage.cache_read_input_tokens` get it (0 when the
  details are on and the chat usage has none: vLLM leaves a zero out), so the router can tell
  its clients what the engine did not compute.

Everything else passes through untouched. The rewrites of events are pure (`message_delta`,
`ChatStreamTap.observe`) and tested without vLLM; `apply` patches vLLM where its serving
classes have the expected methods, and says in the log what it could not patch.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any

logger = logging.getLogger("boomerang.connector.plugin.api_ids")

_PATCHED = "__boomerang_api_ids__"
_RESPONSES = ("vllm.entrypoints.openai.responses.serving", "OpenAIServingResponses")
_MESSAGES = ("vllm.entrypoints.anthropic.serving", "AnthropicServingMessages")
MESSAGE_DELTA = "event: message_delta\n"


class ChatStreamTap:
    """Passes a chat stream's SSE strings through, remembering D's params, the prompt's ids
    (first chunk) and the output ids (every chunk's choice), as vLLM's chat stream carries
    them with `return_token_ids` (params: on the finishing chunk, from vLLM 0.33 or
    Boomerang's plugin)."""

    def __init__(self, source: AsyncIterator[str]) -> None:
        self._source = source
        self.params: dict[str, Any] | None = None
        self.prompt_ids: list[int] | None = None
        self.output_ids: list[int] = []
        self.seen_ids = False
        self.cached: int | None = None
        """Prompt tokens the engine did not compute, from the usage of the chat stream (set
        to 0 up front where the details are on: vLLM sends none for a zero)."""

    def __aiter__(self) -> ChatStreamTap:
        return self

    async def __anext__(self) -> str:
        event: str = await self._source.__anext__()
        self.observe(event)
        return event

    def observe(self, event: str) -> None:
        """Collect from one chat SSE event (cheap for events that carry nothing of it)."""
        if not event.startswith("data:") or (
            "token_ids" not in event
            and "kv_transfer_params" not in event
            and "prompt_tokens_details" not in event
        ):
            return
        try:
            chunk = json.loads(event[5:].strip())
        except ValueError:
            return
        if not isinstance(chunk, dict):
            return
        if isinstance(params := chunk.get("kv_transfer_params"), dict) and params:
            self.params = params
        if isinstance(prompt := chunk.get("prompt_token_ids"), list):
            self.prompt_ids, self.seen_ids = prompt, True
        for choice in chunk.get("choices") or ():
            if isinstance(choice, dict) and isinstance(ids := choice.get("token_ids"), list):
                self.output_ids.extend(ids)
                self.seen_ids = True
        if (cached := cached_of(chunk.get("usage"))) is not None:
            self.cached = cached


def cached_of(usage: Any) -> int | None:
    """`prompt_tokens_details.cached_tokens` of a chat usage (dict or vLLM's model)."""
    details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
    if details is None and usage is not None and not isinstance(usage, dict):
        details = getattr(usage, "prompt_tokens_details", None)
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    if cached is None and details is not None and not isinstance(details, dict):
        cached = getattr(details, "cached_tokens", None)
    return cached if isinstance(cached, int) and not isinstance(cached, bool) else None


def message_delta(event: str, tap: ChatStreamTap) -> str:
    """A Messages SSE event, with D's params and ids added if it is the `message_delta` and
    the chat stream carried them. Pure: the decision and the rewrite, testable without vLLM."""
    if not event.startswith(MESSAGE_DELTA) or not (
        tap.params or tap.seen_ids or tap.cached is not None
    ):
        return event
    head, _, data = event.partition("\ndata: ")
    try:
        payload = json.loads(data)
    except ValueError:
        return event
    if not isinstance(payload, dict):
        return event
    extra: dict[str, Any] = {"kv_transfer_params": tap.params}
    if tap.seen_ids:
        extra |= {"prompt_token_ids": tap.prompt_ids, "token_ids": tap.output_ids}
    for key, value in extra.items():
        if value is not None and key not in payload:
            payload[key] = value
    usage = payload.get("usage")
    if tap.cached is not None and isinstance(usage, dict):
        usage.setdefault("cache_read_input_tokens", tap.cached)
    return f"{head}\ndata: {json.dumps(payload, separators=(',', ':'))}\n\n"


def asks_for_transfer(request: Any) -> bool:
    """Whether a request carries `kv_transfer_params` (the router's P/D legs do)."""
    return bool(getattr(request, "kv_transfer_params", None))


def responses_ids(context: Any) -> tuple[list[int], list[int]] | None:
    """(prompt ids, output ids) of a Responses request's final output, if it has one."""
    final = getattr(context, "final_output", None)
    outputs = getattr(final, "outputs", None)
    prompt = getattr(final, "prompt_token_ids", None)
    if not outputs or prompt is None:
        return None
    return list(prompt), list(outputs[0].token_ids or ())


# -- patches -----------------------------------------------------------------------------------


def _wrap_full_generator(original: Callable[..., Any]) -> Any:
    signature = inspect.signature(original)

    @functools.wraps(original)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        response = await original(*args, **kwargs)
        bound = signature.bind(*args, **kwargs).arguments
        request, context = bound.get("request"), bound.get("context")
        ids = responses_ids(context) if asks_for_transfer(request) else None
        if ids is not None and hasattr(response, "output"):
            response.prompt_token_ids, response.token_ids = ids
        return response

    setattr(wrapper, _PATCHED, True)
    return wrapper


def _wrap_to_chat(original: Callable[..., Any]) -> Any:
    @functools.wraps(original)
    def wrapper(cls: Any, anthropic_request: Any, *args: Any, **kwargs: Any) -> Any:
        req = original(cls, anthropic_request, *args, **kwargs)
        if asks_for_transfer(anthropic_request):
            req.return_token_ids = True
        return req

    setattr(wrapper, _PATCHED, True)
    return classmethod(wrapper)


def _wrap_full_converter(original: Callable[..., Any], with_ids: Any) -> Any:
    @functools.wraps(original)
    def wrapper(self: Any, generator: Any) -> Any:
        result = original(self, generator)
        cached = cached_of(getattr(generator, "usage", None))
        if cached is None and getattr(self, "enable_prompt_tokens_details", False):
            cached = 0  # vLLM leaves a zero out
        usage = getattr(result, "usage", None)
        if cached is not None and usage is not None and hasattr(usage, "cache_read_input_tokens"):
            usage.cache_read_input_tokens = cached
        prompt = getattr(generator, "prompt_token_ids", None)
        choices = getattr(generator, "choices", None) or ()
        if prompt is None or not choices:
            return result
        output = list(getattr(choices[0], "token_ids", None) or ())
        fields = {name: getattr(result, name) for name in type(result).model_fields}
        return with_ids.model_construct(
            _fields_set=result.model_fields_set | {"prompt_token_ids", "token_ids"},
            **fields,
            prompt_token_ids=list(prompt),
            token_ids=output,
        )

    setattr(wrapper, _PATCHED, True)
    return wrapper


def _wrap_stream_converter(original: Callable[..., AsyncGenerator[str, None]]) -> Any:
    @functools.wraps(original)
    async def wrapper(self: Any, generator: AsyncIterator[str]) -> AsyncGenerator[str, None]:
        tap = ChatStreamTap(generator)
        if getattr(self, "enable_prompt_tokens_details", False):
            tap.cached = 0  # vLLM sends no details for a zero
        async for event in original(self, tap):
            yield message_delta(event, tap)

    setattr(wrapper, _PATCHED, True)
    return wrapper


def _class(module_name: str, class_name: str) -> Any:
    import importlib

    try:
        return getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as exc:
        logger.warning("boomerang: cannot patch %s (%s)", class_name, exc)
        return None


def _patch_responses() -> bool:
    cls = _class(*_RESPONSES)
    method = getattr(cls, "responses_full_generator", None)
    if method is None or getattr(method, _PATCHED, False):
        return False
    cls.responses_full_generator = _wrap_full_generator(method)
    return True


def _patch_messages() -> bool:
    cls = _class(*_MESSAGES)
    if cls is None:
        return False
    names = ("to_chat_completion_request", "messages_full_converter", "message_stream_converter")
    if not all(hasattr(cls, n) for n in names):
        logger.warning("boomerang: vLLM's Messages serving moved; its answers carry no ids")
        return False
    if getattr(cls.message_stream_converter, _PATCHED, False):
        return False
    from pydantic import ConfigDict
    from vllm.entrypoints.anthropic.protocol import AnthropicMessagesResponse

    with_ids = type(
        "AnthropicMessagesResponseWithIds",
        (AnthropicMessagesResponse,),
        {"model_config": ConfigDict(extra="allow"), "__module__": __name__},
    )
    cls.to_chat_completion_request = _wrap_to_chat(cls.to_chat_completion_request.__func__)
    cls.messages_full_converter = _wrap_full_converter(cls.messages_full_converter, with_ids)
    cls.message_stream_converter = _wrap_stream_converter(cls.message_stream_converter)
    return True


def apply() -> list[str]:
    """Patch vLLM's Responses and Messages serving (idempotent); which ones were patched."""
    done = []
    if _patch_responses():
        done.append("responses")
    if _patch_messages():
        done.append("messages")
    return done
