"""Serving load benchmark against any OpenAI-compatible endpoint; the same as `tokenspeed bench serving`.

    python benchmarks/serving.py --base-url http://127.0.0.1:8000 --num-prompts 200 \
        --input-len 128 --output-len 64 --max-concurrency 1,8,32

See `tokenspeed/bench_serving.py` for every option.
"""

from tokenspeed.bench_serving import main

if __name__ == "__main__":
    raise SystemExit(main())
