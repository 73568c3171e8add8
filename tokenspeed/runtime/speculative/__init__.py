"""Speculative decoding: drafts proposed per request (NGRAM prompt lookup, an EAGLE3 draft model), verified
by the target model in one forward, accepted so that the output distribution is exactly the target's."""
