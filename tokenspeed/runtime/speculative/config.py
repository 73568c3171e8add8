"""SpecConfig: the speculative-decoding slice of a resolved ServerArgs (None when it is off)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tokenspeed.config.server_args import ServerArgs

# What runs here; config.support lists the same names (its test checks they agree).
SPECULATIVE_ALGORITHMS = ("EAGLE3", "NGRAM")


def tokens_per_verify(args: ServerArgs) -> int:
    """Tokens a verify forward computes per request (the last known token and its drafts); 1 when
    speculative decoding is off. The model runner sizes its verify CUDA graphs by it."""
    if args.speculative_algorithm is None:
        return 1
    return int(args.speculative_num_draft_tokens or args.speculative_num_steps + 1)


@dataclass(frozen=True)
class SpecConfig:
    algorithm: str  # one of SPECULATIVE_ALGORITHMS
    # Tokens one verify forward computes per request: the last known token plus `num_drafted` drafts.
    num_draft_tokens: int
    ngram_min: int = 1
    ngram_max: int = 12
    draft_model_path: str | None = None
    layers_to_capture: tuple[int, ...] | None = None  # None: the draft config's, or EAGLE3's default
    draft_attention_backend: str | None = None

    @property
    def num_drafted(self) -> int:
        return max(self.num_draft_tokens - 1, 0)

    @classmethod
    def from_server_args(cls, args: ServerArgs) -> SpecConfig | None:
        algo = args.speculative_algorithm
        if algo is None:
            return None
        if algo not in SPECULATIVE_ALGORITHMS:
            # config.support_check refuses these before start-up; an EngineCore built directly says it too.
            raise ValueError(
                f"--speculative-algorithm {algo} is not supported (it needs multi-token-prediction layers that "
                f"no supported architecture carries); use one of {', '.join(SPECULATIVE_ALGORITHMS)}"
            )
        layers = args.eagle3_layers_to_capture
        return cls(
            algorithm=algo,
            num_draft_tokens=tokens_per_verify(args),
            ngram_min=args.speculative_ngram_min_match_window_size,
            ngram_max=args.speculative_ngram_max_match_window_size,
            draft_model_path=args.speculative_draft_model_path,
            layers_to_capture=tuple(layers) if layers else None,
            draft_attention_backend=args.drafter_attention_backend,
        )
