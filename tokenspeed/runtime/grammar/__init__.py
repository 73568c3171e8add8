"""Structured output: request constraints (JSON schema, regex, EBNF, choices) compiled to grammars whose
token bitmask the sampler applies on the device. `spec` reads the request fields, `backend` compiles
(thread pool, cache, limits), `matcher` follows one request's output, `bitmask` builds a step's mask."""
