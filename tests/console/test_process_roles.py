"""The Server screen's Processes panel names what each process of a server is.

A `tokenspeed serve` process starts its scheduler (a spawned interpreter), and with it Python starts the
multiprocessing resource tracker; the first large request body starts the body parser. All three are
children of the front end, and the panel once called every one of them "scheduler / controller". Here a
real process tree of that shape, sampled by the supervisor's sampler."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import psutil

from console.supervisor.resources import ProcessSampler

# A front end in miniature: a spawned child (as the scheduler is, which brings the resource tracker) and
# the real body parser, then it waits for its stdin to close.
FRONT_END = textwrap.dedent(
    """
    import multiprocessing as mp, subprocess, sys, time

    def idle():
        time.sleep(600)

    if __name__ == "__main__":
        child = mp.get_context("spawn").Process(target=idle, daemon=True)
        child.start()
        parser = subprocess.Popen([sys.executable, "-m", "tokenspeed.runtime.entrypoints.body_parser"],
                                  stdin=subprocess.PIPE)
        print("started", flush=True)
        sys.stdin.read()
        parser.stdin.close()
        parser.wait()
        child.kill()
    """
)


def test_each_child_of_the_front_end_is_named_by_what_it_is():
    front = subprocess.Popen(
        [sys.executable, "-c", FRONT_END], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert front.stdout.readline().strip() == "started"
        deadline = time.time() + 30
        while len(psutil.Process(front.pid).children()) < 3 and time.time() < deadline:
            time.sleep(0.1)
        sampler = ProcessSampler()
        sampler.sample({"s": [front.pid]})
        roles = sorted(row.name for row in sampler.usage["s"])
        assert roles == ["body parser", "front end", "resource tracker", "scheduler / controller"]
        sampler.sample({"s": [front.pid]})  # the next sample names them from what the first one read
        assert sorted(row.name for row in sampler.usage["s"]) == roles
    finally:
        front.stdin.close()
        front.wait(timeout=30)
