"""The parts of speculative decoding that need no model: prompt lookup, the rejection sampler (a chi-square
test that the emitted tokens follow the target distribution whatever the draft), the target distribution
under sampling parameters, and the start-up refusals of the speculative flags."""

from __future__ import annotations

import collections

import pytest
import torch

from tokenspeed.config.server_args import ServerArgs
from tokenspeed.config.support_check import assess
from tokenspeed.runtime.layers.sampling.torch_sampler import TorchSampler
from tokenspeed.runtime.speculative.ngram import propose_ngram
from tokenspeed.runtime.speculative.rejection import greedy_verify, rejection_sample, target_probs
from tokenspeed.sampling_params import SamplingParams

# chi-square critical values at p = 0.001 by degrees of freedom: a correct sampler fails 1 time in 1000
# (and the seeds are fixed, so the outcome is the same every run)
CHI2_999 = {5: 20.52, 35: 66.62}


def test_ngram_prefers_the_longest_then_the_latest_match():
    tokens = [1, 2, 3, 9, 1, 2, 3, 7, 8, 5, 2, 3]
    # suffix [2, 3] occurs at 1..2 (followed by 9) and 5..6 (followed by 7): the latest wins
    assert propose_ngram(tokens, 3, 1, 4) == [7, 8, 5]
    # a longer suffix [1, 2, 3] beats a shorter, more recent one
    assert propose_ngram([1, 2, 3, 4, 6, 2, 3, 5, 1, 2, 3], 2, 1, 3) == [4, 6]
    assert propose_ngram([1, 2, 3, 4], 3, 1, 3) == []  # nothing recurs
    assert propose_ngram([5, 6, 5, 6], 3, 3, 4) == []  # the match is shorter than the minimum
    assert propose_ngram([5, 6, 5, 6], 3, 1, 4) == [5, 6]  # what follows runs up to the end


def _chi2(counts: collections.Counter, p: torch.Tensor, n: int) -> float:
    expected = p * n
    keep = expected > 0
    observed = torch.tensor([counts.get(i, 0) for i in range(len(p))], dtype=torch.float64)
    assert observed[~keep].sum() == 0, "a token of probability 0 was emitted"
    return float(((observed[keep] - expected[keep]) ** 2 / expected[keep]).sum())


@pytest.mark.parametrize("draft_kind", ["sampled_q", "one_hot"])
def test_rejection_sampling_matches_the_target(draft_kind):
    """Emitted tokens follow p at the first position and, after an accepted draft, at the second."""
    gen = torch.Generator().manual_seed(1234)
    p = torch.tensor(
        [[0.30, 0.25, 0.20, 0.15, 0.10, 0.00], [0.05, 0.05, 0.10, 0.20, 0.25, 0.35]], dtype=torch.float64
    )
    # a deliberately different draft distribution (mass on a token the target never emits)
    q = torch.tensor([[0.05, 0.10, 0.15, 0.20, 0.30, 0.20]], dtype=torch.float64)
    n = 6000
    first, second = collections.Counter(), collections.Counter()
    for _ in range(n):
        if draft_kind == "sampled_q":
            x = int(torch.multinomial(q[0], 1, generator=gen))
            tokens = rejection_sample(p, [x], q, gen)
        else:
            tokens = rejection_sample(p, [4], None, gen)  # always drafts token 4
        assert 1 <= len(tokens) <= 2
        first[tokens[0]] += 1
        if len(tokens) == 2:
            second[tokens[1]] += 1
    assert _chi2(first, p[0], n) < CHI2_999[5], first
    assert _chi2(second, p[1], sum(second.values())) < CHI2_999[5], second


class Row:
    def __init__(self, **kw):
        self.sampling = SamplingParams(**kw)
        self.generator = None
        self.token_ids = [0, 1, 1, 3]
        self.eos_token_ids = frozenset({4})
        self.num_prompt_tokens = 2
        self.num_output_tokens = 2


def test_target_probs_are_what_the_torch_sampler_draws_from():
    """Verification accepts against exactly the sampler's distribution (chi-square over 6000 draws)."""
    torch.manual_seed(0)
    logits = torch.tensor([[1.5, 1.2, 0.9, 0.7, 0.1, -0.3, -2.0]])
    params = dict(temperature=0.8, top_k=6, top_p=0.9, min_p=0.05, presence_penalty=0.4, logit_bias={"5": 1.0})
    n = 6000
    rows = [Row(**params) for _ in range(n)]
    probs, _ = target_probs(logits, rows[:1])
    drawn = TorchSampler("cpu").sample(logits.expand(n, -1), rows).token_ids.tolist()
    assert _chi2(collections.Counter(drawn), probs[0].double(), n) < CHI2_999[5]


def test_target_probs_follow_the_sampling_parameters():
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0]])

    probs, _ = target_probs(logits, [Row(temperature=0.5, top_k=3)])
    want = torch.softmax(logits[0, :3] / 0.5, -1)
    assert torch.allclose(probs[0, :3], want) and probs[0, 3:].sum() == 0
    greedy, _ = target_probs(logits, [Row(temperature=0.0, logit_bias={"2": 5.0})])
    assert greedy[0].tolist() == [0, 0, 1, 0, 0]
    # min_new_tokens bans EOS (4) until reached; a penalty lowers seen tokens
    probs, _ = target_probs(logits, [Row(temperature=1.0, min_new_tokens=3, presence_penalty=0.0)])
    assert probs[0, 4] == 0
    assert greedy_verify([3, 5, 6], [3, 7]) == [3, 5]
    assert greedy_verify([3, 7, 6], [3, 7]) == [3, 7, 6]


def test_speculative_flags_resolve_and_refuse():
    args = ServerArgs(model="demo", device="cpu", speculative_algorithm="NGRAM")
    assert args.speculative_num_draft_tokens == 4 and not assess(args).refused
    cfg = '{"method": "ngram", "num_speculative_tokens": 2}'
    args = ServerArgs(model="demo", device="cpu", speculative_config=cfg)
    assert (args.speculative_algorithm, args.speculative_num_draft_tokens) == ("NGRAM", 3)
    for algo in ("MTP", "DFLASH"):
        kw = {"speculative_num_draft_tokens": 4} if algo == "DFLASH" else {}
        error = assess(ServerArgs(model="demo", device="cpu", speculative_algorithm=algo, **kw)).error()
        assert f"--speculative-algorithm {algo}" in error and "none of the supported architectures" in error
    with pytest.raises(ValueError, match="--speculative-draft-model-path"):
        ServerArgs(model="demo", device="cpu", speculative_algorithm="EAGLE3")
    with pytest.raises(ValueError, match="--speculative-eagle-topk"):
        ServerArgs(model="demo", device="cpu", speculative_algorithm="EAGLE3", speculative_draft_model_path="d",
                   speculative_eagle_topk=2)  # fmt: skip
    with pytest.raises(ValueError, match="--speculative-ngram-min-match-window-size"):
        ServerArgs(model="demo", device="cpu", speculative_algorithm="NGRAM",
                   speculative_ngram_min_match_window_size=5, speculative_ngram_max_match_window_size=2)  # fmt: skip
    steps = ServerArgs(model="demo", device="cpu", speculative_algorithm="EAGLE3",
                       speculative_draft_model_path="d", speculative_num_draft_tokens=5)  # fmt: skip
    assert steps.speculative_num_steps == 4
