"""Real `tokenspeed serve` servers with several ranks over gloo on the CPU.

Started together (start-up is mostly imports): Llama with --tp 2 over two "nodes" (two serve processes,
--nnodes 2 --node-rank 0|1 --dist-init-addr); Qwen3-MoE with --tp 2 --ep-size 2, redundant experts and
live EPLB every few steps. (TP=2 on Qwen3 and every other layout are checked at the model level, with
the same greedy tokens, in tests/unit/test_tensor_parallel.py.) Greedy outputs of concurrent requests must equal the
single-rank offline Engine token for token; the MoE server's expert endpoints, metrics and server info
must show the routed tokens.
"""

from __future__ import annotations

import signal
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.server.server_proc import free_port_block, launch
from tests.tiny_models import make_tiny_model

ENV = {"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
GREEDY = {"max_new_tokens": 10, "temperature": 0, "ignore_eos": True}
PROMPTS = [
    [5, 6, 7, 8, 9, 10],
    list(range(40, 75)),
    [(7 * i) % 300 + 5 for i in range(23)],
    [101] * 48,  # one token over and over: a skewed expert load
    [202] * 40 + [7, 8],
    [17, 18],
]
EPLB_INTERVAL = 8


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    root = tmp_path_factory.mktemp("parallel")
    models = {
        "llama": make_tiny_model("llama", root / "llama"),
        "moe": make_tiny_model("qwen3_moe", root / "moe"),
    }
    logs = root / "logs"
    logs.mkdir()
    dist = f"127.0.0.1:{free_port_block()}"
    procs = {
        "node0": launch(
            models["llama"], logs, "--tp", "2", "--nnodes", "2", "--node-rank", "0", "--dist-init-addr", dist,
            "--skip-server-warmup", env=ENV,
        ),
        "node1": launch(
            models["llama"], logs, "--tp", "2", "--nnodes", "2", "--node-rank", "1", "--dist-init-addr", dist,
            "--skip-server-warmup", env=ENV,
        ),
        "moe": launch(
            models["moe"], logs, "--tp", "2", "--ep-size", "2", "--ep-num-redundant-experts", "2",
            "--ep-dispatch-algorithm", "dynamic", "--enable-eplb",
            "--eplb-rebalance-num-iterations", str(EPLB_INTERVAL), "--enable-metrics",
            "--enable-expert-distribution-metrics", "--no-enable-prefix-caching", "--skip-server-warmup",
            env=ENV,
        ),
    }  # fmt: skip
    try:
        for name in ("node0", "moe"):
            try:
                procs[name].wait_ready()
            except (RuntimeError, TimeoutError) as exc:
                # The head waits on the second node's rank: its log says why that rank did not come up.
                raise RuntimeError(
                    f"{exc}\n--- second node's log ---\n{procs['node1'].log()[-3000:]}"
                ) from exc
        yield models, procs
    finally:
        for name in ("node0", "moe", "node1"):
            procs[name].stop(signal.SIGTERM, timeout=30)


def reference(model: str) -> list[list[int]]:
    """Greedy outputs of the single-rank offline Engine."""
    from tokenspeed import Engine

    engine = Engine(model=model, device="cpu")
    try:
        return [r["output_ids"] for r in engine.generate(input_ids=PROMPTS, sampling_params=dict(GREEDY))]
    finally:
        engine.shutdown()


def generate_all(url: str, prompts=PROMPTS, params=GREEDY) -> list[dict]:
    def one(ids):
        r = httpx.post(f"{url}/generate", json={"input_ids": ids, "sampling_params": params}, timeout=120)
        assert r.status_code == 200, r.text
        return r.json()

    with ThreadPoolExecutor(len(prompts)) as pool:
        return list(pool.map(one, prompts))


def test_two_node_tp2_greedy_equals_single_rank(servers):
    models, procs = servers
    got = [r["output_ids"] for r in generate_all(procs["node0"].url)]
    assert got == reference(models["llama"])
    assert procs["node1"].proc.poll() is None, "the second node's scheduler exited"
    info = procs["node0"].server_info()
    assert info["nnodes"] == 2 and info["mapping"]["attn_tp_size"] == 2
    assert [r["node_rank"] for r in info["mapping"]["ranks"]] == [0, 1]


def metric_samples(url: str) -> dict[str, list]:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    out: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append(s)
    return out


def test_live_eplb_keeps_outputs_and_balances_a_skewed_load(servers):
    models, procs = servers
    url = procs["moe"].url
    want = reference(models["moe"])
    rounds = [generate_all(url) for _ in range(2)]  # enough steps for several rebalances
    for results in rounds:
        assert [r["output_ids"] for r in results] == want
        assert all(r["meta_info"]["finish_reason"]["type"] == "length" for r in results)
    # the scheduler publishes its figures at most every 0.1 s: the last step's may still be on its way
    deadline = time.monotonic() + 10
    while True:
        samples = metric_samples(url)
        (rebalances,) = samples["tokenspeed:eplb_rebalances_total"]
        if rebalances.value >= 2 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert rebalances.value >= 2
    layers = {s.labels["layer"] for s in samples["tokenspeed:eplb_balancedness"]}
    assert layers == {"0", "1"}
    assert all(0 < s.value <= 1 for s in samples["tokenspeed:eplb_balancedness"])
    dump = httpx.post(f"{url}/dump_expert_distribution_record", timeout=30).json()["results"][0]
    first = dump["rebalances"][0]
    # the first rebalance placed the replicas for the skewed load the trivial placement had served
    before, after = first["balancedness_before"], first["balancedness_after"]
    assert sum(after) / len(after) > sum(before) / len(before), (before, after)
    assert all(a >= b - 1e-6 for a, b in zip(after, before, strict=True)), (before, after)


def test_expert_record_endpoints_count_routed_tokens(servers):
    _, procs = servers
    url = procs["moe"].url
    prompt = [(11 * i) % 350 + 3 for i in range(19)]
    params = {"max_new_tokens": 3, "temperature": 0, "ignore_eos": True}
    for _attempt in range(3):
        before = httpx.post(f"{url}/dump_expert_distribution_record", timeout=30).json()["results"][0]
        assert httpx.post(f"{url}/start_expert_distribution_record", timeout=30).json()["ok"]
        (result,) = generate_all(url, [prompt], params)
        stop = httpx.post(f"{url}/stop_expert_distribution_record", timeout=30).json()
        # --enable-eplb (and the expert metrics) keep the recorder on after a stop, and the answer says so
        assert stop["ok"] and stop["results"][0]["recording"] is True
        assert stop["recording"] is True and "--enable-eplb" in stop["reason"], stop
        dump = httpx.post(f"{url}/dump_expert_distribution_record", timeout=30).json()["results"][0]
        if dump["num_rebalances"] != before["num_rebalances"]:
            continue  # a rebalance restarted the window meanwhile: measure again
        computed = len(prompt) - result["meta_info"]["cached_tokens"] + params["max_new_tokens"] - 1
        # top-2 routing: every computed token counts twice per MoE layer, over experts and over EP ranks
        assert [sum(row) for row in dump["logical_count"]] == [2 * computed] * 2
        assert [sum(row) for row in dump["rank_load"]] == [2 * computed] * 2
        assert dump["passes"] == params["max_new_tokens"]
        break
    else:
        pytest.fail("a rebalance interrupted every measurement")
    # the metrics and /get_server_info carry the same window (stats reach the front end within ~0.1 s)
    deadline = time.monotonic() + 10
    while True:
        samples = metric_samples(url)
        load = sum(s.value for s in samples["tokenspeed:expert_load"] if s.labels["layer"] == "0")
        if load == 2 * computed or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert load == 2 * computed
    state = procs["moe"].server_info()["internal_states"][0]
    assert state["expert_layers"] == [0, 1] and len(state["eplb_balancedness"]) == 2
    assert sum(state["expert_load"][1]) == 2 * computed
