"""vLLM's own KV-event publisher (``ZmqEventPublisher`` with its PUB and
replay ROUTER), run in a vLLM environment by the tests -- nothing of
blockpool is imported here.

argv: PUB endpoint, replay endpoint, topic.  Then one JSON line per command
on stdin: a list of batches, each a list of events (``["stored", hashes,
parent, token_ids, block_size, lora_id, lora_name]``, ``["removed",
hashes]``, ``["cleared"]``), published in order; once vLLM's thread sent
them, ``@@ sent N`` (the batches published so far) on stdout, where vLLM's
log lines may go too.  stdin closed:
shut down.
"""

import json
import sys

from vllm.distributed.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    ZmqEventPublisher,
)


def event(item):
    kind = item[0]
    if kind == "stored":
        hashes, parent, tokens, block_size, lora_id, lora_name = item[1:]
        return BlockStored(
            block_hashes=hashes,
            parent_block_hash=parent,
            token_ids=tokens,
            block_size=block_size,
            lora_id=lora_id,
            medium="GPU",
            lora_name=lora_name,
        )
    if kind == "removed":
        return BlockRemoved(block_hashes=item[1], medium="GPU")
    return AllBlocksCleared()


def main():
    endpoint, replay, topic = sys.argv[1:4]
    pub = ZmqEventPublisher(0, endpoint=endpoint, replay_endpoint=replay, topic=topic)
    print("@@ ready", flush=True)
    sent = 0
    for line in sys.stdin:
        for batch in json.loads(line):
            pub.publish(KVEventBatch(ts=1.0, events=[event(e) for e in batch]))
            sent += 1
        pub._event_queue.join()  # every batch taken and sent by vLLM's thread
        print(f"@@ sent {sent}", flush=True)
    pub.shutdown()


main()
