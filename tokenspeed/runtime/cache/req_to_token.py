"""The request -> token slot table (`req_to_token`), read by attention backends.

Row r belongs to one running request; `req_to_token[r, i]` is the KV slot of the request's token i.
Slots follow the request's pages: token i lives in page `pages[i // block_size]` at offset
`i % block_size`, so a row is written one page at a time when pages are assigned.
"""

from __future__ import annotations

import torch


class ReqToTokenTable:
    def __init__(self, num_rows: int, max_context_len: int, block_size: int, device: torch.device | str):
        self.block_size = block_size
        self.max_pages_per_req = -(-max_context_len // block_size)
        self.width = self.max_pages_per_req * block_size
        self.num_rows = num_rows
        # int32 is what the paged kernels index with; 2^31 slots is far beyond any pool.
        self.table = torch.zeros((num_rows, self.width), dtype=torch.int32, device=device)
        self._free_rows: list[int] = list(range(num_rows - 1, -1, -1))
        self._offsets = torch.arange(block_size, dtype=torch.int32)

    @property
    def num_free_rows(self) -> int:
        return len(self._free_rows)

    def can_allocate(self) -> bool:
        return bool(self._free_rows)

    def allocate(self) -> int:
        if not self._free_rows:
            raise RuntimeError("no free req_to_token row; the scheduler admitted more than max_num_seqs")
        return self._free_rows.pop()

    def free(self, row: int) -> None:
        self._free_rows.append(row)

    def write_pages(self, row: int, first_page_index: int, pages: list[int]) -> None:
        """Point the row's page slots [first_page_index, first_page_index + len(pages)) at `pages`."""
        if not pages:
            return
        bs = self.block_size
        slots = (torch.tensor(pages, dtype=torch.int32).unsqueeze(1) * bs + self._offsets).flatten()
        start = first_page_index * bs
        self.table[row, start : start + slots.numel()] = slots.to(self.table.device, non_blocking=True)
