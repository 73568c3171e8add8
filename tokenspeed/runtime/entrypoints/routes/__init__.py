"""The HTTP routes, one FastAPI router per concern; `http_server.build_app` includes them in this order:

    openai_routes   /v1/chat/completions, /v1/completions, /v1/models, /v1/models/{id}
    native_routes   /generate
    tokenize        /tokenize, /detokenize (vLLM's bodies)
    monitoring      /health, /health_generate, /get_model_info, /get_server_info, /version, /metrics
    admin           /abort_request, /flush_cache
    experts         the expert-load recording and /rebalance_experts

Handlers get the server's `ServerState` through the `Server` dependency (`deps`), never from a closure.
"""
