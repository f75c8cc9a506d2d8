"""`freeride pool …` against a real redis-server, in this process (the entry point itself: test_cli.py).

Bad input, a missing pool, a Redis that does not answer or refuses the password: exit code 2 and
one line on stderr, never a traceback and never the password.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from support.cli import InProcess, clean_env
from support.redis_server import RedisServer

from freeride.pool import DEFAULT_LEASE_S, DEFAULT_MAX_TRIES, Pool, parse_pool_url

REPO = Path(__file__).resolve().parents[2]
PASSWORD = "s3cret-Pa55"


def _env(**extra: str) -> dict[str, str]:
    return clean_env(columns=None, **extra)


_CLI = InProcess()


def freeride(*args: object, stdin: str | None = None, env: dict[str, str] | None = None,
             ) -> subprocess.CompletedProcess[str]:
    """`freeride ARGS` in this process (support.cli.InProcess: its exit code and output as the command's; about 0.3
    CPU-s less a call than a new interpreter); (the entry point's own test: integration/cli/test_cli.py)."""
    return _CLI(*args, stdin=stdin, env=env or _env())


def ok(res: subprocess.CompletedProcess[str]) -> str:
    assert res.returncode == 0, f"exit code {res.returncode}:\n{res.stderr}"
    assert res.stderr == "", res.stderr
    return res.stdout


def one_line_error(res: subprocess.CompletedProcess[str]) -> str:
    """Exit code 2, one line on stderr from freeride, nothing on stdout, no traceback, no password."""
    lines = res.stderr.splitlines()
    assert res.returncode == 2, f"exit code {res.returncode}:\n{res.stdout}\n{res.stderr}"
    assert len(lines) == 1 and lines[0].startswith("freeride"), res.stderr
    assert "Traceback" not in res.stderr and res.stdout == ""
    assert PASSWORD not in res.stderr
    return lines[0]


def status(url: str) -> dict:
    return json.loads(ok(freeride("pool", "status", url, "--json")))


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- create ---------------------------------------------------------------------------------------
def test_create_from_a_lines_file_is_idempotent(redis_server: RedisServer, tmp_path: Path) -> None:
    url = redis_server.url("lines")
    items = tmp_path / "items.txt"
    items.write_text("# one id per line\nimg/001.jpg\n\nimg/002.jpg\nimg/003.jpg\n")
    out = ok(freeride("pool", "create", url, "--items", items))
    assert out == (f"pool {url}: added 3 items of 3 given; it holds 3 items (0 done, 3 pending, 0 failed); "
                   f"lease {DEFAULT_LEASE_S:g} s, {DEFAULT_MAX_TRIES} tries\n")
    items.write_text("img/001.jpg\nimg/002.jpg\nimg/003.jpg\nimg/004.jpg\n")
    again = json.loads(ok(freeride("pool", "create", url, "--items", items, "--json")))
    assert again == {"pool": url, "added": 1, "given": 4, "total": 4, "lease_s": DEFAULT_LEASE_S,
                     "max_tries": DEFAULT_MAX_TRIES}
    assert json.loads(ok(freeride("pool", "create", url, "--items", items, "--json")))["added"] == 0
    s = status(url)
    assert (s["total"], s["queued"], s["pending"]) == (4, 4, 4)


def test_create_from_json_lines_keeps_each_items_arguments(redis_server: RedisServer, tmp_path: Path) -> None:
    url = redis_server.url("jsonl")
    items = tmp_path / "items.jsonl"
    items.write_text('{"id": "a", "path": "img/a.jpg", "size": 64}\n{"id": 7, "args": {"seed": 3}}\nplain\n')
    assert "added 3 items" in ok(freeride("pool", "create", url, "--items", items))
    with Pool(parse_pool_url(url)) as pool:
        leased = {lease.item.id: dict(lease.item.args) for lease in pool.lease("t", 10)}
    assert leased == {"a": {"path": "img/a.jpg", "size": 64}, "7": {"seed": 3}, "plain": {}}


def test_create_from_stdin_and_from_a_range(redis_server: RedisServer) -> None:
    url = redis_server.url("stdin")
    assert "added 2 items of 2 given" in ok(freeride("pool", "create", url, "--items", "-", stdin="x\ny\n"))
    assert "added 1 item of 3 given; it holds 3 items" in ok(
        freeride("pool", "create", url, "--items", "-", stdin="x\ny\nz\n"))
    sweep = redis_server.url("sweep")
    assert "added 5 items" in ok(freeride("pool", "create", sweep, "--range", 5))
    assert json.loads(ok(freeride("pool", "create", sweep, "--range", 7, "--json")))["added"] == 2
    with Pool(parse_pool_url(sweep)) as pool:
        assert sorted(int(lease.item.id) for lease in pool.lease("t", 10)) == list(range(7))


def test_create_keeps_the_pools_settings_unless_given_new_ones(redis_server: RedisServer) -> None:
    url = redis_server.url("settings")
    ok(freeride("pool", "create", url, "--range", 3, "--lease-s", 120, "--max-tries", 5))
    ok(freeride("pool", "create", url, "--range", 4))
    s = status(url)
    assert (s["lease_s"], s["max_tries"], s["total"]) == (120.0, 5, 4)
    ok(freeride("pool", "create", url, "--range", 4, "--max-tries", 2))
    assert (status(url)["lease_s"], status(url)["max_tries"]) == (120.0, 2)


@pytest.mark.parametrize(("content", "argv", "words"), [
    ("a\n{not json\n", [], ["line 2", "not JSON"]),
    ('{"path": "x"}\n', [], ["line 1", '"id"']),
    ("# nothing but a comment\n\n", [], ["holds no items"]),
    (None, [], ["No such file", "--items"]),
    ("a\n", ["--lease-s", "0"], ["--lease-s", "above 0"]),
    ("a\n", ["--max-tries", "0"], ["--max-tries", "1 or more"]),
], ids=["bad-json", "json-without-id", "empty", "missing-file", "zero-lease", "zero-tries"])
def test_bad_items_or_flags_create_nothing(redis_server: RedisServer, tmp_path: Path, content: str | None,
                                           argv: list[str], words: list[str]) -> None:
    url = redis_server.url("bad")
    items = tmp_path / "items.txt"
    if content is not None:
        items.write_text(content)
    line = one_line_error(freeride("pool", "create", url, "--items", items, *argv))
    for word in words:
        assert word in line
    with Pool(parse_pool_url(url)) as pool:
        assert not pool.exists()


def test_create_needs_exactly_one_source(redis_server: RedisServer) -> None:
    url = redis_server.url("src")
    assert "one of the arguments --items --range is required" in one_line_error(freeride("pool", "create", url))
    assert "not allowed with" in one_line_error(freeride("pool", "create", url, "--range", 3, "--items", "-"))
    assert "positive count" in one_line_error(freeride("pool", "create", url, "--range", 0))


# -- status ---------------------------------------------------------------------------------------
@pytest.fixture
def busy_pool(redis_server: RedisServer) -> str:
    """10 items: 3 done and 1 in flight by a consumer on node7's GPU 2, one dead letter (a traceback), 5 queued
    (one of them leased and given back)."""
    url = redis_server.url("busy")
    ok(freeride("pool", "create", url, "--range", 10, "--max-tries", 1))
    with Pool(parse_pool_url(url)) as pool:
        held = pool.lease("node7/gpu2/task4", 6, host="node7", gpu="2", task="4")
        pool.ack("node7/gpu2/task4", held[:3], busy_s=1.5, io_s=0.5)
        assert pool.fail("node7/gpu2/task4", held[3],
                         'Traceback (most recent call last):\n  File "t.py", line 3\nValueError: bad pixel at 3,4\n')
        pool.release(held[4:5])
    return url


def test_status_table_shows_totals_consumers_and_dead_letters(busy_pool: str) -> None:
    out = ok(freeride("pool", "status", busy_pool))  # piped, no COLUMNS: rows are not cut to 80 columns
    for words in (["total", "done", "pending", "in flight", "failed", "items/s", "ETA"],
                  ["host", "GPU", "task", "harvested", "queue I/O", "last seen"]):
        header = next(line for line in out.splitlines() if words[0] in line and words[-1] in line)
        assert all(word in header for word in words), header
    rows = [[cell.strip() for cell in line.split("│")[1:-1]] for line in out.splitlines() if line.startswith("│")]
    totals, consumer, dead = rows
    assert totals[:6] == ["10", "3", "6", "5", "1", "1"]
    assert consumer[:5] == ["node7", "2", "4", "3", "1"]
    assert consumer[6:8] == ["1.50 s", "25.0%"] and consumer[8].endswith(" ago")
    assert dead == ["3", "1", "ValueError: bad pixel at 3,4"]
    assert max(len(line) for line in out.splitlines()) > 80
    assert "Traceback" not in out
    assert "dead letters: first 1 of 1" in out and "freeride pool retry-failed" in out


def test_status_json_has_numbers_and_the_same_shape_whatever_the_counts(busy_pool: str,
                                                                        redis_server: RedisServer) -> None:
    s = status(busy_pool)
    assert (s["total"], s["done"], s["pending"], s["queued"], s["in_flight"], s["failed"]) == (10, 3, 6, 5, 1, 1)
    for key in ("total", "done", "pending", "queued", "in_flight", "failed", "max_tries"):
        assert type(s[key]) is int, key
    for key in ("items_per_s", "lease_s", "created_unix", "now_unix"):
        assert type(s[key]) is float, key
    assert s["eta_s"] is None or type(s["eta_s"]) is float
    [c] = s["consumers"]
    assert (c["name"], c["host"], c["gpu"], c["task"], c["done"], c["failed"]) == ("node7/gpu2/task4", "node7", "2",
                                                                                    "4", 3, 1)
    assert (c["busy_s"], c["io_s"], c["io_share"]) == (1.5, 0.5, 0.25)
    for key in ("items_per_s", "first_unix", "last_unix", "last_seen_s"):
        assert type(c[key]) is float, key
    [d] = s["dead"]
    assert (d["id"], d["args"], d["tries"], d["consumer"]) == ("3", {}, 1, "node7/gpu2/task4")
    assert d["error"].endswith("ValueError: bad pixel at 3,4\n")
    assert json.loads(ok(freeride("pool", "status", busy_pool, "--json", "--dead", "0")))["dead"] == []

    fresh = redis_server.url("fresh")
    ok(freeride("pool", "create", fresh, "--range", 2))
    empty = status(fresh)
    assert set(empty) == set(s) and empty["consumers"] == [] and empty["dead"] == []
    assert (empty["items_per_s"], empty["eta_s"]) == (0.0, None)  # nothing works on it: no rate, no ETA


def test_status_of_a_pool_nobody_works_on_says_how_to_start(redis_server: RedisServer) -> None:
    url = redis_server.url("idle")
    ok(freeride("pool", "create", url, "--range", 2))
    out = ok(freeride("pool", "status", url))
    assert "no consumer yet" in out and "dead letters" not in out


# -- retry-failed, delete -------------------------------------------------------------------------
def test_retry_failed_puts_dead_letters_back(busy_pool: str) -> None:
    assert ok(freeride("pool", "retry-failed", busy_pool)) == f"pool {busy_pool}: 1 item back in the queue from the " \
                                                              "dead letters\n"
    s = status(busy_pool)
    assert (s["failed"], s["queued"], s["dead"]) == (0, 6, [])
    assert json.loads(ok(freeride("pool", "retry-failed", busy_pool, "--json"))) == {"pool": busy_pool, "retried": 0}


def test_delete_refuses_while_items_are_pending_unless_forced(busy_pool: str) -> None:
    line = one_line_error(freeride("pool", "delete", busy_pool))
    assert "still has 6 items pending (5 queued, 1 in flight)" in line and "--force" in line
    assert status(busy_pool)["total"] == 10  # untouched
    out = ok(freeride("pool", "delete", busy_pool, "--force"))
    assert out.startswith(f"deleted pool {busy_pool} (3 of 10 items done, 6 pending, 1 failed)")
    assert "does not exist" in one_line_error(freeride("pool", "status", busy_pool))


def test_delete_of_a_finished_pool_needs_no_force(redis_server: RedisServer) -> None:
    url = redis_server.url("finished")
    ok(freeride("pool", "create", url, "--range", 2))
    with Pool(parse_pool_url(url)) as pool:
        pool.ack("t", pool.lease("t", 2))
    assert json.loads(ok(freeride("pool", "delete", url, "--json"))) == {
        "pool": url, "deleted": True, "total": 2, "done": 2, "pending": 0, "failed": 0}
    with redis_server.client() as r:
        assert r.keys("freeride:pool:*") == []


# -- errors ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("command", [["status"], ["retry-failed"], ["delete"], ["delete", "--force"]])
def test_a_missing_pool_is_one_line_that_says_how_to_create_it(redis_server: RedisServer, command: list[str]) -> None:
    line = one_line_error(freeride("pool", command[0], redis_server.url("nope"), *command[1:]))
    assert "does not exist: create it with `freeride pool create" in line


@pytest.mark.parametrize(("url", "words"), [
    (f"redis://:{PASSWORD}@localhost:6379", ["names no pool", "redis://:***@localhost:6379"]),
    (f"redis://:{PASSWORD}@localhost/0/bad name", ["pool name 'bad name'"]),
    (f"http://:{PASSWORD}@localhost/p", ["must start with redis://"]),
    (f"redis://:{PASSWORD}@localhost:99999/p", ["bad port"]),
])
def test_a_bad_url_is_one_line_without_the_password(url: str, words: list[str]) -> None:
    line = one_line_error(freeride("pool", "status", url))
    for word in words:
        assert word in line


def test_unreachable_redis_is_one_line_without_the_password(redis_server: RedisServer) -> None:
    port = closed_port()
    for url in (f"redis://:{PASSWORD}@127.0.0.1:{port}/0/p", f"redis://127.0.0.1:{port}/p?password={PASSWORD}"):
        for argv in (["status", url], ["create", url, "--range", "3"], ["delete", url, "--force"]):
            line = one_line_error(freeride("pool", *argv))
            assert "Redis at redis://" in line and f"127.0.0.1:{port}" in line and "***" in line
            assert "does not answer" in line and "check the URL and that redis-server runs" in line
    redis_server.stop()
    line = one_line_error(freeride("pool", "status", redis_server.url("p")))
    assert f"Redis at unix://{redis_server.socket} does not answer" in line


def test_a_server_that_is_not_redis_is_one_line() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]

        def answer_http() -> None:
            conn, _ = listener.accept()
            with conn:
                conn.recv(4096)
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")

        server = threading.Thread(target=answer_http, daemon=True)
        server.start()
        line = one_line_error(freeride("pool", "status", f"redis://:{PASSWORD}@127.0.0.1:{port}/0/p"))
        server.join(timeout=10)
    assert f"Redis at redis://:***@127.0.0.1:{port}/0 does not answer as Redis does" in line
    assert "check the URL's host and port" in line


def test_a_redis_that_requires_a_password(redis_server: RedisServer) -> None:
    plain = redis_server.url("locked")
    with redis_server.client() as r:
        r.config_set("requirepass", PASSWORD)
    line = one_line_error(freeride("pool", "create", plain, "--range", 3))
    assert "requires a password and the URL gives none" in line
    wrong = plain.replace("unix://", "unix://:not-it@")
    line = one_line_error(freeride("pool", "status", wrong))
    assert "refused the credentials in the URL" in line and "not-it" not in line
    right = plain.replace("unix://", f"unix://:{PASSWORD}@")
    out = ok(freeride("pool", "create", right, "--range", 3))
    assert "added 3 items" in out and PASSWORD not in out and "unix://:***@" in out
    out = ok(freeride("pool", "status", right)) + ok(freeride("pool", "status", right, "--json"))
    assert PASSWORD not in out
    assert PASSWORD not in one_line_error(freeride("pool", "delete", right))
    assert PASSWORD not in one_line_error(freeride("pool", "status", right.replace("/locked", "/other")))


# -- the rest of the CLI does not pay for redis ----------------------------------------------------
def test_help_does_not_import_redis_and_the_defaults_agree() -> None:
    res = subprocess.run([sys.executable, "-X", "importtime", "-m", "freeride", "--help"], cwd=REPO, env=_env(),
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0
    imported = {line.rsplit("|", 1)[-1].strip() for line in res.stderr.splitlines() if "|" in line}
    assert "freeride.cli.pool" in imported and not {"redis", "freeride.pool"} & imported
    from freeride.cli import pool as pool_cli

    assert (pool_cli.DEFAULT_LEASE_S, pool_cli.DEFAULT_MAX_TRIES) == (DEFAULT_LEASE_S, DEFAULT_MAX_TRIES)
