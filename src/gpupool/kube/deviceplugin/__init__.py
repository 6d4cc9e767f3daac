"""Kubelet device plugin (API v1beta1) advertising `gpupool.io/gpu` units.

`api.proto` is written from the published API; `api_pb2*.py` are generated from
it by `gen.py` and committed, so the agent needs grpcio and protobuf only.
"""
