"""Names vulture reports as unused that the code needs: signatures fixed by a caller outside TokenSpeed.

Vulture reads this file beside the packages (see [tool.vulture] in pyproject.toml); each bare name marks
every definition of that name as used. Add a name here only with the reason it must stay.
"""

# signal.signal handlers are called as handler(signum, frame).
frame  # tokenspeed/runtime/entrypoints/http_runner.py: _on_signal

# Triton's autotune prune_configs_by["early_config_prune"] is called as fn(configs, named_args, **kwargs).
configs  # tokenspeed/runtime/kernels/bf16_gemv.py, fp8_gemv.py: _prune

# A tl.constexpr kernel argument read only by the autotuner's key and prune function, not the kernel body.
M_BUCKET  # tokenspeed/runtime/kernels/fp8_gemv.py: _fp8_gemv_kernel
