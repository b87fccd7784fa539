"""The live stream: a websocket protocol of snapshot + sequenced deltas."""
