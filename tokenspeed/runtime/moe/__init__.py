"""Mixture of experts: routing, the experts, their kernels, expert parallelism, the recorder and EPLB.

How one token's hidden state goes through a MoE layer (`sparse_block.SparseMoeBlock`):

1. router: a replicated linear gives one logit per logical expert (`router.TopKRouter` holds the
   settings and the PyTorch reference);
2. top-k: the block's backend (`backend.py`, `--moe-backend`: `torch` reference or `triton`, whose
   `kernels/routing.py` does softmax, top-k, renormalisation, dispatch and counting in one launch)
   picks k logical experts and their weights;
3. dispatch: each (token, k) choice becomes one physical slot, a replica of that logical expert
   (`expert_location.ExpertLocation` on the host, `dispatch.ExpertDispatch` on the device,
   `--ep-dispatch-algorithm`);
4. experts kernel: the experts held by this rank run their gated MLP on the tokens routed to them
   (`experts.TorchExperts` reference; `kernels/fused.py`: align by expert, grouped GEMMs of
   `kernels/gemm.py`, block sizes tuned per GPU in `kernels/configs.py`);
5. combine: outputs weighted by the routing weights and summed over k; with EP or MoE TP
   (`expert_parallel.ParallelMoeBlock`) each rank computes its slots' share and one all-reduce sums them.

While routing, the load is counted on the device (`expert_counts.ExpertCounts`); the recorder
(`distribution_recorder.py`) turns it into tokens per (layer, physical expert), and `expert_stats.py` /
`expert_metrics.py` export it. EPLB (`eplb_algorithm.py` places logical experts and redundant replicas
on EP ranks from that load; `eplb_manager.py` rebalances while serving, moving weights between ranks)
writes a new placement into the dispatch tables in place. `rank_experts.py` owns a rank's recorder and
EPLB manager and their control calls; `placement_view.py` is the placement as operators read it.

Nothing is imported here: importing `tokenspeed.runtime.moe.expert_metrics` in the HTTP process must not
pull in the layers or kernels.
"""
