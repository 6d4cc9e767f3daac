"""Pure data model and placement: no I/O, no clock, no sockets."""
