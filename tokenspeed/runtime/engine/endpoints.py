"""The ZMQ addresses of one server's processes, derived from `PortArgs` (nothing else invents an address).

```
main (AsyncLLM) --PUSH--> request_input --+-- dp == 1: the scheduler of DP group 0 binds it
                                           +-- dp > 1: the DP controller binds it, then PUSHes to
                                                       rank_inputs[g] (tp-rank 0 of group g)
schedulers --PUSH--> output (main binds): outputs, stats, ready messages, rpc answers
schedulers --PUSH--> load (DP controller binds, dp > 1 only): stats for load balancing
```

On one node the sockets are `ipc://` files in private 0700 directories; across nodes they are TCP from
`--dist-init-addr`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tokenspeed.config.ports import PortArgs
from tokenspeed.config.server_args import ServerArgs


@dataclass
class ServerEndpoints:
    output: str
    request_input: str
    rank_inputs: list[str]
    load: str | None = None
    ipc_dirs: list[str] = field(default_factory=list)
    nccl_port: int = 0

    @property
    def dp_size(self) -> int:
        return len(self.rank_inputs)

    @classmethod
    def from_server_args(cls, server_args: ServerArgs) -> ServerEndpoints:
        mapping = server_args.mapping
        dp_size = mapping.attn_dp_size
        transport = "ipc" if mapping.nnodes == 1 and server_args.dist_init_addr is None else "tcp"
        main = PortArgs.init_new(server_args, transport=transport)
        dirs = [main.ipc_dir] if main.ipc_dir else []
        if dp_size == 1:
            return cls(
                output=main.tokenizer_ipc_name,
                request_input=main.scheduler_input_ipc_name,
                rank_inputs=[main.scheduler_input_ipc_name],
                ipc_dirs=dirs,
                nccl_port=main.nccl_port,
            )
        rank_inputs = []
        for g in range(dp_size):
            ports = PortArgs.init_new(server_args, dp_rank=g, transport=transport)
            rank_inputs.append(ports.scheduler_input_ipc_name)
            if ports.ipc_dir:
                dirs.append(ports.ipc_dir)
        return cls(
            output=main.tokenizer_ipc_name,
            request_input=main.scheduler_input_ipc_name,
            rank_inputs=rank_inputs,
            load=main.metrics_ipc_name,
            ipc_dirs=dirs,
            nccl_port=main.nccl_port,
        )

    def cleanup(self) -> None:
        import shutil

        for d in self.ipc_dirs:
            shutil.rmtree(d, ignore_errors=True)
