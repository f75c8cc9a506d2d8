"""Real 4-rank torch.distributed.pipelining runs (gloo, CPU) report every bubble to an agent per rank.

Stage compute sleeps F ms forward and B ms backward, so the bubbles each schedule implies are
known. Tolerances are wide enough for a loaded 2-core machine: a bubble within 20% or 6 ms of
theory.
"""

from __future__ import annotations

import dataclasses
import functools
import random
import statistics
import threading
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.agents import Agents
from support.jitter import Jitter, judge

from freeride.tooling.bench.pipeline import SCHEDULES, SINGLE, PipelineConfig, launch, launch_series
from freeride.tooling.trace import Segment, simulate_iteration
from freeride.v1 import trainer_pb2

P, M, F_MS, B_MS = 4, 4, 10.0, 20.0


@pytest.fixture(scope="module")
def shared_agents(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Agents]:
    """One agent per rank for the whole module: starting four agents per test would double its time."""
    a = Agents(tmp_path_factory.mktemp("agents")).start()
    try:
        yield a
    finally:
        a.stop()
SIGNIFICANT_MS = 7.0  # below F: waits on sends and bookkeeping, which the simple model leaves out
BETWEEN = trainer_pb2.BUBBLE_KIND_BETWEEN_STEPS


def per_iteration(result: dict[str, Any]) -> dict[int, list[dict[str, Any]]]:
    out: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for b in result["bubbles"]:
        if b["kind"] != BETWEEN:
            out[b["iteration"]].append(b)
    return out


def ms(b: dict[str, Any]) -> float:
    return (b["end_ns"] - b["start_ns"]) / 1e6


def simulated(schedule: str, f_ms: float, b_ms: float) -> list[list[Segment]]:
    """One iteration of every rank of the schedule in theory, each forward and backward taking `f_ms` and `b_ms`."""
    return simulate_iteration(schedule, P, M, f_ms / 1e3, b_ms / 1e3, 0.0, random.Random(0))


def theory(schedule: str, rank: int, f_ms: float = F_MS, b_ms: float = B_MS) -> list[float]:
    """Bubbles of a torch schedule (no barrier between steps: a stage's drain merges into its next fill), with each
    forward and backward taking `f_ms` and `b_ms` (the run's own: its sleeps and each operation's overhead)."""
    segs = simulated(schedule, f_ms, b_ms)[rank]
    lengths = [s.duration_s * 1e3 for s in segs if s.bubble]
    kinds = [s.kind for s in segs if s.bubble]
    if kinds[-1] == trainer_pb2.BUBBLE_KIND_DRAIN and rank > 0:
        lengths[0] += lengths.pop()
    return [x for x in lengths if x > SIGNIFICANT_MS]


def makespan_ms(schedule: str, f_ms: float, b_ms: float) -> float:
    """One iteration's length in theory: the step's period (its drain overlaps the next fill on no rank's clock)."""
    return max(sum(s.duration_s for s in segs) for segs in simulated(schedule, f_ms, b_ms)) * 1e3


def overhead_per_op_ms(schedule: str, step_ms: float, f_ms: float, b_ms: float) -> float:
    """What each forward and backward took beyond its sleep (Python, the send and the receive: ~1 ms on a quiet
    2-core VM, ~3 ms on the CI runner), from the run's own step period: the theory's period grows by one such per
    operation on its critical path, and every bubble spans some of them."""
    base = makespan_ms(schedule, f_ms, b_ms)
    per_op = makespan_ms(schedule, f_ms + 1.0, b_ms + 1.0) - base  # operations on the critical path
    return max(0.0, (step_ms - base) / per_op)


def close_to(measured: float, expected: float) -> bool:
    return abs(measured - expected) <= max(6.0, 0.2 * expected)


def implied_bubbles_found(measured: list[float], expected: list[float]) -> bool:
    """Every bubble the schedule implies is measured, in order, within tolerance; every other wait
    is shorter than one forward (sends and bookkeeping: a busy runner stretches them by a few ms)."""

    @functools.cache
    def fits(i: int, j: int) -> bool:
        if j == len(expected):
            return all(x < F_MS for x in measured[i:])
        if i == len(measured):
            return False
        return (close_to(measured[i], expected[j]) and fits(i + 1, j + 1)) or (measured[i] < F_MS and fits(i + 1, j))

    return fits(0, 0)


def ring_attachments(agents: Agents) -> list[int]:
    """How many trainer streams each agent has moved onto a shared-memory ring (from its log)."""
    return [p.log_path.read_text(errors="replace").count("reports through shared memory") for p in agents.procs]


def microbatches(schedule: str) -> int:
    return 2 * P if schedule == "DualPipeV" else M  # DualPipeV needs a micro-batch per stage


def pipeline(schedule: str, agents: Agents) -> PipelineConfig:
    return PipelineConfig(schedule=schedule, stages=P, microbatches=microbatches(schedule), forward_ms=F_MS,
                          backward_ms=B_MS, iterations=6, instrument=True, socket_dir=str(agents.socket_dir))


@dataclasses.dataclass
class Trained:
    """One launch's results per schedule (each rank's, rank order), with what its agents saw meanwhile: bubbles
    counted, trainer streams moved onto a ring."""

    results: dict[str, list[dict[str, Any]]]
    bubbles_seen: list[int]
    rings: list[int]


def train(schedules: list[str], path: str, agents: Agents, out: Path) -> Trained:
    """Every schedule in turn in one set of rank processes (torch and gloo started once), on the road asked for."""
    attached_before = ring_attachments(agents)
    seen_before = [c.stats().gpu.bubbles for c in agents.clients]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FREERIDE_BUBBLE_PATH", "auto" if path == "shm" else "grpc")  # the ranks inherit it
        runs = launch_series([pipeline(s, agents) for s in schedules], out)
    return Trained(dict(zip(schedules, runs, strict=True)),
                   [c.stats().gpu.bubbles - b for c, b in zip(agents.clients, seen_before, strict=True)],
                   [a - b for a, b in zip(ring_attachments(agents), attached_before, strict=True)])


def reported(results: list[dict[str, Any]], rank: int) -> int:
    """What a rank's reporter sent its agent (BETWEEN_STEPS edges are counted as events only)."""
    return sum(b["reported"] for v in per_iteration(results[rank]).values() for b in v)


@pytest.fixture(scope="module")
def every_schedule(shared_agents: Agents, tmp_path_factory: pytest.TempPathFactory) -> Trained:
    """Every schedule on the default road (the shared-memory ring), one after the other in one launch."""
    return train(list(SCHEDULES), "shm", shared_agents, tmp_path_factory.mktemp("schedules"))


@pytest.mark.serial  # with the launch the every-schedule tests judge in real time (one launch, in the serial phase)
def test_each_rank_reported_every_bubble_to_its_agent_on_the_road_asked_for(
    every_schedule: Trained, shared_agents: Agents, tmp_path: Path
) -> None:
    """The agents counted what the ranks sent, and each stage's reporter of each schedule took a ring; the gRPC road
    alike, with no ring."""
    for road, trained in (("shm", every_schedule), ("grpc", train(["1F1B"], "grpc", shared_agents, tmp_path))):
        for r in range(P):
            assert trained.bubbles_seen[r] == sum(reported(res, r) for res in trained.results.values()), (road, r)
            assert shared_agents.clients[r].stats().gpu.rejected_events == 0
        # one ring per stage's reporter (a reporter per schedule), or none
        if road == "shm":
            assert all(n >= len(trained.results) for n in trained.rings), trained.rings
        else:
            assert trained.rings == [0] * P, trained.rings


@pytest.mark.serial  # bubbles within 20% or 6 ms of theory, in real time
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_every_schedule_reports_every_bubble_of_every_rank(schedule: str, every_schedule: Trained) -> None:
    results = every_schedule.results[schedule]
    m = microbatches(schedule)
    iterations = len(results[0]["step_ms"])
    stages_per_rank = 1 if schedule in SINGLE else 2
    compute_ms = m * (F_MS + B_MS) * stages_per_rank
    # How much longer than asked the sleeps took (each overshoots by a wake-up: a few ms on a loaded runner): a
    # bubble spans other ranks' compute, so the theory's F and B are stretched by it.
    stretch = statistics.median(res["compute_ms"][it] / compute_ms for res in results
                                for it in range(2, iterations))
    # The machine's own jitter in this run (each rank's sleeps: F and B per micro-batch and stage): what the
    # timing checks below are judged against. The checks of what was reported are asserted whatever the load.
    sleeps = 2 * m * stages_per_rank
    jitter = Jitter.of_slices((res["compute_ms"][it], compute_ms, sleeps) for res in results
                              for it in range(2, iterations))
    # Each operation's overhead beyond its sleep, from the step period (the trainer's clock, not the bubbles judged).
    overhead = overhead_per_op_ms(schedule, statistics.median(res["step_ms"][it] for res in results
                                                              for it in range(2, iterations)),
                                  F_MS * stretch, B_MS * stretch) if schedule in SINGLE else 0.0
    timing: list[str] = []
    for r, res in enumerate(results):
        iters = per_iteration(res)
        assert res["reporter_dropped"] == 0
        # The same waits, in the same order, every iteration after the first (which sets up the pipeline).
        shapes = {it: [(b["slot"], b["kind"]) for b in iters[it]] for it in range(1, iterations)}
        assert len({tuple(s) for s in shapes.values()}) == 1, f"rank {r}: waits differ between iterations"
        assert [slot for slot, _ in shapes[1]] == list(range(len(shapes[1])))
        # The bubbles account for the time the rank did not compute (loosely: Python overhead under
        # load is neither; the exact per-bubble check is below, for the schedules with a model). Medians
        # over the steady iterations, so one step stretched by a busy 2-core runner does not decide. The
        # compute is what the sleeps really took: each overshoots by a wake-up, a few ms on a loaded runner.
        steady = range(2, iterations)
        assert all(res["compute_ms"][it] >= 0.99 * compute_ms for it in steady), (r, res["compute_ms"], compute_ms)
        unaccounted = statistics.median(res["step_ms"][it] - res["compute_ms"][it] - sum(map(ms, iters[it]))
                                        for it in steady)
        step = statistics.median(res["step_ms"][it] for it in steady)
        if abs(unaccounted) > max(20.0, 0.2 * step):
            timing.append(f"rank {r}: {unaccounted:.1f} ms of a {step:.1f} ms step neither compute nor bubble")
        if r > 0:
            assert iters[3][0]["kind"] == trainer_pb2.BUBBLE_KIND_FILL  # waits for the first activation
        if schedule in SINGLE:
            expected = theory(schedule, r, F_MS * stretch + overhead, B_MS * stretch + overhead)
            typical = [statistics.median(ms(iters[it][slot]) for it in steady) for slot in range(len(shapes[1]))]
            if not implied_bubbles_found(typical, expected):
                timing.append(f"rank {r}: bubbles {[round(x, 1) for x in typical]} ms, theory "
                              f"{[round(x, 1) for x in expected]} ms ({overhead:.1f} ms per operation)")
        assert res["reporter_path"] == "shm"  # this schedule's own reporter took the ring
    judge(timing, jitter, "bubble lengths against theory (20 % or 6 ms)")


@pytest.mark.serial  # predicted against measured bubble lengths, within 10%
@pytest.mark.parametrize("schedule", ["1F1B", "Interleaved1F1B"])
def test_the_agents_predictions_converge_to_within_ten_percent(schedule: str, agents: Agents, tmp_path: Path) -> None:
    # Fresh agents: shared ones would start from the slot lengths of the other schedules' runs.
    first = [len(c.windows) for c in agents.collectors]
    # Twice the usual stage times: scheduling jitter on a busy runner is a few ms whatever the bubble, so
    # longer bubbles measure the predictor rather than the machine's load.
    cfg = PipelineConfig(schedule=schedule, stages=P, microbatches=M, forward_ms=2 * F_MS, backward_ms=2 * B_MS,
                         iterations=10, instrument=True, socket_dir=str(agents.socket_dir))
    results = launch(cfg, tmp_path / "run")
    per_rank = 2 * M * (1 if schedule in SINGLE else 2)  # sleeps per iteration: F and B per micro-batch and stage
    nominal = M * 2 * (F_MS + B_MS) * (1 if schedule in SINGLE else 2)
    jitter = Jitter.of_slices((res["compute_ms"][it], nominal, per_rank) for res in results
                              for it in range(2, cfg.iterations))
    timing: list[str] = []
    pooled = []
    for r, collector in enumerate(agents.collectors):
        mine = collector.windows[first[r]:]
        late = [w for w in mine if w.iteration >= 4 and w.bubble_end_ns - w.bubble_start_ns > 10e6]
        assert late, f"rank {r}: no window granted after the first iterations"
        assert sum(sh.steps for w in late for sh in w.shares) > 0  # and the side task ran in them
        # The error is judged on the slots of 50 ms or more (every rank has one: its fill or warm-up wait).
        # The predictor is the minimum of a slot's recent lengths, so it is short by the slot's jitter: on
        # a loaded runner a 20 ms slot jitters by 5 ms (CI: 21-29% on rank 0's), which is the machine's.
        long = [(w.predicted_ns, w.bubble_end_ns - w.bubble_start_ns) for w in late
                if w.bubble_end_ns - w.bubble_start_ns >= 50e6]
        assert long, (r, [w.bubble_end_ns - w.bubble_start_ns for w in late])
        errors = sorted(abs(predicted - actual) / actual for predicted, actual in long)
        pooled += errors
        if errors[len(errors) // 2] > 0.15:
            timing.append(f"rank {r}: median error {errors[len(errors) // 2]:.0%} (at most 15 %)")
    pooled.sort()
    if pooled[len(pooled) // 2] > 0.10:
        timing.append(f"pooled median error {pooled[len(pooled) // 2]:.0%} (at most 10 %)")
    judge(timing, jitter, "the agents' predictions against measured bubbles")


@pytest.mark.background  # the same parameters and losses (its one wait: 60 s for three windows)
def test_training_computes_the_same_with_without_and_when_the_agents_are_killed(tmp_path: Path) -> None:
    agents = Agents(tmp_path / "sockets").start()
    try:
        base = PipelineConfig(schedule="1F1B", stages=P, microbatches=M, forward_ms=5.0, backward_ms=10.0,
                              iterations=12, socket_dir=str(agents.socket_dir))
        # Plain, then instrumented, in the same rank processes (each seeded and built afresh)
        plain, instrumented = launch_series([base, dataclasses.replace(base, instrument=True)], tmp_path / "both")
        # Again, and kill -9 every agent once side tasks run in the bubbles: training must not notice.
        run: dict[str, Any] = {}
        trainer = threading.Thread(target=lambda: run.update(results=launch(
            dataclasses.replace(base, instrument=True), tmp_path / "killed",
        )))
        before = [len(c.windows) for c in agents.collectors]
        trainer.start()
        assert agents.collectors[0].wait_for(before[0] + 3, 60), "no window was granted in the second run"
        for proc in agents.procs:
            proc.kill9()
        trainer.join(300)
    finally:
        agents.stop()
    killed = run["results"]
    for a, b, c in zip(plain, instrumented, killed, strict=True):
        assert a["params_sha256"] == b["params_sha256"] == c["params_sha256"]
        assert a["losses"] == b["losses"] == c["losses"]
    assert plain[-1]["losses"]  # the last stage computed losses
    assert sum(r["reporter_dropped"] for r in killed) > 0  # edges after the kill went nowhere


@pytest.mark.background  # counts and parameters
def test_with_data_parallelism_every_rank_reports_to_the_agent_of_its_own_gpu(tmp_path: Path) -> None:
    # Two pipelines of two stages (4 ranks, one "GPU" each): LOCAL_RANK picks each rank's agent.
    agents = Agents(tmp_path / "sockets", ranks=4).start()
    try:
        cfg = PipelineConfig(schedule="1F1B", stages=2, data_parallel=2, microbatches=4, forward_ms=F_MS,
                             backward_ms=B_MS, iterations=5, instrument=True, socket_dir=str(agents.socket_dir))
        results = launch(cfg, tmp_path / "run")
        for r in range(len(results)):
            assert reported(results, r) > 0
            assert agents.clients[r].stats().gpu.bubbles == reported(results, r)  # its own agent, nobody else's
    finally:
        agents.stop()
    # The replicas trained one model: after the gradient all-reduce their stages agree.
    assert results[0]["params_sha256"] == results[2]["params_sha256"]
    assert results[1]["params_sha256"] == results[3]["params_sha256"]
