"""Pure data model and placement: no I/O, no clock, no sockets.

Owns: Device, GpuRequest, Claim, Holder, Lease, Slice, PoolStatus (`status`) and their one wire format
(`to_dict`/`from_dict`); placement policies and filters; quantity parsing; the usage and
isolation records (`usage`); the one exception hierarchy with its exit codes and HTTP statuses
(`errors`, also `error_for_status`).
May import: the standard library only (floor 0: nothing else of gpupool).
"""
