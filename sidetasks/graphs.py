"""R-MAT graphs with the Graph500 parameters, and row blocks of sparse matrices for chunked iterations.

R-MAT (Chakrabarti et al. 2004) places each edge by descending `scale` levels of the adjacency
matrix, picking a quadrant with probabilities a, b, c, d = 1-a-b-c; Graph500 uses a=0.57,
b=0.19, c=0.19 and 16 edges per vertex. Vertex ids are shuffled (as Graph500 does) so the hubs
are not all near 0; duplicate edges and self-loops are dropped, leaving a simple directed graph.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch

GRAPH500_ABC = (0.57, 0.19, 0.19)


def rmat_edges(scale: int, edge_factor: int, seed: int, abc: tuple[float, float, float] = GRAPH500_ABC,
               ) -> tuple[np.ndarray, np.ndarray]:
    """(src, dst) int64 arrays of a simple directed R-MAT graph on 2**scale vertices, sorted by (src, dst)."""
    if not 1 <= scale <= 30 or edge_factor < 1:
        raise ValueError(f"need 1 <= scale <= 30 and edge_factor >= 1, got scale={scale}, edge_factor={edge_factor}")
    a, b, c = abc
    n, m = 1 << scale, edge_factor << scale
    rng = np.random.default_rng(seed)
    src = np.zeros(m, dtype=np.int64)
    dst = np.zeros(m, dtype=np.int64)
    for level in range(scale):
        r = rng.random(m)
        down = r >= a + b  # quadrants c and d: the lower half, source bit set
        right = ((r >= a) & (r < a + b)) | (r >= a + b + c)  # quadrants b and d: destination bit set
        src |= down.astype(np.int64) << level
        dst |= right.astype(np.int64) << level
    perm = rng.permutation(n)
    src, dst = perm[src], perm[dst]
    keep = src != dst
    key = np.sort(src[keep] * n + dst[keep])  # sort + neighbour compare: far faster than np.unique's hashing
    key = key[np.concatenate(([True], key[1:] != key[:-1]))]
    return key // n, key % n


def csr_row_blocks(rows: np.ndarray, cols: np.ndarray, values: np.ndarray, n: int, block_nnz: int,
                   device: torch.device) -> list[tuple[int, int, torch.Tensor]]:
    """The n x n matrix with entries (rows[k], cols[k]) = values[k], cut into CSR blocks of whole rows.

    Each block holds about `block_nnz` entries (at least one row), so one block's product is a
    bounded unit of work: (row_start, row_end, csr_block) with block @ x = (M @ x)[row_start:row_end].
    """
    order = np.lexsort((cols, rows))
    cols, values = cols[order], values[order]
    crow = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=n), out=crow[1:])
    blocks = []
    start = 0
    while start < n:
        end = int(np.searchsorted(crow, crow[start] + block_nnz, side="right")) - 1
        end = min(n, max(end, start + 1))
        lo, hi = crow[start], crow[end]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "sparse CSR support is in beta"
            block = torch.sparse_csr_tensor(
                torch.from_numpy(crow[start:end + 1] - lo), torch.from_numpy(cols[lo:hi].copy()),
                torch.from_numpy(values[lo:hi].copy()), (end - start, n),
            ).to(device)
        blocks.append((start, end, block))
        start = end
    return blocks
