"""lm-evaluation-harness against a real server: its `local-completions` model, pointed at a `tokenspeed serve`
of the demo model, must score (context, continuation) pairs as its `hf` model does on the same weights.

`local-completions` scores a pair by sending the context and continuation tokens to /v1/completions with
`echo`, `logprobs=1` and `max_tokens=1`, then summing the prompt logprobs of the continuation and checking
each against the top-1 entry (is_greedy); `hf` runs transformers on the same folder. The pairs are built
here by hand as lm-eval `Instance`s: no task, no dataset, nothing from the network.
"""

from __future__ import annotations

import pytest
from lm_eval.api.instance import Instance  # the test extra installs lm-eval
from lm_eval.models.huggingface import HFLM
from lm_eval.models.openai_completions import LocalCompletionsAPI

from tests.server.server_proc import module_server
from tokenspeed.demo_models import DEMO_MODELS

MODEL = str(DEMO_MODELS[0].path)
MAX_LENGTH = 512  # the demo model's max_position_embeddings
# Both sides compute in float32 over the same weights but in different kernels and summation orders (the
# server's paged attention and fused ops, transformers' eager modules), so each token logprob may differ by
# a few float32 steps of an O(10) logit / log-sum-exp difference, ~1e-6 each; a continuation sums up to a
# dozen of them. 1e-4 covers that rounding with margin, and is far below what a real defect moves (a wrong
# position, token or softmax shifts a logprob by 1e-2 or more).
LL_ABS_TOL = 1e-4

# (context, continuation) in the style of the demo corpus (the Python documentation).
PAIRS: list[tuple[str, str]] = [
    ("The open function returns a", " file object"),
    ("To read a file, call the", " read method"),
    ("A list is a mutable", " sequence"),
    ("A tuple is an immutable", " sequence of values"),
    ("The dictionary maps keys to", " values"),
    ("When an exception is raised, the", " interpreter looks for a handler"),
    ("The for statement iterates over the items of a", " sequence"),
    ("The return statement leaves the current", " function call"),
    ("An integer is a", " whole number"),
    ("The string method split returns a", " list of the words in the string"),
    ("The module defines the following", " functions"),
    ("This function returns", " None"),
    ("The default value is", " None"),
    ("If the argument is omitted, the", " default value is used"),
    ("The class attribute is shared by all", " instances"),
    ("The import statement loads a", " module"),
    ("The value of the", " expression is returned"),
    ("Raise a ValueError if the", " argument is not valid"),
    ("The loop ends when the", " condition is false"),
    ("The file is closed when the", " with block ends"),
    ("Each thread has its own", " stack"),
    ("The keys of a dictionary must be", " hashable"),
    ("The result is a new", " list"),
    ("Use the print function to write", " text to standard output"),
    ("The number of items in a list is given by the", " len function"),
    ("A generator is a function that", " returns an iterator"),
    ("The socket module provides access to the", " BSD socket interface"),
    ("The time module provides various", " time related functions"),
    # Context ending with a space: lm-eval moves the space onto the continuation.
    ("The name of the ", "module"),
    # The continuation's first token merges with the end of the context ("func" + "tion").
    ("Call the func", "tion with two arguments"),
    # Empty context: both sides condition on the end-of-text token instead.
    ("", "The function returns a value."),
]


def _instances() -> list[Instance]:
    return [
        Instance(request_type="loglikelihood", doc={}, arguments=pair, idx=i, metadata=("manual", i, 1))
        for i, pair in enumerate(PAIRS)
    ]


srv = module_server(MODEL, "lm-eval-logs", "--served-model-name", "demo")


def test_local_completions_matches_hf_loglikelihoods(srv):
    api = LocalCompletionsAPI(
        model="demo",
        base_url=f"{srv.url}/v1/completions",
        tokenizer_backend="huggingface",
        tokenizer=MODEL,
        num_concurrent=1,
        max_retries=1,
        batch_size=1,
        max_length=MAX_LENGTH,
        add_bos_token=False,
        timeout=120,
    )
    hf = HFLM(
        pretrained=MODEL,
        device="cpu",
        dtype="float32",
        batch_size=8,
        max_length=MAX_LENGTH,
        add_bos_token=False,
    )

    # What the pairs are meant to cover holds for this tokenizer: a continuation of several tokens, and one
    # whose first token merges with the end of the context (the whole text's tokens do not start with the
    # context's; lm-eval then splits the whole text's tokens at the context's length).
    encoded = [(api.tok_encode(c), api.tok_encode(c + x)) for c, x in PAIRS if c]
    assert max(len(whole) - len(ctx) for ctx, whole in encoded) >= 5
    assert any(whole[: len(ctx)] != ctx for ctx, whole in encoded)

    served_ll = api.loglikelihood(_instances(), disable_tqdm=True)
    hf_ll = hf.loglikelihood(_instances(), disable_tqdm=True)
    assert len(served_ll) == len(hf_ll) == len(PAIRS)

    diffs = [abs(s - h) for (s, _), (h, _) in zip(served_ll, hf_ll, strict=True)]
    worst = max(range(len(PAIRS)), key=diffs.__getitem__)
    print(f"\nlm-eval local-completions vs hf on the demo model: {len(PAIRS)} pairs, "
          f"max |loglikelihood difference| = {diffs[worst]:.3g} (pair {PAIRS[worst]!r})")  # fmt: skip
    for (c, x), (s, sg), (h, hg) in zip(PAIRS, served_ll, hf_ll, strict=True):
        assert s == pytest.approx(h, abs=LL_ABS_TOL), (c, x, s, h)
        assert sg == hg, (c, x, sg, hg)
    # The comparison of is_greedy means something only if both answers occur.
    assert {g for _, g in hf_ll} == {True, False}
    assert all(ll < 0 for ll, _ in hf_ll)
