"""GPU sampling backends: the distribution they draw from (temperature, top-k, top-p, min-p), greedy rows,
per-request seeds, the `*_full` adjustments, and no device-to-host sync while sampling."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from tokenspeed.runtime.layers.sampling import create_sampler
from tokenspeed.runtime.layers.sampling.penalties import apply_penalties
from tokenspeed.sampling_params import SamplingParams

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

BACKENDS = ["triton", "triton_full", "flashinfer", "flashinfer_full"]
FULL = {"triton_full", "flashinfer_full"}


def _req(prompt=(1, 2, 3), output=(), **sp):
    ids = list(prompt) + list(output)
    return SimpleNamespace(
        sampling=SamplingParams(**sp),
        generator=None,
        token_ids=ids,
        eos_token_ids=frozenset(),
        num_prompt_tokens=len(prompt),
        num_output_tokens=len(output),
    )


def _sampler(name):
    if name.startswith("flashinfer"):
        pytest.importorskip("flashinfer")
    return create_sampler(name, "cuda")


def _expected(base: torch.Tensor, t: float, k: int, p: float, mp: float) -> torch.Tensor:
    """The torch reference's distribution: top-k, then top-p over the renormalised rest, then min-p."""
    x = base.double() / t
    srt, order = x.sort(descending=True)
    pr = srt.softmax(-1)
    if k > 0:
        pr[k:] = 0
        pr = pr / pr.sum()
    if p < 1:
        before = pr.cumsum(0) - pr
        pr[before > p] = 0
    if mp > 0:
        pr[pr < mp * pr[0]] = 0
    pr = pr / pr.sum()
    out = torch.zeros_like(pr)
    out[order] = pr
    return out


SETTINGS = [
    (1.0, -1, 1.0, 0.0),
    (0.7, 5, 1.0, 0.0),
    (1.0, -1, 0.8, 0.0),
    (1.3, 10, 0.7, 0.0),
    (1.0, -1, 1.0, 0.2),
]


@pytest.mark.parametrize("name", BACKENDS)
@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: "t{}-k{}-p{}-minp{}".format(*s))
def test_distribution(name, setting):
    t, k, p, mp = setting
    if mp > 0 and name not in FULL:
        pytest.skip("min_p is a *_full feature")
    sampler = _sampler(name)
    torch.manual_seed(0)
    vocab, rows = 64, 8192
    base = torch.randn(vocab, device="cuda") * 2
    logits = base.repeat(rows, 1)
    reqs = [_req(temperature=t, top_k=k, top_p=p, min_p=mp) for _ in range(rows)]
    ids = torch.tensor(sampler(logits, reqs).token_ids, device="cuda")
    hist = torch.bincount(ids, minlength=vocab).double() / rows
    exp = _expected(base, t, k, p, mp)
    assert float(hist[exp == 0].sum()) == 0.0, "drew a token the filters remove"
    assert float((hist - exp).abs().max()) < 0.025


@pytest.mark.parametrize("name", BACKENDS)
def test_greedy_rows_take_argmax(name):
    sampler = _sampler(name)
    logits = torch.randn(6, 32000, device="cuda")
    reqs = [
        _req(temperature=0.0),
        _req(temperature=1.0, top_k=1),
        _req(temperature=0.8, top_p=0.9),
        _req(temperature=0.0, top_p=0.5),
        _req(temperature=1.0),
        _req(temperature=0.0, top_k=20),
    ]
    out = sampler(logits, reqs).token_ids
    argmax = logits.argmax(-1).tolist()
    for i in (0, 1, 3, 5):
        assert out[i] == argmax[i]


@pytest.mark.parametrize("name", BACKENDS)
def test_seeded_requests_repeat_in_any_batch(name):
    sampler = _sampler(name)
    torch.manual_seed(1)
    row = torch.randn(1, 5000, device="cuda")
    others = torch.randn(5, 5000, device="cuda")
    seeded = _req(temperature=1.0, top_p=0.95, seed=1234, output=(7, 8))
    alone = sampler(row, [seeded]).token_ids[0]
    mixed = sampler(
        torch.cat([others[:3], row, others[3:]]), [_req(temperature=1.0)] * 3 + [seeded] + [_req()] * 2
    )
    assert mixed.token_ids[3] == alone
    # Another output position draws other noise: over many steps the tokens are not all the same.
    steps = {
        sampler(row, [_req(temperature=1.0, seed=1234, output=tuple(range(n)))]).token_ids[0]
        for n in range(30)
    }
    assert len(steps) > 1


@pytest.mark.parametrize("name", sorted(FULL))
def test_full_adjustments_match_torch_reference(name):
    """Penalties and logit bias steer greedy choices exactly as the torch reference's penalties do."""
    sampler = _sampler(name)
    torch.manual_seed(2)
    vocab = 100
    logits = torch.randn(4, vocab, device="cuda")
    reqs = [
        _req(
            prompt=(1, 2),
            output=tuple(logits[0].topk(3).indices.tolist()),
            temperature=0.0,
            frequency_penalty=2.0,
        ),
        _req(prompt=tuple(logits[1].topk(2).indices.tolist()), temperature=0.0, repetition_penalty=5.0),
        _req(output=(int(logits[2].argmax()),), temperature=0.0, presence_penalty=2.0),
        _req(temperature=0.0),
    ]
    expected = apply_penalties(logits, reqs).argmax(-1).tolist()
    assert sampler(logits, reqs).token_ids == expected
    assert expected[:3] != logits[:3].argmax(-1).tolist(), "the penalties were meant to change the choice"
    biased = _req(temperature=0.0)
    biased.sampling.logit_bias = {7: 100.0}
    assert sampler(logits[3:], [biased]).token_ids == [7]


@pytest.mark.parametrize("name", BACKENDS)
def test_no_host_sync_while_sampling(name):
    sampler = _sampler(name)
    logits = torch.randn(16, 32000, device="cuda")
    reqs = [
        _req(temperature=0.8, top_k=50, top_p=0.9, min_p=0.05, frequency_penalty=0.5, output=(3, 4))
        for _ in range(16)
    ]
    sampler._sample(logits, reqs)  # warm-up: kernel compilation may sync
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        sampler._sample(logits, reqs)
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize("name", BACKENDS)
def test_warm_up_loads_the_kernels_before_the_first_request(name):
    # The model runner warms the sampler at start-up: FlashInfer's sampling family once compiled for ~100 s at
    # the first sampled token, and the scheduler was taken for hung.
    sampler = _sampler(name)
    print(f"{name}: warm-up {sampler.warm_up(vocab_size=128256):.2f} s")
    second = sampler.warm_up(vocab_size=128256)
    assert second < 1.0, f"{name}: a second warm-up took {second:.2f} s: the first one loaded nothing"
