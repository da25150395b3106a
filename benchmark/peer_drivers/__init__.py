"""Peer job queues driven through their public APIs, run by the benchmark's own separate
virtual environment (`benchmark/peers.py`, from `benchmark/peers.lock`). The drivers here
import only the standard library and the peer, never jobq, so they run in that environment.

Each driver: `--phase enqueue` installs the peer's schema into an empty database and inserts N
no-op jobs (the caller then runs VACUUM ANALYZE); `--phase burn` prepares a worker, prints
`ready`, waits for a line on stdin (so the caller meters only the burn-down), drains the jobs,
and prints one JSON line `{processed, seconds, remaining}`: seconds from the first job's start
to the worker's return, `remaining` the jobs the peer still holds as not done.
"""
