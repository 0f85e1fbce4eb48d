"""Generated protobuf and gRPC modules of the gosched.v1 API.

Regenerate with `python -m gosched.proto.generate`.
"""
