"""WorkerTransport: how task plans reach workers and partitions come back (in-memory, Flight)."""
