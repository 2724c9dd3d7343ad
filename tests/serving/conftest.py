"""Fixtures that run real `nanospec serve` processes (SGLang scheduler included)."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, ExitStack, nullcontext
from pathlib import Path

import pytest

from nanospec_server.launch.server import generate, running_server
from nanospec_server.models.tiny import tiny_model_path
from nanospec_server.models.tiny.tokenizer import BOS_ID, VOCAB_SIZE

MAX_NEW_TOKENS = 24
ADMIN_KEY = "test-admin-key"  # live settings changes need SGLang's --admin-api-key
# Shared flags: small KV pool (the tiny models need little), fp32 so that the random
# target has no bf16 near-ties that a different batch shape could flip.
BASE_FLAGS = ["--max-total-tokens", "8192", "--mem-fraction-static", "0.3", "--dtype", "float32"]
# Speculative servers draft at the launch's fixed depth unless a test turns adaptive
# speculation (the CPU default) on: most tests check what the fixed depth does.
BASE_FLAGS += ["--admin-api-key", ADMIN_KEY, "--no-nanospec-adaptive"]


def make_prompts(count: int, seed: int, max_len: int = 200) -> list[list[int]]:
    rng = random.Random(seed)
    lengths = [1, 2, 7, max_len] + [rng.randint(3, max_len) for _ in range(count - 4)]
    return [[BOS_ID] + [rng.randrange(3, VOCAB_SIZE) for _ in range(n)] for n in lengths]


def generate_all(
    url: str, prompts: list[list[int]], max_new_tokens: int | list[int] = MAX_NEW_TOKENS
) -> list[dict]:
    """Send the prompts concurrently, so the scheduler batches them."""
    if isinstance(max_new_tokens, int):
        max_new_tokens = [max_new_tokens] * len(prompts)
    with ThreadPoolExecutor(max_workers=len(prompts)) as pool:
        return list(pool.map(lambda p, n: generate(url, p, n), prompts, max_new_tokens))


def generate_waves(url: str, prompts: list[list[int]], max_new: list[int]) -> list[dict]:
    """Two concurrent waves, the second in reverse order (slots are reused, batches differ);
    results in the first wave's order, then the second's in the same order."""
    first = generate_all(url, prompts, max_new)
    second = generate_all(url, prompts[::-1], max_new[::-1])
    return first + second[::-1]


# Flags that leave a server plain decoding in BASE_FLAGS' float32: its reference answers.
PLAIN_FLAGS = ([], ["--dtype", "float32"])
# The targets most modules take references from; each shared server stays up (~3 GB).
SHARED_TARGETS = ("tiny-target", "agree-target")


@pytest.fixture(scope="package")
def serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable]:
    """serve(target, extra_flags) -> context manager yielding the server URL.

    Plain decoding of a shared target is one server for the whole package: every module
    takes its reference answers from it (a start costs more than most modules' requests).
    Its radix cache then holds other modules' prompts, which must not change an answer
    either. A test that puts plain decoding itself under test asks for a ``fresh`` one."""
    plain: dict[str, str] = {}

    def started(target: str, flags: list[str]) -> AbstractContextManager[str]:
        log = Path(tmp_path_factory.mktemp("server")) / "server.log"
        model = ["--model-path", str(tiny_model_path(target))]
        return running_server(model + BASE_FLAGS + flags, log)

    with ExitStack() as running:

        def start(
            target: str, flags: list[str], fresh: bool = False
        ) -> AbstractContextManager[str]:
            if fresh or flags not in PLAIN_FLAGS or target not in SHARED_TARGETS:
                return started(target, flags)
            if target not in plain:
                plain[target] = running.enter_context(started(target, []))
            return nullcontext(plain[target])

        yield start
