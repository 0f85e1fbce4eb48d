"""The public API of a running GoSched: gRPC services, HTTP health/metrics, and the Python Client.

    from gosched.api.server import serve      # start a scheduler that serves the API
    from gosched import Client                # talk to it

Submodules import grpc and prometheus-client; this package itself imports nothing heavy.
"""
