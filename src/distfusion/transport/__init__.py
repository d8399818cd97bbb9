"""WorkerTransport: how task plans reach workers and partitions come back.

``base.py`` is the protocol, ``in_memory.py`` (workers in this process) and
``flight.py`` (Arrow Flight) its implementations; the messages they carry are in
:mod:`distfusion.protocol`. See docs/architecture.md.
"""
