"""PageRank and ConnectedComponents on R-MAT graphs agree with networkx, in chunks and across resumes."""

from __future__ import annotations

import itertools
from pathlib import Path

import networkx as nx
import numpy as np
import pytest
from support.sidetasks import checkpoint, progress, resumed, run, started

from sidetasks.components import ConnectedComponents
from sidetasks.graphs import rmat_edges
from sidetasks.pagerank import PageRank


def nx_graph(scale: int, edge_factor: int, seed: int, directed: bool) -> nx.Graph:
    src, dst = rmat_edges(scale, edge_factor, seed)
    g: nx.Graph = nx.DiGraph() if directed else nx.Graph()
    g.add_nodes_from(range(1 << scale))  # isolated vertices count too
    g.add_edges_from(zip(src.tolist(), dst.tolist(), strict=True))
    return g


def test_rmat_is_a_seeded_simple_graph_with_graph500_skew():
    src, dst = rmat_edges(12, 16, seed=7)
    again = rmat_edges(12, 16, seed=7)
    assert np.array_equal(src, again[0]) and np.array_equal(dst, again[1])
    assert not np.array_equal(src, rmat_edges(12, 16, seed=8)[0])
    assert (src != dst).all() and len(np.unique(src * 4096 + dst)) == len(src)  # no self-loops, no duplicates
    assert 0.8 * 16 * 4096 < len(src) <= 16 * 4096
    degree = np.bincount(src, minlength=4096)
    assert degree.max() > 20 * degree.mean() and (degree == 0).sum() > 0.2 * 4096  # hubs and dangling vertices


def test_pagerank_matches_networkx_including_dangling_vertices_when_iterated_in_row_blocks(tmp_path: Path):
    task = started(PageRank(scale=9, edge_factor=8, block_edges=300, seed=1), tmp_path)
    assert len(task.blocks) > 5 and task.dangling.any()
    steps = run(task)
    reference = nx.pagerank(nx_graph(9, 8, 1, directed=True), alpha=0.85, tol=1e-14, max_iter=10_000)
    expected = np.array([reference[v] for v in range(1 << 9)])
    assert np.abs(task.ranks() - expected).max() < 1e-6
    assert task.ranks().sum() == pytest.approx(1.0, abs=1e-12)
    p = progress(task)
    assert p["converged"] == 1 and p["residual"] < 1e-10 and steps == p["iterations"] * len(task.blocks)


def test_pagerank_resumed_mid_iteration_ends_with_the_same_ranks(tmp_path: Path):
    args = {"scale": 10, "edge_factor": 8, "block_edges": 1000}
    whole = started(PageRank(**args), tmp_path, window_s=0.05)
    run(whole)
    first = started(PageRank(**args), tmp_path)
    run(first, steps=2 * len(first.blocks) + 3)  # in the middle of the third iteration
    second = resumed(PageRank(**args), checkpoint(first), tmp_path, window_s=0.05)
    run(second)
    assert np.array_equal(whole.ranks(), second.ranks()) and whole.iterations == second.iterations


def test_pagerank_residual_falls_each_iteration_until_it_is_below_tol(tmp_path: Path):
    task = started(PageRank(scale=10, edge_factor=8, tol=1e-8), tmp_path)
    residuals = []
    while not task.is_done():
        task.step()
        residuals.append(progress(task)["residual"])
    assert all(b < a for a, b in itertools.pairwise(residuals))
    assert residuals[-1] < 1e-8 <= residuals[-2]


def test_connected_components_match_networkx(tmp_path: Path):
    task = started(ConnectedComponents(scale=11, edge_factor=1, block_edges=256, seed=2), tmp_path)
    run(task)
    labels = task.component_labels()
    components = list(nx.connected_components(nx_graph(11, 1, 2, directed=False)))
    assert progress(task)["components"] == len(components) > 100
    for comp in components:
        assert set(labels[list(comp)]) == {min(comp)}


def test_connected_components_resumed_mid_sweep_end_the_same(tmp_path: Path):
    args = {"scale": 11, "edge_factor": 2, "block_edges": 128}
    whole = started(ConnectedComponents(**args), tmp_path)
    run(whole)
    first = started(ConnectedComponents(**args), tmp_path)
    run(first, steps=first.block_count + 5)
    second = resumed(ConnectedComponents(**args), checkpoint(first), tmp_path, window_s=0.05)
    run(second)
    assert np.array_equal(whole.component_labels(), second.component_labels())
    assert progress(whole) == progress(second)
