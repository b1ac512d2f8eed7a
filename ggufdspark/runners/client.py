"""A minimal ``llama-server`` HTTP client (stdlib only): completions and chat return the text plus
parsed timings; image parts of a chat message may be local files (sent as data URIs)."""

from __future__ import annotations

import base64
import http.client
import json
import mimetypes
import re
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from ggufdspark import timings as tm
from ggufdspark.errors import ContextSizeError, EngineError, RequestFailedError

# Our own engine listens on loopback: requests to it never go through a proxy. urllib's default
# opener reads http_proxy / HTTP_PROXY from the environment (and honours no_proxy only for some
# spellings), so a proxy set for the user's other traffic would carry our health polls to a
# machine that cannot reach this one's 127.0.0.1. An empty ProxyHandler turns that off.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def urlopen_direct(req: "urllib.request.Request | str", *, timeout: float):
    """``urllib.request.urlopen`` without any proxy from the environment (for our own engine)."""
    return _DIRECT.open(req, timeout=timeout)


@dataclass
class Completion:
    """A finished request: the text, token ids where the endpoint gives them, parsed timings."""

    text: str
    timings: tm.RequestTimings
    tokens: list[int] | None = None
    probs: list[dict] | None = None
    raw: dict = field(default_factory=dict, repr=False)


# Token events that reach the client within this many seconds of the previous one belong to one
# chunk (what a user sees appear at once). The pinned llama-server streams every token as its own
# event (server-context.cpp: process_token -> send_partial_response, one a token, also for each
# token a verify accepted), so a drafted step's tokens arrive back to back: 0.01-0.1 ms apart on a
# CPU build, against a step of a few ms or more for any model served here (a plain decode of the
# 3B target on an H200: ~2.5 ms). A client thread held up between two events of one step (the GIL,
# under many clients) can split a chunk; that counts as one more, shorter gap.
CHUNK_JOIN_S = 0.001


@dataclass
class StreamedCompletion(Completion):
    """A streamed request: a Completion plus the client's clock (seconds from send): ``ttft_s`` to
    the first token, ``e2e_s`` to the final chunk, ``longest_gap_s`` the longest wait between two
    events carrying tokens after the first (a stall the user sees; None with fewer than two),
    ``longest_gap_end_s`` when it ended and ``longest_gap_index`` its place in ``gaps_s`` (None when
    it is shorter than ``CHUNK_JOIN_S``, inside a chunk);
    ``gaps_s`` the inter-token latencies: the wait before each chunk after the first (token events
    arriving within ``CHUNK_JOIN_S`` of the previous one are one chunk); ``chunks`` their count."""

    ttft_s: float = 0.0
    e2e_s: float = 0.0
    longest_gap_s: float | None = None
    longest_gap_end_s: float | None = None
    longest_gap_index: int | None = None
    gaps_s: list[float] = field(default_factory=list, repr=False)
    chunks: int = 0


class Client:
    """A minimal llama-server HTTP client (stdlib only)."""

    def __init__(self, url: str, *, api_key: str | None = None, timeout: float = 600.0):
        self.url = url.rstrip("/")
        self.api_key = api_key
        self.timeout = timeout

    def _request(self, path: str, body: dict | None = None, *, stream: bool = False):
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, headers=headers,
                                     method="POST" if body is not None else "GET")
        try:
            resp = urlopen_direct(req, timeout=self.timeout)
        except urllib.error.HTTPError as e:
            body = e.read().decode(errors="replace")
            raise _http_error(f"{self.url}{path}", e.code, body) from None
        except (urllib.error.URLError, ConnectionError, TimeoutError) as e:
            raise EngineError(f"{self.url}{path}: {getattr(e, 'reason', e)}") from None
        return resp

    def post_json(self, path: str, body: dict) -> dict:
        with self._request(path, body) as r:
            return json.loads(r.read())

    def get_text(self, path: str) -> str:
        with self._request(path) as r:
            return r.read().decode()

    def stream_lines(self, path: str, body: dict) -> Iterator[str]:
        """Raw SSE lines of a streamed request."""
        with self._request(path, {**body, "stream": True}) as r:
            for raw in r:
                yield raw.decode("utf-8", errors="replace").rstrip("\r\n")

    def health(self) -> dict:
        return json.loads(self.get_text("/health"))

    def metrics(self) -> str:
        return self.get_text("/metrics")

    def props(self) -> dict:
        """``/props``: the server's settings (a slot's ``default_generation_settings``, ``media_marker``...)."""
        return json.loads(self.get_text("/props"))

    def tokenize(self, text: str, *, add_special: bool = True) -> list[int]:
        return self.post_json("/tokenize", {"content": text, "add_special": add_special, "parse_special": True})["tokens"]

    def detokenize(self, tokens: list[int]) -> str:
        return self.post_json("/detokenize", {"tokens": tokens})["content"]

    def apply_template(self, messages: list[dict]) -> str:
        return self.post_json("/apply-template", {"messages": messages})["prompt"]

    def complete(self, prompt: str | list[int], *, n_predict: int = 64, temperature: float = 0.0,
                 n_probs: int = 0, speculative: dict | None = None, **extra: Any) -> Completion:
        """``/completion``. ``speculative`` maps to per-request ``speculative.*`` keys (n_max...)."""
        body: dict[str, Any] = {"prompt": prompt, "n_predict": n_predict, "temperature": temperature,
                                "cache_prompt": False, "return_tokens": True, **extra}
        if temperature == 0:
            body.setdefault("top_k", 1)
        if n_probs:
            body["n_probs"] = n_probs
        for k, v in (speculative or {}).items():
            body[f"speculative.{k}"] = v
        out = self.post_json("/completion", body)
        return Completion(text=out.get("content", ""), timings=tm.parse_response(out, where=f"{self.url}/completion"),
                          tokens=out.get("tokens"), probs=out.get("completion_probabilities"), raw=out)

    def stream_complete(self, prompt: str | list[int], *, n_predict: int = 64, temperature: float = 0.0,
                        **extra: Any) -> StreamedCompletion:
        """A streamed ``/completion`` (greedy by default, prompt cache off), timed on the client:
        ``ttft_s`` from send to the first chunk carrying a token, ``e2e_s`` to the final chunk
        (``"stop": true``, which carries the engine's ``timings``), the gaps between chunks
        (``StreamedCompletion``).

        Raises:
            RequestFailedError: the server answered with an error (HTTP status or error event).
            EngineError: connection failure, or a stream that breaks or ends without its final chunk.
        """
        body: dict[str, Any] = {"prompt": prompt, "n_predict": n_predict, "temperature": temperature,
                                "cache_prompt": False, "return_tokens": True, **extra}
        if temperature == 0:
            body.setdefault("top_k", 1)
        where = f"{self.url}/completion"
        t0 = time.perf_counter()
        first: float | None = None
        last: float | None = None
        gap: float | None = None
        gap_end: float | None = None
        gap_index: int | None = None
        gaps: list[float] = []
        chunks = 0
        tokens: list[int] = []
        text: list[str] = []
        final: dict | None = None
        try:
            for line in self.stream_lines("/completion", body):
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    break
                chunk = json.loads(payload)
                if "error" in chunk:
                    raise RequestFailedError(f"{where}: the server answered with an error: {chunk['error']}")
                got = chunk.get("tokens") or []
                if got or chunk.get("content"):
                    now = time.perf_counter() - t0
                    first = now if first is None else first
                    new_chunk = last is None or now - last > CHUNK_JOIN_S
                    if new_chunk:
                        chunks += 1
                        if last is not None:
                            gaps.append(now - last)
                    if last is not None and (gap is None or now - last > gap):
                        gap, gap_end, gap_index = now - last, now, len(gaps) - 1 if new_chunk else None
                    last = now
                if chunk.get("stop"):
                    final = chunk  # the final chunk repeats no tokens of the partial ones
                    break
                tokens.extend(got)
                text.append(chunk.get("content", ""))
        except (OSError, http.client.HTTPException) as e:  # a server that died mid-stream (IncompleteRead...)
            raise EngineError(f"{where}: the stream broke: {e}") from None
        except json.JSONDecodeError as e:
            raise EngineError(f"{where}: a streamed chunk is not JSON ({e.msg})") from None
        e2e = time.perf_counter() - t0
        if final is None:
            raise EngineError(f"{where}: the stream ended without its final chunk (stop: true)")
        timings = tm.parse_response(final, where=where)
        return StreamedCompletion(text="".join(text), timings=timings, tokens=tokens,
                                  ttft_s=first if first is not None else e2e, e2e_s=e2e, longest_gap_s=gap,
                                  longest_gap_end_s=gap_end, longest_gap_index=gap_index, gaps_s=gaps,
                                  chunks=chunks, raw=final)

    def chat(self, messages: list[dict], *, max_tokens: int = 64, temperature: float = 0.0,
             **extra: Any) -> Completion:
        """``/v1/chat/completions``; image parts may be local file paths (sent as data URIs)."""
        body = {"messages": [_inline_images(m) for m in messages], "max_tokens": max_tokens,
                "temperature": temperature, **extra}
        out = self.post_json("/v1/chat/completions", body)
        text = out["choices"][0]["message"].get("content") or ""
        return Completion(text=text, timings=tm.parse_response(out, where=f"{self.url}/v1/chat/completions"), raw=out)


# The pinned engine's refusal of a prompt that does not fit its slot (tools/server/server-context.cpp,
# ERROR_TYPE_EXCEED_CONTEXT_SIZE): "request (N tokens) exceeds the available context size (M tokens), ..."
_CONTEXT_NUMBERS = re.compile(r"\((\d+) tokens\).*?\((\d+)\s+tokens\)")


def _http_error(where: str, code: int, body: str) -> EngineError:
    """The error for an HTTP error answer: ``ContextSizeError`` for a request longer than the
    slot's context, said plainly with the numbers; else ``RequestFailedError`` with the engine's answer."""
    try:
        err = json.loads(body).get("error") or {}
    except (ValueError, AttributeError):
        err = {}
    if isinstance(err, dict) and err.get("type") == "exceed_context_size_error":
        m = _CONTEXT_NUMBERS.search(str(err.get("message", "")))
        n_prompt, n_ctx = (int(m.group(1)), int(m.group(2))) if m else (None, None)
        size = (f"the request holds {n_prompt} tokens and a slot of this server holds {n_ctx}" if m
                else "the request is longer than a slot of this server holds")
        return ContextSizeError(f"{where}: HTTP {code}: {size}: llama-server divides its context (-c) among its "
                                f"slots (-np); shorten the prompt or give each slot more (serve --ctx-per-slot) "
                                f"[engine: {err.get('message', '')}]", n_prompt, n_ctx)
    return RequestFailedError(f"{where}: HTTP {code}: {body[:300]}")


def image_data_uri(path: str | Path) -> str:
    """``data:image/png;base64,...`` for an ``image_url`` part of a chat message."""
    p = Path(path)
    mime = mimetypes.guess_type(p.name)[0] or "image/png"
    return f"data:{mime};base64,{base64.b64encode(p.read_bytes()).decode()}"


def _inline_images(message: dict) -> dict:
    content = message.get("content")
    if not isinstance(content, list):
        return message
    parts = []
    for part in content:
        if part.get("type") == "image" and "path" in part:
            parts.append({"type": "image_url", "image_url": {"url": image_data_uri(part["path"])}})
        elif part.get("type") == "image_url" and not str(part["image_url"].get("url", "")).startswith(("data:", "http")):
            parts.append({"type": "image_url", "image_url": {"url": image_data_uri(part["image_url"]["url"])}})
        else:
            parts.append(part)
    return {**message, "content": parts}
