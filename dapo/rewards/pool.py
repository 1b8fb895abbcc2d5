"""A persistent process pool with a hard time limit per item: a hung worker is killed and replaced.
Why not `ProcessPoolExecutor` or `multiprocessing.Pool`: neither can kill the one worker stuck in a C call, so one
pathological answer would block every later training step. How: docs/architecture.md, "rewards/"."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any

STARTUP_LIMIT_S = 180.0  # generous: the first start imports sympy + math-verify on a loaded 2-core machine
MAX_CHUNK = 32


def _worker_main(
    conn: Connection,
    fn: Callable[[Any], Any],
    warmup: Any,
    mem_limit: int | None,
    retire_if: Callable[[Any], bool] | None,
) -> None:
    """Worker loop: run `fn(warmup)` and send ("ready", None), or ("failed", why) and exit if it raised; then
    receive a list of items, send ("ok", fn(item)) or ("error", why) per item, in order; after a result for which
    `retire_if` is true, send ("retire", None) and exit (the parent replaces it)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    if mem_limit:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (mem_limit, resource.getrlimit(resource.RLIMIT_AS)[1]))
    if warmup is not None:
        try:
            fn(warmup)
        except Exception as e:  # the parent raises it: a worker that cannot do its job must not take items
            conn.send(("failed", f"{type(e).__name__}: {e}"))
            return
    conn.send(("ready", None))
    while True:
        try:
            batch = conn.recv()
        except (EOFError, OSError):
            return
        if batch is None:
            return
        for item in batch:
            try:
                out = ("ok", fn(item))
            except BaseException as e:  # fn should not raise; if it does, that item alone is lost (and named)
                out = ("error", f"{type(e).__name__}: {e}")
            conn.send(out)
            if retire_if is not None and out[0] == "ok" and retire_if(out[1]):
                conn.send(("retire", None))
                return


@dataclass
class _Worker:
    proc: Any
    conn: Connection
    born: float
    ready: bool = False
    job: list[int] = field(default_factory=list)  # indices of the chunk in flight; job[0] is running now
    item_start: float = 0.0


class BoundedPool:
    """`workers` processes running the picklable top-level `fn` on items, each item bounded in time.

    A worker also retires (is replaced) after an item whose result `retire_if` flags, e.g. one whose
    computation was interrupted by a signal and may have left the process's caches half-updated.
    `map(items, hard_timeout_s)` returns, in order, `(status, value)` per item with status "ok" (value is
    fn's result), "timeout" (killed after `hard_timeout_s`), "crash" (the worker died on it) or "error" (fn
    raised; value is the exception's text). A worker whose warm-up raises makes `map` raise RuntimeError.
    Thread-safe (one map at a time); survives a fork of the parent by starting fresh workers.
    """

    def __init__(
        self,
        fn: Callable[[Any], Any],
        workers: int,
        *,
        warmup: Any = None,
        preload: Sequence[str] = (),
        mem_limit_bytes: int | None = None,
        retire_if: Callable[[Any], bool] | None = None,
    ) -> None:
        self.fn, self.n_workers, self.warmup = fn, max(1, int(workers)), warmup
        self.mem_limit = mem_limit_bytes
        self.retire_if = retire_if
        methods = mp.get_all_start_methods()
        self._ctx = mp.get_context("forkserver" if "forkserver" in methods else "spawn")
        if preload and self._ctx.get_start_method() == "forkserver":
            self._ctx.set_forkserver_preload(list(preload))  # ignored if the forkserver already runs
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._workers: list[_Worker] = []
        self.restarts = 0  # workers killed or lost so far (a health signal for the caller)

    # --------------------------------------------------------------------------------------- workers
    def _spawn(self) -> _Worker:
        parent_conn, child_conn = self._ctx.Pipe(duplex=True)
        args = (child_conn, self.fn, self.warmup, self.mem_limit, self.retire_if)
        proc = self._ctx.Process(target=_worker_main, args=args, daemon=True, name="dapo-reward-worker")
        proc.start()
        child_conn.close()  # so that the parent sees EOF when the worker dies
        return _Worker(proc=proc, conn=parent_conn, born=time.monotonic())

    def _kill(self, w: _Worker) -> None:
        try:
            w.proc.kill()
            w.proc.join(timeout=5)
        except (OSError, ValueError):  # already reaped or closed: nothing left to stop
            pass
        w.conn.close()

    def _replace(self, w: _Worker) -> None:
        self._kill(w)
        self._workers[self._workers.index(w)] = self._spawn()
        self.restarts += 1

    def _ensure_workers(self) -> None:
        if os.getpid() != self._pid:  # forked: the workers belong to the parent process
            self._workers, self._pid = [], os.getpid()
        for w in list(self._workers):
            if w.job or not w.proc.is_alive():  # dead, or left mid-chunk by an interrupted map
                self._kill(w)
                self._workers.remove(w)
        while len(self._workers) < self.n_workers:
            self._workers.append(self._spawn())

    # ------------------------------------------------------------------------------------------- map
    def map(self, items: Sequence[Any], hard_timeout_s: float) -> list[tuple[str, Any]]:
        with self._lock:
            return self._map(items, float(hard_timeout_s))

    def _map(self, items: Sequence[Any], hard: float) -> list[tuple[str, Any]]:
        n = len(items)
        results: list[tuple[str, Any] | None] = [None] * n
        if n == 0:
            return []
        self._ensure_workers()
        chunk = max(1, min(MAX_CHUNK, -(-n // (4 * self.n_workers))))
        queue: deque[list[int]] = deque(list(range(i, min(i + chunk, n))) for i in range(0, n, chunk))

        def finish_current(w: _Worker, status: str, value: Any) -> None:
            results[w.job.pop(0)] = (status, value)
            w.item_start = time.monotonic()

        def requeue(w: _Worker, lost: str | None = None) -> None:
            """Replace the worker; its current item ends with status `lost` (if given), the rest of its chunk goes
            back to the front of the queue."""
            if lost is not None and w.job:
                finish_current(w, lost, None)
            if w.job:
                queue.appendleft(w.job)
            w.job = []
            self._replace(w)

        while queue or any(w.job for w in self._workers):
            for w in self._workers:  # hand chunks to idle, ready workers
                if w.ready and not w.job and queue:
                    w.job = queue.popleft()
                    try:
                        w.conn.send([items[i] for i in w.job])
                    except (OSError, ValueError):  # the worker died while idle
                        requeue(w)
                        continue
                    w.item_start = time.monotonic()
            now = time.monotonic()
            limits = [w.item_start + hard for w in self._workers if w.job]
            limits += [w.born + STARTUP_LIMIT_S for w in self._workers if not w.ready]
            timeout = max(0.0, min(limits, default=now + 1) - now)
            ready = wait([w.conn for w in self._workers], timeout=timeout)
            for conn in ready:
                w = next(x for x in self._workers if x.conn is conn)
                try:
                    while conn.poll():
                        status, value = conn.recv()
                        if status == "ready":
                            w.ready = True
                        elif status == "failed":
                            self._kill(w)
                            raise RuntimeError(f"a reward worker failed its warm-up: {value}")
                        elif status == "retire":  # done with its last item; the rest goes back
                            requeue(w)
                            break
                        elif w.job:
                            finish_current(w, status, value)
                        if not w.job:
                            break
                except (EOFError, OSError):  # the worker died: on its current item, if any
                    if not w.ready:
                        self._kill(w)
                        raise RuntimeError(
                            "a reward worker died while starting (a script that scores "
                            "responses needs an `if __name__ == '__main__':` guard)"
                        ) from None
                    requeue(w, "crash")
            now = time.monotonic()
            for w in list(self._workers):
                if w.job and now - w.item_start > hard:
                    requeue(w, "timeout")
                elif not w.ready and now - w.born > STARTUP_LIMIT_S:
                    self._kill(w)
                    raise RuntimeError(f"a reward worker did not start within {STARTUP_LIMIT_S:.0f} s")
        return [r if r is not None else ("error", None) for r in results]

    def close(self) -> None:
        """Stop the workers (politely, then by force)."""
        with self._lock:
            if os.getpid() != self._pid:
                self._workers = []
                return
            for w in self._workers:
                try:
                    w.conn.send(None)
                except (OSError, ValueError):  # the worker is gone already: it is killed below anyway
                    pass
            for w in self._workers:
                w.proc.join(timeout=2)
                self._kill(w)
            self._workers = []
