"""Which CUDA-graph sizes a speculative server captures: the decode sizes plus the token counts of verify
steps (b * tokens per verify), bounded so verify graphs need no more graph memory than decode's largest."""

from tests.unit.test_config_slices import HOPPER, resolve
from tokenspeed.config.slices import RunnerConfig
from tokenspeed.runtime.execution.cuda_graph import verify_graph_sizes


def test_tokens_per_verify_from_the_speculative_flags():
    def tokens(*argv):
        return RunnerConfig.from_server_args(resolve(list(argv), platform=HOPPER)).spec_tokens_per_req

    assert tokens() == 1
    assert tokens("--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "5") == 5
    assert tokens("--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3",
                  "--speculative-draft-model-path", "D") == 4  # fmt: skip


def test_verify_sizes_join_the_decode_ladder_up_to_its_top():
    ladder = [1, 2, 4, 8, 16, 24, 32]
    assert verify_graph_sizes(ladder, 1) == ladder  # no speculation: unchanged
    assert verify_graph_sizes(None, 5) is None  # graphs off stay off
    # 5 tokens a verify: 5, 10, 20 join; 40 would pass the largest decode size
    assert verify_graph_sizes(ladder, 5) == [1, 2, 4, 5, 8, 10, 16, 20, 24, 32]
    # one request at a time still verifies in a graph
    assert verify_graph_sizes([1], 5) == [1, 5]
    assert verify_graph_sizes([1, 2], 4) == [1, 2, 4]
