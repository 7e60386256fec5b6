"""Judge backends: an OpenAI-compatible chat-completions endpoint, and a local transformers model.

Both satisfy `fincheck.eval.judge.ChatClient`. The HTTP backend leans on the `openai` client for
the hard parts: per-request timeout, retries with exponential backoff and jitter on 408/409/429,
5xx and connection errors and timeouts, honouring `Retry-After`/`retry-after-ms`. We only set
its limits and turn its final failure into a `JudgeCallError` (recorded, never scored). A
401/403 stops the run at once: retrying a wrong key on every example helps nobody.
"""

from __future__ import annotations

import os
import threading

from fincheck.errors import FincheckError
from fincheck.eval.judge import JudgeCallError

DEFAULT_KEY_ENV = "OPENAI_API_KEY"


class OpenAIChatClient:
    """Chat completions over HTTP. The API key is read from an environment variable and only
    handed to the `openai` client: it is not stored on this object, printed, or cached."""

    def __init__(
        self,
        model: str,
        base_url: str | None = None,
        api_key_env: str = DEFAULT_KEY_ENV,
        timeout_s: float = 120.0,
        max_retries: int = 6,
        max_consecutive_unreachable: int = 5,
    ) -> None:
        import openai

        key = os.environ.get(api_key_env)
        if not key:
            if base_url is None:
                raise FincheckError(
                    f"the judge needs an API key: set ${api_key_env} (or point --judge-api-key-env "
                    "at the variable that holds it)"
                )
            key = "not-needed"  # local OpenAI-compatible servers (vLLM, llama.cpp) ignore it
        self._client = openai.OpenAI(
            api_key=key, base_url=base_url, timeout=timeout_s, max_retries=max_retries
        )
        self.identity = {
            "backend": "openai",
            "model": model,
            "base_url": str(self._client.base_url),
        }
        self.model = model
        # Circuit breaker: this many calls in a row that could not connect (each after all its
        # retries) means the endpoint is down or mistyped; stop instead of failing every example.
        self.max_consecutive_unreachable = max_consecutive_unreachable
        self._unreachable_in_a_row = 0
        self._lock = threading.Lock()

    def complete(self, messages: list[dict[str, str]], sampling: dict) -> str:
        import openai

        try:
            response = self._client.chat.completions.create(
                model=self.model, messages=messages, **sampling
            )
        except (openai.AuthenticationError, openai.PermissionDeniedError) as e:
            raise FincheckError(
                f"the judge endpoint {self.identity['base_url']} refused the API key "
                f"(HTTP {e.status_code}); check the key variable and the model name"
            ) from None
        except openai.NotFoundError as e:
            raise FincheckError(
                f"the judge endpoint {self.identity['base_url']} has no model {self.model!r} "
                f"(HTTP {e.status_code})"
            ) from None
        except openai.APIConnectionError as e:  # also timeouts; after all retries
            with self._lock:
                self._unreachable_in_a_row += 1
                stop = self._unreachable_in_a_row >= self.max_consecutive_unreachable
            if stop:
                raise FincheckError(
                    f"the judge endpoint {self.identity['base_url']} is unreachable "
                    f"({self._unreachable_in_a_row} calls in a row could not connect or timed out: {_short(e)}); "
                    "check --judge-base-url and the network, then rerun (answers so far are cached)"
                ) from None
            raise JudgeCallError(f"{type(e).__name__}: {_short(e)}") from None
        except openai.APIError as e:  # retries exhausted on 429/5xx, other 4xx
            raise JudgeCallError(f"{type(e).__name__}: {_short(e)}") from None
        if not hasattr(response, "choices"):  # a 200 whose body is no chat completion (HTML)
            with self._lock:
                self._unreachable_in_a_row += 1
                stop = self._unreachable_in_a_row >= self.max_consecutive_unreachable
            body = " ".join(str(response).split())[:80]
            if stop:
                raise FincheckError(
                    f"the judge endpoint {self.identity['base_url']} does not answer with chat "
                    f"completions (a 200 reply began {body!r}): is --judge-base-url the API's "
                    "/v1 URL? Answers so far are cached; rerun once it is fixed"
                ) from None
            raise JudgeCallError(f"not a chat completion: {body!r}")
        with self._lock:
            self._unreachable_in_a_row = 0
        if not response.choices:
            raise JudgeCallError("the endpoint returned no choices")
        content = response.choices[0].message.content
        if content is None:
            raise JudgeCallError("the endpoint returned an empty message")
        return content


def _short(e: Exception) -> str:
    text = str(e).replace("\n", " ")
    return text[:300]


class TransformersChatClient:
    """A local causal LM as judge, through the project's one inference path: chat template,
    explicit greedy decoding (not the model's shipped sampling or repetition penalty), one call
    at a time."""

    def __init__(self, model_path: str, max_new_tokens: int = 512, device: str | None = None):
        from fincheck.inference import load_model

        self.loaded = load_model(model_path, dtype="auto", device=device)
        self.max_new_tokens = max_new_tokens
        self.identity = {"backend": "transformers", "model": str(model_path)}
        self._lock = threading.Lock()

    def complete(self, messages: list[dict[str, str]], sampling: dict) -> str:
        from fincheck.inference import generate_batch, render_chat

        max_new = min(int(sampling.get("max_tokens", self.max_new_tokens)), self.max_new_tokens)
        prompt = render_chat(self.loaded.tokenizer, messages, add_generation_prompt=True)
        with self._lock:
            texts, _ = generate_batch(
                self.loaded.model, self.loaded.tokenizer, [prompt], max_new, want_p_yes=False
            )
        return texts[0]
