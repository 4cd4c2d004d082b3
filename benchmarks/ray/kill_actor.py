"""Kill one RayExecutor worker's process mid-run (SIGKILL, after 20 all-reduces) and print the error
``RayExecutor.run`` raises: ringlet's ``PeerError`` naming the killed rank.

    python benchmarks/ray/kill_actor.py --address HOST:PORT --rank 1
"""
import argparse
import os
import signal
import time


def allreduce_until_killed(victim: int):
    import torch

    import ringlet

    ringlet.init()
    for step in range(10_000):
        if ringlet.rank() == victim and step == 20:
            os.kill(os.getpid(), signal.SIGKILL)
        ringlet.allreduce(torch.ones(4096))
    return "finished"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--address", default=None)
    parser.add_argument("--rank", type=int, default=1)
    args = parser.parse_args()
    import ray

    import ringlet
    from ringlet.ray import RayExecutor

    ray.init(address=args.address)
    with RayExecutor(RayExecutor.create_settings(timeout_s=60), num_workers=2) as executor:
        executor.start()
        print(f"ranks' hosts: {executor.hosts}", flush=True)
        t0 = time.monotonic()
        try:
            executor.run(allreduce_until_killed, args=(args.rank,))
            print("no error: the run finished")
        except ringlet.PeerError as exc:
            print(f"PeerError after {time.monotonic() - t0:.1f} s, rank={exc.rank} host={exc.host}: {exc}")


if __name__ == "__main__":
    main()
