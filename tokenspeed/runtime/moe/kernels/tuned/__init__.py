"""Tuned tables of the few-token MoE GEMV, one `<device name>.json` per GPU (read by `gemv_table.py`, written
by `benchmarks/moe_tune.py --gemv`; a package so the tables ship with the wheel). None is shipped until a
table measured on that device exists: every step then takes the tensor-core path."""
