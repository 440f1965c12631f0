"""Test support: real S3 servers (moto), a fault-injecting HTTP proxy, and the rendered Kubernetes delivery.

Everything here talks over real loopback sockets, so adapters and the CLI are
tested against the same HTTP stack they meet in production. The exception is
`fakes.py`: in-memory fakes of the engine's backend Protocols (engine/ports.py),
for engine tests that need no server; the adapters behind those Protocols keep
their real-server tests.
"""
