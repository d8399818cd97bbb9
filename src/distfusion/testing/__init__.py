"""Helpers for testing and benchmarking distfusion against real servers on 127.0.0.1.

:mod:`distfusion.testing.s3_server`: a local S3-protocol server (moto's) that
records every request. Needs the ``test`` extra (``pip install 'distfusion[test]'``).
"""
