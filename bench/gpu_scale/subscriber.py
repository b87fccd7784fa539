"""A SUB socket that drains the plugin's stream (``run.py --subscriber``):
counts messages and bytes until SIGTERM, then prints one JSON line.

    python -m bench.gpu_scale.subscriber tcp://127.0.0.1:PORT
"""

from __future__ import annotations

import json
import signal
import sys
import time

import zmq


def main() -> int:
    endpoint = sys.argv[1]
    stop = False

    def on_term(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.setsockopt(zmq.RCVHWM, 0)
    sub.connect(endpoint)
    messages = frames = size = 0
    first = last = 0.0
    while not stop:
        if not sub.poll(100):
            continue
        while True:
            try:
                parts = sub.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            messages += 1
            frames += len(parts)
            size += sum(len(p) for p in parts)
            last = time.time()
            first = first or last
    sub.close(linger=0)
    ctx.term()
    print(
        json.dumps(
            {
                "messages": messages,
                "frames": frames,
                "bytes": size,
                "seconds": round(last - first, 3),
            }
        ),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
